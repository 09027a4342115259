"""Memory lanes end to end: admission by memory (Salus's lane rule), waiting, RESOURCE_EXHAUSTED, reclaim.

Every test starts its own salus-server with --memory-capacity (never the shared one) and stops it by its PID.
Jobs are integration_tests/workloads/mem_job.py children: small TF1 graphs whose every step fetches a node
named salus_main_iter, so their third step is the first main iteration, where the job asks for its lane. A
job builds its graph, touches its ready file and waits for its go file (arrival order is controlled); with
--close-file it holds its session open after training until the test creates that file.

1. Three identical hinted jobs (20 MiB persistent + 10 MiB ephemeral) on 64 MiB: two lanes of 30 MiB open,
   the third waits ("waiting for memory", need in the note) until the first closes; all losses are exact.
2. A job bigger than the device fails at once with RESOURCE_EXHAUSTED; a job that waits longer than
   --admission-timeout fails with RESOURCE_EXHAUSTED naming its need; the server keeps serving.
3. A SIGKILLed client's lane share is freed after --idle-timeout and the waiting job is admitted.
4. Without hints, the server's estimates for a 784-512-10 Adam MLP (batch 256) are within 20% of TensorFlow's
   own numbers (variable bytes; rise of allocator_bytes_in_use over a FULL_TRACE step + fed bytes), with
   TensorFlow's oneDNN kernels off and on (server and reference alike).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest

import salus_wire as w
from gated_jobs import GatedJob, GatedJobs
from server_ctl import ctl_json, jobs_by_name, require_server_flag, stop_cleanly, wait_state
from conftest import ALLOCATOR_STATS_ENV, WORKLOADS, SalusProcess, last_json_line, venv_python, wait_until

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SALUS_TEST_TARGET")),
    reason="memory-lane tests start their own salus-server with --memory-capacity")

JOB_SCRIPT = WORKLOADS / "mem_job.py"
MiB = 1 << 20
WAITING = "waiting for memory"
TINY_STEPS = 20


@pytest.fixture(scope="module", autouse=True)
def memory_binary():
    return require_server_flag("--memory-capacity", "memory lanes")


@pytest.fixture(scope="module")
def tiny_reference():
    from workloads import mem_job
    return mem_job.reference("tiny_sgd", 1, TINY_STEPS)


# --- helpers ----------------------------------------------------------------------------------------------

def healthy(server: SalusProcess) -> bool:
    with grpc.insecure_channel(server.address) as ch:
        return server.proc.poll() is None and w.health_check(ch) == w.SERVING


class MemJob(GatedJob):
    """One mem_job.py child; with `hold`, it keeps its session open until `close()`."""

    def __init__(self, key: str, tmp: Path, *, name: str, model: str = "tiny_sgd", steps: int = TINY_STEPS,
                 hold: bool = True):
        self.close_file = tmp / f"{key}.close"
        extra = ["--close-file", str(self.close_file)] if hold else []
        super().__init__(key, tmp, [str(JOB_SCRIPT), "--model", model, "--name", name, "--steps", str(steps),
                                    *extra])

    def close(self) -> None:
        self.close_file.touch()


class MemJobs(GatedJobs):
    def __init__(self, tmp: Path):
        super().__init__(tmp, MemJob)


def admitted(row: dict) -> bool:
    return row["memory_state"] == "admitted"


def waiting(row: dict) -> bool:
    return row["memory_state"] == WAITING and row["state"] == WAITING


def check_trained(res: dict, reference: list[float]) -> None:
    assert "error" not in res, f"{res.get('error')}: {res.get('message')} (after {res.get('steps')} steps)"
    assert res["steps"] == len(reference), res
    assert res["losses"] == reference, f"{res['name']}: per-step losses differ from the same job in-process"


# --- 1. two of three fit --------------------------------------------------------------------------------

def test_third_job_waits_for_memory_until_the_first_closes(tiny_reference, tmp_path):
    # Each job needs 20 + 10 = 30 MiB. On 64 MiB: lane 1 (30), lane 2 (30), 4 MiB left; the third job would
    # need 20 + max(10, 10) = 30 MiB of a lane whose persistent sum is already 20 of 30: it waits.
    hints = "persistent=20MiB&ephemeral=10MiB"
    server = SalusProcess(tmp_path / "salus-server.stderr.log", extra_args=("--memory-capacity", "64MiB"))
    try:
        with MemJobs(tmp_path) as jobs:
            for key in ("a", "b", "c"):
                jobs.start(key, name=f"{key}?{hints}", hold=key != "c")
            jobs.wait_ready()
            for key in ("a", "b"):
                jobs.jobs[key].release(server.target)
                held = jobs.jobs[key].result()
                assert held.get("phase") == "holding", held
            rows = jobs_by_name(server.address)
            a, b = rows["a"], rows["b"]
            for row in (a, b):
                assert admitted(row), row
                assert row["persistent_estimate_bytes"] == 20 * MiB and row["persistent_source"] == "hint", row
                assert row["ephemeral_estimate_bytes"] == 10 * MiB and row["ephemeral_source"] == "hint", row
            assert a["lane"] != b["lane"], f"two jobs of 30 MiB on 64 MiB share one lane: {a} {b}"

            jobs.jobs["c"].release(server.target)
            rows = wait_state(server.address, "c", waiting, timeout=60)
            c = rows["c"]
            print(f"waiting job: {c['note']}")
            need = 30 * MiB
            assert str(need) in c["note"] and str(20 * MiB) in c["note"] and str(10 * MiB) in c["note"], c
            assert f"{4 * MiB} of {64 * MiB} free" in c["note"], c
            time.sleep(1.0)  # it stays waiting while nothing is released
            rows = jobs_by_name(server.address)
            assert waiting(rows["c"]), rows["c"]
            assert jobs.jobs["c"].proc.poll() is None and jobs.jobs["c"].lines.empty()

            closed_at = time.time()
            jobs.jobs["a"].close()
            res_a = jobs.jobs["a"].result()
            res_c = jobs.jobs["c"].result()
            print(f"third job admitted and finished {res_c['end'] - closed_at:.2f}s after the first closed")
            assert res_c["end"] >= res_a["closed"] - 0.5, (res_a, res_c)
            rows = jobs_by_name(server.address)
            assert "a" not in rows and "c" not in rows, rows
            assert admitted(rows["b"]), rows
            jobs.jobs["b"].close()
            res_b = jobs.jobs["b"].result()
        for res in (res_a, res_b, res_c):
            check_trained(res, tiny_reference)
        stop_cleanly(server)
    finally:
        server.kill()


# --- 2. RESOURCE_EXHAUSTED --------------------------------------------------------------------------------

def test_too_big_job_fails_at_once_and_admission_timeout(tiny_reference, tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log",
                          extra_args=("--memory-capacity", "64MiB", "--admission-timeout", "2s"))
    try:
        with MemJobs(tmp_path) as jobs:
            huge = jobs.start("huge", name="huge?persistent=80MiB&ephemeral=10MiB", hold=False)
            holder = jobs.start("holder", name="holder?persistent=30MiB&ephemeral=10MiB")
            late = jobs.start("late", name="late?persistent=30MiB&ephemeral=10MiB", hold=False)
            jobs.wait_ready()

            huge.release(server.target)
            res = huge.result()
            print(f"too big: {res}")
            assert res.get("error") == "ResourceExhaustedError", res
            assert f"device has {64 * MiB} bytes" in res["message"], res
            assert res["end"] - res["go"] < 10, f"the impossible job was not refused at once: {res}"
            # salus_main_iter makes even the first step a main iteration; at most the two warm-up runs ran.
            assert res["steps"] <= 2, f"the impossible job trained: {res}"
            assert healthy(server)

            # Another job still runs: 40 MiB of 64.
            holder.release(server.target)
            held = holder.result()
            assert held.get("phase") == "holding", held
            check_trained(held, tiny_reference)

            # 30 MiB more does not fit (24 free, the lane has no room): waits, then times out after 2 s.
            late.release(server.target)
            wait_state(server.address, "late", waiting, timeout=60)
            res = late.result(timeout=30)
            waited = res["end"] - res["start"]
            print(f"admission timeout after {waited:.2f}s: {res.get('message')}")
            assert res.get("error") == "ResourceExhaustedError", res
            assert str(30 * MiB) in res["message"] and str(24 * MiB) in res["message"], res
            assert 1.5 <= waited < 15, res
            assert healthy(server)
            holder.close()
            assert "error" not in holder.result(), "the admitted job failed"
        assert wait_until(lambda: not ctl_json(server.address, "jobs")["jobs"], timeout=10, interval=0.2)
        stop_cleanly(server)
    finally:
        server.kill()


# --- 3. SIGKILLed client -------------------------------------------------------------------------------

def test_killed_client_lane_is_freed_after_idle_timeout(tiny_reference, tmp_path):
    hints = "persistent=30MiB&ephemeral=10MiB"  # 40 MiB each: one at a time on 64 MiB
    server = SalusProcess(tmp_path / "salus-server.stderr.log",
                          extra_args=("--memory-capacity", "64MiB", "--idle-timeout", "2s"))
    try:
        with MemJobs(tmp_path) as jobs:
            victim = jobs.start("victim", name=f"victim?{hints}")
            waiter = jobs.start("waiter", name=f"waiter?{hints}", hold=False)
            jobs.wait_ready()
            victim.release(server.target)
            assert victim.result().get("phase") == "holding"
            waiter.release(server.target)
            rows = wait_state(server.address, "waiter", waiting, timeout=60)
            assert admitted(rows["victim"]), rows
            victim.kill()  # SIGKILL: the session is never closed by the client
            killed_at = time.monotonic()
            res = waiter.result(timeout=30)
            freed_after = time.monotonic() - killed_at
            print(f"waiting job finished {freed_after:.2f}s after the lane holder was SIGKILLed "
                  f"(--idle-timeout 2)")
            # The waiter's own RunStep was in flight (blocked on memory) the whole time: it is not idle, and
            # must not be reclaimed together with the dead client's session.
            assert "error" not in res, (
                f"the waiting job failed once admitted: {res.get('error')}: {res.get('message')}\n"
                f"server log tail:\n{server.stderr_tail(2500)}")
            check_trained(res, tiny_reference)
            assert freed_after < 10, freed_after
            assert "victim" not in jobs_by_name(server.address)
        assert healthy(server)
        stop_cleanly(server)
    finally:
        server.kill()


# --- 4. estimates vs TensorFlow -------------------------------------------------------------------------

def tf_numbers_in_fresh_process(model: str, onednn: dict) -> dict:
    """TensorFlow's own numbers from a process of their own: allocator_bytes_in_use is process-wide, so in the
    test runner (which has run other TensorFlow work) a traced step's rise also counts unrelated allocations.
    Same oneDNN setting as the server's; an allocator that keeps statistics under either (ALLOCATOR_STATS_ENV)."""
    proc = subprocess.run([venv_python(), str(JOB_SCRIPT), "--model", model, "--tf-numbers"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, **onednn, **ALLOCATOR_STATS_ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json_line(proc.stdout)


def test_estimates_match_tensorflows_own_numbers(tmp_path, onednn):
    server = SalusProcess(tmp_path / "salus-server.stderr.log", extra_args=("--memory-capacity", "8GiB"),
                          env=onednn)
    try:
        with MemJobs(tmp_path) as jobs:
            job = jobs.start("adam", name="adam", model="mlp_adam", steps=15)
            jobs.wait_ready()
            job.release(server.target)
            held = job.result()
            assert held.get("phase") == "holding" and held["steps"] == 15, held
            row = jobs_by_name(server.address)["adam"]
            job.close()
            assert "error" not in job.result()
        stop_cleanly(server)
    finally:
        server.kill()

    tf_nums = tf_numbers_in_fresh_process("mlp_adam", onednn)
    p_est, e_est = row["persistent_estimate_bytes"], row["ephemeral_estimate_bytes"]
    p_tf, e_tf = tf_nums["variable_bytes"], tf_nums["ephemeral_bytes"]
    print(f"{onednn}: persistent: salus {p_est} vs TF {p_tf} ({p_est / p_tf:.3f}x); "
          f"ephemeral: salus {e_est} vs TF {e_tf} ({e_est / e_tf:.3f}x; TF rise {tf_nums['trace_rise_bytes']} "
          f"+ fed {tf_nums['fed_bytes']})")
    assert admitted(row), row
    assert row["persistent_source"] == "graph" and row["ephemeral_source"] == "measured", row
    assert row["variable_bytes"] == p_tf and row["variables"] == tf_nums["variables"], (row, tf_nums)
    assert abs(p_est - p_tf) <= 0.2 * p_tf, (row, tf_nums)
    assert abs(e_est - e_tf) <= 0.2 * e_tf, (row, tf_nums)
