"""Server lifecycle: health service, graceful shutdown on SIGTERM / SIGINT with work in flight.

The shutdown tests start their own salus-server (never the shared one) and stop it by its PID.
"""

import json
import queue
import signal
import threading
import time

import grpc

import salus_wire as w
from conftest import WORKLOADS, SalusProcess, start_python


def test_health_serving(channel, salus_only):
    assert w.health_check(channel) == w.SERVING


class JsonLines:
    """The child's stdout JSON lines, read on a thread so waiting for one can time out."""

    def __init__(self, proc):
        self.proc = proc
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)  # EOF

    def next(self, phase: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                msg = None
            if msg is None:
                self.proc.poll()
                raise AssertionError(f"client never reported phase {phase!r} (exit code "
                                     f"{self.proc.returncode})")
            if msg.get("phase") == phase:
                return msg


def test_sigterm_lets_in_flight_run_finish_and_exits_0(tmp_path):
    # --adopt-grace 0: SIGTERM is a full stop (with adoption it stops only the supervisor: test_restart.py).
    server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--adopt-grace", "0"))
    client = None
    try:
        with grpc.insecure_channel(server.address) as ch:
            assert w.health_check(ch) == w.SERVING
        client = start_python(WORKLOADS / "long_run.py", "--target", server.target, "--seconds", "3")
        out = JsonLines(client)
        warm = out.next("warm", timeout=120)
        time.sleep(0.7)  # the long RunStep (about 3 s) is now in flight
        assert client.poll() is None
        sigterm_wall = time.time()
        server.send_signal(signal.SIGTERM)
        done = out.next("done", timeout=120)
        # The run completed for the client with the right result, although shutdown began during it.
        assert done["i"] == warm["n"], done
        assert done["end_wall"] > sigterm_wall, "the run ended before SIGTERM; the test proved nothing"
        code = server.stop(signal.SIGTERM)
        assert code == 0, f"exit code {code} after SIGTERM; stderr tail:\n{server.stderr_tail()}"
    finally:
        if client and client.poll() is None:
            client.kill()  # our own child, by its Popen handle
            client.wait()
        server.kill()


def test_sigint_with_open_session_exits_0(tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log")
    try:
        with grpc.insecure_channel(server.address) as ch:
            # An open session that nobody closes: shutdown must not wait for its client.
            import tensorflow as tf

            g = tf.Graph()
            with g.as_default():
                tf.constant(1.0, name="one")
            resp = w.call(ch, "CreateSession", w.create_session_request(g.as_graph_def().SerializeToString()))
            assert w.first(resp, 1)
        t0 = time.monotonic()
        code = server.stop(signal.SIGINT, timeout=30)
        assert code == 0, f"exit code {code} after SIGINT; stderr tail:\n{server.stderr_tail()}"
        assert time.monotonic() - t0 < 30
    finally:
        server.kill()


def test_tenant_isolation_without_the_supervisor_binary_says_what_is_missing(tmp_path):
    """salus-server execs into salus-supervisor (beside it) under --isolation tenant; a copy installed alone
    fails at once, naming the missing file and the way out, instead of serving without isolation."""
    import shutil
    import subprocess
    from pathlib import Path

    from conftest import server_bin

    lone = tmp_path / "salus-server"
    shutil.copy2(server_bin(), lone)
    # The mode said, as SALUS_ISOLATION=none scripts/test.sh runs the suite's other servers without isolation.
    proc = subprocess.run([str(lone), "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"),
                           "--isolation", "tenant"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc
    assert f"{tmp_path / 'salus-supervisor'} is missing" in proc.stderr and "--isolation none" in proc.stderr, \
        proc.stderr
    assert "listening" not in proc.stdout
    # The supervisor serves only --isolation tenant, and leaves subcommands to salus-server.
    supervisor = Path(server_bin()).with_name("salus-supervisor")
    for args, says in ((["--isolation", "none"], "run salus-server for --isolation none"),
                       (["ctl", "info"], "subcommands are salus-server's")):
        proc = subprocess.run([str(supervisor), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and says in proc.stderr, proc
