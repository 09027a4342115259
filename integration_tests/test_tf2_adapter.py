"""The adapter's eager routing itself: hints of an eager job on the server, SALUS_EAGER=0, an unreachable
server, salus.connect_eager(), TensorFlow imported before salus.configure(), graph-only scripts, and the
ServerDef it builds (what travels in EagerService/CreateContext).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from conftest import WORKLOADS, last_json_line, venv_python
from test_python_adapter import (Held, closed_port, list_jobs, salus_cli, salus_package,  # noqa: F401
                                 sessions_created)
from tf2_common import SERVER_JOB, assert_devices, run_workload, salus_lines, tf2_env


def run_code(code: str, env: dict, check: bool = True):
    import subprocess
    proc = subprocess.run([venv_python(), "-c", code], capture_output=True, text=True, env=env, timeout=240,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        pytest.fail(f"exited with {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}")
    return proc


def test_eager_job_has_name_and_hints_on_server(channel, salus_address, salus_only):
    name = f"eager-{uuid.uuid4().hex[:8]}"
    env = tf2_env(SALUS_SERVER=salus_address, SALUS_JOB_NAME=name, SALUS_PRIORITY="-4",
                  SALUS_EXPECTED_ITERATIONS="12", SALUS_EXPECTED_SECONDS="2.5")
    held = Held([venv_python(), str(WORKLOADS / "tf2_eager_ops.py")], env)
    try:
        held.wait()
        found = [j for j in list_jobs(channel) if j["name"] == name]
        assert len(found) == 1, f"expected one job named {name!r} (the eager context); jobs: {list_jobs(channel)}"
        job = found[0]
        assert (job["priority"], job["expected_iterations"], job["expected_seconds"]) == (-4, 12, 2.5), job
        r = salus_cli("jobs", "--json", env=tf2_env(SALUS_SERVER=salus_address))
        assert r.returncode == 0, r.stderr
        [row] = [j for j in json.loads(r.stdout)["jobs"] if j["name"] == name]
        assert "kind" in row, (f"`salus jobs --json` has no 'kind' (admin JobInfo.kind not in the server or "
                               f"the CLI yet): {row}")
        assert row["kind"] == "eager", row
    except BaseException:
        held.kill()
        raise
    result = last_json_line(held.release())
    assert_devices(result, SERVER_JOB)
    deadline = time.monotonic() + 30  # the client closes its context at exit
    while any(j["name"] == name for j in list_jobs(channel)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [j for j in list_jobs(channel) if j["name"] == name], "the eager job outlived its client"


def test_salus_eager_0_keeps_eager_work_local_and_warns_once(salus_address):
    proc = run_workload("tf2_eager_ops.py", tf2_env(SALUS_SERVER=salus_address, SALUS_EAGER="0"))
    assert_devices(last_json_line(proc.stdout), "/job:localhost")
    warnings = salus_lines(proc.stderr)
    assert len(warnings) == 1, proc.stderr
    assert "SALUS_EAGER=0" in warnings[0] and "ran locally" in warnings[0] and salus_address in warnings[0]


def test_unreachable_server_fails_fast_with_a_clear_message():
    address = f"127.0.0.1:{closed_port()}"
    t0 = time.monotonic()
    proc = run_workload("tf2_eager_ops.py", tf2_env(SALUS_SERVER=address), check=False)
    assert proc.returncode != 0
    assert f"cannot reach salus-server at {address}" in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 60


EXPLICIT = """
import json, tensorflow as tf, salus
before = tf.constant(1.0)            # initializes the context locally first
salus.{call}
v = tf.Variable([1.0, 2.0])
x = tf.constant([3.0, 4.0])
print(json.dumps({{"before": before.device, "devices": sorted({{v.device, x.device, (v * x).device}}),
                  "value": (v * x).numpy().tolist(), "stats": salus._patch.stats()}}))
"""


@pytest.mark.parametrize("call", ["connect_eager(server={addr!r}, name='explicit-eager', priority=3)",
                                  "configure(server={addr!r}, name='configured-eager')"])
def test_explicit_connect_after_tensorflow_is_in_use(call, salus_address):
    code = EXPLICIT.format(call=call.format(addr=salus_address))
    proc = run_code(code, tf2_env())
    result = last_json_line(proc.stdout)
    assert result["before"].startswith("/job:localhost"), result
    assert_devices(result, SERVER_JOB)
    assert result["value"] == [3.0, 8.0]
    assert result["stats"]["eager"] == "connected", result
    assert not salus_lines(proc.stderr), proc.stderr


def test_graph_only_script_opens_no_eager_context(salus_address, channel, is_salus):
    code = ("import json, tensorflow.compat.v1 as tf; tf.disable_v2_behavior()\n"
            "x = tf.placeholder(tf.float32); y = x * 2\n"
            "with tf.Session() as s: r = s.run(y, {x: 3.0})\n"
            "import salus._patch as p; print(json.dumps({'r': float(r), 'stats': p.stats()}))")
    before = sessions_created(channel) if is_salus else None
    proc = run_code(code, tf2_env(SALUS_SERVER=salus_address))
    result = last_json_line(proc.stdout)
    assert result["r"] == 6.0
    assert result["stats"]["eager"] in ("pending", "graph"), result  # never connected
    assert result["stats"]["server_sessions"] == 1
    assert not salus_lines(proc.stderr), proc.stderr
    if is_salus:
        assert sessions_created(channel) - before == 1


def test_server_def_is_connect_to_cluster_s_with_hints():
    from tensorflow.core.protobuf import config_pb2

    from salus import _config, _eager
    settings = _config.validated(server="10.0.0.1:5501", name="job", priority="3", iterations="100",
                                 seconds="2.5")
    base = config_pb2.ConfigProto(intra_op_parallelism_threads=2)
    sd = _eager.build_server_def(settings, base)
    assert sd.job_name == "localhost" and sd.task_index == 0 and sd.protocol == "grpc"
    jobs = {j.name: dict(j.tasks) for j in sd.cluster.job}
    assert set(jobs) == {"worker", "localhost"} and jobs["worker"] == {0: "10.0.0.1:5501"}
    assert jobs["localhost"][0].startswith("localhost:")
    cfg = sd.default_session_config
    assert cfg.experimental.session_metadata.name == "job?priority=3&iterations=100&seconds=2.5"
    assert cfg.experimental.session_metadata.version > 0
    assert cfg.experimental.collective_group_leader == "/job:worker/replica:0/task:0"
    assert cfg.intra_op_parallelism_threads == 2
    assert not base.HasField("experimental")  # the context's config object is not modified


def test_default_device_is_the_servers_first_gpu_when_it_has_one(monkeypatch):
    """The adapter asks the server's GetStatus; a GPU server gets new ops on its GPU:0 (no GPU here, so a
    stand-in answers GetStatus), a CPU-only or unreachable one on CPU:0, SALUS_EAGER_DEVICE overrides."""
    from concurrent import futures

    import grpc
    from salus import _eager, _proto  # noqa: F401

    def attrs(name, kind):
        body = b"\x0a" + bytes([len(name)]) + name.encode() + b"\x12" + bytes([len(kind)]) + kind.encode()
        return b"\x0a" + bytes([len(body)]) + body

    answer = attrs("/job:localhost/replica:0/task:0/device:CPU:0", "CPU") + \
        attrs("/job:localhost/replica:0/task:0/device:GPU:0", "GPU")

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            if details.method == "/tensorflow.WorkerService/GetStatus":
                return grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer)
            return None

    server = grpc.server(futures.ThreadPoolExecutor(2), handlers=[Handler()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        monkeypatch.delenv("SALUS_EAGER_DEVICE", raising=False)
        assert _eager.server_device(f"127.0.0.1:{port}") == "/job:worker/replica:0/task:0/device:GPU:0"
        assert _eager.server_device(f"127.0.0.1:{closed_port()}") == "/job:worker/replica:0/task:0/device:CPU:0"
        monkeypatch.setenv("SALUS_EAGER_DEVICE", "cpu:0")
        assert _eager.server_device(f"127.0.0.1:{port}") == "/job:worker/replica:0/task:0/device:CPU:0"
    finally:
        server.stop(0)
