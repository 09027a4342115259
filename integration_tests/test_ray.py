"""Ray places trainings onto per-node Salus servers by memory (deploy/ray, python/src/salus/ray.py).

A real Ray 2.60 cluster on this host: a head and a worker node, each started with deploy/ray/salus-ray-start
(distinct ports and temp dirs, one CPU each), each with its own salus-server (head 1 GiB, worker 2 GiB of
--memory-capacity), so the nodes offer salus_mem_mib 1024 and 2048. A driver (workloads/ray_driver.py, run with
.venv-ray's python) asks salus.ray.place() for 1536 MiB (only the worker fits) and 768 MiB (best fit: the head),
and runs the unmodified tf-keras script workloads/keras_script.py in a Ray actor on each chosen node, with the
SALUS_SERVER/SALUS_TOKEN that runtime_env gave the actor. While both hold their sessions open, each server's
`ctl jobs --json` shows the job of its own token's tenant and not the other's, and `ctl capacity` the
reservation; the losses equal an in-process run of the same script; after release() the tokens and
reservations are gone. Also: a placement larger than every node, and one that no longer fits once both are
placed, fail with NoRoom naming the largest room.

A restart keeps a placement (issue 40): once both trainings have finished (the driver's RAN pause; placements,
tokens and actors still held), the worker's server is killed (SIGKILL) and started again on the same address and
the same --state-dir. Before the next run it lists the big placement's token and `ctl capacity` its reservation;
the big actor's next training, with the same SALUS_TOKEN, is listed there under the placement's tenant and gives
the local run's numbers. Memory another engine reserved: with 200 MiB of the head's server held by a `ctl token
issue` token, Ray still offers the head 256 MiB of salus_mem_mib (fixed at `ray start`), but salus_nodes() says
the head has 56 MiB (its server's figure), and a 128 MiB placement, whose best fit in Ray's view alone is the head,
lands on the worker without trying the head.

Cost: 55-60 s measured on 2 cores (two salus-servers, two Ray nodes, a few Ray workers, three trainings and a
local reference run), one module-scoped scenario; allow about 2 minutes on a loaded machine. The restart part
(a server start, a 128 MiB placement and its release, the second training) took 6.7 s from RAN to RESULT, and
the module 55-59 s against 60 s without it in the same session: within its run-to-run spread. No timing
assertions. Needs .venv-ray (scripts/setup_ray.sh); skips with that reason when it is missing.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import (REPO, WORKLOADS, SalusProcess, child_env, executors_of, reachable_tmpdir, venv_python,
                      wait_until)
from server_ctl import ctl, ctl_json

RAY_VENV = REPO / ".venv-ray"
RAY_PYTHON = RAY_VENV / "bin" / "python"
RAY_CLI = RAY_VENV / "bin" / "ray"
START = REPO / "deploy" / "ray" / "salus-ray-start"
MIB = 1 << 20
NODE_START_TIMEOUT_S = 120
DRIVER_TIMEOUT_S = 420

pytestmark = pytest.mark.skipif(not RAY_CLI.exists(), reason=f"{RAY_VENV} is missing: run scripts/setup_ray.sh")


def free_port() -> int:
    """A free port from the kernel's ephemeral range (outside 10002-19999, Ray's worker ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayNode:
    """`salus-ray-start ... -- ... --block` in a process group of its own: every Ray daemon and worker of the
    node is in it, and is stopped by that group id (SIGTERM, then SIGKILL: some ignore SIGTERM for >15 s)."""

    def __init__(self, directory: Path, salus: str, ray_args: list[str], temp_dir: Path):
        self.log_path = directory / "ray-start.log"
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "SALUS_RAY": str(RAY_CLI)}
        env.pop("SALUS_SERVER", None)
        env.pop("SALUS_TOKEN", None)
        self.proc = subprocess.Popen(
            [str(START), "--salus", salus, "--", *ray_args, "--temp-dir", str(temp_dir), "--num-cpus", "1",
             "--dashboard-agent-listen-port", str(free_port()),
             "--object-store-memory", str(100 * 1000 * 1000), "--disable-usage-stats", "--block"],
            stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
        self.pgid = self.proc.pid
        up = wait_until(lambda: self.proc.poll() is not None or b"will now block forever" in self.log_path.read_bytes(),
                        timeout=NODE_START_TIMEOUT_S, interval=0.2)
        if not up or self.proc.poll() is not None:
            self.stop()
            pytest.fail(f"ray node did not start (exit {self.proc.poll()}):\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_bytes()[-4000:].decode(errors="replace")

    def stop(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break

            def gone() -> bool:
                self.proc.poll()
                try:
                    os.killpg(self.pgid, 0)
                    return False
                except ProcessLookupError:
                    return True

            if wait_until(gone, timeout=wait_s, interval=0.2):
                break
        self.proc.poll()


class Driver:
    """workloads/ray_driver.py with its stdout read on a thread (line protocol: HOLDING, RESULT)."""

    def __init__(self, head: str):
        env = {**child_env(), "RAY_USAGE_STATS_ENABLED": "0"}
        for key in ("SALUS_SERVER", "SALUS_TOKEN", "PYTHONPATH"):
            env.pop(key, None)
        self.proc = subprocess.Popen([str(RAY_PYTHON), str(WORKLOADS / "ray_driver.py"), head, venv_python(),
                                      str(WORKLOADS / "keras_script.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # end of output

    def expect(self, word: str) -> dict:
        deadline = time.monotonic() + DRIVER_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            if line.startswith(word + " "):
                return json.loads(line[len(word) + 1:])
        self.kill()
        pytest.fail(f"the Ray driver printed no {word} line (exit {self.proc.poll()}); stderr tail:\n"
                    f"{''.join(self.stderr)[-6000:]}")

    def proceed(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def local_reference() -> dict:
    """The same script in a plain process, no Salus (the repository's tests compare these exactly)."""
    env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_")}
    proc = subprocess.run([venv_python(), str(WORKLOADS / "keras_script.py")], capture_output=True, text=True,
                          env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


CAPACITY = {"head": "1GiB", "worker": "2GiB"}
OTHER_MIB = 200  # reserved on the head's server by another tenant (`ctl token issue`) while the driver places 128 MiB


def server_args(base: Path, name: str) -> tuple[str, ...]:
    """A node's salus-server arguments: its capacity and its state directory (its restart reuses both).
    --adopt-grace 0: the scenario's crash ends the node's running jobs, as it is about the placement's token and
    reservation (a restart that keeps running jobs is test_restart.py's)."""
    return ("--memory-capacity", CAPACITY[name], "--state-dir", str(base / name / "state"), "--adopt-grace", "0")


def server_view(address: str) -> dict:
    return {"jobs": ctl_json(address, "jobs")["jobs"], "tokens": ctl_json(address, "token", "list"),
            "capacity": ctl_json(address, "capacity")}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    """Runs the whole scenario once: servers, Ray nodes, the driver to HOLDING (views of both servers taken
    then), RAN (the worker's server restarted on its address and state directory, its view taken, another tenant's
    token issued on the head), AGAIN (views taken; the other token revoked), release, RESULT (views taken again);
    everything started here is stopped by its PID or group."""
    base = tmp_path_factory.mktemp("ray")
    cwd = reachable_tmpdir("salus-ray-")  # executors of token tenants run as uids of no account
    # Ray's session directories hold AF_UNIX sockets (107 bytes at most, its own name ~60 of them): a short root.
    ray_temp = Path(tempfile.mkdtemp(prefix="ray-"))
    started: list = []
    try:
        servers = {}
        for name in CAPACITY:
            (base / name).mkdir()
            servers[name] = SalusProcess(base / name / "salus-server.stderr.log", server_args(base, name), cwd=cwd)
            started.append(servers[name])
        head_port = free_port()
        head_address = f"127.0.0.1:{head_port}"
        head_args = ["--head", "--port", str(head_port), "--include-dashboard", "false",
                     "--dashboard-port", str(free_port()), "--ray-client-server-port", str(free_port())]
        nodes = {"head": RayNode(base / "head", servers["head"].address, head_args, ray_temp / "head")}
        started.append(nodes["head"])
        nodes["worker"] = RayNode(base / "worker", servers["worker"].address, ["--address", head_address],
                                  ray_temp / "worker")
        started.append(nodes["worker"])

        driver = Driver(head_address)
        started.append(driver)
        holding = driver.expect("HOLDING")
        during = {name: server_view(s.address) for name, s in servers.items()}
        driver.proceed()
        driver.expect("RAN")
        # The big placement's server killed under it (SIGKILL: a crash, nothing saved at exit; SIGTERM restarts
        # are tested under Slurm and Kubernetes), then started on the same address and state directory once
        # its executors have gone with it.
        old = servers["worker"]
        old.kill()
        state = base / "worker" / "state"
        assert wait_until(lambda: not executors_of(state), timeout=15, interval=0.2), executors_of(state)
        servers["worker"] = SalusProcess(base / "worker" / "salus-server-2.stderr.log", server_args(base, "worker"),
                                         cwd=cwd, listen=old.address)
        started[started.index(old)] = servers["worker"]
        restarted = {"address": servers["worker"].address, **server_view(servers["worker"].address)}
        # Another engine's (or an admin's) reservation on the head, which Ray knows nothing of.
        other = ctl_json(servers["head"].address, "token", "issue", "--tenant", "elsewhere", "--memory",
                         f"{OTHER_MIB}MiB")
        try:
            driver.proceed()
            again = driver.expect("AGAIN")
            during_again = server_view(servers["worker"].address)
        finally:
            ctl(servers["head"].address, "token", "revoke", other["id"])
        driver.proceed()
        result = driver.expect("RESULT")
        assert driver.proc.wait(120) == 0, "".join(driver.stderr)[-4000:]
        after = {name: server_view(s.address) for name, s in servers.items()}
        yield {"servers": {name: s.address for name, s in servers.items()}, "holding": holding,
               "during": during, "restarted": restarted, "again": again, "during_again": during_again,
               "result": result, "after": after, "local": local_reference()}
    finally:
        for thing in reversed(started):
            if isinstance(thing, SalusProcess):
                code = thing.stop()
                assert code == 0, f"salus-server exited with {code}:\n{thing.stderr_tail()}"
            elif isinstance(thing, Driver):
                thing.kill()
            else:
                thing.stop()
        shutil.rmtree(cwd, ignore_errors=True)
        shutil.rmtree(ray_temp, ignore_errors=True)


def node_of(scenario, server_name: str) -> str:
    address = scenario["servers"][server_name]
    ids = [nid for nid, n in scenario["holding"]["nodes"].items() if n["server"] == address]
    assert len(ids) == 1, scenario["holding"]["nodes"]
    return ids[0]


def test_nodes_offer_their_servers_memory(scenario):
    nodes = scenario["holding"]["nodes"]
    assert sorted((n["server"], n["total_mib"]) for n in nodes.values()) == sorted(
        [(scenario["servers"]["head"], 1024), (scenario["servers"]["worker"], 2048)])


def test_trainings_are_placed_by_memory(scenario):
    placed, started = scenario["holding"]["placed"], scenario["holding"]["started"]
    for key, server_name, mib in (("big", "worker", 1536), ("small", "head", 768)):
        node = node_of(scenario, server_name)
        assert placed[key]["node_id"] == node and placed[key]["mib"] == mib, placed[key]
        assert placed[key]["server"] == scenario["servers"][server_name]
        # The actor ran there, with the server and token runtime_env set.
        assert started[key]["hold"] == "HOLD", started[key]
        assert started[key]["node_id"] == node and started[key]["server"] == scenario["servers"][server_name]
        assert started[key]["has_token"], started[key]
        assert placed[key]["env_keys"] == ["SALUS_JOB_NAME", "SALUS_SERVER", "SALUS_TOKEN"]


def test_each_trained_through_its_nodes_server_within_its_reservation(scenario):
    placed, during = scenario["holding"]["placed"], scenario["during"]
    for key, server_name, other in (("big", "worker", "head"), ("small", "head", "worker")):
        tenant = placed[key]["tenant"]
        mine = [j for j in during[server_name]["jobs"] if j["tenant"] == tenant]
        assert len(mine) == 1 and mine[0]["runs_completed"] > 0, during[server_name]["jobs"]
        assert not [j for j in during[other]["jobs"] if j["tenant"] == tenant], during[other]["jobs"]
        tokens = during[server_name]["tokens"]
        assert [(t["id"], t["tenant"], t["memory_bytes"]) for t in tokens] == [
            (placed[key]["token_id"], tenant, placed[key]["mib"] * MIB)], tokens
        assert during[server_name]["capacity"]["reserved_bytes"] == placed[key]["mib"] * MIB


def test_training_results_equal_a_local_run(scenario):
    for key, run in scenario["result"]["finished"].items():
        assert run["rc"] == 0, run["stderr"]
        remote = json.loads([line for line in run["stdout"].splitlines() if line.startswith("{")][-1])
        assert remote == scenario["local"], key


def test_no_room_names_the_largest_available(scenario):
    too_big = scenario["result"]["too_big"]
    assert "3072 MiB" in too_big and "largest available is 2048 MiB" in too_big, too_big
    assert scenario["servers"]["worker"] in too_big, too_big
    # Once both are placed (512 and 256 MiB left), 600 MiB fits nowhere: in Ray's accounting, or, while Ray's
    # view lags, the servers refuse the token (their reservations are the arbiter).
    third = scenario["result"]["third"]
    assert third and ("largest available is 512 MiB" in third or "refused the token" in third), third


def test_a_server_restart_keeps_the_placement_and_its_next_run_is_served(scenario):
    """The worker's server restarted (same address, same --state-dir) after the big placement's first run: before
    the next run it lists the placement's token and holds its reservation; the next run, in the same actor with the
    same SALUS_TOKEN, is served there as the placement's tenant and trains as a local run does."""
    big, restarted = scenario["holding"]["placed"]["big"], scenario["restarted"]
    assert restarted["address"] == scenario["servers"]["worker"] == big["server"]
    assert [(t["id"], t["tenant"], t["memory_bytes"]) for t in restarted["tokens"]] == [
        (big["token_id"], big["tenant"], big["mib"] * MIB)], restarted["tokens"]
    assert restarted["capacity"]["reserved_bytes"] == big["mib"] * MIB, restarted["capacity"]
    assert not [j for j in restarted["jobs"] if j["tenant"] == big["tenant"]], restarted["jobs"]

    started = scenario["again"]["started_again"]
    assert started["hold"] == "HOLD" and started["server"] == big["server"] and started["has_token"], started
    assert started["node_id"] == big["node_id"], started
    during = scenario["during_again"]
    mine = [j for j in during["jobs"] if j["tenant"] == big["tenant"]]
    assert len(mine) == 1 and mine[0]["runs_completed"] > 0, during["jobs"]
    assert [t["id"] for t in during["tokens"]] == [big["token_id"]], during["tokens"]
    assert during["capacity"]["reserved_bytes"] == big["mib"] * MIB, during["capacity"]
    run = scenario["result"]["finished_again"]
    assert run["rc"] == 0, run["stderr"]
    remote = json.loads([line for line in run["stdout"].splitlines() if line.startswith("{")][-1])
    assert remote == scenario["local"]


def test_memory_reserved_outside_ray_is_not_offered_to_a_placement(scenario):
    """Another tenant's token on the head's server (OTHER_MIB, issued with `ctl token issue` as Slurm's prolog or
    an admin does) leaves the head 56 MiB, while Ray's salus_mem_mib (fixed at `ray start`) still offers it 256:
    salus_nodes() shows both figures and counts the smaller, and a 128 MiB placement goes to the worker without
    asking the head for a token."""
    head, worker = scenario["servers"]["head"], scenario["servers"]["worker"]
    small = scenario["holding"]["placed"]["small"]
    seen = scenario["again"]["seen"]
    offered = int(CAPACITY["head"].removesuffix("GiB")) * 1024 - small["mib"]
    assert seen[head] == {"available_mib": offered - OTHER_MIB, "ray_available_mib": offered,
                          "server_unreserved_mib": offered - OTHER_MIB, "server_error": None}, seen
    assert seen[worker]["server_error"] is None and seen[worker]["available_mib"] >= 128, seen
    other = scenario["again"]["other"]
    assert other["server"] == worker, other
    assert other["node_id"] == node_of(scenario, "worker"), other
    assert other["refusals"] == [], other
    assert len(other["revoked"]) == 1, other


def test_release_revokes_tokens_and_reservations(scenario):
    result, after = scenario["result"], scenario["after"]
    for key, p in scenario["holding"]["placed"].items():
        assert [t["id"] for t in result["revoked"][key]] == [p["token_id"]], result["revoked"]
        assert result["released_again"][key] == []
    for name, view in after.items():
        assert view["tokens"] == [], view
        assert view["capacity"]["reserved_bytes"] == 0, view
        assert not [j for j in view["jobs"] if j["tenant"].startswith("ray-")], view["jobs"]
