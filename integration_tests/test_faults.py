"""Faults in one job (or in the server) while other jobs train: the other jobs keep progressing and lose nothing.

"Other jobs" are survivors: stock TF1 clients (threads of this process, each with its own graph and session)
training integration_tests/workloads/fault_client.py's tiny model, every step a main iteration scheduled
together with the faulty job's. Each survivor's per-step losses must equal the same job run in-process, and it
must keep finishing steps during or right after the fault.

(a) a client SIGKILLed while its long iteration (long_run.py) runs: the iteration runs to its end on the
    server (TensorFlow cannot cut it off), then the lane goes back to the survivors; the session is reclaimed
    --idle-timeout after the client's connection dropped;
(b) a live client that never closes its session: reclaimed after --idle-timeout while the active survivors'
    sessions are kept; when the stock client comes back it gets AbortedError ("session ... not found: it was
    closed, reclaimed, or the server restarted") at once, for run and for close, and a new session works;
(c) a kernel error (CheckNumerics on NaN, a failing tf.debugging.assert_less) in one job's main iteration: that
    job gets InvalidArgumentError with TensorFlow's message, its state is untouched and it continues;
(d) an out-of-memory iteration: tf.zeros of a fed shape of 2**46 floats (256 TiB, more than a 47-bit address
    space, so the allocation fails at once under any overcommit setting and no memory is touched). The job gets
    ResourceExhaustedError ("OOM when allocating ...") and continues; with --memory-capacity its ephemeral
    estimate is raised by half each time; the survivor in another lane keeps training. Other jobs do not stall
    while the allocation fails (TensorFlow's default oneDNN allocator retries it for 10 s under a process-wide
    lock; salus-server sets TF_ONEDNN_USE_SYSTEM_ALLOCATOR=true before TensorFlow loads);
(e) SIGTERM while three jobs have iterations in flight (one running, two queued in the one lane; test_lifecycle
    covers one long RunStep and an idle session): every iteration in flight completes with the right result,
    all sessions are closed, the server exits 0 at once. The clients' next requests: with
    ConfigProto.operation_timeout_in_ms, DeadlineExceededError after that timeout (run, then close); with
    TensorFlow's defaults the RunStep blocks without an error for as long as no server listens;
(f) SIGKILL of the server, then a restart on the same port: a client with operation_timeout_in_ms gets
    DeadlineExceededError after the timeout (run, then close); a stock client's RunStep blocks while no server
    listens (TensorFlow's master client waits for the server to come back, minutes and more) and, as soon as
    the new server is up, fails with AbortedError "session ... not found: ... or the server restarted", as does
    its close. New jobs on the restarted server train exactly.

Two tests guard fixed server bugs: an OOM step stalled every job of the process for 10 s (oneDNN's CPU
allocator), and with --memory-capacity concurrent jobs' memory-sampling traced runs failed each other's steps
with AlreadyExistsError "Another profiling session active." (traced runs now take turns).

The shared server of (a)-(c) has --idle-timeout 3 and no memory capacity: every job shares one lane, the
strongest interference. (d), (e), (f) start their own servers. Runs in about a minute on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest
import tensorflow as tf

import salus_wire as w
from conftest import WORKLOADS, SalusProcess, start_python, wait_until
from gated_jobs import GatedJob
from server_ctl import ctl_json, jobs_by_name, stop_cleanly
from workloads import fault_client

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SALUS_TEST_TARGET")),
    reason="fault tests start, signal and kill their own salus-server")

IDLE_TIMEOUT_S = 3
SURVIVOR_SEEDS = (101, 102)
SURVIVOR_SLEEP_S = 0.005  # between steps, like a client preparing its next batch
# Survivors never hang the suite: a step or close that gets no answer fails after this (TF's own option).
SURVIVOR_OP_TIMEOUT_MS = 60_000
LONG_RUN_S = 2.0  # the victim's long iteration (its remaining part ends well before the idle timeout)
HUGE_SHAPE = [2 ** 46]  # float32: 256 TiB
SLOW_SEEDS = (31, 32, 33)
CLIENT_OP_TIMEOUT_MS = 1500


# --- helpers ------------------------------------------------------------------------------------------------

class References:
    """In-process runs of fault_client's models by (seed, model), extended on demand."""

    def __init__(self):
        self.refs: dict[tuple[int, str], fault_client.Reference] = {}

    def first(self, seed: int, n: int, model: str = "tiny") -> list[float]:
        if (seed, model) not in self.refs:
            self.refs[(seed, model)] = fault_client.Reference(seed, model)
        return self.refs[(seed, model)].first(n)

    def close(self):
        for ref in self.refs.values():
            ref.sess.close()


@pytest.fixture(scope="module")
def refs():
    r = References()
    yield r
    r.close()


class Survivor(threading.Thread):
    """Another job: a stock client training fault_client's tiny model until stopped, every step recorded."""

    def __init__(self, target: str, seed: int, name: str):
        super().__init__(daemon=True)
        self.target, self.seed, self.name = target, seed, name
        self.m = fault_client.build(seed)
        self.losses: list[float] = []
        self.ends: list[float] = []  # time.monotonic() at the end of each step
        self.error: str | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with self.m.graph.as_default():
                cfg = fault_client.config(self.name, op_timeout_ms=SURVIVOR_OP_TIMEOUT_MS)
                sess = tf.compat.v1.Session(self.target, config=cfg)
                try:
                    sess.run(self.m.init)
                    while not self.stopping.is_set():
                        loss, _ = sess.run([self.m.loss, self.m.train_op])
                        self.losses.append(float(loss))
                        self.ends.append(time.monotonic())
                        time.sleep(SURVIVOR_SLEEP_S)
                finally:
                    sess.close()
        except Exception as e:  # reported by finish()
            self.error = f"{type(e).__name__}: {e}"

    def steps_between(self, t0: float, t1: float = math.inf) -> int:
        return sum(1 for t in list(self.ends) if t0 < t <= t1)

    def longest_gap(self, t0: float, t1: float) -> float:
        """Longest time without a finished step within [t0, t1]."""
        points = [t0, *(t for t in list(self.ends) if t0 < t < t1), t1]
        return max(b - a for a, b in zip(points, points[1:]))


class Survivors:
    """Survivor jobs for one test: started on entry (and warmed up), checked for exact losses by finish()."""

    def __init__(self, target: str, refs: References, tag: str, seeds=SURVIVOR_SEEDS):
        self.refs = refs
        self.all = [Survivor(target, seed, f"survivor-{tag}-{seed}") for seed in seeds]

    def __enter__(self) -> "Survivors":
        for s in self.all:
            s.start()
        if not wait_until(lambda: all(len(s.losses) >= 5 or s.error for s in self.all), timeout=60):
            pytest.fail(f"survivors did not start training: {[len(s.losses) for s in self.all]}")
        self._check_errors()
        return self

    def __exit__(self, *exc):
        for s in self.all:
            s.stopping.set()
        for s in self.all:
            s.join(SURVIVOR_OP_TIMEOUT_MS / 1000 + 10)

    def names(self) -> list[str]:
        return [s.name for s in self.all]

    def _check_errors(self) -> None:
        errors = {s.name: s.error for s in self.all if s.error}
        assert not errors, f"a survivor job failed: {errors}"

    def min_steps_between(self, t0: float, t1: float = math.inf) -> int:
        return min(s.steps_between(t0, t1) for s in self.all)

    def longest_gap(self, t0: float, t1: float) -> float:
        return max(s.longest_gap(t0, t1) for s in self.all)

    def wait_steps(self, n: int, after: float, timeout: float = 30) -> None:
        """Every survivor finishes n steps after monotonic time `after`."""
        ok = wait_until(lambda: self.min_steps_between(after) >= n or any(s.error for s in self.all), timeout)
        self._check_errors()
        assert ok, f"survivors stalled: {[s.steps_between(after) for s in self.all]} steps in {timeout}s"

    def finish(self) -> list[int]:
        """Stops them; every survivor closed cleanly and its losses equal the same job in-process."""
        self.__exit__()
        assert not any(s.is_alive() for s in self.all), "a survivor is stuck in a step or close"
        self._check_errors()
        for s in self.all:
            ref = self.refs.first(s.seed, len(s.losses))
            assert s.losses == ref, f"{s.name}: per-step losses differ from the same job in-process"
        return [len(s.losses) for s in self.all]


class Events:
    """JSON lines of a child's stdout, awaited by phase (and session); others are kept for later."""

    def __init__(self, lines: queue.Queue, describe):
        self.lines, self.describe = lines, describe
        self.backlog: list[dict] = []

    @staticmethod
    def _match(msg: dict, phase: str, session) -> bool:
        return msg.get("phase") == phase and (session is None or msg.get("session") == session)

    def _take(self, phase: str, session) -> dict | None:
        for i, msg in enumerate(self.backlog):
            if self._match(msg, phase, session):
                return self.backlog.pop(i)
        return None

    def seen(self, phase: str, session=None) -> bool:
        while True:
            try:
                msg = self.lines.get_nowait()
            except queue.Empty:
                break
            if msg is None:
                self.lines.put(None)
                break
            self.backlog.append(msg)
        return any(self._match(m, phase, session) for m in self.backlog)

    def next(self, phase: str, timeout: float = 60, session=None) -> dict:
        found = self._take(phase, session)
        deadline = time.monotonic() + timeout
        while found is None:
            try:
                msg = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {phase!r} event (session {session}) within {timeout}s: {self.describe()}")
            if msg is None:
                self.lines.put(None)  # EOF stays visible
                pytest.fail(f"child ended without a {phase!r} event (session {session}): {self.describe()}")
            if self._match(msg, phase, session):
                found = msg
            else:
                self.backlog.append(msg)
        return found


class FaultClient(GatedJob):
    """A fault_client.py child: several stock sessions in one process, held at its go file until released."""

    def __init__(self, key: str, tmp: Path, *, seeds, model: str = "tiny", extra: tuple = ()):
        self.stop_file = tmp / f"{key}.stop"
        super().__init__(key, tmp, [str(WORKLOADS / "fault_client.py"), "--seeds", ",".join(map(str, seeds)),
                                    "--model", model, "--stop-file", str(self.stop_file), *extra])
        self.events = Events(self.lines, lambda: f"stderr tail:\n{''.join(self.stderr)[-3000:]}")

    def wait_ready_file(self, timeout: float = 120) -> None:
        if not wait_until(lambda: self.ready.exists() or self.proc.poll() is not None, timeout):
            pytest.fail(f"client {self.key} not ready in {timeout}s")
        if self.proc.poll() is not None:
            pytest.fail(f"client {self.key} died: {''.join(self.stderr)[-3000:]}")

    def finish(self) -> dict:
        self.stop_file.touch()
        return self.events.next("done", timeout=30)


class LineChild:
    """A plain child (no gating) whose JSON stdout lines are awaited by phase."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(proc.stderr), daemon=True).start()
        self.events = Events(self.lines, lambda: f"exit code {proc.poll()}; stderr:\n{''.join(self.stderr)[-3000:]}")

    def _pump(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by its Popen handle
        self.proc.wait(10)


def line_with(message: str, text: str) -> str:
    """The line of a TensorFlow error message that contains `text` (the message has a traceback part)."""
    return next((line.strip() for line in message.splitlines() if text in line), message.strip().splitlines()[0])


def healthy(server: SalusProcess) -> bool:
    with grpc.insecure_channel(server.address) as ch:
        return server.proc.poll() is None and w.health_check(ch) == w.SERVING


def vm_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One server for (a)-(c): --idle-timeout IDLE_TIMEOUT_S, no memory capacity (all jobs time-share one lane)."""
    server = SalusProcess(tmp_path_factory.mktemp("faults") / "salus-server.stderr.log",
                          ("--idle-timeout", f"{IDLE_TIMEOUT_S}s"))
    try:
        yield server
        assert healthy(server)
        stop_cleanly(server)
    finally:
        server.kill()


# --- (a) client SIGKILLed mid-iteration ---------------------------------------------------------------------

def test_client_sigkilled_mid_iteration(shared, refs):
    addr = shared.address
    with Survivors(shared.target, refs, "a") as survivors:
        victim = LineChild(start_python(WORKLOADS / "long_run.py", "--target", shared.target,
                                        "--seconds", str(LONG_RUN_S)))
        try:
            warm = victim.events.next("warm", timeout=120)
            warm_at = time.monotonic()  # the long RunStep is sent after this line

            def victim_row() -> dict | None:
                return next((r for r in ctl_json(addr, "jobs")["jobs"] if r["name"] not in survivors.names()), None)

            def running() -> bool:
                return (victim_row() or {}).get("state") == "running"

            # long_run's third run (the long one, ~LONG_RUN_S) is a main iteration: wait until the lane runs it.
            assert wait_until(running, timeout=20, interval=0.05), f"the long iteration never ran: {victim_row()}"
            time.sleep(0.1)
            victim.kill()  # SIGKILL mid-iteration
            killed = time.monotonic()
            seen: list[dict] = []

            def gone() -> bool:
                row = victim_row()
                if row:
                    seen.append(row)
                return row is None

            assert wait_until(gone, timeout=LONG_RUN_S * 3 + IDLE_TIMEOUT_S + 6, interval=0.1), \
                f"session of the killed client never reclaimed: {seen[-1:]}"
            reclaimed = time.monotonic()
        finally:
            victim.kill()
        survivors.wait_steps(20, after=reclaimed)
        stall = survivors.longest_gap(killed, reclaimed)
        after_kill = survivors.min_steps_between(killed, reclaimed)
        counts = survivors.finish()

    done = [r for r in seen if r["iterations"] == 1 and r["state"] == "idle"]
    print(f"(a) long iteration of {warm['n']} loop steps ({done[0]['attained_s'] if done else '?'}s), client "
          f"SIGKILLed mid-iteration; its session reclaimed {reclaimed - killed:.2f}s after the kill; survivors: "
          f"stalled {stall:.2f}s after the kill (the lane finished the dead client's iteration), then "
          f">= {after_kill} steps each before the reclaim; {counts} steps in all; victim rows after the kill (state, "
          f"runs_completed, runs_failed): "
          f"{sorted({(r['state'], r['runs_completed'], r['runs_failed']) for r in seen})}")
    assert seen, "the session vanished when its client was killed, before the idle timeout"
    # The running iteration finished on the server (TensorFlow cannot cut it off; its reply goes nowhere)...
    assert done, f"the dead client's iteration never completed: {[(r['state'], r['iterations']) for r in seen]}"
    assert done[0]["runs_failed"] == 0, done[0]
    # ...it was running when the client died: a row polled after the kill still shows it running, or, failing
    # that poll (a loaded machine can answer the first poll late), its device time alone reaches past the kill
    # counted from before its start.
    running_after_kill = any(r["state"] == "running" and r["iterations"] == 0 for r in seen)
    assert running_after_kill or warm_at + done[0]["attained_s"] > killed + 0.05, \
        f"the iteration ended before the kill: the test proved nothing ({killed - warm_at:.2f}s after warm)"
    # ...and the session was reclaimed only after the idle timeout, counted from the end of the dead client's
    # request (when its connection dropped) and never while its iteration ran.
    assert reclaimed - killed >= IDLE_TIMEOUT_S - 0.5
    assert after_kill >= 20, "survivors made no progress between the kill and the reclaim"
    assert stall < LONG_RUN_S * 3, f"survivors stalled {stall:.1f}s after the kill"
    assert healthy(shared)


# --- (b) a client that never closes its session ------------------------------------------------------------

def test_session_never_closed_is_reclaimed_after_idle_timeout(shared, refs):
    addr = shared.address
    seed = 21
    with Survivors(shared.target, refs, "b") as survivors:
        m = fault_client.build(seed)
        with m.graph.as_default():
            sess = tf.compat.v1.Session(shared.target, config=fault_client.config("idler"))
            sess.run(m.init)
            losses = [float(sess.run([m.loss, m.train_op])[0]) for _ in range(5)]
            last_request = time.monotonic()
            assert losses == refs.first(seed, 5)
            assert "idler" in jobs_by_name(addr)
            # The client stays alive and keeps its Session, but sends nothing more.
            rows: dict = {}

            def reclaimed() -> bool:
                rows.clear()
                rows.update(jobs_by_name(addr))
                return "idler" not in rows

            assert wait_until(reclaimed, timeout=IDLE_TIMEOUT_S + 6, interval=0.1), "idle session never reclaimed"
            idle_for = time.monotonic() - last_request
            # Active sessions are kept (their clients never pause for 2 s).
            assert all(name in rows for name in survivors.names()), rows.keys()

            # The stock client comes back: a clear error at once, for run and for close.
            t0 = time.monotonic()
            with pytest.raises(tf.errors.AbortedError) as err:
                sess.run([m.loss, m.train_op])
            run_s = time.monotonic() - t0
            t0 = time.monotonic()
            try:
                sess.close()
                close_outcome = "ok"
            except tf.errors.OpError as e:
                close_outcome = f"{type(e).__name__}: {e.message}"
            close_s = time.monotonic() - t0
            del sess
            # The same client opens a new session and trains from scratch, exactly.
            with tf.compat.v1.Session(shared.target, config=fault_client.config("idler-again")) as again:
                again.run(m.init)
                assert [float(again.run([m.loss, m.train_op])[0]) for _ in range(5)] == losses
        survivors.wait_steps(20, after=time.monotonic())
        counts = survivors.finish()

    print(f"(b) idle session reclaimed {idle_for:.2f}s after its last request (--idle-timeout {IDLE_TIMEOUT_S}); "
          f"stock client then: run -> AbortedError in {run_s:.3f}s ({err.value.message!r}), close -> "
          f"{close_outcome} in {close_s:.3f}s; survivors {counts} steps")
    assert IDLE_TIMEOUT_S - 0.3 <= idle_for <= IDLE_TIMEOUT_S + 4, idle_for
    assert "not found" in err.value.message and "reclaimed" in err.value.message, err.value.message
    assert run_s < 5 and close_s < 5


# --- (c) a TensorFlow kernel error in one job -----------------------------------------------------------------

def test_kernel_error_in_one_job(shared, refs):
    addr = shared.address
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        total = tf.compat.v1.get_variable("total", [], tf.float32, initializer=tf.compat.v1.zeros_initializer())
        checked = tf.debugging.check_numerics(x, "fault-test input")
        with tf.control_dependencies([tf.debugging.assert_less(checked, 1e6, message="fault-test bound")]):
            step = total.assign_add(tf.reduce_sum(checked))
        out = tf.identity(step, name="salus_main_iter")  # every repeated run is a main iteration
        init = tf.compat.v1.global_variables_initializer()

    with Survivors(shared.target, refs, "c") as survivors:
        with tf.compat.v1.Session(shared.target, graph=g, config=fault_client.config("kernel-error")) as sess:
            sess.run(init)
            assert [float(sess.run(out, {x: [1.0, 2.0, 3.0]})) for _ in range(4)] == [6.0, 12.0, 18.0, 24.0]
            t0 = time.monotonic()
            with pytest.raises(tf.errors.InvalidArgumentError) as nan_err:
                sess.run(out, {x: [1.0, float("nan")]})
            with pytest.raises(tf.errors.InvalidArgumentError) as assert_err:
                sess.run(out, {x: [2e6]})
            errors_s = time.monotonic() - t0
            row = jobs_by_name(addr)["kernel-error"]
            # The failed steps changed nothing; the job goes on.
            assert [float(sess.run(out, {x: [1.0, 1.0]})) for _ in range(2)] == [26.0, 28.0]
            row_after = jobs_by_name(addr)["kernel-error"]
        survivors.wait_steps(20, after=time.monotonic())
        counts = survivors.finish()

    print(f"(c) stock client got InvalidArgumentError {line_with(nan_err.value.message, 'fault-test')!r} and "
          f"{line_with(assert_err.value.message, 'fault-test')!r} in {errors_s:.3f}s; job row runs_failed "
          f"{row['runs_failed']}, iterations {row['iterations']} -> {row_after['iterations']}; survivors {counts}")
    assert "fault-test input" in nan_err.value.message and "NaN" in nan_err.value.message, nan_err.value.message
    assert "fault-test bound" in assert_err.value.message, assert_err.value.message
    assert row["runs_failed"] == 2, row
    assert row_after["iterations"] > row["iterations"], "the job's later steps were not main iterations"
    assert healthy(shared)


# --- (d) an out-of-memory iteration in one job ------------------------------------------------------------

def oom_graph():
    """total += sum(zeros(shape)) + 1: a fed shape of HUGE_SHAPE makes the step run out of memory."""
    g = tf.Graph()
    with g.as_default():
        shape = tf.compat.v1.placeholder(tf.int64, [None], name="shape")
        total = tf.compat.v1.get_variable("total", [], tf.float32, initializer=tf.compat.v1.zeros_initializer())
        step = total.assign_add(tf.reduce_sum(tf.zeros(shape, tf.float32)) + 1.0)
        out = tf.identity(step, name="salus_main_iter")  # every repeated run is a main iteration
        init = tf.compat.v1.global_variables_initializer()
    return g, shape, out, init


def test_out_of_memory_iteration_in_one_job(refs, tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--memory-capacity", "8GiB"))
    g, shape, out, init = oom_graph()
    try:
        rss_before = vm_rss_mib(server.pid)
        with Survivors(server.target, refs, "d", seeds=SURVIVOR_SEEDS[:1]) as survivors:
            with tf.compat.v1.Session(server.target, graph=g, config=fault_client.config("oom")) as sess:
                sess.run(init)
                assert [float(sess.run(out, {shape: [64, 64]})) for _ in range(4)] == [1.0, 2.0, 3.0, 4.0]
                before = jobs_by_name(server.address)["oom"]
                assert before["memory_state"] == "admitted" and before["ephemeral_source"] == "measured", before
                assert before["lane"] != jobs_by_name(server.address)[survivors.names()[0]]["lane"]
                t0 = time.monotonic()
                with pytest.raises(tf.errors.ResourceExhaustedError) as err:
                    sess.run(out, {shape: HUGE_SHAPE})
                oom_s = time.monotonic() - t0
                after = jobs_by_name(server.address)["oom"]
                # The job continues, its state intact, and again after a second failure.
                assert float(sess.run(out, {shape: [64, 64]})) == 5.0
                with pytest.raises(tf.errors.ResourceExhaustedError):
                    sess.run(out, {shape: HUGE_SHAPE})
                assert float(sess.run(out, {shape: [64, 64]})) == 6.0
                row = jobs_by_name(server.address)["oom"]
            survivors.wait_steps(20, after=time.monotonic())
            counts = survivors.finish()
        rss_after = vm_rss_mib(server.pid)
        assert healthy(server)
        stop_cleanly(server)
        log = server.stderr_tail(20000)
    finally:
        server.kill()

    print(f"(d) OOM step failed after {oom_s:.3f}s with ResourceExhaustedError "
          f"{line_with(err.value.message, 'OOM when')[:150]!r}; ephemeral estimate "
          f"{before['ephemeral_estimate_bytes']} "
          f"-> {after['ephemeral_estimate_bytes']} -> {row['ephemeral_estimate_bytes']} bytes after two OOMs; "
          f"survivor {counts} steps; server RSS {rss_before:.0f} -> {rss_after:.0f} MiB")
    assert "OOM when allocating" in err.value.message, err.value.message
    assert after["runs_failed"] == 1 and row["runs_failed"] == 2, (after, row)
    # The server raised the job's estimate (half again, for its next admission) and logged it.
    assert after["ephemeral_estimate_bytes"] >= 1.5 * before["ephemeral_estimate_bytes"] - 2, (before, after)
    assert row["ephemeral_estimate_bytes"] >= 1.5 * after["ephemeral_estimate_bytes"] - 2, (after, row)
    assert "iteration ran out of memory; estimate raised" in log
    assert rss_after - rss_before < 512, "the failed allocations left memory behind"


def test_out_of_memory_iteration_does_not_stall_other_jobs(shared, refs):
    g, shape, out, init = oom_graph()
    with Survivors(shared.target, refs, "d2") as survivors:
        with tf.compat.v1.Session(shared.target, graph=g, config=fault_client.config("oom-stall")) as sess:
            sess.run(init)
            # The first run of its signature is a cheap run: it does not hold the survivors' lane.
            t0 = time.monotonic()
            with pytest.raises(tf.errors.ResourceExhaustedError):
                sess.run(out, {shape: HUGE_SHAPE})
            t1 = time.monotonic()
        stall = survivors.longest_gap(t0, t1)
        during = survivors.min_steps_between(t0, t1)
        survivors.wait_steps(20, after=time.monotonic())
        survivors.finish()
    print(f"(d) default allocator: OOM step took {t1 - t0:.2f}s; survivors' longest stall {stall:.2f}s, "
          f">= {during} steps each during it")
    assert t1 - t0 < 2, f"the OOM step took {t1 - t0:.1f}s"
    assert stall < 1, f"other jobs stalled {stall:.1f}s while one job's allocation failed"


# --- memory sampling: traced runs of concurrent jobs --------------------------------------------------------

def test_memory_sampling_of_concurrent_jobs_does_not_fail_them(tmp_path):
    server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--memory-capacity", "8GiB"))
    jobs, steps = 8, 11
    barrier = threading.Barrier(jobs)
    errors: list[str] = []

    def job(seed: int) -> None:
        m = fault_client.build(seed)
        with tf.compat.v1.Session(server.target, graph=m.graph, config=fault_client.config(f"sampled-{seed}")) as s:
            s.run(m.init)
            for k in range(steps):
                barrier.wait(60)  # the k-th step of every job at the same moment (the server traces runs 2, 10)
                try:
                    s.run([m.loss, m.train_op])
                except tf.errors.OpError as e:
                    errors.append(f"job {seed} step {k + 1}: {type(e).__name__}: {e.message.splitlines()[-1]}")

    try:
        threads = [threading.Thread(target=job, args=(200 + i,), daemon=True) for i in range(jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert healthy(server)
        stop_cleanly(server)
    finally:
        server.kill()
    print(f"{len(errors)} of {jobs * steps} steps failed: {errors[:3]}")
    assert not errors, f"{len(errors)} of {jobs * steps} steps failed, e.g. {errors[:3]}"


# --- (e) server SIGTERM with iterations in flight ---------------------------------------------------------

def test_sigterm_with_iterations_of_several_jobs_in_flight(refs, tmp_path):
    timeouts = f"{CLIENT_OP_TIMEOUT_MS},{CLIENT_OP_TIMEOUT_MS},0"  # the third session keeps TF's defaults
    client = FaultClient("e", tmp_path, seeds=SLOW_SEEDS, model="slow",
                         extra=("--op-timeout-ms", timeouts, "--warm", "3", "--deadline", "90"))
    server = None
    try:
        for seed in SLOW_SEEDS:  # while the client imports TensorFlow
            refs.first(seed, 12, "slow")
        client.wait_ready_file()
        # --adopt-grace 0: SIGTERM is a full stop (with adoption it stops only the supervisor: test_restart.py).
        server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--adopt-grace", "0"))
        client.release(server.target)
        client.events.next("ready", timeout=60)
        time.sleep(0.3)
        sigterm_wall = time.time()
        server.send_signal(signal.SIGTERM)
        code = server.proc.wait(60)
        exit_s = time.time() - sigterm_wall
        for i in (0, 1):
            client.events.next("closed", timeout=30, session=i)
        time.sleep(1.0)  # the stock session has had more than 2 s to give up; it does not
        done = client.finish()
        log = server.stderr_tail(20000)
    finally:
        client.kill()
        if server:
            server.kill()

    sessions = done["sessions"]
    lines = []
    for s in sessions:
        in_flight = s["ended"] and s["ended"][-1] > sigterm_wall
        err, close, pending = s["error"], s["close"], s["pending_step"]
        lines.append(f"  session {s['session']} (operation_timeout_in_ms={s['op_timeout_ms']}): {len(s['losses'])} "
                     f"steps, in-flight step finished after SIGTERM: {bool(in_flight)}"
                     + (f" (+{s['ended'][-1] - sigterm_wall:.3f}s)" if in_flight else "")
                     + (f"; next step {err['class']} after {err['at'] - err['sent']:.2f}s" if err else "")
                     + (f"; close {close['outcome']} after {close['seconds']:.2f}s" if close else "")
                     + (f"; next step still blocked after {pending['seconds']:.1f}s, no error" if pending else ""))
    print(f"(e) SIGTERM: exit {code} after {exit_s:.2f}s\n" + "\n".join(lines))
    assert code == 0, f"exit code {code} after SIGTERM; log:\n{log[-3000:]}"
    assert exit_s < 10, f"exit took {exit_s:.1f}s: something waited for the grace period"
    assert "all sessions closed sessions=3" in log, log[-3000:]
    finished_after = 0
    for s in sessions:
        n = len(s["losses"])
        # Lost nothing: every step the client got back is the in-process step's exact result...
        assert s["losses"] == refs.first(s["seed"], n, "slow"), f"session {s['session']}: wrong losses"
        # ...and every step that reached the server before the signal completed.
        err = s["error"]
        if err:
            assert err["sent"] > sigterm_wall - 0.005, f"a step sent before SIGTERM failed: {err}"
        finished_after += bool(s["ended"] and s["ended"][-1] > sigterm_wall)
    assert finished_after >= 1, "no iteration was in flight at SIGTERM: the test proved nothing"
    for s in sessions[:2]:
        # The next step fails within its timeout: DeadlineExceeded once nothing listens, or UNAVAILABLE "shutting
        # down" when it reached the server while it was still draining (which of the two is a race of the step
        # against the exit, not a property of the server).
        err, close = s["error"], s["close"]
        assert err and (err["class"] == "DeadlineExceededError"
                        or (err["class"] == "UnavailableError" and "shutting down" in err["message"])), err
        assert close["outcome"] == "DeadlineExceededError" or (
            close["outcome"] == "UnavailableError" and "shutting down" in (close["message"] or "")), close
        assert s["close"]["seconds"] < CLIENT_OP_TIMEOUT_MS / 1000 + 3, s["close"]
    stock = sessions[2]
    # TensorFlow's client waits for a server to come back (no error while none listens); it must not have
    # got a wrong answer instead.
    assert stock["error"] is None or stock["error"]["class"] in ("UnavailableError", "AbortedError"), stock


# --- (f) server SIGKILL and restart on the same port ------------------------------------------------------

def test_server_sigkill_and_restart_on_the_same_port(refs, tmp_path):
    seeds = (41, 42)
    client = FaultClient("f", tmp_path, seeds=seeds,
                         extra=("--op-timeout-ms", f"0,{CLIENT_OP_TIMEOUT_MS}", "--step-sleep-ms", "2",
                                "--deadline", "90"))
    first = second = None
    try:
        refs.first(99, 20)  # while the client imports TensorFlow
        client.wait_ready_file()
        # --adopt-grace 0: the restart this test is about loses the jobs (test_restart.py: one that does not).
        first = SalusProcess(tmp_path / "first.stderr.log", ("--adopt-grace", "0"))
        client.release(first.target)
        client.events.next("ready", timeout=60)
        kill_wall = time.time()
        first.kill()  # SIGKILL, by PID
        # The session with operation_timeout_in_ms gives up after it, for its step and then its close.
        err1 = client.events.next("error", timeout=30, session=1)
        closed1 = client.events.next("closed", timeout=30, session=1)
        time.sleep(0.5)
        stock_failed_while_down = client.events.seen("error", session=0)
        down_s = time.time() - kill_wall
        second = SalusProcess(tmp_path / "second.stderr.log", listen=first.address)
        restart_wall = time.time()
        err0 = client.events.next("error", timeout=30, session=0)
        closed0 = client.events.next("closed", timeout=30, session=0)
        done = client.finish()

        # New jobs on the restarted server: exact training; no session of the dead server is listed.
        m = fault_client.build(99)
        with tf.compat.v1.Session(second.target, graph=m.graph, config=fault_client.config("after-restart")) as sess:
            sess.run(m.init)
            new_losses = [float(sess.run([m.loss, m.train_op])[0]) for _ in range(20)]
        rows_after = ctl_json(second.address, "jobs")["jobs"]
        assert healthy(second)
        stop_cleanly(second)
    finally:
        client.kill()
        for server in (first, second):
            if server:
                server.kill()

    print(f"(f) server SIGKILLed; with operation_timeout_in_ms={CLIENT_OP_TIMEOUT_MS}: run "
          f"{err1['class']} {err1['at'] - kill_wall:.2f}s after the kill, close {closed1['outcome']} after "
          f"{closed1['seconds']:.2f}s; stock session: no error while the server was down ({down_s:.1f}s), "
          f"{err0['class']} {err0['at'] - restart_wall:.2f}s after the restart "
          f"({err0['message'].splitlines()[-1]!r}), "
          f"close {closed0['outcome']} after {closed0['seconds']:.3f}s")
    for s in done["sessions"]:
        assert s["losses"] == refs.first(s["seed"], len(s["losses"])), f"session {s['session']}: wrong losses"
    assert err1["class"] == "DeadlineExceededError", err1
    assert err1["at"] - err1["sent"] < CLIENT_OP_TIMEOUT_MS / 1000 + 3, err1
    assert closed1["outcome"] == "DeadlineExceededError", closed1
    assert not stock_failed_while_down, "the stock client failed while no server listened (TF behaviour changed?)"
    assert err0["class"] == "AbortedError", err0
    assert "not found" in err0["message"] and "restarted" in err0["message"], err0
    assert err0["at"] - restart_wall < 10, "the stock client did not get its error soon after the restart"
    assert closed0["outcome"] == "AbortedError" and closed0["seconds"] < 5, closed0
    assert new_losses == refs.first(99, 20)
    assert [r["name"] for r in rows_after] == [], f"sessions listed after every client closed: {rows_after}"
