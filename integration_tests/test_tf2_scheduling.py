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
from pathlib import Path

import grpc
import pytest

from conftest import TESTS, WORKLOADS, SalusProcess, compile_c, last_json_line, venv_python, wait_until
from server_ctl import ctl_json
from tf2_common import SERVER_JOB, tf2_env

SCRIPT = WORKLOADS / "tf2_steps.py"
C_PROGRAMS = TESTS / "c_programs"


class Job:
    """tf2_steps.py against a server; HOLD lines and the JSON outcome are read on a thread."""

    def __init__(self, address: str, name: str, steps: int, hold_after: int | str = -1, env: dict | None = None):
        env = tf2_env(SALUS_SERVER=address, SALUS_JOB_NAME=name, **(env or {}))
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
    return next((j for j in ctl_json(address, "jobs")["jobs"] if j["name"] == name), None)


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


@pytest.fixture(scope="module")
def measured_job(onednn, tmp_path_factory) -> dict:
    """The admin row of a tf2_steps.py job that the server measured (--memory-capacity 8GiB), under one oneDNN
    setting: its ephemeral need depends on TensorFlow's kernels, so the admission test sizes its device from it."""
    tmp = tmp_path_factory.mktemp("tf2-measured")
    server = SalusProcess(tmp / "server.log", ("--memory-capacity", "8GiB"), env=onednn)
    job = Job(server.address, "tf2-measured", 20, hold_after=15, env=onednn)
    try:
        assert job.held.wait(180), "".join(job.lines)
        r = row(server.address, "tf2-measured")
        job.release()
        assert "error" not in job.result(), job.lines
    finally:
        job.kill()
        server.stop()
    assert r["ephemeral_source"] == "measured" and r["persistent_source"] == "variables", r
    return r


@pytest.fixture(scope="module")
def heap_peak_lib(tmp_path_factory) -> Path:
    """integration_tests/c_programs/heap_peak.c built as an LD_PRELOAD library (cc, under a second)."""
    return compile_c(C_PROGRAMS / "heap_peak.c", tmp_path_factory.mktemp("heap_peak") / "heap_peak.so",
                     "-shared", "-fPIC", "-O2")


# The server's own process settings (node/src/tf_env.rs): oneDNN's allocator hands every block to malloc, and
# glibc keeps blocks up to 1 GiB on its heap. The in-process reference runs with the same, so both heaps see the
# same blocks.
SERVER_ALLOCATOR_ENV = {"TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "true", "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
                        "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}


def test_tf2_ephemeral_memory_is_measured_like_tensorflows_own(measured_job, onednn, heap_peak_lib):
    """With --memory-capacity, the server measures an eager job's per-call memory (its heap's rise during sampled
    function calls; TF 2.21 keeps no memory records for eager calls), and it agrees with the same step measured
    the same way in TensorFlow's own process, under both oneDNN settings. TensorFlow's allocator statistics are no
    reference here: they exist only with oneDNN on (or the BFC CPU allocator), and they miss the kernels' own
    scratch (Eigen's matmul buffers: 5.0 MB of heap against 3 MiB in the BFC allocator with oneDNN off)."""
    reference = subprocess.run([venv_python(), str(SCRIPT), "12"],
                               env=tf2_env(TF2_STEPS_MEMORY="heap", LD_PRELOAD=str(heap_peak_lib), **onednn,
                                           **SERVER_ALLOCATOR_ENV),
                               capture_output=True, text=True, timeout=180)
    assert reference.returncode == 0, reference.stderr[-3000:]
    tf_peak = last_json_line(reference.stdout)["step_heap_peak_bytes"]
    assert tf_peak >= 2 * 512 * 512 * 4, reference.stdout  # two 1 MiB intermediates live at once
    r = measured_job
    measured = r["ephemeral_estimate_bytes"] * 20 / 21  # the estimate adds Salus's 5% margin
    print(f"{onednn}: ephemeral: salus measured {measured:.0f} ({r['ephemeral_meter']}; the allocator saw "
          f"{r['ephemeral_allocator_bytes']}) vs the same step in-process {tf_peak} ({measured / tf_peak:.3f}x)")
    assert abs(measured - tf_peak) <= 0.25 * tf_peak, (r, tf_peak)


def test_tf2_memory_admission_waits_and_refuses(tmp_path, measured_job, onednn):
    """Capacity for one job and half a variable more (each job needs its 1 MiB variable +10% and its calls'
    measured need +5%, which TensorFlow's kernels decide: about 2.2 MB with oneDNN, more without, so the capacity
    comes from the same job measured under the same setting): the second cannot even share the first one's lane
    (that needs room for its variable), so it waits, shown as "waiting for memory", and runs once the first is
    gone; a 64 KiB server refuses the job with RESOURCE_EXHAUSTED naming its need, and still runs single eager
    ops."""
    variable = 512 * 512 * 4
    need = measured_job["persistent_estimate_bytes"] + measured_job["ephemeral_estimate_bytes"]
    capacity = need + variable // 2
    server = SalusProcess(tmp_path / "server.log", ("--memory-capacity", str(capacity)), env=onednn)
    jobs = []
    try:
        first = Job(server.address, "tf2-mem-first", 20, hold_after=5, env=onednn)
        jobs.append(first)
        assert first.held.wait(180), "".join(first.lines)
        r = row(server.address, "tf2-mem-first")
        assert r["memory_state"] == "admitted" and r["persistent_source"] == "variables", (r, capacity)
        assert r["variable_bytes"] == variable and r["persistent_estimate_bytes"] == variable * 11 // 10, r
        second = Job(server.address, "tf2-mem-second", 10, env=onednn)
        jobs.append(second)
        assert wait_until(lambda: (row(server.address, "tf2-mem-second") or {}).get("state") == "waiting for memory",
                          timeout=120), (row(server.address, "tf2-mem-second"), r, capacity)
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

    tiny = SalusProcess(tmp_path / "tiny.log", ("--memory-capacity", "64KiB"), env=onednn)
    try:
        started = time.monotonic()
        job = Job(tiny.address, "tf2-too-big", 5, env=onednn)
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
