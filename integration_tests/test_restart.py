"""A restart or an upgrade of the server loses no running job (issue 53).

- Two users' jobs train through one server with a state directory: a TF1 graph session (user salus-ta) and a
  Keras 3 `fit` (user salus-tb), both paced so that they train across three restarts: SIGTERM and the same
  command line; SIGKILL and the same command line; an in-place upgrade (the binaries replaced by new files, then
  SIGUSR2: the supervisor execs the new binary with its listening socket). Each new supervisor adopts the
  executors its predecessor left. Both jobs end with exit 0, exactly their in-process losses, and no error in
  their output; a TF1 job started while the server is down starts within 10 s of the new supervisor's start.
- No supervisor comes back: with `--adopt-grace 4` the job ends with UNAVAILABLE naming the reason, and no
  executor (nor the keeper of the listening socket) is left running.

Cost: about 60 s on 2 cores (three TensorFlow clients beside their two in-process references, four server
starts; then a short job and a server for the second test).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import (WORKLOADS, SalusProcess, as_user, child_env, executors_of, server_bin, venv_python,
                      wait_until)
from tf2_common import tf2_env

JOB = WORKLOADS / "restart_job.py"
STEPS = 90
PACE_S = 0.2


class Job:
    """A restart_job.py process; its {"step": N} lines are read as they come."""

    def __init__(self, cmd: list[str], env: dict, cwd: str | None = None):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=cwd, stdin=subprocess.DEVNULL)
        self.lines: list[dict] = []
        self.stderr = ""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def _read_err(self):
        self.stderr = self.proc.stderr.read()

    def steps(self) -> int:
        return max((m["step"] for m in self.lines if "step" in m), default=0)

    def first_step_at(self) -> float | None:
        return next((m["t"] for m in self.lines if m.get("step") == 1), None)

    def result(self, timeout: float = 240) -> dict:
        code = self.proc.wait(timeout)
        wait_until(lambda: self.lines and "losses" in self.lines[-1], 10)
        assert code == 0, f"job exited with {code}\nstderr:\n{self.stderr[-4000:]}"
        return self.lines[-1]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def user_env(user, base: dict) -> dict:
    return {**base, "HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def copy_binaries(to: Path) -> Path:
    """The build's two binaries as new files in `to` (a second copy of the install); returns its salus-server."""
    to.mkdir(exist_ok=True)
    built = server_bin().resolve().parent
    for name in ("salus-server", "salus-supervisor"):
        fresh = to / (name + ".new")
        shutil.copy2(built / name, fresh)
        os.replace(fresh, to / name)  # a new inode: the running binary keeps its own
    return to / "salus-server"


def tf1_job(user, address: str, steps: int) -> Job:
    env = user_env(user, child_env())
    return Job(as_user(user, [venv_python(), str(JOB), "--kind", "tf1", "--target", f"grpc://{address}",
                              "--steps", str(steps), "--pace", str(PACE_S)]), env, cwd=user.pw_dir)


def keras_job(user, address: str) -> Job:
    env = user_env(user, tf2_env(SALUS_SERVER=address, SALUS_JOB_NAME="restart-keras"))
    return Job(as_user(user, [venv_python(), str(JOB), "--kind", "keras", "--steps", str(STEPS),
                              "--pace", str(PACE_S)]), env, cwd=user.pw_dir)


def progressed(jobs: list[Job], beyond: list[int], by: int = 2, timeout: float = 60) -> None:
    ok = wait_until(lambda: all(j.steps() >= b + by or j.proc.poll() is not None for j, b in zip(jobs, beyond)),
                    timeout)
    assert ok, f"the jobs did not train on: steps {[j.steps() for j in jobs]}, before {beyond}\n" + \
        "\n".join(j.stderr[-2000:] for j in jobs)
    for j in jobs:
        assert j.proc.poll() is None, f"a job ended before the restarts were over: {j.stderr[-3000:]}"


def test_restarts_and_an_upgrade_lose_no_running_job(tmp_path, unix_users):
    ta, tb = unix_users["salus-ta"], unix_users["salus-tb"]
    # In-process references, beside the server runs.
    ref_tf1 = Job([venv_python(), str(JOB), "--kind", "tf1", "--steps", str(STEPS)], child_env())
    ref_keras = Job([venv_python(), str(JOB), "--kind", "keras", "--steps", str(STEPS)], tf2_env())
    ref_short = Job([venv_python(), str(JOB), "--kind", "tf1", "--steps", "5"], child_env())
    install = copy_binaries(tmp_path / "install")
    state = tmp_path / "state"
    listen = f"127.0.0.1:{free_port()}"
    args = ("--state-dir", str(state))
    log = tmp_path / "salus-server.stderr.log"
    server = SalusProcess(log, args, listen=listen, binary=install)
    jobs: list[Job] = []
    late = None
    try:
        a, b = tf1_job(ta, server.address, STEPS), keras_job(tb, server.address)
        jobs = [a, b]
        progressed(jobs, [0, 0], by=3, timeout=120)

        # 1. SIGTERM, then the same command line; a job starts meanwhile.
        before = [j.steps() for j in jobs]
        assert server.stop(signal.SIGTERM, timeout=30) == 0, server.stderr_tail()
        late = tf1_job(ta, listen, 5)
        time.sleep(1.0)
        server = SalusProcess(log, args, listen=listen, binary=install)
        second_start = time.time()
        progressed(jobs, before)
        assert wait_until(lambda: late.first_step_at() is not None or late.proc.poll() is not None, 60)
        started_in = late.first_step_at() - second_start
        print(f"a job started while the server was down took its first step {started_in:.2f} s after the new "
              f"supervisor started")
        assert started_in <= 10, started_in

        # 2. SIGKILL, then the same command line.
        before = [j.steps() for j in jobs]
        server.kill()
        server._log.close()
        server = SalusProcess(log, args, listen=listen, binary=install)
        progressed(jobs, before)

        # 3. An in-place upgrade: new files, then SIGUSR2; the pid stays, the new binary listens on the socket.
        before = [j.steps() for j in jobs]
        copy_binaries(tmp_path / "install")
        listening = len(server.stdout_lines)
        server.send_signal(signal.SIGUSR2)
        assert wait_until(lambda: any("listening on" in line for line in server.stdout_lines[listening:]), 60), \
            server.stderr_tail()
        progressed(jobs, before)

        results = [a.result(), b.result(), late.result()]
        refs = [ref_tf1.result(), ref_keras.result(), ref_short.result()]
        for got, want, name in zip(results, refs, ["tf1", "keras", "tf1 started while down"]):
            assert got["losses"] == want["losses"], f"{name}: {got['losses'][:5]} vs {want['losses'][:5]}"
            assert got["final"] == want["final"], name
        for job in [a, b, late]:
            assert "Error" not in job.stderr, job.stderr[-3000:]
        text = log.read_text(errors="replace")
        assert text.count("adopted a running executor") >= 6, text[-4000:]
        code = server.stop(signal.SIGINT)
        assert code == 0, server.stderr_tail()
        assert wait_until(lambda: not executors_of(state), 30), executors_of(state)
    finally:
        for job in [*jobs, late, ref_tf1, ref_keras, ref_short]:
            if job:
                job.kill()
        server.kill()
        for pid in executors_of(state):
            os.kill(pid, signal.SIGKILL)


def keepers_of(state: Path) -> list[int]:
    marker = f"SALUS_KEEP_LISTENERS={state}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if any(v.startswith(marker) for v in (entry / "environ").read_bytes().split(b"\0")):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_with_no_new_supervisor_the_jobs_end_clearly_and_nothing_is_left(tmp_path):
    state = tmp_path / "state"
    server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--state-dir", str(state), "--adopt-grace", "4s"))
    job = Job([venv_python(), str(JOB), "--kind", "tf1", "--target", server.target, "--steps", "200",
               "--pace", "0.05"], child_env())
    try:
        assert wait_until(lambda: job.steps() >= 2 or job.proc.poll() is not None, 120), job.stderr[-3000:]
        assert executors_of(state), "no executor runs the job"
        assert server.stop(signal.SIGTERM, timeout=30) == 0
        code = job.proc.wait(120)
        assert code != 0, "the job went on without a server"
        assert "adopt" in job.stderr, job.stderr[-3000:]
        assert "UNAVAILABLE" in job.stderr or "Unavailable" in job.stderr, job.stderr[-3000:]
        assert wait_until(lambda: not executors_of(state) and not keepers_of(state), 30), \
            (executors_of(state), keepers_of(state))
    finally:
        job.kill()
        server.kill()
        for pid in executors_of(state) + keepers_of(state):
            os.kill(pid, signal.SIGKILL)
