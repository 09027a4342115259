"""TF2 jobs under the scheduler and memory admission, like graph jobs: a repeated tf.function call is a main
iteration, ranked by the server's policy; with --memory-capacity an eager job is admitted (persistent memory from
its variables) before its first main iteration, waits while memory is short (shown by the admin API), and a job
larger than the device gets RESOURCE_EXHAUSTED at once while single eager ops of other jobs still run.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import grpc
import pytest

from conftest import WORKLOADS, SalusProcess, last_json_line, venv_python, wait_until
from server_ctl import ctl_json
from tf2_common import SERVER_JOB, tf2_env

SCRIPT = WORKLOADS / "tf2_steps.py"


class Job:
    """tf2_steps.py against a server; HOLD lines and the JSON outcome are read on a thread."""

    def __init__(self, address: str, name: str, steps: int, hold_after: int | str = -1):
        env = tf2_env(SALUS_SERVER=address, SALUS_JOB_NAME=name)
        self.proc = subprocess.Popen([venv_python(), str(SCRIPT), str(steps), str(hold_after)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self.held = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.strip() == "HOLD":
                self.held.set()
        self.held.set()

    def release(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout: float = 240) -> dict:
        self.proc.wait(timeout=timeout)
        time.sleep(0.2)
        out = "".join(self.lines)
        if self.proc.returncode != 0:
            pytest.fail(f"job exited {self.proc.returncode}: {out}\n{self.proc.stderr.read()[-3000:]}")
        return last_json_line(out)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()


def row(address: str, name: str) -> dict | None:
    return next((j for j in ctl_json(address, "jobs") if j["name"] == name), None)


@pytest.mark.parametrize("policy, short_first", [("fifo", False), ("fair", True)])
def test_policy_orders_tf2_jobs(tmp_path, policy, short_first):
    """A long and a short TF2 job, the short one joining once the long one runs: FIFO finishes the short one last,
    fair first. The short job's process has imported TensorFlow before the long one starts and waits only to create
    its eager context, so it joins within a fraction of the long job's run however slow the machine is."""
    server = SalusProcess(tmp_path / "server.log", ("--policy", policy))
    jobs = []
    try:
        short = Job(server.address, "tf2-short", 30, hold_after="start")
        jobs.append(short)
        assert short.held.wait(180), "".join(short.lines)
        long = Job(server.address, "tf2-long", 600)
        jobs.append(long)
        assert wait_until(lambda: (row(server.address, "tf2-long") or {}).get("iterations", 0) >= 5, timeout=120), \
            "the long job never started its main iterations"
        short.release()
        long_result, short_result = long.result(), short.result()
        assert long_result["device"].startswith(SERVER_JOB) and short_result["device"].startswith(SERVER_JOB)
        print(f"{policy}: long ended {long_result['end']:.2f}, short ended {short_result['end']:.2f}")
        assert (short_result["end"] < long_result["end"]) == short_first, (policy, long_result, short_result)
    finally:
        for job in jobs:
            job.kill()
        server.stop()


def test_tf2_ephemeral_memory_is_measured_like_tensorflows_own(tmp_path):
    """With --memory-capacity, the server measures an eager job's per-call memory (its heap's rise during sampled
    function calls; TF 2.21 keeps no memory records for eager calls) and it agrees with TensorFlow's own accounting
    of the same step in-process (its CPU allocator's peak, `get_memory_info`)."""
    reference = subprocess.run([venv_python(), str(SCRIPT), "12"], env=tf2_env(TF2_STEPS_MEMORY="1"),
                               capture_output=True, text=True, timeout=180)
    tf_peak = last_json_line(reference.stdout)["step_peak_bytes"]
    assert tf_peak >= 2 * 512 * 512 * 4, reference.stdout  # two 1 MiB intermediates live at once
    server = SalusProcess(tmp_path / "server.log", ("--memory-capacity", "8GiB"))
    job = Job(server.address, "tf2-measured", 20, hold_after=15)
    try:
        assert job.held.wait(180), "".join(job.lines)
        r = row(server.address, "tf2-measured")
        job.release()
        assert "error" not in job.result(), job.lines
    finally:
        job.kill()
        server.stop()
    measured = r["ephemeral_estimate_bytes"] * 20 / 21  # the estimate adds Salus's 5% margin
    print(f"ephemeral: salus measured {measured:.0f} vs TensorFlow in-process {tf_peak} ({measured / tf_peak:.3f}x)")
    assert r["ephemeral_source"] == "measured", r
    assert abs(measured - tf_peak) <= 0.25 * tf_peak, (r, tf_peak)


def test_tf2_memory_admission_waits_and_refuses(tmp_path):
    """Capacity for one job (each needs about 3.5 MB: a 1 MiB variable +10%, and its calls' measured 2.2 MB +5%;
    a second job could share the first one's lane if the pool had room for its variable, 1.2 MB): the second waits, shown as "waiting for memory", and runs once the first is gone; a 64 KiB server refuses the
    job with RESOURCE_EXHAUSTED naming its need, and still runs single eager ops."""
    server = SalusProcess(tmp_path / "server.log", ("--memory-capacity", "4MiB"))
    jobs = []
    try:
        first = Job(server.address, "tf2-mem-first", 20, hold_after=5)
        jobs.append(first)
        assert first.held.wait(180), "".join(first.lines)
        r = row(server.address, "tf2-mem-first")
        assert r["memory_state"] == "admitted" and r["persistent_source"] == "variables", r
        assert r["variable_bytes"] == 512 * 512 * 4 and r["persistent_estimate_bytes"] == 512 * 512 * 4 * 11 // 10, r
        second = Job(server.address, "tf2-mem-second", 10)
        jobs.append(second)
        assert wait_until(lambda: (row(server.address, "tf2-mem-second") or {}).get("state") == "waiting for memory",
                          timeout=120), row(server.address, "tf2-mem-second")
        assert "waiting for memory" in row(server.address, "tf2-mem-second")["note"]
        first.release()
        assert "error" not in first.result(), first.lines
        # The first client exits without closing its context; once it is reclaimed the second is admitted.
        result = second.result()
        assert "error" not in result, result
    finally:
        for job in jobs:
            job.kill()
        server.stop()

    tiny = SalusProcess(tmp_path / "tiny.log", ("--memory-capacity", "64KiB"))
    try:
        started = time.monotonic()
        job = Job(tiny.address, "tf2-too-big", 5)
        result = job.result()
        assert result.get("error") == "ResourceExhaustedError", result
        assert "65536" in result["message"] and "needs" in result["message"], result
        assert time.monotonic() - started < 60
        code = ("import tensorflow as tf, json; a = tf.constant([1.0, 2.0]); b = a * 3 + 1; "
                "print(json.dumps({'b': b.numpy().tolist(), 'device': b.device}))")
        proc = subprocess.run([venv_python(), "-c", code], env=tf2_env(SALUS_SERVER=tiny.address),
                              capture_output=True, text=True, timeout=120)
        out = last_json_line(proc.stdout)
        assert out["b"] == [4.0, 7.0] and out["device"].startswith(SERVER_JOB), (out, proc.stderr[-2000:])
    finally:
        tiny.stop()
