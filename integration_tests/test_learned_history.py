"""The `learned` policy orders jobs by what their history says, with no hints (issue 41, item 5).

One server with `--policy learned` and a state directory: two job identities of one tenant ("short", 100 steps, and
"long", 600 steps of the same model: one graph, so one fingerprint, told apart by name) run three times each, closing
normally. The server is restarted on the same state directory (the history must come back from history.json), then
both arrive together, the long one released first, neither with a hint: the short one must be run first. Under
fifo the long one would run first; under fair or las they would share the device and the long one would run about
as many steps as the short one while the short one runs. The run lengths, completed runs and expected lengths are
read back with `ctl history --json` and the running job's row in `ctl jobs --json`; the tenant's history is erased
at the end, and stays erased over a restart. A TF2 job (tf.function steps through the adapter) runs beside the first
runs and is recorded under its SALUS_JOB_NAME with its function's fingerprint.

Costs about 25 s on 2 cores (three server starts, four TensorFlow client processes, ~4,000 training steps).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from conftest import WORKLOADS, SalusProcess, run_python, start_python, wait_until
from gated_jobs import GatedJob, GatedJobs
from server_ctl import ctl, ctl_json, jobs_by_name, require_server_flag
from test_python_adapter import salus_package  # noqa: F401  (autouse: the venv has this tree's python/)
from tf2_common import tf2_env

pytestmark = pytest.mark.skipif(bool(os.environ.get("SALUS_TEST_TARGET")),
                                reason="starts its own salus-server with --policy learned")

STEPS = {"short": 100, "long": 600}
TF2_NAME, TF2_STEPS = "tf2-steps", 50  # a TF2 job (tf.function steps through the adapter) is recorded as well
EARLIER_RUNS = 3
# The lane waits this long for the best-ranked job's next iteration before running another job's: generous, so a
# busy 2-core machine's gap between two of the short client's steps does not hand the long one a turn.
SERVER_ARGS = ("--policy", "learned", "--anticipation", "20ms")


class Job(GatedJob):
    """One sched_job.py child of the same model as the history's runs, under its identity's name, no hints."""

    def __init__(self, key: str, tmp: Path):
        super().__init__(key, tmp, [str(WORKLOADS / "sched_job.py"), "--name", key, "--steps", str(STEPS[key]),
                                    "--digest-only", "--step-times"])


def history(address: str) -> dict[str, dict]:
    """`ctl history --json`'s identities by name."""
    return {i["name"]: i for i in ctl_json(address, "history")["identities"]}


def recorded(address: str, name: str, runs: int) -> dict:
    """`name`'s identity once it has `runs` runs (a run is recorded when its job's end reaches the scheduler,
    which in an executor process is a message after the client's close returned)."""
    seen: dict = {}

    def has_runs() -> bool:
        seen.update(history(address).get(name) or {})
        return len(seen.get("runs", ())) >= runs

    wait_until(has_runs, 10)
    return seen


def check_history(address: str, runs: int) -> dict[str, dict]:
    listed = {name: recorded(address, name, runs) for name in STEPS}
    assert all(listed.values()), f"an identity is missing from the history: {listed}"
    for name, identity in listed.items():
        assert identity["completed_runs"] == runs, identity
        # Main iterations: the steps once their fetches repeat (the first ones are the signature's learning, and
        # a step measured brief on a busy machine may run as a cheap one).
        assert all(0.9 * STEPS[name] <= r["iterations"] <= STEPS[name] for r in identity["runs"]), identity["runs"]
        assert len(identity["runs"]) == runs, identity
        assert all(r["end"] == "completed" and r["device_s"] > 0 for r in identity["runs"]), identity
        assert identity["fingerprint"], f"no fingerprint of the main iteration in {identity}"
    # Same graph, so same fingerprint: the name alone tells the two identities apart.
    assert listed["short"]["fingerprint"] == listed["long"]["fingerprint"], listed
    # The expectation is the median of the completed runs' device time (the middle run's, or the geometric mean of
    # the middle two). Device seconds per step follow the machine's load (other tests run beside this one), so the
    # two identities are compared by order, not by their 6:1 ratio of steps.
    for identity in listed.values():
        logs = sorted(math.log(r["device_s"]) for r in identity["runs"])
        median = math.exp((logs[(len(logs) - 1) // 2] + logs[len(logs) // 2]) / 2)
        assert identity["expected_s"] == pytest.approx(median, rel=1e-6), identity
    assert listed["long"]["expected_s"] > listed["short"]["expected_s"], listed
    return listed


def test_a_short_job_known_from_history_runs_before_a_long_one(tmp_path):
    require_server_flag("--policy", "the scheduler")
    state = tmp_path / "state"
    server = SalusProcess(tmp_path / "first.stderr.log", (*SERVER_ARGS, "--state-dir", str(state)))
    try:
        # Beside them, one TF2 run: its identity's fingerprint is its main function's.
        tf2 = start_python(WORKLOADS / "tf2_sched_job.py", "--name", TF2_NAME, "--steps", str(TF2_STEPS),
                           "--digest-only", env=tf2_env(SALUS_SERVER=server.address, SALUS_JOB_NAME=TF2_NAME))
        runs = [f"{name}:{STEPS[name]}" for _ in range(EARLIER_RUNS) for name in STEPS]
        out = run_python(WORKLOADS / "history_runs.py", "--target", server.target, *runs, timeout=300).stdout
        assert len([line for line in out.splitlines() if line.startswith("{")]) == len(runs), out
        tf2_out, tf2_err = tf2.communicate(timeout=180)
        assert tf2.returncode == 0 and '"closed"' in tf2_out, f"TF2 job: exit {tf2.returncode}\n{tf2_err[-4000:]}"
        check_history(server.address, EARLIER_RUNS)
        tf2_identity = recorded(server.address, TF2_NAME, 1)
        assert tf2_identity["fingerprint"].startswith("f") and tf2_identity["completed_runs"] == 1, tf2_identity
        assert 0.9 * TF2_STEPS <= tf2_identity["runs"][0]["iterations"] <= TF2_STEPS, tf2_identity
        assert server.stop() == 0, server.stderr_tail()
    finally:
        server.kill()

    server = SalusProcess(tmp_path / "second.stderr.log", (*SERVER_ARGS, "--state-dir", str(state)))
    try:
        listed = check_history(server.address, EARLIER_RUNS)
        assert listed["long"]["tenant"] == listed["short"]["tenant"] == tf2_identity["tenant"], listed
        with GatedJobs(tmp_path, Job) as jobs:
            long, short = jobs.start("long"), jobs.start("short")
            jobs.wait_ready()
            # Released together, the long one first: arrival order favours it.
            long.release(server.target)
            short.release(server.target)
            # The long job's row, once its first main iteration told its fingerprint (its full identity).
            row: dict = {}
            assert wait_until(lambda: row.update(jobs_by_name(server.address).get("long") or {})
                              or row.get("history_runs", 0) > 0, 120), row
            results = jobs.results(180)
        assert results["short"]["steps"] == STEPS["short"] and results["long"]["steps"] == STEPS["long"], results
        # The long job's row says what its history expects.
        assert row["history_runs"] == EARLIER_RUNS, row
        assert row["history_expected_s"] == pytest.approx(listed["long"]["expected_s"], rel=1e-6), row
        short_run, long_run = results["short"], results["long"]
        assert short_run["end"] < long_run["end"], json.dumps(
            {k: {f: r[f] for f in ("go", "start", "end")} for k, r in results.items()})
        # While the short job trains, the long one (known to need six times as long) waits.
        long_ends = [long_run["start"] + s for s in long_run["step_end_s"]]
        overlapping = sum(short_run["start"] < t < short_run["end"] for t in long_ends)
        assert overlapping < STEPS["short"] // 4, (
            f"the long job ran {overlapping} steps while the short one ran its {STEPS['short']}: "
            f"not ordered by history")
        # Both runs are recorded, as the fourth of each identity.
        check_history(server.address, EARLIER_RUNS + 1)

        listed_text = ctl(server.address, "history").stdout
        assert "long" in listed_text and str(state / "history.json") in listed_text, listed_text
        tenant = listed["short"]["tenant"]
        erased = ctl_json(server.address, "history", "erase", "--tenant", tenant)
        assert erased["erased_identities"] == 3, erased
        assert history(server.address) == {}
        assert server.stop() == 0, server.stderr_tail()
    finally:
        server.kill()
    # The erasure was saved: a restart brings nothing back.
    server = SalusProcess(tmp_path / "third.stderr.log", (*SERVER_ARGS, "--state-dir", str(state)))
    try:
        assert history(server.address) == {}
        assert server.stop() == 0, server.stderr_tail()
    finally:
        server.kill()
