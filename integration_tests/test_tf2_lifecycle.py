"""Lifecycle of eager jobs: the stock TF2 client never closes its context, so the server reclaims it when the
client is gone (killed: its stream ends) or silent (stopped: --idle-timeout), freeing the job; a client whose
context was reclaimed gets an error that says so, and the server keeps serving new jobs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest

from conftest import WORKLOADS, SalusProcess, venv_python, wait_until
from test_python_adapter import list_jobs
from tf2_common import SERVER_JOB, tf2_env

import grpc

SCRIPT = WORKLOADS / "tf2_lifecycle.py"


class Client:
    """The lifecycle workload as a child process; READY lines are watched on a thread."""

    def __init__(self, address: str, name: str, mode: str):
        env = tf2_env(SALUS_SERVER=address, SALUS_JOB_NAME=name, WORKLOAD_MODE=mode)
        self.proc = subprocess.Popen([venv_python(), str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("READY"):
                self.ready.set()
        self.ready.set()

    def wait_ready(self, timeout: float = 180) -> str:
        if not self.ready.wait(timeout) or self.proc.poll() is not None:
            self.proc.kill()
            pytest.fail(f"client did not get ready: {''.join(self.lines)}\n{self.proc.stderr.read()[-4000:]}")
        return next(l for l in self.lines if l.startswith("READY"))

    def resume(self, timeout: float = 120) -> dict:
        """Lets a `wait` client run its last step; its JSON outcome."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.proc.stdin.close()
        self.proc.wait(timeout=timeout)
        time.sleep(0.2)  # the reader thread drains stdout
        last = [l for l in self.lines if l.startswith("{")]
        if not last:
            pytest.fail(f"no outcome from the client: {''.join(self.lines)}\n{self.proc.stderr.read()[-4000:]}")
        return json.loads(last[-1])

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def named(channel, name: str) -> list[dict]:
    return [j for j in list_jobs(channel) if j["name"] == name]


def test_killed_client_context_is_reclaimed(channel, salus_address, salus_only):
    client = Client(salus_address, "tf2-killed", "train")
    try:
        assert SERVER_JOB in client.wait_ready(), "the variable lives on the server"
        assert len(named(channel, "tf2-killed")) == 1
        client.proc.send_signal(signal.SIGKILL)
        client.proc.wait(timeout=30)
        assert wait_until(lambda: not named(channel, "tf2-killed"), timeout=20), \
            f"the killed client's context was not reclaimed: {named(channel, 'tf2-killed')}"
    finally:
        client.kill()
    # The server keeps serving eager jobs.
    again = Client(salus_address, "tf2-after-kill", "wait")
    try:
        again.wait_ready()
        assert again.resume()["ok"]
    finally:
        again.kill()


def test_idle_context_is_reclaimed_and_its_client_told(tmp_path):
    server = SalusProcess(tmp_path / "server.log", ("--idle-timeout", "2s"))
    client = None
    try:
        channel = grpc.insecure_channel(server.address)
        client = Client(server.address, "tf2-idle", "wait")
        client.wait_ready()
        assert len(named(channel, "tf2-idle")) == 1
        # The client stays silent (its stream stays open): reclaimed by --idle-timeout.
        assert wait_until(lambda: not named(channel, "tf2-idle"), timeout=20), "the idle context was not reclaimed"
        result = client.resume()
        assert not result["ok"], result
        assert "not found" in result["message"] and "idle" in result["message"], result
        channel.close()
    finally:
        if client is not None:
            client.kill()
        server.stop()
