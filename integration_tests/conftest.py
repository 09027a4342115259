"""Shared fixtures for the end-to-end tests: one salus-server for the whole pytest session.

Environment:
  SALUS_SERVER_BIN    path of the server binary (default <repo>/target/release/salus-server)
  SALUS_CLI_BIN       path of the `salus` CLI (default: beside the server binary)
  SALUS_TEST_TARGET   grpc://host:port of an already running server; no binary is started. Used to check the
                      TF-script tests against TensorFlow's own server (tf.distribute.Server). Tests of
                      Salus-only behaviour skip themselves when that target is not a Salus server (it does
                      not answer the gRPC health service); against the real binary they always run.
  SALUS_CI_PHASES     the times of the phases before pytest ("name N s; ..."), set by scripts/test.sh: the
                      summary prints them with pytest's own, just above its last line.
  SALUS_TEST_PYTHON   the interpreter the tests start their TensorFlow programs with (default .venv's); the
                      GPU-wheel run (test_gpu_wheel.py) sets .venv-gpu's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# Before TensorFlow is imported anywhere in this process: quiet C++ logs.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Before grpc is imported: no fork handlers in this process's children (see `as_user`); the tests' own gRPC
# never crosses a fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import grpc  # noqa: E402
import pytest  # noqa: E402

import salus_wire as wire  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
WORKLOADS = TESTS / "workloads"
LISTEN_RE = re.compile(r"^salus-server listening on (127\.0\.0\.1:\d+)\s*$")
START_TIMEOUT_S = 90  # the server loads libtensorflow at start; a busy 2-core machine is slow
STOP_TIMEOUT_S = 60


_SESSION_STARTED = [time.monotonic()]
# Seconds per test file (setup, call and teardown), for the phases' summary.
_FILE_SECONDS: dict[str, float] = {}


def pytest_sessionstart(session):
    _SESSION_STARTED[0] = time.monotonic()


# scripts/test.sh runs the files on two pytest-xdist workers (`--dist loadfile`: a file's tests, and so its
# module-scoped servers, stay on one worker), each taking the next file in collection order when it runs dry.
# The longest files go first (as measured on 2 cores, scripts/test.sh's summary prints them), so that neither
# worker is left with a long file at the end (the GPU-wheel suites among them); then the rest as pytest found
# them; the build checks last, when the background builds have had the whole suite.
FILES_FIRST = ("test_tenant_isolation.py", "test_scheduler.py", "test_tf2_scheduling.py",
               "test_tf2_python_pipeline.py", "test_slurm.py", "test_tf2_faults.py", "test_tf2_old_client.py",
               "test_k8s_device_plugin.py", "test_ray.py", "test_python_adapter.py", "test_tf2_eager.py",
               "test_release_wheel.py", "test_gpu_wheel.py")
FILES_LAST = ("test_background_builds.py",)


def _file_rank(nodeid: str) -> int:
    name = nodeid.split("::")[0].rsplit("/", 1)[-1]
    if name in FILES_FIRST:
        return FILES_FIRST.index(name) - len(FILES_FIRST)
    return 1 if name in FILES_LAST else 0


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: _file_rank(item.nodeid))  # stable: a file's tests keep their order


# What the whole run shares across xdist workers (the Unix test users) is made once, under a lock, in a
# directory the first process (the xdist controller, or pytest alone) makes, and undone by that process at the end.
SHARED_DIR_VAR = "_SALUS_TESTS_SHARED_DIR"


def pytest_configure(config):
    if SHARED_DIR_VAR not in os.environ:
        import tempfile
        os.environ[SHARED_DIR_VAR] = tempfile.mkdtemp(prefix="salus-tests-")
        config.salus_shared_dir = Path(os.environ[SHARED_DIR_VAR])


def pytest_unconfigure(config):
    shared = getattr(config, "salus_shared_dir", None)
    if shared is None:
        return
    record = shared / "unix-users.json"
    if record.exists():
        _restore_modes(json.loads(record.read_text()).get("modes", []))
        for name in TEST_USERS:
            subprocess.run(["userdel", "-r", name], capture_output=True)
    shutil.rmtree(shared, ignore_errors=True)
    os.environ.pop(SHARED_DIR_VAR, None)


def pytest_runtest_logreport(report):
    name = report.nodeid.split("::")[0]
    _FILE_SECONDS[name] = _FILE_SECONDS.get(name, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    phases = [p.strip() for p in os.environ.get("SALUS_CI_PHASES", "").split(";") if p.strip()]
    if not phases:
        return
    phases.append(f"pytest {time.monotonic() - _SESSION_STARTED[0]:.0f} s")
    seconds = Path(os.environ.get("SALUS_CI_BACKGROUND", "/nonexistent")) / "seconds"
    if seconds.exists():
        phases.append(f"build checks: fuzz build and seeds, then the book (beside pytest) {seconds.read_text().strip()} s")
    gpu_wheel = seconds.parent / "gpu-wheel"
    times = {name: (gpu_wheel / f"{name}-seconds").read_text().strip()
             for name in ("venv", "suites") if (gpu_wheel / f"{name}-seconds").exists()}
    if times:
        phases.append(f"GPU wheel: venv {times.get('venv', '?')} s (beside setup), "
                      f"suites {times.get('suites', '?')} s (in pytest)")
    slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:12]
    phases.append("slowest test files: " + ", ".join(f"{name} {s:.0f} s" for name, s in slowest))
    terminalreporter.write_sep("=", "phases of scripts/test.sh")
    for phase in phases:
        terminalreporter.write_line(phase)


def server_bin() -> Path:
    return Path(os.environ.get("SALUS_SERVER_BIN", REPO / "target" / "release" / "salus-server"))


def cli_bin() -> Path:
    """The `salus` CLI: $SALUS_CLI_BIN, else beside the server binary (cargo builds both into target/release)."""
    return Path(os.environ.get("SALUS_CLI_BIN", server_bin().parent / "salus"))


def venv_python() -> str:
    """The project's venv interpreter for subprocesses (falls back to the one running pytest). SALUS_TEST_PYTHON
    names another (scripts/test.sh's GPU-wheel run: .venv-gpu's)."""
    chosen = os.environ.get("SALUS_TEST_PYTHON")
    if chosen:
        return chosen
    p = REPO / ".venv" / "bin" / "python"
    return str(p) if p.exists() else sys.executable


def child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1", PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.update(extra)
    return env


# TensorFlow turns its oneDNN CPU kernels and allocator on or off by CPU (measured: on for an AMD EPYC with AVX-512
# VNNI and BF16, off for an AMD EPYC with AVX2 only); TF_ENABLE_ONEDNN_OPTS overrides it. Memory accounting and kernels differ between the
# two, so the tests that depend on them run under both, whatever this machine's default is.
ONEDNN_SETTINGS = {"onednn-off": "0", "onednn-on": "1"}


def onednn_env(setting: str) -> dict:
    """The environment (for a server and its reference runs alike) that fixes TensorFlow's oneDNN setting."""
    return {"TF_ENABLE_ONEDNN_OPTS": setting}


@pytest.fixture(params=sorted(ONEDNN_SETTINGS), scope="module")
def onednn(request) -> dict:
    """Each oneDNN setting in turn (module-scoped, so a module's servers for one setting can be shared)."""
    return onednn_env(ONEDNN_SETTINGS[request.param])


# TensorFlow's default CPU allocator keeps statistics (`get_memory_info`, RunMetadata's allocator_bytes_in_use)
# only with oneDNN on; its BFC CPU allocator keeps them under both settings. A reference run that reads
# TensorFlow's own accounting uses it, so the reference exists on every CPU (allocations are the kernels' own
# requests either way; BFC rounds each up to 256 bytes).
ALLOCATOR_STATS_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}


def compile_c(source: Path, output: Path, *flags: str, libs: tuple[str, ...] = ()) -> Path:
    """`cc -Wall -Werror FLAGS -o OUTPUT SOURCE LIBS` (a test's own C program or preload library; libraries after
    the source, as the linker needs them); fails the test with the compiler's message."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail(f"no C compiler (cc) on PATH: the test builds {source.name} with it")
    cmd = [cc, "-Wall", "-Werror", *flags, "-o", str(output), str(source), *libs]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr[-4000:]}"
    return output


class SalusProcess:
    """A salus-server child started on a free port; stopped by its own PID only."""

    def __init__(self, log_path: Path, extra_args: tuple[str, ...] = (), cwd: Path | None = None,
                 listen: str = "127.0.0.1:0", env: dict | None = None, binary: Path | None = None):
        """`listen`: a fixed address, to restart a server on the port of one that died (default: a free port);
        `env`: extra environment variables for the server; `binary`: another salus-server than the build's."""
        binary = (binary or server_bin()).resolve()  # absolute: the child runs in another directory
        if not binary.exists():
            pytest.fail(f"salus-server binary not found at {binary}: build it (cargo build --release), set "
                        f"SALUS_SERVER_BIN, or point SALUS_TEST_TARGET at a running server")
        self.log_path = log_path
        # Each server keeps its issued tokens in a state directory of its own (a test's tokens must not outlive
        # its server into another's, nor two servers share root's default /var/lib/salus/state), unless the
        # caller names one (a restart test reuses it).
        if "--state-dir" not in extra_args and "SALUS_STATE_DIR" not in (env or {}):
            extra_args = ("--state-dir", str(log_path.with_name(log_path.name + ".state")), *extra_args)
        self._log = open(log_path, "ab")
        # The server's working directory holds its default per-job checkpoint directories.
        self.proc = subprocess.Popen([str(binary), "--listen", listen, *extra_args],
                                     stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
                                     cwd=cwd or log_path.parent, env={**os.environ, **env} if env else None)
        self.pid = self.proc.pid
        self.address = self._wait_listening()
        self.target = f"grpc://{self.address}"

    def _wait_listening(self) -> str:
        # Read stdout on a thread so a silent or hung server cannot block the test past the timeout.
        found: list[str] = []
        ready = threading.Event()
        self.stdout_lines: list[str] = []  # every stdout line so far (e.g. "salus-server metrics on ADDR")

        def reader():
            for raw in self.proc.stdout:  # keeps draining afterwards so the pipe never fills
                line = raw.decode(errors="replace")
                self.stdout_lines.append(line)
                m = LISTEN_RE.match(line)
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        if not ready.wait(START_TIMEOUT_S) or not found:
            self.kill()
            pytest.fail(f"salus-server did not print its listening line within {START_TIMEOUT_S}s "
                        f"(exit code {self.proc.poll()}); stderr tail:\n{self.stderr_tail()}")
        return found[0]

    def stderr_tail(self, n: int = 4000) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, sig)

    def stop(self, sig: int = signal.SIGINT, timeout: float = STOP_TIMEOUT_S) -> int:
        """Graceful stop; returns the exit code (kills by PID and fails if it does not exit in time). SIGINT: a
        full stop (under --isolation tenant SIGTERM stops only the supervisor and leaves its executors and their
        jobs for the next one, docs/src/operator/restarts.md)."""
        self.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"salus-server (pid {self.pid}) did not exit within {timeout}s of signal {sig}; "
                        f"stderr tail:\n{self.stderr_tail()}")
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)


def is_salus_server(address: str) -> bool:
    """Salus answers grpc.health.v1; TensorFlow's own server answers UNIMPLEMENTED."""
    with grpc.insecure_channel(address) as ch:
        try:
            return wire.health_check(ch) == wire.SERVING
        except grpc.RpcError:
            return False


# The shared server outlives every test of its worker, some of which leave a client's request or stream behind
# (killed clients, held callback streams): at its stop it would give them the production grace (30 s, idle CPU
# at the end of the run). Shutdown itself is tested with servers of its own (test_lifecycle, test_tf2_lifecycle).
SHARED_SERVER_SHUTDOWN = ("--shutdown-grace", "3s")


@pytest.fixture(scope="session")
def salus_server(tmp_path_factory):
    """(target, SalusProcess or None). None when SALUS_TEST_TARGET names an external server."""
    external = os.environ.get("SALUS_TEST_TARGET")
    if external:
        yield external, None
        return
    # Tests save checkpoints under their tmp_path: the shared server's checkpoint root is pytest's base.
    root = str(tmp_path_factory.getbasetemp())
    server = SalusProcess(tmp_path_factory.mktemp("salus") / "salus-server.stderr.log",
                          ("--checkpoint-root", root, *SHARED_SERVER_SHUTDOWN))
    yield server.target, server
    code = server.stop()
    assert code == 0, f"salus-server exited with {code} after SIGINT; stderr tail:\n{server.stderr_tail()}"


@pytest.fixture(scope="session")
def salus_target(salus_server) -> str:
    """grpc://127.0.0.1:PORT of the shared server."""
    return salus_server[0]


@pytest.fixture(scope="session")
def salus_address(salus_target) -> str:
    return salus_target.removeprefix("grpc://")


@pytest.fixture(scope="session")
def is_salus(salus_server, salus_address) -> bool:
    return salus_server[1] is not None or is_salus_server(salus_address)


@pytest.fixture
def salus_only(is_salus):
    """For checks of behaviour TensorFlow's own server does not have (health service, Salus error codes)."""
    if not is_salus:
        pytest.skip("Salus-only behaviour; SALUS_TEST_TARGET is not a Salus server")


@pytest.fixture(scope="session")
def channel(salus_address):
    ch = grpc.insecure_channel(salus_address)
    yield ch
    ch.close()


def run_python(script: Path | str, *args: str, timeout: float = 300, env: dict | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run a python script with the venv's interpreter (quiet TF logs, legacy Keras)."""
    proc = subprocess.run([venv_python(), str(script), *args], capture_output=True, text=True,
                          timeout=timeout, env=env or child_env(), stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        pytest.fail(f"{script} {' '.join(args)} exited with {proc.returncode}\n"
                    f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc


def start_python(script: Path | str, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([venv_python(), str(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or child_env(),
                            stdin=subprocess.DEVNULL)


def last_json_line(stdout: str) -> dict:
    """Workload scripts print their result as the last line of stdout, as JSON."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON result line in output:\n{stdout[-2000:]}"
    return json.loads(lines[-1])


def executors_of(state: Path) -> list[int]:
    """Executor processes started with this state directory among their arguments (they inherit the supervisor's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(state).encode() in args and b"executor" in args:
            found.append(int(entry.name))
    return found


def wait_until(pred, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


# --- real Unix users as tenants -------------------------------------------------------------------------

TEST_USERS = ("salus-ta", "salus-tb")


def _made_traversable(paths) -> list[tuple[str, int]]:
    """Adds o+x (search, not read) to every ancestor directory of `paths` that lacks it, so other users can
    reach the interpreter and the venv (pyenv's Python lives under /root, mode 0700, on these machines).
    Returns what was changed, for `_restore_modes`."""
    changed = []
    for path in paths:
        p = Path(path).resolve()
        for directory in [*reversed(p.parents)]:
            mode = directory.stat().st_mode
            if not mode & 0o001:
                os.chmod(directory, mode | 0o001)
                changed.append((str(directory), mode & 0o7777))
    return changed


def _restore_modes(changed) -> None:
    for directory, mode in reversed(changed):
        os.chmod(directory, mode)


@pytest.fixture(scope="session")
def unix_users():
    """Two real Unix users with home directories (0700), created once for the test run (whichever xdist worker
    asks first; the others wait on the lock and use them) and removed at its end (`pytest_unconfigure`):
    {name: pwd entry}. Needs root (CI runs as root); the interpreter and the venv are made reachable for them
    (o+x on their ancestors) while the run lasts, and the modes restored after."""
    import fcntl
    import pwd
    if os.geteuid() != 0:
        pytest.fail("the tenant tests create Unix users and need root (CI runs as root)")
    if shutil.which("useradd") is None:
        pytest.fail("useradd is missing (Debian: apt-get install passwd)")
    shared = Path(os.environ[SHARED_DIR_VAR])
    record = shared / "unix-users.json"
    with open(shared / "unix-users.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            # Written first, so that the users are removed at the end even if making them fails halfway.
            record.write_text(json.dumps({"modes": []}))
            for name in TEST_USERS:  # left over by a run that was killed
                subprocess.run(["userdel", "-r", name], capture_output=True)
            for name in TEST_USERS:
                subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--user-group", name],
                               check=True, capture_output=True)
                os.chmod(pwd.getpwnam(name).pw_dir, 0o700)
            python = Path(venv_python())
            changed = _made_traversable([python.resolve(), python.parent, TESTS])
            record.write_text(json.dumps({"modes": changed}))
    return {name: pwd.getpwnam(name) for name in TEST_USERS}


def as_user(user, cmd: list[str]) -> list[str]:
    """`cmd` run as `user` (a pwd entry): its uid, primary group and no supplementary groups, by setpriv.

    Not subprocess's user=/group=: with those CPython forks (it cannot vfork past a credential change), and
    fork() runs grpc's fork handlers in the child, whose event engine may crash it before the exec (seen: sbatch
    "died" of SIGSEGV with grpc's "epoll_wait error: Bad file descriptor"). setpriv lets CPython vfork, where
    no fork handler runs."""
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--", *cmd]


def run_as(user, cmd: list[str], env: dict | None = None, timeout: float = 240, **kwargs):
    """Runs `cmd` as `user` (see `as_user`) in its home directory with HOME set, as a login would."""
    full_env = {**os.environ, **(env or {}), "HOME": user.pw_dir, "USER": user.pw_name,
                "LOGNAME": user.pw_name}
    return subprocess.run(as_user(user, cmd), env=full_env, cwd=kwargs.pop("cwd", user.pw_dir),
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def reachable_tmpdir(prefix: str) -> Path:
    """A fresh directory under /tmp that other users can pass through (0711, its ancestors are /tmp and /):
    for a server whose per-job checkpoint directories an executor running as another user (an anonymous
    tenant's runs as nobody) must reach; pytest's own directories are 0700. The caller removes it."""
    import tempfile
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, 0o711)
    return path
