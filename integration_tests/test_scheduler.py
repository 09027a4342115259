"""The iteration scheduler end to end: real TF training jobs (subprocesses) against servers with each policy.

Every test but the hint-format one starts its own salus-server (never the shared one) with the flags under
test, and stops it by its PID. Jobs are integration_tests/workloads/sched_job.py: an MLP whose steps take several milliseconds, so its
repeated steps are main iterations that the scheduler orders. A job imports TensorFlow and builds its graph
first, then waits for its go file; the test releases the jobs about a second apart, so arrival order is
controlled although TensorFlow's import time varies a lot on a busy machine.

What is checked: finishing order per policy (fifo, fair, srtf), a policy switch at run time, the admin CLI
(`salus-server ctl ... --json`, hints, the JSON field names), unknown policy names, malformed hints, and that
a killed client's session is reclaimed after --idle-timeout, also while one of its iterations is queued.
Every job's per-step losses must equal the same job run in-process. Runs in about 75 s on 2 cores.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest

import salus_wire as w
from gated_jobs import GatedJob, GatedJobs
from server_ctl import ctl, ctl_json, jobs_by_name, require_server_flag, stop_cleanly, wait_state
import reference_runs
from conftest import WORKLOADS, SalusProcess, child_env, last_json_line, server_bin, venv_python, wait_until

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SALUS_TEST_TARGET")),
    reason="scheduler tests start their own salus-server with scheduler flags")

JOB_SCRIPT = WORKLOADS / "sched_job.py"
POLICIES = ("fifo", "srtf", "pack", "fair", "rr", "priority", "las")
# Submission order long, medium, short; steps of the same cost (~5-8 ms each on a 2-core machine).
TRIO = {"long": dict(seed=1, steps=600), "medium": dict(seed=2, steps=300), "short": dict(seed=3, steps=60)}
# The trio's jobs arrive by progress, not by the clock, so the orders below hold whatever a step takes on this
# CPU: each next job is released once the server has run this many more iterations. When the medium job arrives
# the long one has 500 steps left (more than the medium's 300); when the short one arrives, the medium one (under
# srtf) has about 200 left, more than the short's 60; under fifo the long job is still far from done.
# Under srtf the long job runs SRTF_LONG_STEPS instead: 800 left when the medium job arrives, so the long job would
# have to run 500 steps alone while the medium one opens its session for the order to flip (with 600 it did,
# once, on a loaded machine: a client slower than the anticipation window lets the long job's steps interleave).
SRTF_LONG_STEPS = 900
ARRIVAL_ITERATIONS = 100
ADMIN_JOBS = {"alpha": dict(seed=1, steps=400, hints="priority=3&iterations=400"),
              "beta": dict(seed=2, steps=400, hints="iterations=400&seconds=5")}
ARRIVAL_GAP_S = 1.0
JOB_ROW_KEYS = {"id", "handle", "name", "state", "lane", "policy", "iterations", "attained_s", "service_s",
                "mean_iteration_ms", "queue_wait_s", "queued", "priority", "expected_iterations",
                "expected_seconds", "note"}


# --- helpers ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def scheduler_binary():
    return require_server_flag("--policy", "the scheduler")


@pytest.fixture(scope="module")
def references():
    """In-process per-step losses by seed, as long as the longest use of that seed (runs share prefixes):
    sched_job.py without a server, replayed from the cache of reference runs (reference_runs.py) when the same run
    was made before."""
    steps: dict[int, int] = {}
    for cfg in [*trio_for("srtf").values(), *TRIO.values(), *ADMIN_JOBS.values()]:
        steps[cfg["seed"]] = max(steps.get(cfg["seed"], 0), cfg["steps"])
    env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_")}
    losses = {}
    for seed, n in steps.items():
        proc = reference_runs.run([venv_python(), str(JOB_SCRIPT), "--seed", str(seed), "--steps", str(n)], env,
                                  timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses[seed] = last_json_line(proc.stdout)["losses"]
    return losses


def trio_for(policy: str) -> dict:
    """The trio as `policy` runs it (srtf's long job is longer, see SRTF_LONG_STEPS)."""
    if policy == "srtf":
        return {**TRIO, "long": dict(TRIO["long"], steps=SRTF_LONG_STEPS)}
    return TRIO


def switch_latency(stats: dict) -> dict:
    """The switch-latency summary of `ctl stats --json` (its key name is checked by the schema test)."""
    lat = stats["switch_latency_us"]
    assert isinstance(lat, dict), f"no switch-latency object in {stats}"
    return lat


class Job(GatedJob):
    """One sched_job.py child."""

    def __init__(self, key: str, tmp: Path, *, seed: int, steps: int, name: str, extra: tuple = (),
                 env: dict | None = None):
        super().__init__(key, tmp, [str(JOB_SCRIPT), "--name", name, "--seed", str(seed), "--steps", str(steps),
                                    *extra], env=env)


class Jobs(GatedJobs):
    def __init__(self, tmp: Path):
        super().__init__(tmp, Job)


def check_losses(results: dict, configs: dict, references: dict) -> None:
    for key, res in results.items():
        cfg = configs[key]
        assert res["steps"] == cfg["steps"], res
        ref = references[cfg["seed"]][:cfg["steps"]]
        assert res["losses"] == ref, f"job {key}: per-step losses differ from the same job in-process"


def total_iterations(address: str) -> int:
    """Main iterations the server ran so far, over its open jobs."""
    return sum(row["iterations"] for row in ctl_json(address, "jobs")["jobs"])


def finish_order(results: dict) -> list[str]:
    return sorted(results, key=lambda k: results[k]["end"])


def timeline(results: dict) -> str:
    t0 = min(r["go"] for r in results.values())
    return ", ".join(f"{k}: go {r['go'] - t0:.2f}s start {r['start'] - t0:.2f}s end {r['end'] - t0:.2f}s "
                     f"(median step {r['step_ms_median']:.1f} ms)" for k, r in results.items())


# --- finishing order per policy --------------------------------------------------------------------------

def token_tenants(tmp_path: Path, names) -> tuple[tuple[str, ...], dict]:
    """Server flags with a tenants file of one token tenant per name (no Unix user: each runs as a uid of its own),
    and each name's environment carrying its token."""
    lines, envs = [], {}
    for name in names:
        token = f"tok-{name}-{os.getpid()}"
        lines.append(f"{name} {hashlib.sha256(token.encode()).hexdigest()} -")
        envs[name] = {"SALUS_TOKEN": token}
    path = tmp_path / "tenants"
    path.write_text("\n".join(lines) + "\n")
    return ("--tenants-file", str(path)), envs


@pytest.mark.parametrize("policy,tenants", [("fifo", "one"), ("fair", "one"), ("srtf", "one"),
                                            ("fifo", "three"), ("fair", "three")])
def test_three_jobs_finish_in_policy_order(policy, tenants, references, tmp_path):
    """With tenants="three" each job is a tenant of its own (a token each), so their iterations come from three
    executor processes and the one scheduler in the supervisor orders them. Between tenants the server shares
    device time first (--share tenants): fair between the three, short first. fifo between tenants needs
    --share jobs (under --share tenants fifo orders one tenant's own jobs), which the fifo case sets."""
    trio = trio_for(policy)
    flags, envs = token_tenants(tmp_path, trio) if tenants == "three" else ((), {})
    if tenants == "three":
        flags += ("--isolation", "tenant")
        if policy == "fifo":
            flags += ("--share", "jobs")
    server = SalusProcess(tmp_path / "salus-server.stderr.log", extra_args=("--policy", policy, *flags))
    try:
        with Jobs(tmp_path) as jobs:
            for key, cfg in trio.items():
                hints = f"?iterations={cfg['steps']}" if policy == "srtf" else ""
                jobs.start(key, seed=cfg["seed"], steps=cfg["steps"], name=key + hints, env=envs.get(key))
            jobs.wait_ready()
            for i, key in enumerate(trio):  # long, medium, short, each after ARRIVAL_ITERATIONS more iterations
                if i:
                    target = i * ARRIVAL_ITERATIONS
                    assert wait_until(lambda: total_iterations(server.address) >= target, timeout=120,
                                      interval=0.05), f"the server never ran {target} iterations"
                jobs.jobs[key].release(server.target)
            results = jobs.results()
            stats = ctl_json(server.address, "stats")
        stop_cleanly(server)
    finally:
        server.kill()

    when = timeline(results)
    print(f"{policy}, {tenants} tenant(s): {when}")
    if tenants == "three":
        assert stats["server_counters"]["executors_started"] == 3, stats["server_counters"]
    # The jobs overlapped: the short job arrived while the long one was still training.
    assert results["short"]["go"] < results["long"]["end"], f"no overlap, the test proves nothing: {when}"
    order = finish_order(results)
    if policy == "fifo":
        assert order == ["long", "medium", "short"], f"fifo finished {order}: {when}"
        # Strict FIFO: a later job's training runs only after the earlier one is done.
        assert results["medium"]["end"] > results["long"]["end"]
    elif policy == "srtf":
        # Remaining work decides: the medium job overtakes the long one, the short one overtakes both.
        assert order == ["short", "medium", "long"], f"srtf finished {order}: {when}"
    else:
        assert order[0] == "short", f"{policy} finished {order}, short first expected: {when}"
    assert stats["policy"] == policy
    check_losses(results, trio, references)


# --- run-time policy switch ------------------------------------------------------------------------------

def test_policy_switch_at_run_time_changes_the_order(references, tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log", extra_args=("--policy", "fifo"))
    configs = {"long": TRIO["long"], "short": TRIO["short"]}
    try:
        with Jobs(tmp_path) as jobs:
            jobs.start("long", seed=configs["long"]["seed"], steps=configs["long"]["steps"], name="long")
            jobs.start("short", seed=configs["short"]["seed"], steps=configs["short"]["steps"],
                       name=f"short?iterations={configs['short']['steps']}")
            jobs.wait_ready()
            jobs.jobs["long"].release(server.target)
            time.sleep(ARRIVAL_GAP_S)
            jobs.jobs["short"].release(server.target)
            # Under fifo the short job's main iterations wait behind the long job.
            seen: dict = {}

            def short_waiting() -> bool:
                seen.update(jobs_by_name(server.address))
                row = seen.get("short")
                return bool(row and row["state"] == "queued" and row["queued"] > 0)

            assert wait_until(short_waiting, timeout=20, interval=0.1), f"short never queued: {seen}"
            assert seen["short"]["iterations"] == 0, f"fifo ran the short job's main iterations: {seen}"
            assert seen["long"]["state"] == "running" or seen["long"]["iterations"] > 0, seen
            time.sleep(0.3)
            assert jobs.jobs["long"].proc.poll() is None, "the long job ended before the switch"
            switch = ctl(server.address, "policy", "srtf")
            assert "fifo" in switch.stdout and "srtf" in switch.stdout, switch.stdout
            switched_at = time.time()
            results = jobs.results()
            stats = ctl_json(server.address, "stats")
        stop_cleanly(server)
    finally:
        server.kill()

    when = timeline(results)
    print(f"switched fifo -> srtf at {switched_at - min(r['go'] for r in results.values()):.2f}s: {when}")
    assert results["long"]["end"] > switched_at, f"the long job ended before the switch: {when}"
    assert finish_order(results) == ["short", "long"], f"after switching to srtf: {when}"
    assert stats["policy"] == "srtf"
    check_losses(results, configs, references)


# --- admin CLI ----------------------------------------------------------------------------------------------

def test_ctl_jobs_stats_hints_and_bad_policy(references, tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log")  # default policy: fair
    try:
        with Jobs(tmp_path) as jobs:
            for key, cfg in ADMIN_JOBS.items():
                jobs.start(key, seed=cfg["seed"], steps=cfg["steps"], name=f"{key}?{cfg['hints']}")
            jobs.wait_ready()
            for job in jobs.jobs.values():
                job.release(server.target)

            rows: dict = {}
            queued_notes: list[str] = []

            def both_progressing() -> bool:
                rows.clear()
                rows.update(jobs_by_name(server.address))
                queued_notes.extend(r["note"] for r in rows.values() if r["state"] == "queued")
                return all(k in rows and rows[k]["iterations"] > 0 and rows[k]["attained_s"] > 0
                           for k in ADMIN_JOBS)

            assert wait_until(both_progressing, timeout=30, interval=0.1), f"ctl jobs --json: {rows}"
            # A queued job says why it waits, under fair too (its standing on the lane).
            assert all(n.startswith("waiting: ") and "rank " in n for n in queued_notes), queued_notes
            print(f"queued rows seen: {len(queued_notes)}; e.g. {queued_notes[:1]}")
            for key, row in rows.items():
                assert JOB_ROW_KEYS <= set(row), f"missing keys {JOB_ROW_KEYS - set(row)} in {row}"
                assert row["state"] in ("running", "queued", "idle"), row
                assert row["service_s"] >= row["attained_s"], f"service counts main iterations and cheap runs: {row}"
                assert row["lane"] == 0 and row["policy"] == "fair", row
                assert row["mean_iteration_ms"] > 1.0, f"steps of several ms measured as {row}"
                assert isinstance(row["id"], int) and row["handle"], row
            a, b = rows["alpha"], rows["beta"]
            assert (a["priority"], a["expected_iterations"], a["expected_seconds"]) == (3, 400, None), a
            assert (b["priority"], b["expected_iterations"], b["expected_seconds"]) == (0, 400, 5.0), b
            assert a["id"] != b["id"] and a["handle"] != b["handle"]

            human = ctl(server.address, "jobs")
            assert "alpha" in human.stdout and "beta" in human.stdout, human.stdout

            # Hints set at run time, by name and by id.
            ctl(server.address, "hints", "beta", "--priority", "7", "--iterations", "123", "--seconds", "9")
            ctl(server.address, "hints", str(a["id"]), "--priority=-2", "--iterations", "50",
                "--seconds", "1.5")
            rows = jobs_by_name(server.address)
            assert (rows["beta"]["priority"], rows["beta"]["expected_iterations"],
                    rows["beta"]["expected_seconds"]) == (7, 123, 9.0), rows["beta"]
            assert (rows["alpha"]["priority"], rows["alpha"]["expected_iterations"],
                    rows["alpha"]["expected_seconds"]) == (-2, 50, 1.5), rows["alpha"]
            bad_hint = ctl(server.address, "hints", "no-such-job", "--priority", "1", check=False)
            assert bad_hint.returncode != 0, bad_hint.stdout

            results = jobs.results()

        # Both jobs ran concurrently, so the lane switched between them.
        assert results["alpha"]["start"] < results["beta"]["end"]
        assert results["beta"]["start"] < results["alpha"]["end"]
        stats = ctl_json(server.address, "stats")
        assert stats["policy"] == "fair"
        assert stats["iterations_total"] >= 2 * (400 - 2) - 10, stats  # all but the first cheap runs
        assert stats["queued"] == 0, stats
        lat = switch_latency(stats)
        assert lat["count"] > 0, f"no switch-latency samples after two jobs interleaved: {stats}"
        assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"], lat
        assert isinstance(stats["iterations_per_s"], (int, float))
        human = ctl(server.address, "stats")
        assert "fair" in human.stdout, human.stdout

        # Closed sessions leave the job list.
        assert wait_until(lambda: not jobs_by_name(server.address), timeout=10, interval=0.2), \
            ctl_json(server.address, "jobs")["jobs"]

        # An unknown policy is refused with a message naming the valid ones; the server keeps running.
        bad = ctl(server.address, "policy", "bogus", check=False)
        text = bad.stdout + bad.stderr
        assert bad.returncode != 0, text
        assert "bogus" in text and all(p in text for p in POLICIES), text
        assert server.proc.poll() is None
        assert ctl_json(server.address, "stats")["policy"] == "fair"
        with grpc.insecure_channel(server.address) as ch:
            assert w.health_check(ch) == w.SERVING
        ok = ctl(server.address, "policy", "las")
        assert "fair" in ok.stdout and "las" in ok.stdout, ok.stdout
        assert ctl_json(server.address, "stats")["policy"] == "las"
        stop_cleanly(server)
    finally:
        server.kill()
    check_losses(results, ADMIN_JOBS, references)


def test_ctl_json_schema_and_policy_get(tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log", extra_args=("--policy", "rr"))
    try:
        assert ctl_json(server.address, "jobs")["jobs"] == []
        stats = ctl_json(server.address, "stats")
        missing = {"policy", "iterations_total", "iterations_per_s", "queued", "switch_latency_us"} - set(stats)
        assert not missing, f"ctl stats --json lacks {missing}: {sorted(stats)}"
        assert {"count", "p50", "p99", "max"} <= set(stats["switch_latency_us"]), stats
        assert stats["policy"] == "rr" and stats["iterations_total"] == 0 and stats["queued"] == 0, stats
        assert stats["switch_latency_us"]["count"] == 0, stats
        # `ctl policy` without a name shows the current one.
        assert "rr" in ctl(server.address, "policy").stdout
        stop_cleanly(server)
    finally:
        server.kill()


def test_unknown_policy_at_start_fails_naming_the_valid_ones():
    proc = subprocess.run([str(server_bin()), "--listen", "127.0.0.1:0", "--policy", "bogus"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "listening" not in proc.stdout
    assert "bogus" in text and all(p in text for p in POLICIES), text


# --- idle timeout --------------------------------------------------------------------------------------------

def test_killed_client_session_is_reclaimed_after_idle_timeout(tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log", extra_args=("--idle-timeout", "2s"))
    try:
        with Jobs(tmp_path) as jobs:
            orphan = jobs.start("orphan", seed=3, steps=20, name="orphan?iterations=20", extra=("--hold",))
            survivor = jobs.start("survivor", seed=2, steps=20, name="survivor", extra=("--hold",))
            jobs.wait_ready()
            orphan.release(server.target)
            held = orphan.result(timeout=60)
            assert held.get("phase") == "holding", held
            assert "orphan" in jobs_by_name(server.address)
            orphan.kill()  # SIGKILL: the client never closes its session
            killed_at = time.monotonic()
            assert "orphan" in jobs_by_name(server.address), "reclaimed at once, not after the idle timeout"
            # A client that is alive and active is unaffected: it starts (and keeps sending) work meanwhile.
            survivor.release(server.target)
            assert wait_until(lambda: "orphan" not in jobs_by_name(server.address), timeout=6, interval=0.25), \
                f"session of the killed client still listed 6 s after the kill (--idle-timeout 2): " \
                f"{ctl_json(server.address, 'jobs')}"
            reclaimed_after = time.monotonic() - killed_at
            print(f"reclaimed {reclaimed_after:.2f}s after SIGKILL (--idle-timeout 2)")
            assert reclaimed_after >= 1.0, f"reclaimed {reclaimed_after:.1f}s after the kill, before the timeout"
            done = survivor.result(timeout=60)
            assert done.get("phase") == "holding" and done["steps"] == 20, done
        with grpc.insecure_channel(server.address) as ch:
            assert w.health_check(ch) == w.SERVING
        stop_cleanly(server)
    finally:
        server.kill()


def test_killed_client_with_a_queued_iteration(references, tmp_path):
    """Under fifo the second job's iterations queue behind the first; its client dies while one waits. The
    waiting iteration never runs, the session is reclaimed after --idle-timeout, the first job is unaffected.
    The first job trains on until the test has seen the reclaim (a stop file), so it outlasts the wait on any CPU."""
    from workloads import sched_job

    server = SalusProcess(tmp_path / "salus-server.stderr.log",
                          extra_args=("--policy", "fifo", "--idle-timeout", "2s"))
    blocker_seed = TRIO["long"]["seed"]
    stop_file = tmp_path / "blocker.stop"
    try:
        with Jobs(tmp_path) as jobs:
            blocker = jobs.start("blocker", seed=blocker_seed, steps=1, name="blocker",
                                 extra=("--stop-file", str(stop_file)))
            orphan = jobs.start("orphan", seed=3, steps=60, name="orphan")
            jobs.wait_ready()
            blocker.release(server.target)
            # By progress, not the clock: under fifo a session holds the lane from its first main iteration, so
            # an orphan that arrived before the blocker's first one (a slow executor start) would run one itself.
            wait_state(server.address, "blocker", lambda row: row["iterations"] > 0)
            orphan.release(server.target)
            rows: dict = {}

            def orphan_queued() -> bool:
                rows.clear()
                rows.update(jobs_by_name(server.address))
                return bool(rows.get("orphan") and rows["orphan"]["queued"] > 0)

            assert wait_until(orphan_queued, timeout=20, interval=0.05), f"orphan never queued: {rows}"
            orphan.kill()
            killed_at = time.monotonic()
            seen_iterations: list[int] = []

            def orphan_gone() -> bool:
                row = jobs_by_name(server.address).get("orphan")
                if row:
                    seen_iterations.append(row["iterations"])
                return row is None

            assert wait_until(orphan_gone, timeout=6, interval=0.25), "killed client's session still listed"
            reclaimed_after = time.monotonic() - killed_at
            print(f"queued-iteration orphan reclaimed {reclaimed_after:.2f}s after SIGKILL")
            assert seen_iterations and max(seen_iterations) == 0, \
                f"the dead client's queued iteration ran under fifo: iterations {seen_iterations}"
            assert blocker.proc.poll() is None, "blocker ended early: the test proved nothing"
            stop_file.touch()
            result = blocker.result(timeout=120)
        stats = ctl_json(server.address, "stats")
        assert stats["queued"] == 0, stats
        stop_cleanly(server)
    finally:
        server.kill()
    steps = result["steps"]
    known = references[blocker_seed]
    reference = known[:steps] if steps <= len(known) else sched_job.reference(blocker_seed, steps)
    assert result["losses"] == reference, "the blocker's per-step losses differ from the same job in-process"


def test_malformed_hints_are_refused_with_a_clear_error(salus_target):
    import tensorflow as tf
    from workloads import sched_job

    g = tf.Graph()
    with g.as_default():
        c = tf.constant(1.0) + 1.0
        with pytest.raises(tf.errors.InvalidArgumentError, match="prio"):
            with tf.compat.v1.Session(salus_target, config=sched_job.config("typo?prio=1")) as sess:
                sess.run(c)
        # Well-formed hints are accepted by the same server.
        with tf.compat.v1.Session(salus_target, config=sched_job.config("ok?priority=1&iterations=5")) as sess:
            assert sess.run(c) == 2.0
