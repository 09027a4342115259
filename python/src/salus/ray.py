"""Place Ray tasks and actors on the Ray node whose Salus server has the memory they ask for.

Nodes are started with deploy/ray/salus-ray-start, which gives each one the custom resource
`salus_mem_mib` (its server's device memory, in MiB) and the label `salus.io/server` (its server's
HOST_PORT: Ray 2.60 refuses ':' in label values). From a driver:

    import ray, salus.ray
    ray.init(address="auto")
    with salus.ray.place("4GiB", priority=3, expires="12h") as p:
        trainer = Trainer.options(**p.options).remote()   # runs on p.node_id; SALUS_SERVER/SALUS_TOKEN set
        ray.get(trainer.fit.remote())
    # leaving the block revoked the token: the reservation on that server is gone

`place()` picks a live node labelled salus.io/server whose available `salus_mem_mib` (Ray's own
accounting) is at least the memory asked, the one with the least such room first (best fit, so big
nodes stay free for big jobs), and issues a token on that node's server with that memory reserved for
the token's tenant (and as its cap), plus max_priority and expiry. The token is issued by a small Ray
task (num_cpus=0) pinned to that node, because only the server's user or root over loopback may issue
tokens: the task reaches the server at SALUS_RAY_ADMIN, the loopback address salus-ray-start handed to
that node's Ray processes, with the salus admin client. The returned options are

    resources            {"salus_mem_mib": N}: Ray's accounting of the node's memory
    scheduling_strategy  NodeAffinitySchedulingStrategy(node_id, soft=False): that node or nothing
    runtime_env          {"env_vars": {"SALUS_SERVER": addr, "SALUS_TOKEN": token, ...}}

so an unmodified TensorFlow program started by the task or actor (in a venv with the salus-tf
package) trains through that server, within the reservation.

Races. Ray's available resources are a snapshot: two drivers may pick the same node at once. The
server's reservations are the arbiter: issuing a token whose memory, with the other tokens', would
exceed the device is refused (RESOURCE_EXHAUSTED), and place() then tries the next node that fits. Two
placements that both got tokens but whose Ray resources do not both fit (memory of the node taken by
work that holds salus_mem_mib without a token) are queued by Ray on that node until the resource is
free: the hard affinity never moves them elsewhere, where their token would not work.

Errors. NoRoom when no live Salus node has the memory available in Ray's view (naming the largest
available and where), or when every node that fits refused the token (each node's reason). A node's
server that cannot be reached, or a node whose token task fails (the node died; its worker did not
start within TASK_TIMEOUT_S), is skipped like a full one. The token's reservation lasts until
release() (or the `with` block's end) or its expiry; give `expires` so that a driver that dies without
releasing does not hold memory for ever. A server restarted on its address and --state-dir keeps the
token and the reservation: the placement's next run is served with them.

Memory reserved outside Ray (a Slurm prolog's token, the Kubernetes device plugin's, an admin's) is
not subtracted from Ray's own salus_mem_mib, which is fixed at `ray start` (Ray 2.60 cannot change a live
node's custom resources). place() therefore asks each node that fits in Ray's view for its server's
unreserved memory (a small task on the node, like the token's) and counts a node's room as the smaller
of the two figures; salus_nodes() gives both. A reservation made between that question and the token is
caught by the server, which refuses the token, and place() moves on to the next node, as in a race.

This module imports Ray lazily and neither TensorFlow nor gRPC at import (the admin client runs in the
token task on the node), so it is cheap in a driver.
"""

from __future__ import annotations

import math
import os
import re
import uuid
from dataclasses import dataclass, field

RESOURCE = "salus_mem_mib"
LABEL = "salus.io/server"
ENV_ADMIN = "SALUS_RAY_ADMIN"
MIB = 1 << 20
TASK_TIMEOUT_S = 120.0

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 10**6, "mb": 10**6, "mib": 1 << 20,
          "g": 10**9, "gb": 10**9, "gib": 1 << 30, "t": 10**12, "tb": 10**12, "tib": 1 << 40}
_DURATION = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_TENANT = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


class NoRoom(RuntimeError):
    """No live Ray node with a Salus server could take the placement."""


def parse_memory(memory) -> int:
    """Bytes of "4GiB", "1536MiB", "1GB", "512" (bytes), or an int (bytes), as salus-server parses sizes."""
    if isinstance(memory, int) and not isinstance(memory, bool):
        value = memory
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(memory))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ValueError(f"{memory!r} is not a size like 512MiB or 4GiB")
        value = int(m.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"memory must be positive, got {memory!r}")
    return value


def parse_duration(expires) -> float:
    """Seconds of 90, "90s", "15m", "2h", "7d"; None or 0: no expiry (0.0)."""
    if expires is None:
        return 0.0
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        seconds = float(expires)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(expires))
        if m is None:
            raise ValueError(f"{expires!r} is not a duration like 90s, 15m, 2h or 7d")
        seconds = float(m.group(1)) * _DURATION[m.group(2)]
    if seconds < 0:
        raise ValueError(f"expires must not be negative, got {expires!r}")
    return seconds


def server_address(label_value: str) -> str:
    """HOST:PORT of a node's `salus.io/server` label (HOST_PORT)."""
    host, sep, port = label_value.rpartition("_")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{LABEL}={label_value!r} is not HOST_PORT (start the node with salus-ray-start)")
    return f"{host}:{port}"


@dataclass
class SalusNode:
    node_id: str
    server: str          # HOST:PORT, from the label
    total_mib: int
    available_mib: int   # the node's room: Ray's available salus_mem_mib, or less if its server has less
    ray_available_mib: int = 0
    # The server's memory no token reserves (Slurm's, Kubernetes', an admin's tokens included); None when
    # it was not asked, or could not be (then `server_error` says why).
    server_unreserved_mib: int | None = None
    server_error: str | None = None

    def room_text(self) -> str:
        text = f"{self.available_mib} MiB (of {self.total_mib}) on node {self.node_id} (salus {self.server})"
        if self.server_unreserved_mib is not None and self.server_unreserved_mib < self.ray_available_mib:
            text += (f": Ray offers {self.ray_available_mib} MiB, but tokens issued outside Ray leave the "
                     f"server {self.server_unreserved_mib} MiB")
        return text


def salus_nodes(ask_servers: bool = True) -> list[SalusNode]:
    """The live Ray nodes with a Salus server, with their salus_mem_mib (total, available now in Ray's
    accounting) and, unless `ask_servers` is false, each server's unreserved memory: `available_mib` is
    the smaller, so memory reserved through another engine on the same server is not counted as room."""
    import ray
    from ray._private.state import available_resources_per_node  # DeveloperAPI, as in `ray status`

    available = available_resources_per_node()
    nodes = []
    for n in ray.nodes():
        labels = n.get("Labels") or {}
        if not n.get("Alive") or LABEL not in labels or RESOURCE not in n.get("Resources", {}):
            continue
        ray_mib = int(available.get(n["NodeID"], {}).get(RESOURCE, 0))
        nodes.append(SalusNode(node_id=n["NodeID"], server=server_address(labels[LABEL]),
                               total_mib=int(n["Resources"][RESOURCE]), available_mib=ray_mib,
                               ray_available_mib=ray_mib))
    if ask_servers:
        _ask_servers(nodes)
    return nodes


def _ask_servers(nodes: list[SalusNode]) -> None:
    """Sets each node's server_unreserved_mib (and lowers available_mib to it), asking all the nodes'
    servers at once, each through a task on its node (the admin API is answered over loopback)."""
    import ray
    if not nodes:
        return
    refs = {n.node_id: _pinned(_unreserved_here, n.node_id).remote(n.server) for n in nodes}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=TASK_TIMEOUT_S)
    for node in nodes:
        ref = refs[node.node_id]
        if ref not in ready:
            ray.cancel(ref, force=True)
            node.server_error = f"its task did not answer within {TASK_TIMEOUT_S:.0f} s"
            continue
        try:
            reply = ray.get(ref)
        except Exception as e:  # the node died, or its worker failed
            node.server_error = f"its task failed: {type(e).__name__}: {str(e)[:300]}"
            continue
        if "error" in reply:
            node.server_error = f"{reply['code']}: {reply['error']} (admin {reply['admin']})"
            continue
        node.server_unreserved_mib = reply["unreserved_mib"]
        node.available_mib = min(node.ray_available_mib, node.server_unreserved_mib)


# --- run on the chosen node, in a Ray worker there ------------------------------------------------------

def _admin_address(server: str) -> str:
    return os.environ.get(ENV_ADMIN) or server


def _issue_here(server: str, request: dict) -> dict:
    """Issues a token on this node's server (its admin API over loopback). Errors come back as data, not
    as exceptions, so the driver needs none of the admin client's classes."""
    from .admin import AdminClient, AdminError
    address = _admin_address(server)
    try:
        # As this node's Ray user over loopback (root or the server's own: an admin), never as a
        # SALUS_TOKEN tenant that happens to be in the worker's environment.
        with AdminClient(address, timeout=30, token="") as admin:
            return {"ok": admin.issue_token(**request), "admin": address}
    except AdminError as e:
        return {"error": str(e), "code": getattr(e.code, "name", str(e.code)), "admin": address}


def _revoke_here(server: str, token_id: str) -> dict:
    from .admin import AdminClient, AdminError
    address = _admin_address(server)
    try:
        with AdminClient(address, timeout=30, token="") as admin:
            return {"ok": admin.revoke_tokens(token_id)}
    except AdminError as e:
        return {"error": str(e), "code": getattr(e.code, "name", str(e.code))}


def _unreserved_here(server: str) -> dict:
    """This node's server's memory no token reserves, in MiB (as `ctl capacity --json`'s unreserved_mib)."""
    from .admin import AdminClient, AdminError
    address = _admin_address(server)
    try:
        with AdminClient(address, timeout=30, token="") as admin:
            info = admin.server_info()
    except AdminError as e:
        return {"error": str(e), "code": getattr(e.code, "name", str(e.code)), "admin": address}
    capacity = int(info.get("memory_capacity_bytes", 0))
    reserved = int(info.get("memory_reserved_bytes", 0))
    return {"unreserved_mib": max(capacity - reserved, 0) // MIB}


def _pinned(fn, node_id: str):
    """`fn` as a Ray task (no CPU, no retry) that runs on `node_id` or not at all."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return ray.remote(num_cpus=0, max_retries=0)(fn).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), name=f"salus{fn.__name__}")


def _on_node(fn, node_id: str, *args):
    import ray
    return ray.get(_pinned(fn, node_id).remote(*args), timeout=TASK_TIMEOUT_S)


# --- the driver's side ------------------------------------------------------------------------------------

@dataclass
class Placement:
    """A token with memory reserved on one node's Salus server, and the Ray options that run there with it."""
    node_id: str
    server: str
    mib: int
    tenant: str
    token_id: str
    options: dict = field(repr=False)
    released: bool = False
    # Why the nodes tried before this one refused the token (a race lost, or memory reserved meanwhile).
    refusals: list[str] = field(default_factory=list)

    def options_with(self, **more) -> dict:
        """`options` merged with more Ray options; a runtime_env's env_vars are merged, ours win."""
        out = {**more, **{k: v for k, v in self.options.items() if k != "runtime_env"}}
        env = dict((more.get("runtime_env") or {}))
        env["env_vars"] = {**env.get("env_vars", {}), **self.options["runtime_env"]["env_vars"]}
        out["runtime_env"] = env
        return out

    def release(self) -> list[dict]:
        """Revokes the token (its reservation ends; the tenant's jobs still open on the server are ended or
        refused, see docs/src/operator/tenants.md). Idempotent; returns the revoked tokens' records."""
        if self.released:
            return []
        self.released = True
        reply = _on_node(_revoke_here, self.node_id, self.server, self.token_id)
        if "error" in reply:
            raise RuntimeError(f"could not revoke token {self.token_id} on {self.server}: {reply['error']}")
        return reply["ok"]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def place(memory, priority: int | None = None, expires=None, uid: int | None = None,
          tenant: str | None = None, name: str | None = None) -> Placement:
    """Chooses a node with `memory` available and issues a token reserving it there (see the module doc).

    memory: "4GiB", "1536MiB" or bytes (rounded up to whole MiB, Ray's unit). priority: the job's priority
    hint (SALUS_PRIORITY) and the token's max_priority. expires: the token's lifetime ("2h", seconds;
    default none). uid: bind the token to this Unix uid (then only that user's processes on the node may
    use it). tenant: the tenant name (default ray-<random>). name: the job name (SALUS_JOB_NAME).
    Raises NoRoom, or ValueError for a malformed argument."""
    mib = math.ceil(parse_memory(memory) / MIB)
    seconds = parse_duration(expires)
    tenant = tenant or f"ray-{uuid.uuid4().hex[:12]}"
    if not _TENANT.match(tenant):
        raise ValueError(f"tenant {tenant!r}: letters, digits, - _ . @ only, at most 64")
    if priority is not None and not isinstance(priority, int):
        raise ValueError(f"priority must be an int, got {priority!r}")

    nodes = salus_nodes(ask_servers=False)
    if not nodes:
        raise NoRoom(f"no live Ray node has a Salus server (label {LABEL} and resource {RESOURCE}): start the "
                     f"nodes with deploy/ray/salus-ray-start")
    # Only the nodes with room in Ray's view are worth asking their servers about.
    _ask_servers([n for n in nodes if n.ray_available_mib >= mib])
    fitting = sorted((n for n in nodes if n.available_mib >= mib and n.server_error is None),
                     key=lambda n: (n.available_mib, n.node_id))
    if not fitting:
        best = max(nodes, key=lambda n: n.available_mib)
        unasked = "".join(f"; node {n.node_id} (salus {n.server}) could not be asked: {n.server_error}"
                          for n in nodes if n.server_error is not None)
        raise NoRoom(f"no Ray node with a Salus server has {mib} MiB of {RESOURCE} available: the largest "
                     f"available is {best.room_text()}; {len(nodes)} Salus node(s){unasked}")

    request = {"tenant": tenant, "uid": uid, "memory_bytes": mib * MIB, "max_priority": priority,
               "expires_seconds": seconds}
    refusals = []
    for node in fitting:
        try:
            reply = _on_node(_issue_here, node.node_id, node.server, request)
        except Exception as e:  # the node died, or its worker did not start in time
            refusals.append(f"node {node.node_id} (salus {node.server}): the token task failed: "
                            f"{type(e).__name__}: {str(e)[:300]}")
            continue
        if "error" in reply:
            refusals.append(f"node {node.node_id} (salus {node.server}, admin {reply['admin']}): "
                            f"{reply['code']}: {reply['error']}")
            continue
        issued = reply["ok"]
        env = {"SALUS_SERVER": node.server, "SALUS_TOKEN": issued["token"]}
        if priority is not None:
            env["SALUS_PRIORITY"] = str(priority)
        if name:
            env["SALUS_JOB_NAME"] = name
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        options = {"resources": {RESOURCE: mib},
                   "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
                   "runtime_env": {"env_vars": env}}
        return Placement(node_id=node.node_id, server=node.server, mib=mib, tenant=tenant,
                         token_id=issued["info"]["id"], options=options, refusals=refusals)
    raise NoRoom(f"every Ray node with {mib} MiB of {RESOURCE} available refused the token:\n  "
                 + "\n  ".join(refusals))
