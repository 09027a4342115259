"""salus-device-plugin against a stand-in kubelet that speaks the kubelet's device-plugin protocol
(deviceplugin/v1beta1, generated here from k8s/proto with grpc_tools): a Registration server on kubelet.sock
that takes the plugin's registration, then calls the plugin on its socket as the kubelet does
(GetDevicePluginOptions, ListAndWatch, GetPreferredAllocation, Allocate). No real kubelet or Kubernetes
scheduler can run here (see deploy/k8s/README.md).

Checked: registration (version, resource, socket); the real server's 2 GiB advertised as 8 units of 256 MiB,
healthy, unhealthy while the server is down and healthy again when it is back; Allocate returns SALUS_SERVER
and SALUS_TOKEN whose token reserves the units on the server, and an unmodified Keras 3 script trains with them
through the server with the numbers it gets in-process; devices allocated again release their old token; a
token whose job never came (after 25 s), and one whose jobs ended (after 2 s), are released; the plugin registers again when kubelet.sock
is recreated (a kubelet restart); unknown devices and reservations beyond the server are refused with the
server's reason. Costs about 30 s: two TensorFlow processes (the script in-process and through the server),
one server restart, a few seconds of the plugin's release timers.

Also checked (issue 40; about 11 s more, two extra servers and plugins, and ~10 s for a restart and one more
TensorFlow process): a pod's allocation made before a server crash and restart (SIGKILL; the same address and
state directory) trains after it with its reservation held, and is released when its job ends; units another tenant's token
reserves are advertised unhealthy (not allocatable) until it is revoked; a grpc-python client with default
channel options (its `:authority` is the socket's path) reaches the plugin; a 2 s job that no poll saw open
has its reservation released --release-after after the next poll; a plugin started before its server
adopts the earlier run's tokens once the server answers.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

import salus_wire as wire
from conftest import REPO, SalusProcess, executors_of, last_json_line, venv_python, wait_until
from server_ctl import ctl, ctl_json
from test_python_adapter import salus_package  # noqa: F401  (module fixture: python/ installed)
from tf2_common import SERVER_JOB, assert_devices, assert_same_numbers, run_workload, tf2_env

PROTO_DIR = REPO / "k8s" / "proto"
UNIT_MIB = 256
SERVER_ARGS = ("--memory-capacity", "2GiB")
RESOURCE = "salus.io/gpu-mem"


def plugin_bin() -> Path:
    return Path(os.environ.get("SALUS_DEVICE_PLUGIN_BIN", REPO / "target" / "release" / "salus-device-plugin"))


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The generated v1beta1 messages and stubs."""
    out = tmp_path_factory.mktemp("deviceplugin-api")
    subprocess.run([venv_python(), "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}",
                    f"--grpc_python_out={out}", "deviceplugin/v1beta1/api.proto"], check=True, timeout=60)
    sys.path.insert(0, str(out))
    from deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
    return api_pb2, api_pb2_grpc


class StandInKubelet:
    """The kubelet's Registration service on DIR/kubelet.sock; each registration lands in `registrations`."""

    def __init__(self, api, directory: Path):
        pb, rpc = api
        self.pb, self.rpc = pb, rpc
        self.directory = directory
        self.registrations: queue.Queue = queue.Queue()
        self.server = None
        self.start()

    def start(self) -> None:
        pb, rpc, registrations = self.pb, self.rpc, self.registrations

        class Registration(rpc.RegistrationServicer):
            def Register(self, request, context):
                registrations.put(request)
                return pb.Empty()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        rpc.add_RegistrationServicer_to_server(Registration(), self.server)
        self.server.add_insecure_port(f"unix://{self.directory / 'kubelet.sock'}")
        self.server.start()

    def restart(self) -> None:
        """As a kubelet restart looks to plugins: kubelet.sock goes away and comes back, a new file."""
        self.server.stop(0).wait()
        (self.directory / "kubelet.sock").unlink(missing_ok=True)
        self.start()

    def registered(self, timeout: float = 30):
        return self.registrations.get(timeout=timeout)

    def plugin(self, endpoint: str):
        # As the kubelet dials plugins: authority "localhost" (a socket path is no valid HTTP/2 authority).
        channel = grpc.insecure_channel(f"unix://{self.directory / endpoint}",
                                        options=[("grpc.default_authority", "localhost")])
        return self.rpc.DevicePluginStub(channel)

    def stop(self) -> None:
        self.server.stop(0)


def start_plugin(server_address: str, plugins: Path, log_path: Path, *flags: str) -> tuple[subprocess.Popen, object]:
    binary = plugin_bin()
    if not binary.exists():
        pytest.fail(f"{binary} is missing: build it (cargo build --release -p salus-k8s)")
    log = open(log_path, "wb")
    plugin = subprocess.Popen([str(binary), "--server", server_address, "--plugin-dir", str(plugins),
                               "--unit-mib", str(UNIT_MIB), *flags], stderr=log, stdout=log,
                              stdin=subprocess.DEVNULL)
    return plugin, log


def stop_plugin(plugin: subprocess.Popen, log) -> None:
    if plugin.poll() is None:
        plugin.send_signal(signal.SIGTERM)
        try:
            plugin.wait(10)
        except subprocess.TimeoutExpired:
            plugin.kill()
            plugin.wait(10)
    log.close()


@pytest.fixture(scope="module")
def node(api, tmp_path_factory):
    """A salus-server (2 GiB), the plugin, and the stand-in kubelet."""
    directory = tmp_path_factory.mktemp("k8s")
    plugins = directory / "device-plugins"
    plugins.mkdir()
    server = SalusProcess(directory / "salus-server.stderr.log",
                          SERVER_ARGS + ("--state-dir", str(directory / "state")))
    kubelet = StandInKubelet(api, plugins)
    plugin, log = start_plugin(server.address, plugins, directory / "plugin.stderr.log", "--poll", "0.3",
                               "--release-after", "2", "--unused-timeout", "25")
    state = {"server": server, "kubelet": kubelet, "plugin": plugin, "log": directory / "plugin.stderr.log",
             "dir": directory, "plugins": plugins, "starts": 1}
    try:
        yield state
    finally:
        stop_plugin(plugin, log)
        kubelet.stop()
        state["server"].kill()


@contextlib.contextmanager
def another_node(api, directory: Path, *plugin_flags: str, server_address: str | None = None):
    """A node of its own (server, stand-in kubelet, plugin), for a plugin with other flags than the module's
    (or one that would adopt the module plugin's tokens); `server_address`: where the plugin dials instead of
    the caller's server instead of one of its own (through a relay that is not up yet)."""
    directory.mkdir(parents=True)
    # The sockets' directory (a kubelet's /var/lib/kubelet/device-plugins): short, as a test's tmp_path may not be
    # (an AF_UNIX path holds 107 bytes).
    plugins = Path(tempfile.mkdtemp(prefix="salus-dp-"))
    server = None if server_address else SalusProcess(directory / "salus-server.stderr.log",
                                                      ("--memory-capacity", "2GiB"))
    kubelet = StandInKubelet(api, plugins)
    plugin, log = start_plugin(server_address or server.address, plugins, directory / "plugin.stderr.log",
                               *plugin_flags)
    state = {"server": server, "kubelet": kubelet, "plugin": plugin, "log": directory / "plugin.stderr.log",
             "dir": directory}
    try:
        yield state
    finally:
        stop_plugin(plugin, log)
        kubelet.stop()
        if server:
            server.kill()
        shutil.rmtree(plugins, ignore_errors=True)


def plugin_log(node) -> str:
    return node["log"].read_text(errors="replace")[-4000:]


def devices_stream(node):
    stub = node["kubelet"].plugin(node["endpoint"])
    return stub, stub.ListAndWatch(node["kubelet"].pb.Empty(), timeout=120)


def next_devices(stream, want, timeout: float = 30):
    """Reads ListAndWatch until `want(devices)` holds (the plugin sends the list on every change)."""
    deadline = time.time() + timeout
    for response in stream:
        if want(response.devices):
            return response.devices
        if time.time() > deadline:
            break
    pytest.fail("ListAndWatch never sent the expected devices")


def allocate(node, ids):
    pb = node["kubelet"].pb
    stub = node["kubelet"].plugin(node["endpoint"])
    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
    return stub.Allocate(request, timeout=30).container_responses[0]


def reserved_lines(address: str) -> list[str]:
    return [line for line in ctl(address, "jobs").stdout.splitlines() if line.startswith("reserved for")]


def test_registers_and_advertises_the_servers_memory(node):
    reg = node["kubelet"].registered()
    assert (reg.version, reg.resource_name) == ("v1beta1", RESOURCE), reg
    assert reg.endpoint == "salus-gpu-mem.sock" and reg.options.get_preferred_allocation_available, reg
    node["endpoint"] = reg.endpoint
    stub, stream = devices_stream(node)
    devices = next_devices(stream, lambda d: len(d) > 0)
    assert len(devices) == 2048 // UNIT_MIB and {d.health for d in devices} == {"Healthy"}, devices
    assert devices[0].ID == "salus-mem-0"
    stream.cancel()
    pb = node["kubelet"].pb
    options = stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
    assert not options.pre_start_required
    preferred = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=["salus-mem-3", "salus-mem-4", "salus-mem-5"],
                                               must_include_deviceIDs=["salus-mem-5"], allocation_size=2)]),
        timeout=10)
    assert list(preferred.container_responses[0].deviceIDs) == ["salus-mem-5", "salus-mem-3"]


def token_ids(address: str) -> list[str]:
    return [t["id"] for t in ctl_json(address, "token", "list")]


def test_an_allocation_trains_through_its_token_and_is_released_when_its_job_ends(node):
    address = node["server"].address
    # Never used by any job: released after --unused-timeout, while the rest of this test runs.
    unused = allocate(node, ["salus-mem-7"]).annotations["salus.io/token-id"]
    local = last_json_line(run_workload("tf2_keras3.py", tf2_env()).stdout)

    reply = allocate(node, ["salus-mem-0", "salus-mem-1"])
    env = dict(reply.envs)
    assert env["SALUS_SERVER"] == address and env["SALUS_RESERVED_MIB"] == str(2 * UNIT_MIB), env
    tenant = reply.annotations["salus.io/tenant"]
    assert any(line.startswith(f"reserved for {tenant}: 512 MiB") for line in reserved_lines(address))
    remote = last_json_line(run_workload("tf2_keras3.py", tf2_env(SALUS_SERVER=env["SALUS_SERVER"],
                                                                  SALUS_TOKEN=env["SALUS_TOKEN"])).stdout)
    assert_devices(remote, SERVER_JOB)
    assert_same_numbers(local, remote)
    stats = ctl_json(address, "stats")
    assert any(t["tenant"] == tenant and t["device_s"] > 0 for t in stats["tenants"]), stats["tenants"]
    # Its job ended (the script exited; the server closes its context): released after --release-after.
    token = reply.annotations["salus.io/token-id"]
    assert wait_until(lambda: token not in token_ids(address), timeout=60, interval=0.3), plugin_log(node)
    assert not any(line.startswith(f"reserved for {tenant}") for line in reserved_lines(address))
    assert wait_until(lambda: unused not in token_ids(address), timeout=60, interval=0.3), plugin_log(node)
    assert not reserved_lines(address)


def test_devices_allocated_again_release_the_old_token(node):
    address = node["server"].address
    first = allocate(node, ["salus-mem-2", "salus-mem-3"]).annotations["salus.io/token-id"]
    second = allocate(node, ["salus-mem-3", "salus-mem-4"]).annotations["salus.io/token-id"]
    ids = token_ids(address)
    assert first not in ids and second in ids, ids
    allocate(node, ["salus-mem-4"])  # and the second goes the same way
    assert second not in token_ids(address)


def test_refusals_carry_the_reason(node):
    address = node["server"].address
    with pytest.raises(grpc.RpcError) as unknown:
        allocate(node, ["salus-mem-99"])
    assert unknown.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown device" in unknown.value.details()
    # Someone else (an admin, a Slurm prolog) reserved 1 GiB: all 8 units cannot be reserved too.
    other = ctl_json(address, "token", "issue", "--tenant", "elsewhere", "--memory", "1GiB")
    try:
        with pytest.raises(grpc.RpcError) as over:
            allocate(node, [f"salus-mem-{i}" for i in range(8)])
        assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, over.value.details()
        assert "cannot reserve" in over.value.details(), over.value.details()
    finally:
        ctl(address, "token", "revoke", other["id"])


def start_again(node, address: str) -> None:
    """A new server on `address` and the node's state directory, each start with a log of its own."""
    node["starts"] += 1
    node["server"] = SalusProcess(node["dir"] / f"salus-server-{node['starts']}.stderr.log",
                                  SERVER_ARGS + ("--state-dir", str(node["dir"] / "state")), listen=address)


def crash_and_restart_server(node) -> None:
    """SIGKILL (a crash: nothing saved at exit), then, once its executors have gone with it, a new server on the
    same address and state directory. (SIGTERM restarts: the health test here, and test_slurm.)"""
    address = node["server"].address
    node["server"].kill()
    state = node["dir"] / "state"
    assert wait_until(lambda: not executors_of(state), timeout=15, interval=0.2), executors_of(state)
    start_again(node, address)


def test_health_follows_the_server_and_the_plugin_registers_again_after_a_kubelet_restart(node):
    _, stream = devices_stream(node)
    next_devices(stream, lambda d: d and all(x.health == "Healthy" for x in d))
    address = node["server"].address
    assert node["server"].stop() == 0
    next_devices(stream, lambda d: d and all(x.health == "Unhealthy" for x in d))
    start_again(node, address)
    next_devices(stream, lambda d: len(d) == 8 and all(x.health == "Healthy" for x in d))
    stream.cancel()

    node["kubelet"].restart()
    again = node["kubelet"].registered()
    assert again.resource_name == RESOURCE
    _, stream = devices_stream(node)
    assert len(next_devices(stream, lambda d: len(d) > 0)) == 8
    stream.cancel()
    assert node["plugin"].poll() is None, plugin_log(node)


def test_an_allocation_made_before_a_server_restart_trains_after_it(node):
    """The kubelet keeps a pod's Allocate answer (its SALUS_TOKEN) across container restarts; a server restart,
    even after a crash (SIGKILL), must not void it: the token and its reservation come back from the state
    directory before any job, and the pod's next run trains through the new server with its reservation."""
    reply = allocate(node, ["salus-mem-5", "salus-mem-6"])
    env, tenant = dict(reply.envs), reply.annotations["salus.io/tenant"]
    token = reply.annotations["salus.io/token-id"]
    crash_and_restart_server(node)
    address = node["server"].address
    assert token in token_ids(address), plugin_log(node)
    assert any(line.startswith(f"reserved for {tenant}: 512 MiB") for line in reserved_lines(address))
    remote = last_json_line(run_workload("tf2_keras3.py", tf2_env(SALUS_SERVER=env["SALUS_SERVER"],
                                                                  SALUS_TOKEN=env["SALUS_TOKEN"])).stdout)
    assert_devices(remote, SERVER_JOB)
    stats = ctl_json(address, "stats")
    assert any(t["tenant"] == tenant and t["device_s"] > 0 for t in stats["tenants"]), stats["tenants"]
    # The plugin saw the job end on the new server: released after --release-after, as before a restart.
    assert wait_until(lambda: token not in token_ids(address), timeout=60, interval=0.3), plugin_log(node)
    assert not any(line.startswith(f"reserved for {tenant}") for line in reserved_lines(address))


def healthy_ids(devices) -> list[str]:
    return [d.ID for d in devices if d.health == "Healthy"]


def test_units_another_tenant_reserved_are_not_advertised_free(node):
    """A token issued outside Kubernetes (Slurm, Ray, an admin) reserves memory: its units are advertised
    unhealthy, so the kubelet counts them out of the node's allocatable, and healthy again when it is gone.
    The units the plugin's own pods hold stay healthy (the kubelet counts those itself)."""
    address = node["server"].address
    _, stream = devices_stream(node)
    next_devices(stream, lambda d: len(healthy_ids(d)) == 8)
    ours = allocate(node, ["salus-mem-0", "salus-mem-1"]).annotations["salus.io/token-id"]
    other = ctl_json(address, "token", "issue", "--tenant", "slurm-job-7", "--memory", "1GiB")
    try:
        devices = next_devices(stream, lambda d: len(healthy_ids(d)) == 4)
        assert len(devices) == 8, devices  # the IDs stay: capacity 8, allocatable 4
        assert {"salus-mem-0", "salus-mem-1"} <= set(healthy_ids(devices)), devices
        # A part of a unit is a whole unit taken.
        more = ctl_json(address, "token", "issue", "--tenant", "ray-actor", "--memory", "1MiB")
        next_devices(stream, lambda d: len(healthy_ids(d)) == 3)
        ctl(address, "token", "revoke", more["id"])
    finally:
        ctl(address, "token", "revoke", other["id"])
    next_devices(stream, lambda d: len(healthy_ids(d)) == 8)
    stream.cancel()
    ctl(address, "token", "revoke", ours)


def test_a_grpc_python_client_with_default_options_reaches_the_plugin(node):
    """grpc-python sends the socket's path as `:authority`, which the HTTP/2 layer would refuse."""
    pb, rpc = node["kubelet"].pb, node["kubelet"].rpc
    with grpc.insecure_channel(f"unix://{node['plugins'] / node['endpoint']}") as channel:
        stub = rpc.DevicePluginStub(channel)
        assert not stub.GetDevicePluginOptions(pb.Empty(), timeout=10).pre_start_required
        stream = stub.ListAndWatch(pb.Empty(), timeout=30)
        assert len(next(stream).devices) == 8
        stream.cancel()


def token_channel(address: str, token: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[("grpc.primary_user_agent", f"salus1.{token}")])


class LateRelay:
    """A TCP relay to `target` on a port of its own that accepts nothing until `start()` (and after `pause()`):
    to the plugin, a server that is not up (the server itself is up all along)."""

    def __init__(self, target: str):
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()  # refused until start() listens on it
        self.listener = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def pause(self) -> None:
        """New connections are refused again (the plugin opens one per poll); start() resumes."""
        self.stop()

    def _accept(self) -> None:
        host, port = self.target.rsplit(":", 1)
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((host, int(port)))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        if self.listener:
            # shutdown first: a close alone leaves the port listening while accept() blocks on it.
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)
            self.listener.close()


def test_a_plugin_started_before_its_server_adopts_the_earlier_runs_tokens(api, tmp_path):
    """Adoption is tried again (backing off) until the server answers, then the adopted token is managed:
    no job ever came, so it is released after --unused-timeout."""
    relay = None
    try:
        with contextlib.ExitStack() as stack:
            server = SalusProcess(tmp_path / "earlier-server.stderr.log", ("--memory-capacity", "2GiB"))
            stack.callback(server.kill)
            earlier = ctl_json(server.address, "token", "issue", "--tenant", "k8s-earlier0run", "--memory",
                               "256MiB")
            relay = LateRelay(server.address)
            n = stack.enter_context(another_node(api, tmp_path / "node", "--poll", "0.3", "--unused-timeout",
                                                 "2", server_address=relay.address))
            log = n["log"]
            assert wait_until(lambda: "cannot adopt the tokens of an earlier run yet" in log.read_text(),
                              timeout=20, interval=0.1), plugin_log(n)
            relay.start()
            assert wait_until(lambda: "adopted the tokens of an earlier run" in log.read_text(), timeout=20,
                              interval=0.1), plugin_log(n)
            assert wait_until(lambda: earlier["id"] not in token_ids(server.address), timeout=20,
                              interval=0.2), plugin_log(n)
            assert "no job of it reached the server in time" in plugin_log(n)
    finally:
        if relay:
            relay.stop()


def test_a_job_shorter_than_the_poll_releases_its_reservation_after_release_after(api, tmp_path):
    """A 2 s job that no poll (every 3 s) sees open: the server counts the jobs each reservation's tenant
    started, so the plugin learns the job came and went and releases its token --release-after (2 s) after
    the poll that saw the count, not after --unused-timeout (120 s). That no poll sees it open is made sure,
    not left to chance: the plugin's way to the server is cut while the job runs."""
    poll, release_after = 3, 2  # whole seconds: --release-after takes an integer
    relay = None
    try:
        with contextlib.ExitStack() as stack:
            server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--memory-capacity", "2GiB"))
            stack.callback(server.kill)
            relay = LateRelay(server.address)
            relay.start()
            n = stack.enter_context(another_node(api, tmp_path / "node", "--poll", str(poll), "--release-after",
                                                 str(release_after), "--unused-timeout", "120",
                                                 server_address=relay.address))
            n["endpoint"] = n["kubelet"].registered().endpoint
            reply = allocate(n, ["salus-mem-0"])
            token_id = reply.annotations["salus.io/token-id"]
            relay.pause()
            with token_channel(server.address, reply.envs["SALUS_TOKEN"]) as channel:
                request = wire.create_session_request(b"")
                handle = wire.first(wire.call(channel, "CreateSession", request), 1).decode()
                time.sleep(2)  # the job's length (what is tested), not a wait for something
                wire.call(channel, "CloseSession", wire.close_session_request(handle))
            relay.start()
            back = time.monotonic()
            assert wait_until(lambda: token_id not in token_ids(server.address),
                              timeout=poll + release_after + poll + 5, interval=0.2), plugin_log(n)
            # Released at the first poll --release-after past the one that saw the count go up.
            took = time.monotonic() - back
            assert took <= poll + release_after + poll + 1, (took, plugin_log(n))
            assert "releasing a reservation: its jobs ended" in plugin_log(n)
    finally:
        if relay:
            relay.stop()
