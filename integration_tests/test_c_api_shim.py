"""End-to-end: TensorFlow C-API programs sent to the server by the LD_PRELOAD shim (tf_adapter/, libsalus_tf.so).

The C programs in c_programs/ are plain TensorFlow C-API users that know nothing of Salus; they are built with
`cc` against the wheel's headers and libraries. Each is run without the shim (local TensorFlow) and with it
preloaded, and the outputs must be identical.

A second real client is a Rust program on the `tensorflow` crate (tf_adapter/rust_client, binary
salus-tf-rust-train, built by scripts/test.sh's cargo test --workspace, or cargo build --release -p salus-tf-rust-client).

Environment:
  SALUS_TF_SHIM         path of libsalus_tf.so (default: next to SALUS_SERVER_BIN, i.e. <target>/release/)
  SALUS_TF_RUST_CLIENT  path of salus-tf-rust-train (default: next to SALUS_SERVER_BIN)
"""

from __future__ import annotations

import importlib.util
import os
import queue
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import TESTS, child_env, compile_c, last_json_line, run_python, server_bin
from server_ctl import jobs_by_name

C_PROGRAMS = TESTS / "c_programs"
PROGRAM_TIMEOUT_S = 120
PROBE = ["0.5", "-1.25", "2.0"]
TRAIN_STEPS = "8"

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SALUS_TEST_TARGET")),
    reason="the shim's hints and job listing are Salus behaviour (ctl jobs)")


def shim_path() -> Path:
    return Path(os.environ.get("SALUS_TF_SHIM", server_bin().parent / "libsalus_tf.so")).resolve()


def rust_client_path() -> Path:
    return Path(os.environ.get("SALUS_TF_RUST_CLIENT", server_bin().parent / "salus-tf-rust-train")).resolve()


def tf_dir() -> Path:
    spec = importlib.util.find_spec("tensorflow")
    assert spec and spec.origin, "tensorflow is not installed in the interpreter running pytest"
    return Path(spec.origin).parent


@pytest.fixture(scope="module")
def shim() -> Path:
    path = shim_path()
    if not path.exists():
        pytest.fail(f"{path} not found: build it (cargo build --release -p salus-tf-adapter) or set SALUS_TF_SHIM")
    return path


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    """train and serve, compiled against the wheel's C API (rpath to its libraries)."""
    out = tmp_path_factory.mktemp("c_programs")
    lib = tf_dir()
    return {name: compile_c(C_PROGRAMS / f"{name}.c", out / name, "-O1", f"-I{lib / 'include'}", f"-L{lib}",
                            f"-Wl,-rpath,{lib}", libs=("-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2"))
            for name in ("train", "serve")}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    """The GraphDef, configs and SavedModels the programs load (one Python/TensorFlow process)."""
    out = tmp_path_factory.mktemp("c_models")
    result = last_json_line(run_python(C_PROGRAMS / "export_models.py", str(out)).stdout)
    result["dir"] = out
    return result


def program_env(shim: Path | None, **salus: str) -> dict:
    """The environment of a C program: no SALUS_* or LD_PRELOAD from outside; the shim only when given."""
    env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_") and k != "LD_PRELOAD"}
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    env.update(salus)
    return env


def run_program(args: list, env: dict, timeout: float = PROGRAM_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


def checked(proc: subprocess.CompletedProcess) -> list[str]:
    assert proc.returncode == 0, f"{proc.args} exited with {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\n" \
                                 f"stderr:\n{proc.stderr[-4000:]}"
    return proc.stdout.splitlines()


class Held:
    """A program run with HOLD_SESSION=1: its output up to "holding", its session still open."""

    def __init__(self, args: list, env: dict):
        self.proc = subprocess.Popen([str(a) for a in args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env={**env, "HOLD_SESSION": "1"})
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append, False), daemon=True).start()
        self.output: list[str] = []
        deadline = time.monotonic() + PROGRAM_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.finish()
                pytest.fail(f"{args[0]} did not reach its hold point in {PROGRAM_TIMEOUT_S}s: "
                            f"{self.output} {''.join(self.stderr)[-4000:]}")
            if line is None:
                code = self.proc.wait(30)
                pytest.fail(f"{args[0]} exited with {code} before holding\nstdout: {self.output}\n"
                            f"stderr:\n{''.join(self.stderr)[-4000:]}")
            if line.rstrip("\n") == "holding":
                return
            self.output.append(line.rstrip("\n"))

    @staticmethod
    def _pump(stream, sink, mark_end: bool):
        for line in stream:
            sink(line)
        if mark_end:
            sink(None)

    def finish(self) -> int:
        """Lets the program close its session and exit; returns its exit code."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            pytest.fail(f"{self.proc.args[0]} did not exit after its stdin closed")


def train_args(programs, models, config: str | None = None) -> list:
    args = [programs["train"], models["dir"] / "train_graph.pb", "init", "train", "loss:0", TRAIN_STEPS]
    return args + [models["dir"] / config] if config else args


def serve_args(programs, models, version: str) -> list:
    m = models[version]
    return [programs["serve"], models["dir"] / f"model_{version}", "serve", m["input"], m["output"], *PROBE]


@pytest.fixture(scope="module")
def local_losses(programs, models) -> list[str]:
    lines = checked(run_program(train_args(programs, models), program_env(None)))
    assert len(lines) == int(TRAIN_STEPS), lines
    first, last = (float.fromhex(line.split()[3]) for line in (lines[0], lines[-1]))
    assert last < first * 0.8, f"the program does not train: {lines}"
    return lines


def test_training_through_the_shim_gets_the_local_losses(salus_address, shim, programs, models, local_losses):
    env = program_env(shim, SALUS_SERVER=salus_address, SALUS_JOB_NAME="c-train", SALUS_PRIORITY="4",
                      SALUS_EXPECTED_ITERATIONS="8", SALUS_EXPECTED_SECONDS="2.5")
    held = Held(train_args(programs, models), env)
    try:
        rows = jobs_by_name(salus_address)
    finally:
        code = held.finish()
    assert code == 0, "".join(held.stderr)[-4000:]
    assert held.output == local_losses, "losses through the server differ from local ones"
    row = rows.get("c-train")
    assert row is not None, f"the program's session is not a job named c-train on the server: {list(rows)}"
    assert (row["priority"], row["expected_iterations"], row["expected_seconds"]) == (4, 8, 2.5), row
    assert row["kind"] == "graph" and row["runs_completed"] >= int(TRAIN_STEPS), row


@pytest.mark.parametrize("config,job_name", [("config_threads.pb", "c-threads"), ("config_own_name.pb", "c-own-name")])
def test_the_programs_own_config_is_kept(salus_address, shim, programs, models, local_losses, config, job_name):
    """TF_SetConfig bytes are merged with the hints; a session_metadata name the program set wins."""
    env = program_env(shim, SALUS_SERVER=salus_address, SALUS_JOB_NAME="c-threads")
    held = Held(train_args(programs, models, config), env)
    try:
        rows = jobs_by_name(salus_address)
    finally:
        code = held.finish()
    assert code == 0, "".join(held.stderr)[-4000:]
    assert held.output == local_losses
    assert job_name in rows, f"no job {job_name} on the server: {list(rows)}"


def test_shim_without_salus_server_changes_nothing(shim, programs, models, local_losses, salus_address):
    held = Held(train_args(programs, models), program_env(shim, SALUS_JOB_NAME="c-unset"))
    try:
        maps = Path(f"/proc/{held.proc.pid}/maps").read_text()
        rows = jobs_by_name(salus_address)
    finally:
        code = held.finish()
    assert code == 0, "".join(held.stderr)[-4000:]
    assert str(shim) in maps, "the shim was not loaded into the program"
    assert held.output == local_losses
    assert "c-unset" not in rows and "train" not in rows, rows
    for version in ("v1", "v2"):
        args = serve_args(programs, models, version)
        assert checked(run_program(args, program_env(shim))) == checked(run_program(args, program_env(None)))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_saved_model_serves_through_the_shim(salus_address, shim, programs, models, version):
    """v1: TF1 builder (VariableV2, a main op); v2: tf.saved_model.save of a tf.Module (VarHandleOp, functions)."""
    args = serve_args(programs, models, version)
    local = checked(run_program(args, program_env(None)))
    job = f"c-serve-{version}"
    held = Held(args, program_env(shim, SALUS_SERVER=salus_address, SALUS_JOB_NAME=job, SALUS_TF_SHIM_VERBOSE="1"))
    try:
        rows = jobs_by_name(salus_address)
    finally:
        code = held.finish()
    stderr = "".join(held.stderr)
    assert code == 0, stderr[-4000:]
    assert held.output == local, f"server {held.output} != local {local}"
    assert job in rows, f"no job {job} on the server: {list(rows)}"
    assert "variables" in stderr and "shipped to" in stderr, stderr[-2000:]
    print(next(line for line in stderr.splitlines() if "shipped to" in line))
    values = [float.fromhex(v) for v in held.output[0].split()[1:]]
    assert values == pytest.approx(models[version]["expected"][0], rel=1e-5, abs=1e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_down_is_a_clear_error_not_a_hang(shim, programs, models):
    address = f"127.0.0.1:{free_port()}"
    for args in (train_args(programs, models), serve_args(programs, models, "v1")):
        started = time.monotonic()
        proc = run_program(args, program_env(shim, SALUS_SERVER=address), timeout=60)
        elapsed = time.monotonic() - started
        assert proc.returncode != 0, proc.stdout
        assert f"the Salus server {address} is not reachable" in proc.stderr, proc.stderr[-2000:]
        assert "(code 14)" in proc.stderr, "not reported as TF_UNAVAILABLE in the program's TF_Status"
        assert elapsed < 20, f"took {elapsed:.1f}s"


@pytest.mark.parametrize("var,value", [("SALUS_PRIORITY", "high"), ("SALUS_SERVER", "no-port"),
                                       ("SALUS_JOB_NAME", "a?b")])
def test_invalid_settings_fail_the_session_not_the_process(salus_address, shim, programs, models, var, value):
    env = program_env(shim, **{"SALUS_SERVER": salus_address, var: value})
    proc = run_program(train_args(programs, models), env, timeout=60)
    assert proc.returncode == 2, f"expected the program's own error exit: {proc.returncode}\n{proc.stderr[-2000:]}"
    assert f"salus: {var}=" in proc.stderr and "is not valid" in proc.stderr, proc.stderr[-2000:]
    assert "error: creating the session" in proc.stderr and "(code 3)" in proc.stderr, proc.stderr[-2000:]


def as_float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def test_rust_tensorflow_crate_client_through_the_shim(salus_address, shim, models, local_losses):
    """A program on the `tensorflow` crate (tensorflow-sys over the wheel's C API) as a second real client."""
    client = rust_client_path()
    if not client.exists():
        pytest.fail(f"{client} not found: build it (cargo build --release -p salus-tf-rust-client) or set "
                    f"SALUS_TF_RUST_CLIENT")
    args = [client, models["dir"] / "train_graph.pb", "init", "train", "loss", TRAIN_STEPS]
    local = checked(run_program(args, program_env(None)))
    held = Held(args, program_env(shim, SALUS_SERVER=salus_address, SALUS_JOB_NAME="rust-train"))
    try:
        rows = jobs_by_name(salus_address)
    finally:
        code = held.finish()
    assert code == 0, "".join(held.stderr)[-4000:]
    assert held.output == local, "losses through the server differ from local ones"
    assert "rust-train" in rows, f"no job rust-train on the server: {list(rows)}"
    # The same graph as the C program: the same float32 losses.
    rust = [as_float32(float(line.split()[3])) for line in local]
    c = [float.fromhex(line.split()[3]) for line in local_losses]
    assert rust == c, (rust, c)


def test_saving_a_tf2_saved_model_through_the_shim_fails_clearly(salus_address, shim, programs, models, tmp_path):
    """The stand-ins for a TF2 model's checkpoint functions refuse a save, rather than silently doing nothing."""
    saver = models["v2"]["saver"]
    args = serve_args(programs, models, "v2")
    save_env = {"SAVER_FILENAME_TENSOR": saver["filename"], "SAVER_SAVE_TENSOR": saver["save"]}
    local = checked(run_program(args, {**program_env(None), **save_env, "SAVE_PREFIX": str(tmp_path / "local")}))
    assert local[-1] == "saved" and list(tmp_path.glob("local*")), (local, list(tmp_path.iterdir()))
    remote = run_program(args, {**program_env(shim, SALUS_SERVER=salus_address), **save_env,
                                "SAVE_PREFIX": str(tmp_path / "remote")})
    assert remote.returncode == 3, f"{remote.returncode}\n{remote.stdout}\n{remote.stderr[-3000:]}"
    assert "error: saving the model" in remote.stderr and "which the Salus server refuses inside functions" \
        in remote.stderr, remote.stderr[-3000:]
    assert not list(tmp_path.glob("remote*"))


def test_saved_model_with_assets_is_refused_with_what_to_do(salus_address, shim, programs, models):
    """Its init op reads the asset files by path, on the server: refused before anything is sent."""
    args = [programs["serve"], models["dir"] / "model_assets", "serve", "serving_default_x:0",
            "StatefulPartitionedCall:0", *PROBE]
    local = checked(run_program(args, program_env(None)))
    assert [float.fromhex(v) for v in local[0].split()[1:]] == [0.5, -1.25, 2.0]  # the vocabulary's "b" is 1
    proc = run_program(args, program_env(shim, SALUS_SERVER=salus_address))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "has asset files" in proc.stderr and "load it with SALUS_SERVER unset" in proc.stderr, proc.stderr[-2000:]
