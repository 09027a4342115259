"""salus-tf, the Python adapter (python/): unmodified scripts on the server via SALUS_SERVER, the explicit API
and the `salus` CLI, against the real server.

What a script did is checked on the server (admin API, decoded here with salus_wire, independently of the
package's own client): sessions created, and jobs with the expected name and hints while the script holds its
session open. Scripts under workloads/ do not import salus (except explicit_api.py); they print "HOLD" and
wait for a line on stdin when WORKLOAD_HOLD=1. Also: the package's admin client is the one generated from
admin.proto, and `salus timeline` (JSON, summary, PNG) shows a graph and an eager job on their lane.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

import salus_wire as wire
from conftest import REPO, WORKLOADS, child_env, last_json_line, venv_python

PACKAGE = REPO / "python"
ADMIN = "/salus.v1.Admin/"
JOB_JSON_KEYS = {"id", "handle", "name", "state", "lane", "policy", "iterations", "attained_s", "service_s",
                 "mean_iteration_ms", "queue_wait_s", "queued", "priority", "expected_iterations", "expected_seconds",
                 "note", "graph_version", "graph_nodes", "runs_completed", "runs_failed", "age_s", "idle_s"}
TF_TIMEOUT = 180
# matplotlib for `salus timeline --png`, outside the venv (scripts/setup.sh: Keras imports it with TensorFlow).
PLOT_PACKAGES = REPO / ".venv-plot"


# --- the package in the venv ---------------------------------------------------------------------------

def _installed_is_current(env: dict) -> bool:
    probe = ("import os, sysconfig, salus; print(os.path.dirname(salus.__file__)); "
             "print(sysconfig.get_paths()['purelib'])")
    proc = subprocess.run([venv_python(), "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    if proc.returncode != 0:
        return False
    pkg_dir, purelib = (Path(p) for p in proc.stdout.split())
    sources = sorted((PACKAGE / "src" / "salus").glob("*.py"))
    return (all((pkg_dir / s.name).is_file() and (pkg_dir / s.name).read_bytes() == s.read_bytes()
                for s in sources)
            and (purelib / "salus_tf.pth").is_file()
            and (purelib / "salus_tf.pth").read_bytes() == (PACKAGE / "salus_tf.pth").read_bytes()
            and _generated_client_matches_proto(env) == "same")


# Compiles admin.proto with the venv's grpcio-tools and compares it with the descriptor the installed
# salus.v1.admin_pb2 was generated from (json_name and source info are not in generated code).
_COMPARE_DESCRIPTORS = """
import os, sys, tempfile
from grpc_tools import protoc
from google.protobuf import descriptor_pb2
from salus.v1 import admin_pb2

def normalized(file):
    file.ClearField("source_code_info")
    stack = list(file.message_type)
    while stack:
        message = stack.pop()
        stack.extend(message.nested_type)
        for field in message.field:
            field.ClearField("json_name")
    return file

with tempfile.TemporaryDirectory() as d:
    out = os.path.join(d, "admin.desc")
    if protoc.main(["protoc", "-I" + sys.argv[1], "--descriptor_set_out=" + out, "salus/v1/admin.proto"]) != 0:
        sys.exit("protoc failed")
    compiled = descriptor_pb2.FileDescriptorSet.FromString(open(out, "rb").read()).file[0]
installed = descriptor_pb2.FileDescriptorProto.FromString(admin_pb2.DESCRIPTOR.serialized_pb)
print("same" if normalized(compiled) == normalized(installed) else "differs")
"""


def _generated_client_matches_proto(env: dict) -> str:
    proc = subprocess.run([venv_python(), "-c", _COMPARE_DESCRIPTORS, str(REPO / "proto" / "proto")],
                          capture_output=True, text=True, env=env, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else f"error: {proc.stderr[-2000:]}"


@pytest.fixture(scope="module", autouse=True)
def salus_package():
    """python/ installed in the venv (scripts/setup.sh does it; this also catches a stale install)."""
    env = clean_env()
    if not _installed_is_current(env):
        proc = subprocess.run([venv_python(), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                               "--force-reinstall", "--no-deps", str(PACKAGE)],
                              capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0 or not _installed_is_current(env):
            pytest.fail(f"cannot install {PACKAGE} into the venv:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def clean_env(**extra: str) -> dict:
    """child_env without any SALUS_* variable of the caller's environment."""
    env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_")}
    env.update(extra)
    return env


def salus_cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The installed console script."""
    exe = Path(venv_python()).parent / "salus"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env or clean_env(),
                          timeout=timeout, stdin=subprocess.DEVNULL)


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# --- the admin API, decoded independently of the package ------------------------------------------------

def _double(v) -> float:
    return struct.unpack("<d", struct.pack("<Q", v))[0] if v else 0.0


def _int32(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def server_info(channel) -> dict:
    raw = wire.call(channel, ADMIN + "GetServerInfo", b"")
    return {"open_sessions": wire.first(raw, 4, 0), "sessions_created": wire.first(raw, 5, 0),
            "policy": wire.first(raw, 8, b"").decode()}


def list_jobs(channel) -> list[dict]:
    jobs = []
    for j in wire.fields(wire.call(channel, ADMIN + "ListJobs", b""), 1):
        hints = wire.first(j, 12, b"")
        jobs.append({"id": wire.first(j, 1, 0), "name": wire.first(j, 3, b"").decode(),
                     "state": wire.first(j, 4, b"").decode(), "graph_nodes": wire.first(j, 15, 0),
                     "runs_completed": wire.first(j, 16, 0), "priority": _int32(wire.first(hints, 1, 0)),
                     "expected_iterations": wire.first(hints, 2, 0),
                     "expected_seconds": _double(wire.first(hints, 3, 0))})
    return jobs


def sessions_created(channel) -> int:
    return server_info(channel)["sessions_created"]


def jobs_named(channel, name: str) -> list[dict]:
    return [j for j in list_jobs(channel) if j["name"] == name]


def one_job(channel, name: str) -> dict:
    jobs = list_jobs(channel)
    found = [j for j in jobs if j["name"] == name]
    assert len(found) == 1, f"expected one job named {name!r} on the server; its jobs: {jobs}"
    return found[0]


# --- scripts -----------------------------------------------------------------------------------------------

def run_script(script: str, env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([venv_python(), str(WORKLOADS / script), *args], capture_output=True, text=True,
                          env=env, timeout=TF_TIMEOUT, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        pytest.fail(f"{script} exited with {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                    f"stderr:\n{proc.stderr[-5000:]}")
    return proc


class Held:
    """A script started with WORKLOAD_HOLD=1: wait() until it prints HOLD, release() to let it finish."""

    def __init__(self, argv: list[str], env: dict):
        env = dict(env, WORKLOAD_HOLD="1")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.out: list[str] = []
        self.err: list[str] = []
        self.holding = threading.Event()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.out, True), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err, False), daemon=True).start()

    def _read(self, stream, sink, watch):
        for line in stream:
            sink.append(line)
            if watch and line.strip() == "HOLD":
                self.holding.set()
        if watch:
            self.holding.set()

    def wait(self, timeout: float = TF_TIMEOUT) -> None:
        if not self.holding.wait(timeout) or self.proc.poll() is not None:
            self.kill()
            pytest.fail(f"script did not reach HOLD (exit {self.proc.poll()}):\n{''.join(self.out)[-2000:]}\n"
                        f"{''.join(self.err)[-5000:]}")

    def release(self, timeout: float = TF_TIMEOUT) -> str:
        self.proc.stdin.write("\n")
        self.proc.stdin.close()
        code = self.proc.wait(timeout)
        time.sleep(0.05)  # readers drain the pipes
        if code != 0:
            pytest.fail(f"script exited with {code}:\n{''.join(self.out)[-2000:]}\n{''.join(self.err)[-5000:]}")
        return "".join(self.out)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# --- tests -------------------------------------------------------------------------------------------------

def test_startup_hook_imports_nothing_without_salus_server():
    pth = Path(subprocess.run([venv_python(), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()) / "salus_tf.pth"
    assert pth.is_file(), f"{pth} is missing: the startup hook is not installed"
    probe = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] == 'salus'), "
             "'grpc' in sys.modules, 'tensorflow' in sys.modules)")
    unset = subprocess.run([venv_python(), "-X", "importtime", "-c", probe], capture_output=True, text=True,
                           env=clean_env(), check=True)
    assert unset.stdout.strip() == "[] False False"
    assert "salus" not in unset.stderr  # -X importtime lists every module imported at startup
    # Set: the hook is armed (a few small modules), still neither gRPC nor TensorFlow.
    armed = subprocess.run([venv_python(), "-c", probe], capture_output=True, text=True,
                           env=clean_env(SALUS_SERVER="127.0.0.1:1"), check=True)
    assert armed.stdout.strip() == "['salus', 'salus._config', 'salus._hook', 'salus._log'] False False"
    assert armed.stderr == ""


def test_unmodified_tf1_script_runs_on_server_with_hints(channel, salus_address, salus_only):
    # Unset: in-process, nothing reaches the server.
    before = sessions_created(channel)
    local = last_json_line(run_script("plain_tf1.py", clean_env()).stdout)
    assert sessions_created(channel) == before
    assert local["salus_loaded"] is False
    assert local["losses"][-1] < local["losses"][0]

    name = f"tf1-{uuid.uuid4().hex[:8]}"
    env = clean_env(SALUS_SERVER=salus_address, SALUS_JOB_NAME=name, SALUS_PRIORITY="-7",
                    SALUS_EXPECTED_ITERATIONS="20", SALUS_EXPECTED_SECONDS="1.5")
    before = sessions_created(channel)
    held = Held([venv_python(), str(WORKLOADS / "plain_tf1.py")], env)
    try:
        held.wait()
        # The script's tf.Session is a job on the server, with its hints.
        job = one_job(channel, name)
        assert (job["priority"], job["expected_iterations"], job["expected_seconds"]) == (-7, 20, 1.5)
        assert job["runs_completed"] >= 15 and job["graph_nodes"] > 0

        # The CLI sees it too: jobs --json (ctl's keys), the table, stats, and top (two frames).
        cli_env = clean_env(SALUS_SERVER=salus_address)
        r = salus_cli("jobs", "--json", env=cli_env)
        assert r.returncode == 0, r.stderr
        [cj] = [j for j in json.loads(r.stdout)["jobs"] if j["name"] == name]
        assert JOB_JSON_KEYS <= set(cj)  # ctl's keys (newer servers add variable_bytes, variables, ...)
        assert (cj["id"], cj["priority"], cj["expected_iterations"], cj["expected_seconds"]) == \
            (job["id"], -7, 20, 1.5)
        r = salus_cli("jobs", env=cli_env)
        assert r.returncode == 0 and r.stdout.split()[:3] == ["ID", "KIND", "NAME"] and name in r.stdout, r.stdout + r.stderr
        r = salus_cli("stats", "--json", "--server", salus_address)
        assert r.returncode == 0 and "switch_latency_us" in json.loads(r.stdout), r.stderr
        # Per-tenant figures, as ctl's: this script's user is a tenant with device time.
        tenants = json.loads(r.stdout)["tenants"]
        assert tenants and tenants[0]["device_s"] > 0 and tenants[0]["jobs"] >= 1, tenants
        r = salus_cli("top", "--iterations", "2", "--interval", "0.2", env=cli_env)
        assert r.returncode == 0 and r.stderr == "", r.stderr
        frames = r.stdout.split("salus top - ")[1:]
        assert len(frames) == 2, r.stdout
        for frame in frames:
            assert frame.startswith(salus_address) and "LANE" in frame and name in frame, frame
            assert "\x1b[" not in frame  # not a terminal: frames are appended, no ANSI redraw
        r = salus_cli("top", "--once", "--server", salus_address)
        assert r.returncode == 0 and r.stdout.count("salus top - ") == 1 and name in r.stdout, r.stdout + r.stderr
        # Hints can be changed at run time: only the ones given (the expected seconds stay).
        r = salus_cli("hints", name, "--priority", "9", "--iterations", "30", env=cli_env)
        assert r.returncode == 0 and name in r.stdout, r.stdout + r.stderr
        job = one_job(channel, name)
        assert (job["priority"], job["expected_iterations"], job["expected_seconds"]) == (9, 30, 1.5)
    except BaseException:
        held.kill()
        raise
    remote = last_json_line(held.release())

    # tf.Session, InteractiveSession and MonitoredTrainingSession each opened one session on the server.
    assert sessions_created(channel) - before == 3
    assert not jobs_named(channel, name)  # all closed
    assert remote["salus_loaded"] is True
    for key in ("losses", "interactive_loss", "monitored_losses", "monitored_step"):
        assert remote[key] == local[key], key


def test_unmodified_keras_script_through_salus_run(channel, salus_address, salus_only):
    before = sessions_created(channel)
    local = last_json_line(run_script("keras_script.py", clean_env()).stdout)
    assert sessions_created(channel) == before

    name = f"keras-{uuid.uuid4().hex[:8]}"
    exe = str(Path(venv_python()).parent / "salus")
    held = Held([exe, "run", "--server", f"grpc://{salus_address}", "--name", name, "--priority", "2", "--",
                 venv_python(), str(WORKLOADS / "keras_script.py")], clean_env())
    try:
        held.wait()
        job = one_job(channel, name)
        assert job["priority"] == 2 and job["graph_nodes"] > 0 and job["runs_completed"] > 0, job
    except BaseException:
        held.kill()
        raise
    remote = last_json_line(held.release())
    assert sessions_created(channel) - before == 1  # tf-keras's one backend session
    assert remote == local


def test_eager_script_with_salus_eager_0_warns_once_and_runs_locally(channel, salus_address, salus_only):
    # TF2 eager work goes to the server's eager front end (test_tf2_*.py); SALUS_EAGER=0 keeps it local.
    local = run_script("eager_script.py", clean_env())
    assert "salus" not in local.stderr
    before = sessions_created(channel)
    remote = run_script("eager_script.py", clean_env(SALUS_SERVER=salus_address, SALUS_EAGER="0"))
    assert sessions_created(channel) == before
    assert last_json_line(remote.stdout) == last_json_line(local.stdout)
    warnings = [line for line in remote.stderr.splitlines() if line.startswith("salus:")]
    assert len(warnings) == 1, remote.stderr
    assert "ran locally" in warnings[0] and salus_address in warnings[0] and "SALUS_EAGER=0" in warnings[0]


def test_top_redraws_on_a_terminal(salus_address, salus_only):
    """On a terminal `salus top` redraws in place (ANSI home + clear per frame) and restores the cursor."""
    import pty
    master, slave = pty.openpty()
    exe = Path(venv_python()).parent / "salus"
    proc = subprocess.Popen([str(exe), "top", "-n", "2", "-d", "0.1", "--server", salus_address], stdout=slave,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=clean_env(), text=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO once the child has exited and closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(30) == 0, proc.stderr.read()
    out = b"".join(chunks).decode(errors="replace")
    assert out.count("\x1b[H\x1b[2J") == 2 and out.count("salus top - ") == 2, out
    assert out.startswith("\x1b[?25l") and "\x1b[?25h" in out


def test_explicit_api_session_and_configure(channel, salus_address, salus_only):
    before = sessions_created(channel)
    suffix = uuid.uuid4().hex[:8]
    held = Held([venv_python(), str(WORKLOADS / "explicit_api.py"), salus_address, suffix], clean_env())
    try:
        held.wait()
        explicit = one_job(channel, f"explicit-{suffix}")
        assert (explicit["priority"], explicit["expected_iterations"]) == (5, 10)
        configured = one_job(channel, f"configured-{suffix}")
        assert configured["expected_seconds"] == 3.0
    except BaseException:
        held.kill()
        raise
    result = last_json_line(held.release())
    assert result == {"explicit": 54.0, "configured": 54.0, "local": 54.0}
    assert sessions_created(channel) - before == 2


def test_merged_config_keeps_the_scripts_settings():
    from tensorflow.core.protobuf import config_pb2

    from salus import _config, _patch
    settings = _config.validated(name="job", priority="3", iterations="100", seconds="2.5")
    mine = config_pb2.ConfigProto(intra_op_parallelism_threads=2, allow_soft_placement=True)
    mine.graph_options.optimizer_options.opt_level = config_pb2.OptimizerOptions.L0
    merged = _patch.merged_config(mine, settings, config_pb2)
    assert merged.experimental.session_metadata.name == "job?priority=3&iterations=100&seconds=2.5"
    assert merged.experimental.session_metadata.version > 0  # unique: same-named jobs can coexist
    assert merged.intra_op_parallelism_threads == 2 and merged.allow_soft_placement
    assert merged.graph_options.optimizer_options.opt_level == config_pb2.OptimizerOptions.L0
    assert not mine.HasField("experimental")  # the script's object is untouched
    # A name the script set itself wins.
    mine.experimental.session_metadata.name = "own"
    assert _patch.merged_config(mine, settings, config_pb2).experimental.session_metadata.name == "own"


def test_invalid_hints_are_refused_client_side(channel, salus_address, salus_only):
    before = sessions_created(channel)
    proc = run_script("plain_tf1.py", clean_env(SALUS_SERVER=salus_address, SALUS_PRIORITY="high"), check=False)
    assert proc.returncode != 0
    assert "SALUS_PRIORITY='high' is not valid: expected an integer" in proc.stderr
    assert sessions_created(channel) == before
    for args, message in [(["--iterations", "0"], "--iterations='0' is not valid"),
                          (["--seconds", "nan"], "--seconds='nan' is not valid"),
                          (["--name", "a?b"], "cannot contain '?'"),
                          (["--server", "http://x:1"], "expected HOST:PORT")]:
        r = salus_cli("run", *args, "--", "true")
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


def test_salus_run_sets_env_and_propagates_exit_code(salus_address):
    code = ("import json, os, sys; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith('SALUS_')})); sys.exit(7)")
    r = salus_cli("run", "--server", salus_address, "--name", "n1", "--priority", "-3", "--iterations", "5",
                  "--seconds", "2.5", "--", venv_python(), "-c", code)
    assert r.returncode == 7, r.stderr
    assert json.loads(r.stdout) == {"SALUS_SERVER": salus_address, "SALUS_JOB_NAME": "n1", "SALUS_PRIORITY": "-3",
                                    "SALUS_EXPECTED_ITERATIONS": "5", "SALUS_EXPECTED_SECONDS": "2.5"}
    r = salus_cli("run", "--server", salus_address, "--", "true")
    assert r.returncode == 0
    r = salus_cli("run", "--server", salus_address, "--", "no-such-command-salus")
    assert r.returncode == 127 and "command not found: no-such-command-salus" in r.stderr


def test_unreachable_server_is_a_clear_error():
    address = f"127.0.0.1:{closed_port()}"
    for args in (["jobs"], ["jobs", "--json"], ["top", "--once"], ["policy"], ["stats"],
                 ["run", "--", "true"]):
        r = salus_cli(*args, env=clean_env(SALUS_SERVER=address))
        assert r.returncode == 3, (args, r.stdout, r.stderr)  # the CLI's "unreachable"
        assert f"cannot reach salus-server at {address}" in r.stderr and "Connection refused" in r.stderr, \
            (args, r.stderr)
    # A TF script fails fast instead of waiting forever in TensorFlow's gRPC client.
    t0 = time.monotonic()
    proc = run_script("plain_tf1.py", clean_env(SALUS_SERVER=address), check=False)
    assert proc.returncode != 0
    assert f"cannot reach salus-server at {address}" in proc.stderr
    assert time.monotonic() - t0 < 60


def test_policy_show_and_set(channel, salus_address, salus_only):
    original = server_info(channel)["policy"]
    env = clean_env(SALUS_SERVER=salus_address)
    try:
        r = salus_cli("policy", "set", "srtf", env=env)
        assert r.returncode == 0 and r.stdout == f"policy: {original} -> srtf\n", r.stderr
        assert server_info(channel)["policy"] == "srtf"
        r = salus_cli("policy", env=env)
        assert r.returncode == 0 and r.stdout == "policy: srtf\n"
        r = salus_cli("policy", "set", "no-such-policy", env=env)
        assert r.returncode == 1 and r.stderr.startswith("salus: refused (INVALID_ARGUMENT): "), r.stderr
        assert server_info(channel)["policy"] == "srtf"
    finally:
        wire.call(channel, ADMIN + "SetPolicy", wire.f_bytes(1, original))
    assert server_info(channel)["policy"] == original


def test_installed_admin_client_is_generated_from_admin_proto():
    """The package's admin client (salus.v1.admin_pb2) has exactly the messages and fields of the proto the
    server is built from: it is generated from it when the package is built, not written by hand."""
    assert _generated_client_matches_proto(clean_env()) == "same"


# --- salus timeline ------------------------------------------------------------------------------------

TIMELINE_KEYS = {"seconds", "now_uptime_s", "now_unix_s", "capacity", "recorded_total", "spans"}
SPAN_KEYS = {"job", "name", "kind", "lane", "start_ago_s", "end_ago_s", "run"}


def _start_together(jobs: list[tuple[list[str], dict]], tmp_path: Path, timeout: float = TF_TIMEOUT) -> list:
    """Starts the scripts with sched_job.py's start protocol and lets them go at once, so they overlap."""
    go = tmp_path / "go"
    procs, ready = [], []
    for i, (argv, env) in enumerate(jobs):
        ready.append(tmp_path / f"ready-{i}")
        procs.append(subprocess.Popen([*argv, "--ready-file", str(ready[-1]), "--go-file", str(go)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                      stdin=subprocess.DEVNULL))
    deadline = time.monotonic() + timeout
    while not all(r.exists() for r in ready):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            pytest.fail("a job did not get ready: " + " | ".join(p.communicate()[1][-2000:] for p in procs))
        time.sleep(0.05)
    go.write_text("")
    return procs


def test_timeline_shows_both_jobs_iterations_on_their_lane(salus_address, salus_target, salus_only, tmp_path):
    """A graph job and an eager job train at the same time; `salus timeline --json` has both jobs' main
    iterations on one lane, never overlapping there (one iteration at a time per lane), interleaved;
    `--png` draws them, the text summary names them, and `salus-server ctl timeline --json` has the same keys."""
    tag = uuid.uuid4().hex[:6]
    graph, eager = f"tl-graph-{tag}", f"tl-eager-{tag}"
    # 4 s each: the eager job's start (its adapter connects first) can lag the graph job's by more than a
    # second on a busy machine, and they must overlap for the lane to switch between them.
    procs = _start_together([
        ([venv_python(), str(WORKLOADS / "sched_job.py"), "--target", salus_target, "--name", graph,
          "--seconds", "4", "--digest-only"], clean_env()),
        # An eager job's name reaches the server through the adapter's environment.
        ([venv_python(), str(WORKLOADS / "tf2_sched_job.py"), "--name", eager, "--seconds", "4", "--digest-only"],
         clean_env(SALUS_SERVER=salus_address, SALUS_JOB_NAME=eager)),
    ], tmp_path)
    for p in procs:
        out, err = p.communicate(timeout=TF_TIMEOUT)
        assert p.returncode == 0, f"exit {p.returncode}\n{out[-2000:]}\n{err[-4000:]}"

    env = clean_env(SALUS_SERVER=salus_address)
    r = salus_cli("timeline", "--json", "--seconds", "0", env=env)
    assert r.returncode == 0, r.stderr
    t = json.loads(r.stdout)
    assert set(t) == TIMELINE_KEYS and t["seconds"] == 0 and t["capacity"] > 0
    assert t["recorded_total"] >= len(t["spans"]) > 0
    for s in t["spans"]:
        assert set(s) == SPAN_KEYS, s
        assert 0 <= s["end_ago_s"] <= s["start_ago_s"] <= t["now_uptime_s"], s
        assert s["run"] in ("main", "cheap")
    ours = {name: [s for s in t["spans"] if s["name"] == name] for name in (graph, eager)}
    for name, kind in ((graph, "graph"), (eager, "eager")):
        spans = ours[name]
        main = [s for s in spans if s["run"] == "main"]
        # ~4 s of ~5 ms steps, shared with the other job: many main iterations; the first two runs are cheap.
        assert len(main) >= 20, (name, len(main), spans[:5])
        assert any(s["run"] == "cheap" for s in spans), name
        assert {s["kind"] for s in spans} == {kind} and len({s["job"] for s in spans}) == 1, name
    lanes = {s["lane"] for name in ours for s in ours[name] if s["run"] == "main"}
    assert len(lanes) == 1 and None not in lanes, lanes  # no memory admission: one shared lane

    # One iteration at a time on the lane (lane concurrency 1): main spans never overlap, whoever ran them.
    [lane] = lanes
    on_lane = sorted((s for s in t["spans"] if s["lane"] == lane and s["run"] == "main"),
                     key=lambda s: -s["start_ago_s"])
    for a, b in zip(on_lane, on_lane[1:]):
        assert a["end_ago_s"] >= b["start_ago_s"] - 1e-6, (a, b)
    # Both jobs had iterations waiting at the same time, so the lane switched between them many times.
    sequence = [s["name"] for s in on_lane if s["name"] in ours]
    switches = sum(1 for x, y in zip(sequence, sequence[1:]) if x != y)
    assert switches >= 10, (switches, sequence[:40])

    r = salus_cli("timeline", "--seconds", "0", env=env)
    assert r.returncode == 0 and f"lane {lane}: busy" in r.stdout and graph in r.stdout and eager in r.stdout, \
        r.stdout + r.stderr
    png = tmp_path / "timeline.png"
    assert PLOT_PACKAGES.is_dir(), f"{PLOT_PACKAGES} (matplotlib) is missing: scripts/setup.sh makes it"
    plot_env = {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(PLOT_PACKAGES), env.get("PYTHONPATH")) if p)}
    r = salus_cli("timeline", "--seconds", "0", "--png", str(png), env=plot_env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:32]
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 150 and len(data) > 10_000, (width, height, len(data))
    # Without matplotlib: a clear error saying what to install, no traceback.
    # (salus timeline --png pipes the JSON into `python -m salus._timeline --png FILE`.)
    no_matplotlib = ("import sys; sys.modules['matplotlib'] = None; from salus._timeline import main; "
                     f"sys.exit(main(['--png', {str(tmp_path / 'x.png')!r}]))")
    r = subprocess.run([venv_python(), "-c", no_matplotlib], capture_output=True, text=True, env=env, timeout=60,
                       input=json.dumps(t))
    assert r.returncode == 1 and "pip install matplotlib" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()
    r = salus_cli("timeline", "--json", "--png", str(png), env=env)
    assert r.returncode == 2 and "cannot be used with" in r.stderr, r.stderr
    r = salus_cli("timeline", "--seconds", "-1", env=env)
    assert r.returncode == 2 and "--seconds" in r.stderr, r.stderr

    from server_ctl import ctl
    c = json.loads(ctl(salus_address, "timeline", "--json", "--seconds", "5").stdout)
    assert set(c) == TIMELINE_KEYS and c["seconds"] == 5
    assert all(set(s) == SPAN_KEYS for s in c["spans"])
    text = ctl(salus_address, "timeline", "--seconds", "0").stdout
    assert text.startswith("timeline: ") and graph in text and eager in text, text
