#!/usr/bin/env python3
"""What a GPU node must show before Salus's GPU claims can be called verified (issue 39): scripts/gpu_check.sh.

  scripts/gpu_check.sh [--dry-run] [--rehearse-on-cpu] [--keep-logs DIR] [--only CLAIM,...]

Each claim below starts its own salus-server(s) (127.0.0.1, a free port, a state directory of its own) and its own
TensorFlow clients, and prints one line: `PASS name: detail`, `FAIL name: why` or `SKIP name: why`, with its time;
a summary line `gpu_check: N passed, M failed, K skipped` ends the run, and the exit status is 1 if a claim failed
(2 for a usage error). Each claim runs under a time limit, in its own try/finally: every process it started is
stopped by its PID, whatever happened. Server and client logs go to a temporary directory (--keep-logs DIR keeps
them there); it is kept, and named in every FAIL line, when a claim fails.

Without an NVIDIA driver (no nvidia-smi, no /proc/driver/nvidia) it says so in one line, checks its own syntax
(shellcheck or `bash -n` on gpu_check.sh, py_compile on this file) and exits 0. --rehearse-on-cpu runs the claims
that mean something on a CPU against CPU:0 instead (in-process TensorFlow figures instead of nvidia-smi's, executor
PIDs from /proc), so the orchestration itself is exercised on a machine without a GPU.

Clients that talk to the server run with CUDA_VISIBLE_DEVICES= (the GPU hidden from them), so that only the
server's processes hold CUDA contexts; in-process reference runs see the GPU.

The same file is the clients: `gpu_check.py --client tf1|tf2|hog ...` (run with the venv's Python) builds and runs
the TensorFlow jobs and prints JSON lines; see client_main().
"""

from __future__ import annotations

import argparse
import json
import math
import os
import py_compile
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
WRAPPER = REPO / "scripts" / "gpu_check.sh"
WORKLOADS = REPO / "integration_tests" / "workloads"
FLAVOR_FILE = REPO / ".venv" / ".salus-tf-flavor"
LISTEN_RE = re.compile(r"^salus-server listening on (\S+)\s*$")
MiB = 1 << 20
GiB = 1 << 30

# Numbers through the server against the same script in-process on the same device. TF_DETERMINISTIC_OPS=1 on
# both sides makes TensorFlow pick deterministic kernels, so equal inputs should give bitwise-equal results;
# rtol 1e-5 (about 80 float32 ulps) still tolerates a different but equally exact reduction order, while a
# different math mode (TF32 against FP32 matmuls, ~1e-3 relative) or a wrong value fails.
RTOL = 1e-5
ATOL = 1e-7
DETERMINISTIC = {"TF_DETERMINISTIC_OPS": "1"}
# Claim memory-admission on a GPU: both the server and the in-process references use cudaMallocAsync with
# growth, so the memory nvidia-smi shows for a process follows its allocator's high-water mark (the default BFC
# allocator takes nearly the whole GPU at once, or with growth reserves in doubling regions, up to twice the
# peak). GPU_CHECK_ALLOCATOR=bfc keeps TensorFlow's BFC allocator (with growth) instead.
GPU_ALLOCATOR_ENV = ({"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
                     if os.environ.get("GPU_CHECK_ALLOCATOR") == "bfc"
                     else {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "TF_GPU_ALLOCATOR": "cuda_malloc_async"})
# In-process references on a CPU: TensorFlow's BFC CPU allocator keeps statistics whatever oneDNN does.
CPU_STATS_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}

# TF1 models of the clients: MLP layer sizes, batch, optimizer. Data come from stateless random ops inside the
# graph (no feeds), so a step's work and memory are all on the job's device.
TF1_MODELS = {
    "tiny": dict(dims=[64, 32, 10], batch=16, opt="sgd"),
    "adam": dict(dims=[256, 512, 512, 10], batch=128, opt="adam"),
    # Claim memory-admission: persistent and ephemeral of the same order, so sum(P)+max(E) and sum(P+E) differ.
    "mem_cpu": dict(dims=[1024, 1024, 1024, 10], batch=512, opt="sgd"),
    "mem_gpu": dict(dims=[4096, 4096, 4096, 10], batch=2048, opt="sgd"),
}
# The TF2 job has the larger ephemeral need (on a CPU about 13 MiB against the TF1 job's 10 MiB), so max(E) and
# with it the comparison rest on the server's measurement of an eager job.
TF2_MODELS = {
    "tiny": dict(dims=[64, 32, 10], batch=16),
    "mem_cpu": dict(dims=[1024, 2048, 10], batch=256),
    "mem_gpu": dict(dims=[4096, 16384, 10], batch=2048),
}


# ============================================================================================================
# Clients (run with the venv's Python; they import TensorFlow)
# ============================================================================================================

def _emit(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def _wait_file(path: str | None, timeout: float = 900) -> None:
    if not path:
        return
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"gpu_check client: no file {path} within {timeout:.0f} s")
        time.sleep(0.02)


def _matmul_devices(meta) -> list[str]:
    """The devices (as the step stats name them) on which the graph's gpucheck_matmul nodes ran."""
    found = set()
    for dev in meta.step_stats.dev_stats:
        for ns in dev.node_stats:
            if "gpucheck_matmul" in ns.node_name:
                found.add(dev.device)
    return sorted(found)


# In-process allocator figures: the persistent bytes after the variables' initialisation, and the least and the
# largest rise of the allocator's peak over the bytes in use during one step, of these steps (after the warm-up):
# the order in which TensorFlow's inter-op threads run a step's independent ops changes its peak from step to step
# (measured on 2 CPU cores: 10.0 MiB in most steps of the TF2 job, 12.0 MiB in some).
MEASURED_STEPS = range(3, 13)


def _memory(tf, device: str) -> dict:
    return tf.config.experimental.get_memory_info(device)


def client_tf1(args) -> None:
    import tensorflow as tf

    spec = TF1_MODELS[args.model]
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.set_random_seed(args.seed)
        dims, batch = spec["dims"], spec["batch"]
        x = tf.random.stateless_normal([batch, dims[0]], seed=[args.seed, 1], name="data_x")
        y = tf.random.stateless_normal([batch, dims[-1]], seed=[args.seed, 2], name="data_y")
        h, params = x, []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            w = tf.compat.v1.get_variable(f"w{i}", [a, b],
                                          initializer=tf.compat.v1.glorot_uniform_initializer(seed=args.seed * 10 + i))
            bias = tf.compat.v1.get_variable(f"b{i}", [b], initializer=tf.compat.v1.zeros_initializer())
            params += [w, bias]
            h = tf.add(tf.matmul(h, w, name=f"gpucheck_matmul{i}"), bias)
            if i < len(dims) - 2:
                h = tf.nn.relu(h)
        loss = tf.reduce_mean(tf.square(h - y))
        opt = {"sgd": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.01),
               "adam": lambda: tf.compat.v1.train.AdamOptimizer(1e-3)}[spec["opt"]]()
        train = opt.minimize(loss)
        marked = tf.identity(loss, name="salus_main_iter")
        sums = [tf.reduce_sum(tf.cast(p, tf.float64)) for p in params]
        init = tf.compat.v1.global_variables_initializer()
        variable_bytes = sum(v.shape.num_elements() * v.dtype.size for v in tf.compat.v1.global_variables())

    config = tf.compat.v1.ConfigProto()
    if args.name:
        config.experimental.session_metadata.name = args.name
    if args.ready:
        open(args.ready, "w").close()
    _wait_file(args.go)
    result: dict = {"model": args.model, "variable_bytes": int(variable_bytes)}
    losses: list[float] = []
    step_ends: list[float] = []
    with g.as_default():
        sess = tf.compat.v1.Session(args.target, config=config)
        try:
            if args.memory:
                before = _memory(tf, args.memory)["current"]
            sess.run(init)
            if args.memory:
                after_init = _memory(tf, args.memory)["current"]
            started = time.monotonic()
            i = 0
            while True:
                if args.seconds and time.monotonic() - started >= args.seconds and i >= 4:
                    break
                if args.stop_file and os.path.exists(args.stop_file) and i >= 4:
                    break
                if not args.seconds and not args.stop_file and i >= args.steps:
                    break
                fetches = [loss if i < args.plain_steps else marked, train]
                if args.trace and i == 3:
                    opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
                    meta = tf.compat.v1.RunMetadata()
                    value = sess.run(fetches, options=opts, run_metadata=meta)[0]
                    result["matmul_devices"] = _matmul_devices(meta)
                    result["trace_devices"] = sorted(d.device for d in meta.step_stats.dev_stats)
                elif args.memory and i in MEASURED_STEPS:
                    tf.config.experimental.reset_memory_stats(args.memory)
                    current = _memory(tf, args.memory)["current"]
                    value = sess.run(fetches)[0]
                    peak = _memory(tf, args.memory)["peak"]
                    result["tf_persistent_bytes"] = int(after_init - before)
                    result["tf_ephemeral_bytes"] = max(result.get("tf_ephemeral_bytes", 0), int(peak - current))
                    result["tf_device"] = args.memory
                    result["tf_ephemeral_min_bytes"] = min(result.get("tf_ephemeral_min_bytes", 1 << 62), int(peak - current))
                else:
                    value = sess.run(fetches)[0]
                losses.append(float(value))
                step_ends.append(time.time())
                i += 1
                if args.progress and i == args.progress:
                    _emit({"phase": "running", "steps": i})
            result.update(steps=len(losses), losses=losses, sums=[float(s) for s in sess.run(sums)],
                          last_step_end=step_ends[-1] if step_ends else None)
        except tf.errors.OpError as e:
            result.update(error=type(e).__name__, message=e.message[:3000], steps=len(losses), at=time.time())
            _emit(result)
            sess.close()
            return
        if args.hold:
            _emit({"phase": "holding", **result})
            _wait_file(args.hold)
        sess.close()
    _emit(result)


def client_hog(args) -> None:
    """A TF1 job that allocates `--big-bytes` in one step after a few small ones (claim gpu-lanes)."""
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        n = tf.compat.v1.placeholder(tf.int32, [], name="n")
        # 1 MiB of variables: a persistent need, so the next job's session is bound to the other (roomier) lane.
        v = tf.compat.v1.get_variable("hog_v", [256 * 1024], initializer=tf.compat.v1.ones_initializer())
        filled = tf.fill([n], tf.constant(1.0), name="gpucheck_matmul_fill")
        out = tf.identity(tf.reduce_sum(filled) + tf.reduce_sum(v), name="salus_main_iter")
        init = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto()
    config.experimental.session_metadata.name = args.name
    result: dict = {}
    with g.as_default():
        sess = tf.compat.v1.Session(args.target, config=config)
        try:
            sess.run(init)
            for i in range(3):
                if i == 2:
                    opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
                    meta = tf.compat.v1.RunMetadata()
                    sess.run(out, {n: 1024}, options=opts, run_metadata=meta)
                    result["fill_devices"] = sorted({d.device for d in meta.step_stats.dev_stats
                                                     for ns in d.node_stats if "gpucheck_matmul_fill" in ns.node_name})
                else:
                    sess.run(out, {n: 1024})
            _emit({"phase": "holding", **result})
            _wait_file(args.go)
            started = time.time()
            value = sess.run(out, {n: args.big_bytes // 4})
            result.update(big="ok", value=float(value), at=time.time(), started=started)
        except tf.errors.OpError as e:
            result.update(error=type(e).__name__, message=e.message[:3000], at=time.time())
        sess.close()
    _emit(result)


def client_tf2(args) -> None:
    """A TF2 job: explicit variables and a tf.function training step (GradientTape, plain SGD update)."""
    import tensorflow as tf

    spec = TF2_MODELS[args.model]
    dims, batch = spec["dims"], spec["batch"]
    if args.memory:
        before = _memory(tf, args.memory)["current"]
    variables = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        variables.append(tf.Variable(tf.random.stateless_normal([a, b], seed=[args.seed, 10 + i]) * (1.0 / a) ** 0.5,
                                     name=f"w{i}"))
        variables.append(tf.Variable(tf.zeros([b]), name=f"b{i}"))
    if args.memory:
        after_init = _memory(tf, args.memory)["current"]

    @tf.function
    def train_step():
        x = tf.random.stateless_normal([batch, dims[0]], seed=[args.seed, 1])
        y = tf.random.stateless_normal([batch, dims[-1]], seed=[args.seed, 2])
        with tf.GradientTape() as tape:
            h = x
            for i in range(0, len(variables), 2):
                h = tf.matmul(h, variables[i]) + variables[i + 1]
                if i < len(variables) - 2:
                    h = tf.nn.relu(h)
            loss = tf.reduce_mean(tf.square(h - y))
        grads = tape.gradient(loss, variables)
        for v, gr in zip(variables, grads):
            v.assign_sub(0.01 * gr)
        return loss

    result: dict = {"model": args.model,
                    "variable_bytes": int(sum(v.shape.num_elements() * v.dtype.size for v in variables)),
                    "devices": sorted({v.handle.device for v in variables})}
    losses = []
    try:
        for i in range(args.steps):
            if args.memory and i in MEASURED_STEPS:
                tf.config.experimental.reset_memory_stats(args.memory)
                current = _memory(tf, args.memory)["current"]
                losses.append(float(train_step().numpy()))
                peak = _memory(tf, args.memory)["peak"]
                result["tf_persistent_bytes"] = int(after_init - before)
                result["tf_ephemeral_bytes"] = max(result.get("tf_ephemeral_bytes", 0), int(peak - current))
                result["tf_device"] = args.memory
                result["tf_ephemeral_min_bytes"] = min(result.get("tf_ephemeral_min_bytes", 1 << 62), int(peak - current))
            else:
                losses.append(float(train_step().numpy()))
    except tf.errors.OpError as e:
        result.update(error=type(e).__name__, message=e.message[:3000], steps=len(losses))
        _emit(result)
        return
    result.update(steps=len(losses), losses=losses)
    if args.hold:
        _emit({"phase": "holding", **result})
        _wait_file(args.hold)
    _emit(result)


def client_info(args) -> None:
    """In-process TensorFlow: is it built with CUDA, which GPUs does it see (claim driver)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    details = {}
    if gpus:
        try:
            details = tf.config.experimental.get_device_details(gpus[0])
        except Exception as e:  # noqa: BLE001 (a detail only)
            details = {"error": str(e)}
    _emit({"tf": tf.__version__, "built_with_cuda": bool(tf.test.is_built_with_cuda()),
           "gpus": [d.name for d in gpus], "gpu0": {k: str(v) for k, v in details.items()}})


def client_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="gpu_check.py --client")
    ap.add_argument("mode", choices=["tf1", "tf2", "hog", "info"])
    ap.add_argument("--target", default="")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--plain-steps", type=int, default=0,
                    help="TF1: the first N steps fetch the loss, not salus_main_iter (warm-up runs the server "
                         "measures before the job asks for memory)")
    ap.add_argument("--seconds", type=float, default=0.0, help="TF1: loop for this long instead of --steps")
    ap.add_argument("--stop-file", help="TF1: loop until this file exists instead of --steps")
    ap.add_argument("--progress", type=int, default=0, help="TF1: print {\"phase\": \"running\"} after N steps")
    ap.add_argument("--trace", action="store_true", help="TF1: step 4 with FULL_TRACE; report the MatMuls' devices")
    ap.add_argument("--memory", help="in-process: TensorFlow's allocator figures on this device (GPU:0, CPU:0)")
    ap.add_argument("--name", default="")
    ap.add_argument("--hold", help="after the steps print {\"phase\": \"holding\"} and wait for this file")
    ap.add_argument("--ready")
    ap.add_argument("--go")
    ap.add_argument("--big-bytes", type=int, default=0)
    args = ap.parse_args(argv)
    {"tf1": client_tf1, "tf2": client_tf2, "hog": client_hog, "info": client_info}[args.mode](args)


# ============================================================================================================
# Orchestration (plain Python: no TensorFlow in this process)
# ============================================================================================================

class ClaimFailed(Exception):
    pass


class ClaimSkipped(Exception):
    pass


class ClaimTimeout(Exception):
    pass


def server_bin() -> Path:
    return Path(os.environ.get("SALUS_SERVER_BIN", REPO / "target" / "release" / "salus-server"))


def venv_python() -> str:
    p = REPO / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def gpu_driver_present() -> tuple[bool, str]:
    smi = shutil.which("nvidia-smi")
    proc = Path("/proc/driver/nvidia").exists()
    if smi or proc:
        return True, ", ".join(x for x in (smi and f"nvidia-smi at {smi}", proc and "/proc/driver/nvidia") if x)
    return False, "no nvidia-smi on PATH, no /proc/driver/nvidia"


def base_env(**extra: str) -> dict:
    """The caller's environment without its SALUS_* settings (a claim sets what it needs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALUS_") and k != "TF_USE_LEGACY_KERAS"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def mib(n: float | int | None) -> str:
    return "?" if n is None else f"{n / MiB:.1f} MiB"


# --- nvidia-smi -------------------------------------------------------------------------------------------

def smi(*args: str, timeout: float = 30) -> list[list[str]]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        raise ClaimFailed("nvidia-smi is not on PATH (it comes with the NVIDIA driver's utilities)")
    proc = subprocess.run([exe, *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise ClaimFailed(f"nvidia-smi {' '.join(args)} exited with {proc.returncode}: "
                          f"{(proc.stdout + proc.stderr).strip()[-500:]}")
    return [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]


def smi_gpus() -> list[dict]:
    rows = smi("--query-gpu=index,name,memory.total,memory.used,driver_version,uuid")
    return [{"index": int(r[0]), "name": r[1], "total_mib": float(r[2]), "used_mib": float(r[3]),
             "driver": r[4], "uuid": r[5]} for r in rows if len(r) >= 6]


def smi_apps() -> dict[int, float | None]:
    """PID -> used GPU memory (MiB; None where nvidia-smi says N/A) of every compute process it lists."""
    apps: dict[int, float | None] = {}
    for r in smi("--query-compute-apps=pid,used_memory"):
        if len(r) < 2 or not r[0].isdigit():
            continue
        try:
            apps[int(r[0])] = float(r[1])
        except ValueError:
            apps[int(r[0])] = None
    return apps


# --- processes --------------------------------------------------------------------------------------------

def executors_of(state_dir: Path) -> list[int]:
    """The executor processes of the server started with this state directory (they inherit its arguments)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(state_dir).encode() in args and b"executor" in args:
            found.append(int(entry.name))
    return sorted(found)


def proc_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def proc_rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def nvidia_fds(pid: int) -> int:
    """How many /dev/nvidia* files a process has open (a CUDA context holds several)."""
    n = 0
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd).startswith("/dev/nvidia"):
                    n += 1
            except OSError:
                pass
    except OSError:
        pass
    return n


def kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Server:
    """A salus-server started by a claim: its own port, state directory and log; stopped by its PID."""

    def __init__(self, ctx: "Ctx", label: str, args: list[str], env: dict | None = None):
        binary = server_bin().resolve()
        if not binary.exists():
            raise ClaimFailed(f"salus-server is not built ({binary} is missing): run scripts/setup.sh")
        self.label = label
        self.state_dir = ctx.logdir / f"{label}.state"
        self.log_path = ctx.logdir / f"{label}.server.log"
        self.args = ["--listen", "127.0.0.1:0", "--state-dir", str(self.state_dir), *args]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(binary), *self.args], stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL, cwd=ctx.logdir, env=base_env(**(env or {})))
        self.pid = self.proc.pid
        ctx.servers.append(self)
        found: list[str] = []
        ready = threading.Event()

        def reader():
            for raw in self.proc.stdout:
                m = LISTEN_RE.match(raw.decode(errors="replace"))
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        if not ready.wait(180) or not found:
            raise ClaimFailed(f"salus-server ({label}) did not start (exit code {self.proc.poll()}): "
                              f"{self.tail()}")
        self.address = found[0]
        self.target = f"grpc://{self.address}"

    def tail(self, n: int = 600) -> str:
        try:
            self._log.flush()
            text = self.log_path.read_bytes()[-n:].decode(errors="replace")
        except (OSError, ValueError):
            return ""
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-n:]

    def ctl(self, *args: str, as_json: bool = True, timeout: float = 30):
        proc = subprocess.run([str(server_bin().with_name("salus")), "--server", self.address, *args,
                               *(["--json"] if as_json else [])],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=base_env())
        if proc.returncode != 0:
            raise ClaimFailed(f"ctl {' '.join(args)} exited with {proc.returncode}: {proc.stderr.strip()[-500:]}")
        if not as_json:
            return proc.stdout
        try:
            return json.loads(proc.stdout)
        except json.JSONDecodeError as e:
            raise ClaimFailed(f"ctl {' '.join(args)} --json printed no JSON ({e}): {proc.stdout[-300:]}") from None

    def jobs(self) -> dict[str, dict]:
        """ctl jobs --json, by job name without its hints."""
        return {row["name"].split("?")[0]: row for row in self.ctl("jobs")["jobs"]}

    def executors(self) -> list[int]:
        return executors_of(self.state_dir)

    def stop(self) -> None:
        if self.proc.poll() is None:
            kill_pid(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                kill_pid(self.pid)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        # Executors outlive a supervisor only if it was killed; they carry this server's state directory.
        for pid in executors_of(self.state_dir):
            kill_pid(pid)
        self._log.close()


class Client:
    """A TensorFlow client process (this file in --client mode, or a workload script); stdout read on a thread."""

    def __init__(self, ctx: "Ctx", label: str, argv: list[str], env: dict):
        self.label = label
        self.err_path = ctx.logdir / f"{label}.client.err"
        self.out_path = ctx.logdir / f"{label}.client.out"
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen([venv_python(), *argv], stdout=subprocess.PIPE, stderr=self._err,
                                     stdin=subprocess.DEVNULL, cwd=ctx.logdir, env=env)
        self.pid = self.proc.pid
        ctx.clients.append(self)
        self.lines: list[str] = []
        self._new = threading.Condition()
        self._done = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with open(self.out_path, "w") as out:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                out.write(line)
                out.flush()
                with self._new:
                    self.lines.append(line.strip())
                    self._new.notify_all()
        with self._new:
            self._done = True
            self._new.notify_all()

    def _json_lines(self) -> list[dict]:
        found = []
        for line in self.lines:
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
        return found

    def stderr_tail(self, n: int = 500) -> str:
        try:
            self._err.flush()
            text = self.err_path.read_bytes()[-4000:].decode(errors="replace")
        except (OSError, ValueError):
            return ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return " | ".join(lines)[-n:]

    def wait_phase(self, phase: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self._new:
            while True:
                for obj in self._json_lines():
                    if obj.get("phase") == phase:
                        return obj
                    if "error" in obj:
                        raise ClaimFailed(f"{self.label} failed before '{phase}': {obj['error']}: "
                                          f"{obj.get('message', '')[:400]}")
                left = deadline - time.monotonic()
                if self._done or left <= 0:
                    break
                self._new.wait(min(left, 1.0))
        raise ClaimFailed(f"{self.label} never reached '{phase}' (exit code {self.proc.poll()}): "
                          f"{self.stderr_tail()}")

    def result(self, timeout: float, allow_error: bool = False) -> dict:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ClaimFailed(f"{self.label} did not finish within {timeout:.0f} s: {self.stderr_tail()}") from None
        deadline = time.monotonic() + 10
        with self._new:
            while not self._done and time.monotonic() < deadline:
                self._new.wait(0.5)
        results = [o for o in self._json_lines() if "phase" not in o]
        if self.proc.returncode != 0 or not results:
            raise ClaimFailed(f"{self.label} exited with {self.proc.returncode} without a result: "
                              f"{self.stderr_tail()}")
        res = results[-1]
        if "error" in res and not allow_error:
            raise ClaimFailed(f"{self.label}: {res['error']}: {res.get('message', '')[:500]}")
        return res

    def stop(self) -> None:
        if self.proc.poll() is None:
            kill_pid(self.pid)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self._err.close()


@dataclass
class Ctx:
    logdir: Path
    rehearse: bool
    facts: dict
    servers: list = field(default_factory=list)
    clients: list = field(default_factory=list)
    cleanups: list = field(default_factory=list)

    @property
    def device(self) -> str:
        return "CPU:0" if self.rehearse else "GPU:0"

    def server(self, label: str, *args: str, env: dict | None = None) -> Server:
        return Server(self, label, list(args), env)

    def client(self, label: str, mode: str, *args: str, env: dict | None = None, server: Server | None = None,
               token: str | None = None) -> Client:
        """This file as a client. Through a server (`server`): the GPU hidden from the client."""
        extra = dict(env or {})
        if server is not None:
            extra.setdefault("CUDA_VISIBLE_DEVICES", "")
            if mode == "tf2":
                extra["SALUS_SERVER"] = server.address
        if token:
            extra["SALUS_TOKEN"] = token
        argv = [str(SCRIPT), "--client", mode, *args]
        if server is not None and mode != "tf2":
            argv += ["--target", server.target]
        return Client(self, label, argv, base_env(**extra))

    def workload(self, label: str, script: Path, env: dict) -> Client:
        return Client(self, label, [str(script)], base_env(**env))

    def hold_file(self, label: str) -> Path:
        return self.logdir / f"{label}.release"

    def cleanup(self) -> None:
        for c in reversed(self.clients):
            c.stop()
        for s in reversed(self.servers):
            try:
                s.stop()
            except Exception:  # noqa: BLE001 (keep stopping the others)
                kill_pid(s.pid)
        for fn in reversed(self.cleanups):
            try:
                fn()
            except Exception:  # noqa: BLE001
                pass


def wait_until(pred: Callable[[], object], timeout: float, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)


def compare_numbers(a, b, path: str = "") -> tuple[list[str], float]:
    """Differences beyond RTOL/ATOL between two JSON results, and the largest relative difference seen."""
    bad: list[str] = []
    worst = 0.0

    def walk(x, y, p):
        nonlocal worst
        if isinstance(x, dict) and isinstance(y, dict):
            if set(x) != set(y):
                bad.append(f"{p}: keys {sorted(x)} != {sorted(y)}")
                return
            for k in x:
                walk(x[k], y[k], f"{p}.{k}")
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                bad.append(f"{p}: {len(x)} values != {len(y)}")
                return
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{p}[{i}]")
        elif isinstance(x, float) or isinstance(y, float):
            if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, (int, float)) \
                    or not isinstance(y, (int, float)):
                bad.append(f"{p}: {x!r} != {y!r}")
                return
            if x != y and not (math.isnan(x) and math.isnan(y)):
                worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-30))
                if not math.isclose(x, y, rel_tol=RTOL, abs_tol=ATOL):
                    bad.append(f"{p}: in-process {x!r} != through the server {y!r}")
        elif x != y:
            bad.append(f"{p}: {x!r} != {y!r}")

    walk(a, b, path or "result")
    return bad, worst


def equality_note(worst: float) -> str:
    return "bitwise equal" if worst == 0 else f"equal within rtol {RTOL:g} (largest relative difference {worst:.1e})"


def on_device(devices: list[str] | None, device: str) -> bool:
    """All the devices a trace names for a node end with `device` (e.g. GPU:0). TensorFlow's executor names
    devices in full (/job:localhost/replica:0/task:0/device:GPU:0); on a GPU, FULL_TRACE also has the GPU
    tracer's entries (/device:GPU:0/stream:all, ...), which are not where a node was placed."""
    names = [d for d in (devices or []) if "/job:" in d and "/stream:" not in d and "/memcpy" not in d]
    return bool(names) and all(d.endswith(f"device:{device}") for d in names)


# ============================================================================================================
# The claims
# ============================================================================================================

def gpu0_total_mib(ctx: Ctx) -> float:
    if "gpu0" not in ctx.facts:
        gpus = smi_gpus()
        if not gpus:
            raise ClaimFailed("nvidia-smi lists no GPU")
        ctx.facts["gpus"] = gpus
        ctx.facts["gpu0"] = gpus[0]
    return ctx.facts["gpu0"]["total_mib"]


def claim_driver(ctx: Ctx) -> str:
    gpus = smi_gpus()
    if not gpus:
        raise ClaimFailed("nvidia-smi answers but lists no GPU")
    ctx.facts["gpus"], ctx.facts["gpu0"] = gpus, gpus[0]
    g = gpus[0]
    flavor = FLAVOR_FILE.read_text().strip() if FLAVOR_FILE.exists() else "missing"
    if flavor != "gpu":
        raise ClaimFailed(f"GPU 0 is {g['name']} ({g['total_mib']:.0f} MiB), but setup installed the {flavor} "
                          f"TensorFlow ({FLAVOR_FILE}): run SALUS_TF=gpu scripts/setup.sh")
    c = ctx.client("driver-tf-inprocess", "info")
    info = c.result(timeout=180)
    if not info["built_with_cuda"] or not info["gpus"]:
        raise ClaimFailed(f"the venv's TensorFlow {info['tf']} (built with CUDA: {info['built_with_cuda']}) sees "
                          f"GPUs {info['gpus']} in-process: its CUDA libraries do not load (see "
                          f"{c.err_path.name}); run SALUS_TF=gpu scripts/setup.sh")
    return (f"GPU 0 {g['name']}, {g['total_mib']:.0f} MiB (driver {g['driver']}; {len(gpus)} GPU(s)); "
            f"setup flavor gpu; TensorFlow {info['tf']} in-process sees {len(info['gpus'])} GPU(s) "
            f"({info['gpu0'].get('device_name', '?')}, compute capability {info['gpu0'].get('compute_capability', '?')})")


def claim_server_sees_gpu(ctx: Ctx) -> str:
    server = ctx.server("server-sees-gpu")
    info = server.ctl("info")
    cuda, memory, devices = info["cuda"], info["memory"], info["devices"]
    kinds = sorted({d["device_type"] for d in devices})
    if ctx.rehearse:
        problems = []
        if not any(d["name"].endswith("device:CPU:0") for d in devices):
            problems.append(f"no CPU:0 in TensorFlow's device list {devices}")
        if memory["source"] != "none" and not cuda["cuda_build"]:
            problems.append(f"memory.source {memory['source']!r} without --memory-capacity on a CPU build")
        if problems:
            raise ClaimFailed("; ".join(problems))
        return (f"rehearsal: ctl info --json has every field the GPU check reads: TensorFlow {info['tensorflow_version']}"
                f" devices {kinds}, cuda_build {cuda['cuda_build']} ({cuda['error'] or 'no error'}), memory.source "
                f"{memory['source']!r}; on a GPU it needs cuda_build, GPU 0's total within 2% of nvidia-smi's, a GPU "
                f"device and memory.source 'cuda'")
    total_mib = gpu0_total_mib(ctx)
    problems = []
    if not cuda["cuda_build"]:
        problems.append("the server was built without the cuda feature: run scripts/setup.sh on this node (it "
                        "builds with --features salus-server/cuda where a driver is present)")
    elif cuda["error"]:
        problems.append(f"the server's CUDA query failed: {cuda['error']}")
    seen_mib = cuda["gpu0_total_bytes"] / MiB
    if cuda["cuda_build"] and not cuda["error"] and abs(seen_mib - total_mib) > 0.02 * total_mib:
        other = [g for g in ctx.facts.get("gpus", []) if abs(g["total_mib"] - seen_mib) <= 0.02 * g["total_mib"]]
        hint = (f" (it matches nvidia-smi's GPU {other[0]['index']}: CUDA orders GPUs fastest first; "
                f"CUDA_DEVICE_ORDER=PCI_BUS_ID makes them agree)") if other else ""
        problems.append(f"GPU 0 total {seen_mib:.0f} MiB (CUDA driver) against nvidia-smi's {total_mib:.0f} MiB{hint}")
    gpus = [d for d in devices if d["device_type"] == "GPU"]
    if not gpus:
        problems.append(f"TensorFlow's device list in the server has no GPU: {[d['name'] for d in devices]} "
                        f"(the server's log says why: {server.log_path})")
    if memory["source"] != "cuda":
        problems.append(f"memory.source is {memory['source']!r}, not 'cuda', without --memory-capacity")
    elif memory["capacity_bytes"] != cuda["gpu0_total_bytes"]:
        problems.append(f"capacity {memory['capacity_bytes']} != GPU 0 total {cuda['gpu0_total_bytes']}")
    if problems:
        raise ClaimFailed("; ".join(problems))
    # What the supervisor itself holds on the GPU (no TensorFlow runtime: a child listed the devices; only the
    # driver query at start is its own).
    apps = smi_apps()
    held = apps.get(server.pid)
    held_note = (f"the supervisor (pid {server.pid}) holds {held:.0f} MiB of GPU memory" if held is not None
                 else f"nvidia-smi lists no memory for the supervisor (pid {server.pid}; "
                      f"{nvidia_fds(server.pid)} /dev/nvidia* files open)")
    return (f"cuda build, GPU 0 {seen_mib:.0f} MiB (CUDA driver) vs {total_mib:.0f} MiB (nvidia-smi), "
            f"{cuda['gpu0_free_bytes'] / MiB:.0f} MiB free at start; TensorFlow lists "
            f"{', '.join(d['name'].split('device:')[-1] + ' ' + mib(d['memory_limit_bytes']) for d in gpus)}; "
            f"memory.source cuda, capacity {mib(memory['capacity_bytes'])}; {held_note}")


def claim_tf1(ctx: Ctx) -> str:
    dev = ctx.device
    server = ctx.server("tf1-on-gpu", env=DETERMINISTIC)
    args = ("--model", "adam", "--steps", "20", "--trace", "--name", "gpucheck-tf1")
    remote = ctx.client("tf1-through-server", "tf1", *args, env=DETERMINISTIC, server=server)
    local = ctx.client("tf1-in-process", "tf1", *args, env=DETERMINISTIC)
    r, loc = remote.result(timeout=240), local.result(timeout=240)
    problems = []
    if not on_device(r.get("matmul_devices"), dev):
        problems.append(f"through the server the MatMuls ran on {r.get('matmul_devices')}, not {dev} "
                        f"(trace devices {r.get('trace_devices')})")
    if not on_device(loc.get("matmul_devices"), dev):
        problems.append(f"in-process the MatMuls ran on {loc.get('matmul_devices')}, not {dev}")
    keys = ("losses", "sums")
    bad, worst = compare_numbers({k: loc[k] for k in keys}, {k: r[k] for k in keys})
    problems += bad[:3]
    if problems:
        raise ClaimFailed("; ".join(problems))
    return (f"MatMuls on {r['matmul_devices'][0]} through the server (FULL_TRACE step stats) and in-process; "
            f"{len(r['losses'])} losses and {len(r['sums'])} parameter sums {equality_note(worst)}; "
            f"TF_DETERMINISTIC_OPS=1 both sides")


def claim_tf2(ctx: Ctx) -> str:
    dev = ctx.device
    script = WORKLOADS / "tf2_keras3.py"
    if not script.exists():
        raise ClaimFailed(f"{script} is missing")
    server = ctx.server("tf2-on-gpu", env=DETERMINISTIC)
    remote = ctx.workload("tf2-through-server", script,
                          {**DETERMINISTIC, "SALUS_SERVER": server.address, "SALUS_JOB_NAME": "gpucheck-keras3",
                           "CUDA_VISIBLE_DEVICES": ""})
    local = ctx.workload("tf2-in-process", script, DETERMINISTIC)
    r, loc = remote.result(timeout=300), local.result(timeout=300)
    problems = []
    remote_ok = r["devices"] and all(d.startswith("/job:worker") and d.endswith(f"device:{dev}") for d in r["devices"])
    if not remote_ok:
        problems.append(f"through the server the weights are on {r['devices']}, not the server's {dev}")
    if not on_device(loc["devices"], dev):
        problems.append(f"in-process the weights are on {loc['devices']}, not {dev}")
    bad, worst = compare_numbers({k: v for k, v in loc.items() if k != "devices"},
                                 {k: v for k, v in r.items() if k != "devices"})
    problems += bad[:3]
    if problems:
        raise ClaimFailed("; ".join(problems))
    n = sum(len(v) for v in r["history"].values()) + len(r["evaluate"]) + len(r["predict"])
    return (f"Keras 3 weights and optimizer variables on {r['devices'][0]}; {n} numbers (history, evaluate, predict) "
            f"{equality_note(worst)} against in-process on {dev}")


def _hold_pair(ctx: Ctx, server: Server, label: str, tf1_model: str, tf2_model: str) -> tuple[dict, dict, list]:
    """The TF1 job, then the TF2 job (so neither's measured steps overlap the other's), each holding its session
    after 8 steps; returns their `ctl jobs` rows while both hold, and the release files."""
    rel = [ctx.hold_file(f"{label}-{k}") for k in ("tf1", "tf2")]
    a = ctx.client(f"{label}-tf1", "tf1", "--model", tf1_model, "--steps", "8", "--plain-steps", "3",
                   "--name", "gpucheck-tf1", "--hold", str(rel[0]), server=server)
    a.wait_phase("holding", 300)
    b = ctx.client(f"{label}-tf2", "tf2", "--model", tf2_model, "--steps", "8", "--hold", str(rel[1]),
                   env={"SALUS_JOB_NAME": "gpucheck-tf2"}, server=server)
    b.wait_phase("holding", 300)
    rows: dict = {}

    def measured() -> bool:
        rows.clear()
        rows.update(server.jobs())
        return all(rows.get(n, {}).get("ephemeral_source") == "measured" and rows[n]["lane"] is not None
                   for n in ("gpucheck-tf1", "gpucheck-tf2"))

    if not wait_until(measured, 30, 0.25):
        raise ClaimFailed("the server has not measured both jobs' ephemeral memory while they hold (name, lane, "
                          "memory state, ephemeral estimate and source): " + "; ".join(
                              f"{n} {r.get('lane')} {r.get('memory_state')} {r.get('ephemeral_estimate_bytes')} "
                              f"{r.get('ephemeral_source')}" for n, r in sorted(rows.items())))
    return rows["gpucheck-tf1"], rows["gpucheck-tf2"], rel


def _figures(rows: list[dict]) -> tuple[list[int], list[int], int, int]:
    p = [r["persistent_estimate_bytes"] for r in rows]
    e = [r["ephemeral_estimate_bytes"] for r in rows]
    return p, e, sum(p) + max(e), sum(p) + sum(e)


def claim_memory(ctx: Ctx) -> str:
    gpu = not ctx.rehearse
    dev = ctx.device
    tf1_model, tf2_model = ("mem_gpu", "mem_gpu") if gpu else ("mem_cpu", "mem_cpu")
    alloc_env = GPU_ALLOCATOR_ENV if gpu else {}
    ref_env = GPU_ALLOCATOR_ENV if gpu else CPU_STATS_ENV
    # TensorFlow's own figures for each job, in a process of its own (started first: they run meanwhile).
    ref1 = ctx.client("mem-tf1-in-process", "tf1", "--model", tf1_model, "--steps", "13", "--memory", dev, env=ref_env)
    ref2 = ctx.client("mem-tf2-in-process", "tf2", "--model", tf2_model, "--steps", "13", "--memory", dev, env=ref_env)
    # Every step after the warm-up is a main iteration whatever the device's speed (--cheap-below 0).
    common = ("--cheap-below", "0")

    # 1. Calibration: the server measures both jobs on a capacity that holds everything.
    cap1 = int(gpu0_total_mib(ctx) * 0.9) * MiB if gpu else 8 * GiB
    cal = ctx.server("mem-calibrate", "--memory-capacity", str(cap1), *common, env=alloc_env)
    row_a, row_b, rel = _hold_pair(ctx, cal, "mem-calibrate", tf1_model, tf2_model)
    for f in rel:
        f.touch()
    cal.stop()
    p, e, rule, mps_rule = _figures([row_a, row_b])
    capacity = rule + min(e) // 2
    if capacity >= mps_rule:
        raise ClaimFailed(f"the measured figures leave no gap between the rules: P {p}, E {e} bytes (TF1, TF2)")

    # 2. Admission on that capacity: both fit by sum(P)+max(E), not by sum(P+E); a third does not fit.
    srv = ctx.server("mem-admit", "--memory-capacity", str(capacity), "--admission-timeout", "8", *common,
                     env=alloc_env)
    baseline_mib = None
    if gpu:
        # A small job first, so the executor exists with its CUDA context: what it holds then is the baseline.
        warm = ctx.client("mem-admit-warmup", "tf1", "--model", "tiny", "--steps", "4", "--name", "gpucheck-warmup",
                          server=srv)
        warm.result(180)
        execs = wait_until(srv.executors, 10)
        if len(execs) != 1:
            raise ClaimFailed(f"expected one executor (one tenant) after the warm-up job, found {execs}")
        baseline_mib = smi_apps().get(execs[0])
    row_a, row_b, rel = _hold_pair(ctx, srv, "mem-admit", tf1_model, tf2_model)
    both = [row_a, row_b]
    if not all(r["memory_state"] == "admitted" for r in both):
        raise ClaimFailed(f"both jobs hold their sessions but are not both admitted: "
                          f"{[(r['name'], r['lane'], r['memory_state'], r['note']) for r in both]}")
    lanes = sorted({r["lane"] for r in both})
    # The figures the admission used (measured again in this run).
    p, e, rule, mps_rule = _figures(both)
    # What measured E (ctl jobs' ephemeral_meter): on a GPU the device allocator ("allocator") is the claim; a
    # "heap" there would mean the GPU allocator kept no statistics and host memory was counted instead.
    sources = (f"P {row_a['persistent_source']}/{row_b['persistent_source']}, "
               f"E {row_a['ephemeral_source']}/{row_b['ephemeral_source']} by "
               f"{row_a.get('ephemeral_meter') or '-'}/{row_b.get('ephemeral_meter') or '-'}")
    if mps_rule <= capacity:
        raise ClaimFailed(f"this run's figures (P {p}, E {e}) moved from the calibration's: sum(P+E) {mib(mps_rule)} "
                          f"fits the capacity {mib(capacity)} too, so the admission proves nothing")
    used_mib = None
    if gpu:
        execs = srv.executors()
        used_mib = smi_apps().get(execs[0]) if execs else None
    # A third job whose persistent need is more than the free pool could ever hold (with its ephemeral need it
    # still fits the device, so it is not refused at once): it waits, with the reason in ctl jobs, until
    # --admission-timeout, then gets RESOURCE_EXHAUSTED.
    p3 = capacity - rule + max(e) // 2
    third = ctx.client("mem-admit-third", "tf1", "--model", tf1_model, "--steps", "8",
                       "--name", f"gpucheck-third?persistent={p3}&ephemeral={min(e)}", server=srv)
    waiting: dict = {}
    while third.proc.poll() is None and not waiting:
        row = srv.jobs().get("gpucheck-third")
        if row and row["memory_state"] == "waiting for memory":
            waiting = row
        time.sleep(0.25)
    refused = third.result(120, allow_error=True)
    if refused.get("error") != "ResourceExhaustedError":
        raise ClaimFailed(f"the third job (persistent {mib(p3)}, {mib(capacity - rule)} free) was not refused with "
                          f"RESOURCE_EXHAUSTED: {refused}")
    wait_note = (f"waited ({waiting.get('note', '')[:200]})" if waiting
                 else "was refused before ctl jobs showed it waiting")
    for f in rel:
        f.touch()

    # 3. The three figures.
    r1, r2 = ref1.result(300), ref2.result(300)
    tf_p = r1["tf_persistent_bytes"] + r2["tf_persistent_bytes"]
    tf_lo = tf_p + max(r1["tf_ephemeral_min_bytes"], r2["tf_ephemeral_min_bytes"])
    tf_hi = tf_p + max(r1["tf_ephemeral_bytes"], r2["tf_ephemeral_bytes"])
    # The server's figures less Salus's margins (+10% persistent, +5% ephemeral), as measured.
    raw_rule = sum(v / 1.10 for v in p) + max(v / 1.05 for v in e)
    def span(r: dict) -> str:
        lo, hi = mib(r["tf_ephemeral_min_bytes"]), mib(r["tf_ephemeral_bytes"])
        return lo if lo == hi else f"{lo}-{hi}"

    figures = (f"server sum(P)+max(E) {mib(raw_rule)} as measured ({mib(rule)} with Salus's margins; P "
               f"{mib(p[0] / 1.1)}+{mib(p[1] / 1.1)}, E max({mib(e[0] / 1.05)}, {mib(e[1] / 1.05)}); {sources}), "
               f"TensorFlow's allocator in-process {mib(tf_lo)}" + (f"-{mib(tf_hi)}" if mib(tf_hi) != mib(tf_lo) else "") +
               f" (P {mib(r1['tf_persistent_bytes'])}+{mib(r2['tf_persistent_bytes'])}, E max({span(r1)}, "
               f"{span(r2)}) over {len(MEASURED_STEPS)} steps on {dev})")
    problems = []
    if tf_lo <= 0:
        problems.append("TensorFlow's allocator reported no memory in-process")
    elif not 0.9 * tf_lo <= raw_rule <= 1.1 * tf_hi:
        problems.append(f"the server's figure is {raw_rule / (tf_lo if raw_rule < tf_lo else tf_hi):.2f}x "
                        f"TensorFlow's")
    if gpu:
        if used_mib is None or baseline_mib is None:
            problems.append(f"nvidia-smi lists no memory for the executor (baseline {baseline_mib}, with both jobs "
                            f"{used_mib}): a PID namespace (container) hides it?")
            figures += ", nvidia-smi: not listed"
        else:
            rise = (used_mib - baseline_mib) * MiB
            figures += (f", nvidia-smi executor rise {mib(rise)} ({used_mib:.0f} MiB with both jobs, "
                        f"{baseline_mib:.0f} MiB after a warm-up job; allocator env {GPU_ALLOCATOR_ENV})")
            if rise <= 0:
                problems.append("nvidia-smi shows no rise of the executor's memory with both jobs")
            elif abs(raw_rule - rise) > 0.10 * rise:
                problems.append(f"the server's figure is {raw_rule / rise:.2f}x nvidia-smi's rise")
    admission = (f"capacity {mib(capacity)}: sum(P)+max(E) {mib(rule)} fits, sum(P+E) {mib(mps_rule)} would not; "
                 f"both admitted and holding at once (lane{'s' if len(lanes) > 1 else ''} {lanes}); a third job "
                 f"(persistent {mib(p3)}) {wait_note}, then got RESOURCE_EXHAUSTED ({refused['message'][:240]})")
    if problems:
        raise ClaimFailed("; ".join(problems) + f" -- {figures}; {admission}")
    return f"{admission}; {figures}" + ("" if gpu else "; nvidia-smi not asked (rehearsal)")


def claim_gpu_lanes(ctx: Ctx) -> str:
    if ctx.rehearse:
        raise ClaimSkipped("TensorFlow makes virtual GPUs only on a GPU; on a CPU the lanes are admission budgets "
                           "(integration_tests/test_memory_lanes.py and the server's unit tests check those)")
    lane_bytes = 1 * GiB
    server = ctx.server("gpu-lanes", "--gpu-lanes", "2", "--memory-capacity", str(2 * lane_bytes))
    info = server.ctl("info")
    gpus = [d for d in info["devices"] if d["device_type"] == "GPU"]
    if len(gpus) < 2:
        raise ClaimFailed(f"TensorFlow in the server lists {[d['name'] for d in gpus]}: not two virtual GPUs")
    go = ctx.hold_file("gpu-lanes-hog-go")
    stop = ctx.hold_file("gpu-lanes-trainer-stop")
    hog = ctx.client("gpu-lanes-hog", "hog", "--name", "gpucheck-hog", "--big-bytes", str(lane_bytes * 5 // 4),
                     "--go", str(go), server=server)
    held = hog.wait_phase("holding", 240)
    trainer = ctx.client("gpu-lanes-trainer", "tf1", "--model", "adam", "--stop-file", str(stop), "--progress", "5",
                         "--trace", "--name", "gpucheck-trainer", server=server)
    trainer.wait_phase("running", 240)
    rows = server.jobs()
    hog_row, tr_row = rows.get("gpucheck-hog"), rows.get("gpucheck-trainer")
    if not hog_row or not tr_row or hog_row["lane"] is None or tr_row["lane"] is None \
            or hog_row["lane"] == tr_row["lane"]:
        raise ClaimFailed(f"the two jobs are not in two lanes: hog {hog_row and hog_row['lane']}, "
                          f"trainer {tr_row and tr_row['lane']}")
    go.touch()
    oom = hog.result(120, allow_error=True)
    time.sleep(2)  # the trainer goes on
    stop.touch()
    done = trainer.result(120)
    problems = []
    if oom.get("error") != "ResourceExhaustedError":
        problems.append(f"allocating {mib(lane_bytes * 5 // 4)} in a lane of {mib(lane_bytes)} gave {oom}")
    if done.get("last_step_end") is None or done["last_step_end"] <= oom.get("at", float("inf")):
        problems.append("the trainer did not run a step after the other lane's job failed")
    lane_dev = f"GPU:{tr_row['lane']}"
    if not on_device(done.get("matmul_devices"), lane_dev):
        problems.append(f"the trainer's MatMuls ran on {done.get('matmul_devices')}, not its lane's {lane_dev}")
    if not on_device(held.get("fill_devices"), f"GPU:{hog_row['lane']}"):
        problems.append(f"the hog's Fill ran on {held.get('fill_devices')}, not its lane's GPU:{hog_row['lane']}")
    if problems:
        raise ClaimFailed("; ".join(problems))
    return (f"TensorFlow lists {', '.join(d['name'].split('device:')[-1] + ' ' + mib(d['memory_limit_bytes']) for d in gpus)}; "
            f"hog in lane {hog_row['lane']}, trainer in lane {tr_row['lane']} (ops on {lane_dev}); "
            f"{mib(lane_bytes * 5 // 4)} in the hog's lane failed with RESOURCE_EXHAUSTED "
            f"({oom['message'][:100]}); the trainer finished {done['steps']} steps")


def _two_tenants(ctx: Ctx, label: str, env: dict | None = None) -> tuple[str, Server, dict]:
    """Two token tenants' TF1 jobs holding at once: what each one's executor holds, and (by tenant) the executors'
    environments, read while they held."""
    server = ctx.server(label, "--isolation", "tenant", env=env)
    tokens = {}
    for t in ("gpucheck-a", "gpucheck-b"):
        issued = server.ctl("token", "issue", "--tenant", t)
        tokens[t] = issued["token"]
    rel = {t: ctx.hold_file(f"{label}-{t}") for t in tokens}
    jobs = {t: ctx.client(f"{label}-{t}", "tf1", "--model", "adam", "--steps", "8", "--name", f"job-{t}",
                          "--hold", str(rel[t]), server=server, token=tokens[t], env=env) for t in tokens}
    for c in jobs.values():
        c.wait_phase("holding", 300)
    execs = wait_until(lambda: len(server.executors()) >= 2 and server.executors(), 15)
    environs = {pid: proc_environ(pid) for pid in (execs or [])}
    by_tenant = {environ.get("SALUS_EXECUTOR_TENANT", "?"): pid for pid, environ in environs.items()}
    if sorted(by_tenant) != sorted(tokens):
        raise ClaimFailed(f"expected one executor per tenant {sorted(tokens)}, found {by_tenant} "
                          f"(executors {execs})")
    held = {}
    if ctx.rehearse:
        for t, pid in by_tenant.items():
            held[t] = f"executor pid {pid}, RSS {mib(proc_rss(pid))}"
        ok, listing = True, "PIDs from /proc (rehearsal)"
    else:
        apps = smi_apps()
        missing = [t for t, pid in by_tenant.items() if pid not in apps]
        for t, pid in by_tenant.items():
            used = apps.get(pid)
            held[t] = (f"executor pid {pid}, {used:.0f} MiB" if used is not None
                       else f"executor pid {pid}, not listed ({nvidia_fds(pid)} /dev/nvidia* open)")
        sup = apps.get(server.pid)
        listing = (f"nvidia-smi lists {sorted(apps)}" +
                   (f"; the supervisor {server.pid} holds {sup:.0f} MiB" if sup is not None else ""))
        ok = not missing
        if not ok:
            raise ClaimFailed(f"nvidia-smi does not list the executors of {missing}: {held}; {listing} "
                              f"(a PID namespace hides them?)")
    for f in rel.values():
        f.touch()
    for c in jobs.values():
        c.result(120)
    return ("; ".join(f"{t}: {held[t]}" for t in sorted(held)) + f"; {listing}", server,
            {t: environs[pid] for t, pid in by_tenant.items()})


def claim_tenant_contexts(ctx: Ctx) -> str:
    detail, _, _ = _two_tenants(ctx, "tenant-contexts")
    return f"two tenants' jobs held at once, each in its own executor process: {detail}"


def claim_mps(ctx: Ctx) -> str:
    if ctx.rehearse:
        raise ClaimSkipped("MPS needs a GPU")
    control = shutil.which("nvidia-cuda-mps-control")
    if not control:
        raise ClaimSkipped("nvidia-cuda-mps-control is not on PATH (MPS comes with the NVIDIA driver's utilities; "
                           "install them to check executors under MPS)")
    base = ctx.logdir / "mps"
    pipe, log = base / "pipe", base / "log"
    for d in (base, pipe, log):
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o777)  # the executors of token tenants run as nobody when the check runs as root
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    start = subprocess.run([control, "-d"], env=base_env(**env), capture_output=True, text=True, timeout=30)
    if start.returncode != 0:
        raise ClaimFailed(f"nvidia-cuda-mps-control -d exited with {start.returncode}: "
                          f"{(start.stdout + start.stderr).strip()[-300:]}")

    def stop_mps():
        subprocess.run([control], input="quit\n", env=base_env(**env), capture_output=True, text=True, timeout=30)
        time.sleep(1)
        # Left over only if quit failed: the MPS processes that use this check's pipe directory.
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    name = (entry / "comm").read_text().strip()
                except OSError:
                    continue
                if name.startswith("nvidia-cuda-mps") and \
                        proc_environ(int(entry.name)).get("CUDA_MPS_PIPE_DIRECTORY") == str(pipe):
                    kill_pid(int(entry.name))

    ctx.cleanups.append(stop_mps)
    detail, _, executors = _two_tenants(ctx, "mps", env=env)
    # The supervisor passes CUDA_* variables on to the executors it starts: that is how they find the daemon.
    unset = [t for t, environ in executors.items() if environ.get("CUDA_MPS_PIPE_DIRECTORY") != str(pipe)]
    if unset:
        raise ClaimFailed(f"the executors of {unset} do not have CUDA_MPS_PIPE_DIRECTORY={pipe}: {detail}")
    servers = subprocess.run([control], input="get_server_list\n", env=base_env(**env), capture_output=True,
                             text=True, timeout=30).stdout.split()
    control_log = log / "control.log"
    clients = 0
    if control_log.exists():
        clients = sum("New client" in line for line in control_log.read_text(errors="replace").splitlines())
    if not servers and not clients:
        raise ClaimFailed(f"the jobs ran but MPS saw no client (no MPS server, no 'New client' in {control_log}): "
                          f"{detail}")
    return (f"MPS daemon with its own pipe/log dirs (MPS servers {servers or '?'}, {clients} client connections "
            f"logged); {detail}")


def claim_switch_latency(ctx: Ctx) -> str:
    dev = ctx.device
    server = ctx.server("switch-latency")
    go = ctx.hold_file("switch-latency-go")
    jobs = [ctx.client(f"switch-latency-{k}", "tf1", "--model", "tiny", "--seconds", "5", "--trace",
                       "--name", f"gpucheck-switch-{k}", "--ready", str(ctx.logdir / f"switch-{k}.ready"),
                       "--go", str(go), server=server) for k in ("a", "b")]
    if not wait_until(lambda: all((ctx.logdir / f"switch-{k}.ready").exists() for k in ("a", "b")), 180):
        raise ClaimFailed("the two jobs did not get ready")
    go.touch()
    results = [j.result(180) for j in jobs]
    for r in results:
        if not on_device(r.get("matmul_devices"), dev):
            raise ClaimFailed(f"a job's MatMuls ran on {r.get('matmul_devices')}, not {dev}")
    lat = server.ctl("stats")["switch_latency_us"]
    if not lat.get("count"):
        raise ClaimFailed(f"the server measured no switch between the two jobs ({lat})")
    return (f"{lat['count']} switches between two TF1 jobs on {dev} ({sum(r['steps'] for r in results)} steps in "
            f"5 s): p50 {lat['p50']:.0f} us, p99 {lat['p99']:.0f} us, max {lat['max']:.0f} us (ctl stats)")


@dataclass
class Claim:
    name: str
    statement: str
    fn: Callable[[Ctx], str]
    timeout: int
    rehearse: str | None  # why it has no CPU meaning (None: it runs in rehearsal)


CLAIMS = [
    Claim("driver", "nvidia-smi answers with GPU 0's name and total memory, setup installed the GPU wheel "
                    "(.venv/.salus-tf-flavor is gpu) and that TensorFlow sees the GPU in-process",
          claim_driver, 240, "no NVIDIA driver to ask on a CPU"),
    Claim("server-sees-gpu", "a salus-server started without --memory-capacity reports (ctl info --json) a cuda build, "
                             "GPU 0's total within 2% of nvidia-smi's, a GPU in TensorFlow's device list and "
                             "memory.source cuda",
          claim_server_sees_gpu, 240, None),
    Claim("tf1-on-gpu", "a TF1 graph job (MLP, Adam) through the server runs its MatMuls on GPU:0 (FULL_TRACE step "
                        "stats) with losses and parameter sums equal (rtol 1e-5) to the same graph in-process on "
                        "GPU:0, TF_DETERMINISTIC_OPS=1 on both sides",
          claim_tf1, 300, None),
    Claim("tf2-on-gpu", "a Keras 3 script (integration_tests/workloads/tf2_keras3.py) through the server has its "
                        "weights on the server's GPU:0 and every number (history, evaluate, predict) equal "
                        "(rtol 1e-5) to the same script in-process on GPU:0",
          claim_tf2, 360, None),
    Claim("memory-admission", "a TF1 and a TF2 job whose P and E (as the server measured them) fit --memory-capacity "
                              "only by sum(P)+max(E) are both admitted and hold at once, a third waits and gets "
                              "RESOURCE_EXHAUSTED, and the server's sum(P)+max(E) is within 10% of TensorFlow's "
                              "in-process allocator figures and of nvidia-smi's rise of the executor",
          claim_memory, 540, None),
    Claim("gpu-lanes", "with --gpu-lanes 2 TensorFlow lists two virtual GPUs, two jobs are bound to different lanes, "
                       "and a job allocating 1.25x its lane fails with RESOURCE_EXHAUSTED while the other one goes on "
                       "and finishes",
          claim_gpu_lanes, 300, "virtual GPUs exist only on a GPU"),
    Claim("tenant-contexts", "two token tenants' jobs (--isolation tenant) hold at once in two executor processes, "
                             "each with its own CUDA context: nvidia-smi lists both executor PIDs (used memory printed)",
          claim_tenant_contexts, 300, None),
    Claim("mps", "tenant-contexts again under an MPS control daemon of its own (temporary pipe and log directories), "
                 "stopped afterwards; SKIP without nvidia-cuda-mps-control",
          claim_mps, 300, "MPS needs a GPU"),
    Claim("switch-latency", "two TF1 jobs of tiny steps busy at once on GPU:0: the server's switch latency "
                            "(ctl stats --json switch_latency_us count/p50/p99/max) printed, no threshold",
          claim_switch_latency, 240, None),
]
BY_NAME = {c.name: c for c in CLAIMS}


# ============================================================================================================
# Main
# ============================================================================================================

def self_check() -> list[str]:
    """Problems with the check's own files: shellcheck (or bash -n) on the wrapper, py_compile on this file."""
    problems = []
    checker = shutil.which("shellcheck")
    cmd = [checker, str(WRAPPER)] if checker else ["bash", "-n", str(WRAPPER)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            problems.append(f"{' '.join(cmd)}: {(proc.stdout + proc.stderr).strip()[-1000:]}")
    except (OSError, subprocess.TimeoutExpired) as e:
        problems.append(f"{' '.join(cmd)}: {e}")
    try:
        with tempfile.TemporaryDirectory() as d:
            py_compile.compile(str(SCRIPT), cfile=str(Path(d) / "gpu_check.pyc"), doraise=True)
    except py_compile.PyCompileError as e:
        problems.append(f"py_compile: {e.msg}")
    return problems


def parse_only(text: str | None) -> list[Claim]:
    if not text:
        return list(CLAIMS)
    chosen = []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name.isdigit() and 1 <= int(name) <= len(CLAIMS):
            claim = CLAIMS[int(name) - 1]
        elif name in BY_NAME:
            claim = BY_NAME[name]
        else:
            print(f"gpu_check: unknown claim {name!r} in --only; the claims are "
                  f"{', '.join(c.name for c in CLAIMS)} (or their numbers 1-{len(CLAIMS)})", file=sys.stderr)
            raise SystemExit(2)
        if claim not in chosen:
            chosen.append(claim)
    if not chosen:
        print("gpu_check: --only names no claim", file=sys.stderr)
        raise SystemExit(2)
    return [c for c in CLAIMS if c in chosen]  # in the claims' order


def _on_alarm(signum, frame):
    raise ClaimTimeout()


def _on_term(signum, frame):
    raise KeyboardInterrupt()


def run_claim(claim: Claim, ctx: Ctx, budget_left: float) -> tuple[str, str]:
    if ctx.rehearse and claim.rehearse:
        return "SKIP", f"rehearsal on a CPU: {claim.rehearse}"
    limit = int(min(claim.timeout, budget_left))
    if limit < 30:
        return "SKIP", f"no time left in the run's budget ({budget_left:.0f} s)"
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(limit)
    try:
        try:
            return "PASS", claim.fn(ctx)
        finally:
            signal.alarm(0)
            ctx.cleanup()
    except ClaimSkipped as e:
        return "SKIP", str(e)
    except ClaimFailed as e:
        return "FAIL", str(e)
    except ClaimTimeout:
        return "FAIL", f"did not finish within {limit} s"
    except subprocess.TimeoutExpired as e:
        return "FAIL", f"a command timed out: {e}"
    except Exception as e:  # noqa: BLE001 (a bug in a claim is that claim's failure, not the run's)
        return "FAIL", f"{type(e).__name__}: {e}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpu_check.sh",
        description="Check Salus's GPU claims on this node, one line per claim (PASS/FAIL/SKIP).",
        epilog="Claims: " + "; ".join(f"{i}. {c.name}" for i, c in enumerate(CLAIMS, 1)) +
               ". GPU_CHECK_ALLOCATOR=bfc: claim memory-admission with TensorFlow's BFC allocator (with growth) "
               "instead of cudaMallocAsync.")
    ap.add_argument("--dry-run", action="store_true", help="list the claims and exit")
    ap.add_argument("--rehearse-on-cpu", action="store_true",
                    help="run the claims that mean something on a CPU against CPU:0 (no GPU needed)")
    ap.add_argument("--keep-logs", metavar="DIR", help="write the servers' and clients' logs here and keep them")
    ap.add_argument("--only", metavar="CLAIM,...", help="run only these claims (names or numbers)")
    ap.add_argument("--budget", type=float, default=570, help="seconds for the whole run (default 570)")
    args = ap.parse_args(argv)
    claims = parse_only(args.only)

    if args.dry_run:
        for i, c in enumerate(CLAIMS, 1):
            if c in claims:
                cpu = "rehearsed on CPU" if c.rehearse is None else "GPU only"
                print(f"{i}. {c.name}: {c.statement} [{cpu}; limit {c.timeout} s]")
        print(f"gpu_check: {len(claims)} claim(s) listed, nothing started (dry run)")
        return 0

    present, why = gpu_driver_present()
    if not present and not args.rehearse_on_cpu:
        print(f"gpu_check: no NVIDIA GPU here ({why}): nothing to prove; --dry-run lists the claims")
        problems = self_check()
        for p in problems:
            print(f"gpu_check: self-check failed: {p}", file=sys.stderr)
        return 1 if problems else 0

    if args.rehearse_on_cpu:
        # CPU:0 even on a GPU node: no process of the rehearsal sees a GPU.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if args.keep_logs:
        logdir = Path(args.keep_logs).resolve()
        logdir.mkdir(parents=True, exist_ok=True)
    else:
        logdir = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    # Executors of token tenants run as nobody when this runs as root: they must reach their working directory.
    os.chmod(logdir, 0o711)
    signal.signal(signal.SIGTERM, _on_term)
    mode = "rehearsal on CPU:0" if args.rehearse_on_cpu else f"GPU node ({why})"
    print(f"gpu_check: {mode}; {len(claims)} claim(s); logs in {logdir}", flush=True)
    ctx_facts: dict = {}
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    started = time.monotonic()
    interrupted = False
    for claim in claims:
        ctx = Ctx(logdir=logdir, rehearse=args.rehearse_on_cpu, facts=ctx_facts)
        t0 = time.monotonic()
        try:
            verdict, detail = run_claim(claim, ctx, args.budget - (t0 - started))
        except KeyboardInterrupt:
            ctx.cleanup()
            verdict, detail, interrupted = "FAIL", "interrupted", True
        detail = " ".join(detail.split())  # one line per claim, whatever a message held
        if verdict == "FAIL":
            detail += f" (logs: {logdir})"
        if verdict != "SKIP":
            detail += f" [{time.monotonic() - t0:.1f} s]"
        counts[verdict] += 1
        print(f"{verdict} {claim.name}: {detail}", flush=True)
        if interrupted:
            break
    total = time.monotonic() - started
    keep = bool(args.keep_logs) or counts["FAIL"] > 0
    if not keep:
        shutil.rmtree(logdir, ignore_errors=True)
    print(f"gpu_check: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
          f"({total:.0f} s" + (f"; logs kept in {logdir})" if keep else ")"), flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
    else:
        sys.exit(main())
