"""Workload subprocesses held at a "go" file, shared by the scheduler and memory-lane suites.

Each child imports TensorFlow and builds its graph first (seconds), writes its ready file, then waits until the
test writes the server target into its go file: so tests control arrival times exactly despite TF's slow import.
A child prints one JSON line (its result) on stdout; stderr is kept for failure messages.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import child_env, venv_python, wait_until


class GatedJob:
    """One workload child, started at once, held at its go file until released."""

    def __init__(self, key: str, tmp: Path, argv: list[str], env: dict | None = None):
        """`env`: extra environment variables for the child (e.g. SALUS_TOKEN: a tenant of its own)."""
        self.key = key
        self.ready = tmp / f"{key}.ready"
        self.go_file = tmp / f"{key}.go"
        self.proc = subprocess.Popen(
            [venv_python(), *argv, "--ready-file", str(self.ready), "--go-file", str(self.go_file)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(**(env or {})), stdin=subprocess.DEVNULL)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def release(self, target: str) -> None:
        tmp = self.go_file.with_suffix(".tmp")
        tmp.write_text(target)
        tmp.rename(self.go_file)  # atomic: the job never reads a half-written target

    def result(self, timeout: float = 60) -> dict:
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            msg = None
        if msg is None:
            self.proc.poll()
            pytest.fail(f"job {self.key} gave no result (exit code {self.proc.returncode}); stderr tail:\n"
                        f"{''.join(self.stderr)[-4000:]}")
        return msg

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by its Popen handle
            self.proc.wait(10)


class GatedJobs:
    """The jobs of one test; every child is killed on exit. `make(key, tmp, **kw)` builds one job."""

    def __init__(self, tmp: Path, make):
        self.tmp = tmp
        self.make = make
        self.jobs: dict[str, GatedJob] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for job in self.jobs.values():
            job.kill()

    def start(self, key: str, **kw) -> GatedJob:
        self.jobs[key] = self.make(key, self.tmp, **kw)
        return self.jobs[key]

    def wait_ready(self, timeout: float = 120) -> None:
        ok = wait_until(lambda: all(j.ready.exists() or j.proc.poll() is not None for j in self.jobs.values()),
                        timeout)
        dead = [k for k, j in self.jobs.items() if j.proc.poll() is not None]
        if dead or not ok:
            pytest.fail(f"jobs not ready (dead: {dead}); stderr of the first:\n"
                        f"{''.join(self.jobs[(dead or list(self.jobs))[0]].stderr)[-4000:]}")

    def results(self, timeout: float = 120) -> dict[str, dict]:
        return {k: j.result(timeout) for k, j in self.jobs.items()}
