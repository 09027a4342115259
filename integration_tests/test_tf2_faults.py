"""Faults in TF2 eager jobs (and in the server) while other jobs train: the other jobs lose nothing.

TF2 clients are workloads/tf2_fault_job.py children (unmodified eager scripts; SALUS_SERVER set, the adapter
sends their eager work to the server, one eager context = one job). The same script run once in-process (no
SALUS_SERVER, TF_ONEDNN_USE_SYSTEM_ALLOCATOR=true as the server sets it) gives every reference number: the
survivor's per-step losses, the kernel-error and OOM sequences, the long call's value. Remote numbers must equal
them to 1e-6 relative (tf2_common.assert_same_numbers; bitwise in practice); TF1 numbers must be bitwise equal
(test_faults.References: the same graph in a local tf.compat.v1.Session).

"Others", for (a)-(c), on one server shared by those tests: a TF2 job training the tf2_fault_job MLP (a
tf.function step, one loss fetched per step, 10 ms between steps) and a TF1 graph session (test_faults.Survivor,
a thread of this process training fault_client's tiny model). They run through (a)-(c); each test checks that
every loss they reported so far equals the in-process run and that both made progress after its fault.

(a) a Keras 3 fit client (steps of about a second) SIGKILLed mid-step: its context leaves the admin job list
    within 15 s (its stream ended: 3 s grace after the running step), the others keep training exactly;
(b) kernel errors in a tf.function (check_numerics on a NaN, a failing tf.debugging.assert_less): the job gets
    InvalidArgumentError with TensorFlow's message and goes on; its whole sequence equals in-process;
(c) an out-of-memory tf.function call (tf.zeros of 2**46 floats, fails at once): ResourceExhaustedError "OOM
    when allocating", fast, and the job goes on; its sequence equals in-process;
(d) SIGTERM with a TF2 job inside a long function call (about 2 s) and a TF1 session stepping: the long call
    completes and its value reaches the client (equal to in-process), the TF1 steps sent before the signal
    complete exactly, the server closes both and exits 0 at once (well within --shutdown-grace). The clients'
    next requests fail (the TF1 one with DeadlineExceededError after its operation_timeout_in_ms);
(e) SIGKILL of the server and a restart on the same port: the TF2 client's next step fails with an error that
    names its eager context as not found (ABORTED, "... not found ... restarted"); a new TF2 job on the
    restarted server trains exactly.

On SIGTERM the server keeps serving eager contexts (but starts no new function calls) until they are quiet, so
the value of the call in flight, which a TF2 client fetches with a follow-up _Send + RecvTensor, reaches it.

Timing-dependent parts: (a) kills 0.3 s into a Keras step of about 1-2 s (the kill lands mid-step on any machine
where a step takes more than 0.3 s); (d) sends SIGTERM 0.5 s into a call of about 2 s (it asserts the call
ended after the signal). Each test prints what it saw (pytest -s). About 70 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

import salus_wire as w
from conftest import SalusProcess, wait_until
from server_ctl import jobs_by_name, stop_cleanly
from test_faults import (Events, FaultClient, References, Survivor, healthy,
                         line_with)
from tf2_common import assert_same_numbers, start_workload, tf2_env

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("SALUS_TEST_TARGET")),
    reason="TF2 fault tests start, signal and kill their own salus-server")

SCRIPT = "tf2_fault_job.py"
REF_STEPS = 8000  # the TF2 survivor's cap (it makes ~60 steps/s: ~4000 in the module)
STEP_SLEEP_MS = 10
LONG_ITERS = 1800  # (d): the long call, about 2 s on a loaded 2-core machine
TF1_SEED = 111
SLOW_SEED = 131
PROGRESS_STEPS = 20
TF_START_S = 180  # a TF2 child imports TensorFlow first (seconds on a busy 2-core machine)


# --- helpers ------------------------------------------------------------------------------------------------

class Reference:
    """The in-process run (mode reference), started at once and awaited on first use."""

    def __init__(self):
        self.proc = start_workload(SCRIPT, tf2_env(TF_ONEDNN_USE_SYSTEM_ALLOCATOR="true"), "--mode", "reference",
                                   "--steps", str(REF_STEPS), "--long-iters", str(LONG_ITERS), "--deadline",
                                   "240")
        self._value: dict | None = None

    def get(self) -> dict:
        if self._value is None:
            out, err = self.proc.communicate(timeout=240)
            lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            ref = next((l for l in lines if l["phase"] == "reference"), None)
            if ref is None:
                pytest.fail(f"the in-process reference run failed ({self.proc.returncode}):\n{err[-4000:]}")
            self._value = ref
        return self._value


class TF2Child:
    """A tf2_fault_job.py child through the adapter: its step events are collected, the others awaited."""

    def __init__(self, address: str, name: str, *args: str, stdin: bool = False):
        self.name = name
        self.proc = start_workload(SCRIPT, tf2_env(SALUS_SERVER=address, SALUS_JOB_NAME=name), *args, stdin=stdin)
        self.losses: list[float] = []
        self.ends: list[float] = []  # time.monotonic() when each step's line arrived
        self.stderr: list[str] = []
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()
        self.events = Events(self.lines, self.describe)

    def describe(self) -> str:
        return f"{self.name}: exit code {self.proc.poll()}; stderr tail:\n{''.join(self.stderr)[-3000:]}"

    def _pump(self):
        for line in self.proc.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if msg["phase"] == "step":
                self.losses.append(msg["loss"])
                self.ends.append(time.monotonic())
            else:
                self.lines.put(msg)
        self.lines.put(None)

    def steps_after(self, t: float) -> int:
        return sum(1 for e in list(self.ends) if e > t)

    def send_line(self, text: str = "go") -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by its Popen handle
        self.proc.wait(10)


def assert_same_sequence(local: list[dict], remote: list[dict], label: str) -> None:
    """Outcome by outcome: the same values (1e-6), the same error classes, the same TensorFlow message."""
    assert len(local) == len(remote), f"{label}: {len(local)} outcomes in-process, {len(remote)} remote"
    for i, (a, b) in enumerate(zip(local, remote)):
        assert a["ok"] == b["ok"], f"{label} call {i}: in-process {a}, remote {b}"
        if a["ok"]:
            assert_same_numbers({k: v for k, v in a.items() if k != "seconds"},
                                {k: v for k, v in b.items() if k != "seconds"})
        else:
            assert a["error"] == b["error"], f"{label} call {i}: in-process {a['error']}, remote {b['error']}"
            # TensorFlow's own message line (the in-process one comes with a Python traceback first).
            key = b["message"].strip().splitlines()[0].split("}} ", 1)[-1][:60]
            assert key and key in a["message"], f"{label} call {i}: {b['message']!r} vs in-process {a['message']!r}"


def job_row(address: str, name: str) -> dict | None:
    return jobs_by_name(address).get(name)


class Others:
    """The other jobs of (a)-(c): one TF2 job (a child) and one TF1 session (a thread), module-long."""

    def __init__(self, server: SalusProcess, reference: Reference, refs: References, tmp: Path):
        self.reference, self.refs = reference, refs
        self.stop_file = tmp / "others.stop"
        self.tf2 = TF2Child(server.address, "others-tf2", "--mode", "train", "--steps", str(REF_STEPS),
                            "--warm", "5", "--step-sleep-ms", str(STEP_SLEEP_MS), "--stop-file",
                            str(self.stop_file), "--deadline", "600")
        self.tf1 = Survivor(server.target, TF1_SEED, "others-tf1")
        self.tf1.start()
        self.tf2.events.next("ready", timeout=TF_START_S)
        if not wait_until(lambda: len(self.tf1.losses) >= 5 or self.tf1.error, timeout=60):
            pytest.fail("the TF1 job did not start training")
        self.check(after=0.0, steps=0)

    def check(self, after: float, steps: int = PROGRESS_STEPS, timeout: float = 30) -> tuple[int, int]:
        """Both made `steps` steps after monotonic time `after`; every loss so far equals in-process."""
        ok = wait_until(lambda: (self.tf2.steps_after(after) >= steps and self.tf1.steps_between(after) >= steps)
                        or self.tf1.error is not None or self.tf2.proc.poll() is not None, timeout)
        assert self.tf1.error is None, f"the TF1 job failed: {self.tf1.error}"
        assert self.tf2.proc.poll() is None, f"the TF2 job died: {self.tf2.describe()}"
        assert ok, (f"the other jobs stalled: TF2 {self.tf2.steps_after(after)}, TF1 "
                    f"{self.tf1.steps_between(after)} steps in {timeout}s")
        tf2, tf1 = list(self.tf2.losses), list(self.tf1.losses)
        assert len(tf2) < REF_STEPS, "the TF2 job reached its step cap: raise REF_STEPS"
        assert_same_numbers({"losses": self.reference.get()["losses"][:len(tf2)]}, {"losses": tf2})
        assert tf1 == self.refs.first(TF1_SEED, len(tf1)), "the TF1 job's losses differ from in-process"
        return len(tf2), len(tf1)

    def finish(self) -> None:
        self.stop_file.touch()
        done = self.tf2.events.next("done", timeout=30)
        self.tf1.stopping.set()
        self.tf1.join(70)
        assert not self.tf1.is_alive(), "the TF1 job is stuck"
        assert self.tf1.error is None, self.tf1.error
        assert_same_numbers({"losses": self.reference.get()["losses"][:len(done["losses"])]},
                            {"losses": done["losses"]})
        assert self.tf1.losses == self.refs.first(TF1_SEED, len(self.tf1.losses))
        print(f"others: TF2 {len(done['losses'])} steps, TF1 {len(self.tf1.losses)} steps, all equal to in-process")

    def kill(self) -> None:
        self.tf1.stopping.set()
        self.tf2.kill()


@pytest.fixture(scope="module")
def reference():
    return Reference()


@pytest.fixture(scope="module")
def refs():
    r = References()
    yield r
    r.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    server = SalusProcess(tmp_path_factory.mktemp("tf2faults") / "salus-server.stderr.log")
    try:
        yield server
        assert healthy(server)
        stop_cleanly(server)
    finally:
        server.kill()


@pytest.fixture(scope="module")
def others(shared, reference, refs, tmp_path_factory):
    o = Others(shared, reference, refs, tmp_path_factory.mktemp("others"))
    try:
        yield o
        o.finish()
    finally:
        o.kill()


# --- (a) a TF2 client SIGKILLed mid-step --------------------------------------------------------------------

def test_tf2_client_sigkilled_mid_step(shared, others):
    addr = shared.address
    victim = TF2Child(addr, "tf2-victim", "--mode", "victim")
    try:
        victim.events.next("batch", timeout=TF_START_S)
        for _ in range(2):  # the first batch traces; from the third on, steps are ~1 s of server work
            prev = victim.events.next("batch", timeout=60)
        row = job_row(addr, "tf2-victim")
        assert row is not None and row["kind"] == "eager", row
        begun = victim.events.next("batch", timeout=60)
        step_s = begun["t"] - prev["t"]
        time.sleep(min(0.3, step_s / 3))
        row_at_kill = job_row(addr, "tf2-victim")
        victim.proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.proc.wait(10)
        seen: list[dict] = []

        def gone() -> bool:
            r = job_row(addr, "tf2-victim")
            if r:
                seen.append(r)
            return r is None

        assert wait_until(gone, timeout=15, interval=0.1), f"the killed client's context is still listed: {seen[-1:]}"
        reclaimed = time.monotonic()
    finally:
        victim.kill()
    counts = others.check(after=reclaimed)
    assert healthy(shared)
    print(f"(a) Keras fit steps of {step_s:.2f}s; SIGKILLed {min(0.3, step_s / 3):.2f}s into a step (row: state "
          f"{row_at_kill['state']}, runs {row_at_kill['runs_completed']}); context gone from the job list "
          f"{reclaimed - killed:.2f}s later; others at {counts} steps, exact")


# --- (b) kernel errors in a tf.function ---------------------------------------------------------------------

def test_tf2_kernel_error_in_function(shared, others, reference):
    child = TF2Child(shared.address, "tf2-kernel", "--mode", "kernel")
    try:
        t0 = time.monotonic()
        done = child.events.next("done", timeout=TF_START_S)
    finally:
        child.kill()
    outcomes = done["outcomes"]
    assert_same_sequence(reference.get()["kernel"], outcomes, "kernel")
    nan_err, bound_err = outcomes[4], outcomes[5]
    assert nan_err["error"] == "InvalidArgumentError" and "fault-test input" in nan_err["message"] \
        and "NaN" in nan_err["message"], nan_err
    assert bound_err["error"] == "InvalidArgumentError" and "fault-test bound" in bound_err["message"], bound_err
    # The failed calls changed nothing; the job went on.
    assert [o["value"] for o in outcomes[6:8]] == [26.0, 28.0] and outcomes[8]["total"] == 28.0, outcomes
    counts = others.check(after=t0)
    assert healthy(shared)
    print(f"(b) InvalidArgumentError {line_with(nan_err['message'], 'fault-test')!r} and "
          f"{line_with(bound_err['message'], 'fault-test')!r}; later calls "
          f"{[o.get('value') for o in outcomes[6:8]]} as in-process; others at {counts} steps, exact")


# --- (c) an out-of-memory function call ---------------------------------------------------------------------

def test_tf2_out_of_memory_call(shared, others, reference):
    child = TF2Child(shared.address, "tf2-oom", "--mode", "oom")
    try:
        t0 = time.monotonic()
        done = child.events.next("done", timeout=TF_START_S)
    finally:
        child.kill()
    outcomes = done["outcomes"]
    assert_same_sequence(reference.get()["oom"], outcomes, "oom")
    ooms = [o for o in outcomes if not o["ok"]]
    assert len(ooms) == 2 and all(o["error"] == "ResourceExhaustedError" for o in ooms), outcomes
    assert all("OOM when allocating" in o["message"] for o in ooms), ooms
    assert all(o["seconds"] < 2 for o in ooms), f"an OOM call took long: {[o['seconds'] for o in ooms]}"
    assert [o["value"] for o in outcomes if o["ok"]] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    counts = others.check(after=t0)
    assert healthy(shared)
    print(f"(c) ResourceExhaustedError {line_with(ooms[0]['message'], 'OOM when')[:140]!r} after "
          f"{[round(o['seconds'], 3) for o in ooms]}s; the job went on (values 5.0, 6.0); others at {counts} "
          f"steps, exact")


# --- (d) server SIGTERM with TF2 and TF1 work in flight -----------------------------------------------------

# The TF1 client's operation timeout in (d): longer than the TF2 long call (~5 s), which its steps queue behind
# in the one lane, so that a step sent before SIGTERM waits for the server rather than timing out on its own
# before the signal (it did, with 1.5 s, on a loaded CI machine); a step after the stop still ends by it.
TF1_OP_TIMEOUT_MS_D = 12_000


def test_sigterm_with_tf2_and_tf1_work_in_flight(reference, refs, tmp_path):
    tf1 = FaultClient("d", tmp_path, seeds=(SLOW_SEED,), model="slow",
                      extra=("--op-timeout-ms", str(TF1_OP_TIMEOUT_MS_D), "--warm", "3", "--deadline", "90"))
    server = tf2 = None
    try:
        # --adopt-grace 0: SIGTERM is a full stop (with adoption it stops only the supervisor: test_restart.py).
        server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--adopt-grace", "0"))
        tf2 = TF2Child(server.address, "tf2-long", "--mode", "long", "--warm", "3", "--long-iters", str(LONG_ITERS),
                       "--deadline", "90")
        refs.first(SLOW_SEED, 12, "slow")  # while the clients import TensorFlow
        tf1.wait_ready_file()
        tf1.release(server.target)
        tf1.events.next("ready", timeout=60)
        tf2.events.next("ready", timeout=TF_START_S)
        sent = tf2.events.next("long-sent", timeout=30)
        # The long call runs: its iteration has its turn (behind the TF1 session's steps in the one lane, which
        # on a busy machine can take longer than the sleep below alone).
        wait_until(lambda: (job_row(server.address, "tf2-long") or {}).get("state") == "running", timeout=10,
                   interval=0.05)
        time.sleep(0.5)
        sigterm_wall = time.time()
        server.send_signal(signal.SIGTERM)
        code = server.proc.wait(60)
        exit_s = time.time() - sigterm_wall
        long_call = tf2.events.next("long", timeout=60)
        after = tf2.events.next("after", timeout=60)
        tf1.events.next("closed", timeout=30, session=0)
        tf1_done = tf1.finish()
        log = server.stderr_tail(20000)
    finally:
        tf1.kill()
        if tf2:
            tf2.kill()
        if server:
            server.kill()

    s = tf1_done["sessions"][0]
    err = s["error"]
    tf1_in_flight = bool(s["ended"] and s["ended"][-1] > sigterm_wall)
    outcome = (f"value {long_call['value']!r} {long_call['t'] - sigterm_wall:+.2f}s after the signal" if long_call["ok"]
               else f"{long_call['error']}: {long_call['message'].strip().splitlines()[0][:200]!r}")
    print(f"(d) SIGTERM {sigterm_wall - sent['t']:.2f}s into the TF2 long call; server exit {code} after "
          f"{exit_s:.2f}s; the long call: {outcome}; TF2 next step: {after.get('error', 'ok')} "
          f"{after.get('message', '').strip().splitlines()[0][:160] if not after['ok'] else ''!r}; TF1: "
          f"{len(s['losses'])} steps (in-flight step finished after SIGTERM: {tf1_in_flight}), next step "
          f"{err and err['class']}, close {s['close'] and s['close']['outcome']}")
    assert code == 0, f"exit code {code} after SIGTERM; log:\n{log[-3000:]}"
    assert exit_s < 10, f"exit took {exit_s:.1f}s: something waited for the grace period"
    # The TF1 client may close its session itself once its next step is refused (UNAVAILABLE while draining).
    assert "all eager contexts closed contexts=1" in log and re.search(r"all sessions closed sessions=[01]\b", log), \
        log[-3000:]
    # TF1: every step it got back is exact, every step sent before the signal completed.
    assert s["losses"] == refs.first(SLOW_SEED, len(s["losses"]), "slow"), "TF1 losses differ from in-process"
    if err:
        assert err["sent"] > sigterm_wall - 0.005, f"a TF1 step sent before SIGTERM failed: {err}"
        # Refused while eager clients fetch their results (UNAVAILABLE), or timed out once the server stopped.
        assert err["class"] in ("UnavailableError", "DeadlineExceededError"), err
    # TF2: the call in flight at SIGTERM completes and its value reaches the client.
    assert long_call["ok"], f"the TF2 call in flight at SIGTERM failed: {long_call}"
    assert long_call["t"] > sigterm_wall, "the long call ended before SIGTERM: the test proved nothing (raise LONG_ITERS)"
    assert_same_numbers({"long": reference.get()["long"]}, {"long": long_call["value"]})
    if after["ok"]:  # sent before the server stopped listening: it must then be right
        assert_same_numbers({"loss": reference.get()["losses"][3]}, {"loss": after["loss"]})


# --- (e) server SIGKILL and restart on the same port --------------------------------------------------------

def test_server_restart_tf2_client_told_new_job_exact(reference, tmp_path):
    first = second = client = new = None
    try:
        # --adopt-grace 0: the restart this test is about loses the context (test_restart.py: one that does not).
        first = SalusProcess(tmp_path / "first.stderr.log", ("--adopt-grace", "0"))
        client = TF2Child(first.address, "tf2-restart", "--mode", "wait", "--warm", "5", "--deadline", "120",
                          stdin=True)
        ready = client.events.next("ready", timeout=TF_START_S)
        assert_same_numbers({"losses": reference.get()["losses"][:5]}, {"losses": ready["losses"]})
        assert job_row(first.address, "tf2-restart")["kind"] == "eager"
        first.kill()  # SIGKILL, by PID
        second = SalusProcess(tmp_path / "second.stderr.log", listen=first.address)
        t0 = time.monotonic()
        client.send_line()
        after = client.events.next("after", timeout=60)
        told_s = time.monotonic() - t0
        # A new TF2 job on the restarted server trains exactly.
        new = TF2Child(second.address, "tf2-after-restart", "--mode", "train", "--steps", "30", "--warm", "5")
        done = new.events.next("done", timeout=TF_START_S)
        with grpc.insecure_channel(second.address) as ch:
            assert w.health_check(ch) == w.SERVING
        assert wait_until(lambda: not jobs_by_name(second.address), timeout=15), jobs_by_name(second.address)
        stop_cleanly(second)
    finally:
        for c in (client, new):
            if c:
                c.kill()
        for s in (first, second):
            if s:
                s.kill()
    attempts = after["attempts"]
    print(f"(e) after the restart ({told_s:.2f}s): the TF2 client's steps: "
          + "; ".join(f"{a['error']} {a['message'].strip().splitlines()[0][:300]!r}" if not a["ok"] else "ok"
                      for a in attempts) + "; new job: 30 steps exact")
    assert_same_numbers({"losses": reference.get()["losses"][:30]}, {"losses": done["losses"]})
    assert not any(a["ok"] for a in attempts), f"a step of the old context succeeded on the new server: {attempts}"
    # TensorFlow's client first reports its broken stream to the dead server (UnavailableError "Socket closed"),
    # then the new server answers for the context it never had.
    aborted = [a for a in attempts if a["error"] == "AbortedError"]
    assert all(a["error"] in ("UnavailableError", "AbortedError") for a in attempts), attempts
    assert aborted, f"the restarted server never told the client its context is gone: {attempts}"
    message = aborted[0]["message"]
    assert "eager context" in message and "not found" in message and "restarted" in message, message
    assert told_s < 10, f"the client got its errors only after {told_s:.1f}s"


# --- a client that sends faster than its context runs (issue 58) --------------------------------------------

def _enqueue(context_id: int, *items: bytes) -> bytes:
    """EnqueueRequest{context_id=1 (fixed64), queue=3 repeated QueueItem}."""
    return w.tag(1, 1) + context_id.to_bytes(8, "little") + b"".join(w.f_bytes(3, item) for item in items)


def _create_context(ch: grpc.Channel, context_id: int) -> None:
    server_def = w.f_bytes(2, "worker")  # job_name
    w.call(ch, "/tensorflow.eager.EagerService/CreateContext",
           w.f_bytes(1, server_def) + w.tag(7, 1) + context_id.to_bytes(8, "little"))


CPU = "/job:worker/replica:0/task:0/device:CPU:0"


def _send_tensor(op_id: int, floats: int) -> bytes:
    """QueueItem{send_tensor=3: SendTensorOp{op_id=1, tensors=2, device_name=3}} of a float vector."""
    tensor = w.tensor_proto(1, (floats,), tensor_content=bytes(4 * floats))
    return w.f_bytes(3, w.f_varint(1, op_id) + w.f_bytes(2, tensor) + w.f_bytes(3, CPU))


def test_a_client_that_sends_faster_than_its_context_runs_is_held_back(tmp_path):
    # The first request executes Sqrt, which this server never answers (a test fault), so none after it on the
    # stream is answered either. The client keeps sending 128 KiB requests: the server reads a bounded number
    # (its context's requests in flight, MAX_BATCHES_IN_FLIGHT = 256, plus what HTTP/2's 16 MiB stream window
    # holds) and then stops reading, so the client's sends wait (backpressure) instead of the server holding
    # everything the client sends. The server stays healthy for the client's other calls and other clients.
    server = SalusProcess(tmp_path / "server.log", env={"SALUS_FAULT_STALL_OP": "Sqrt"})
    total, floats = 2000, 32 * 1024
    sent = [0]
    try:
        ch = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", -1)])
        context_id = 0x5A105_0058
        _create_context(ch, context_id)
        sqrt = w.f_bytes(2, w.f_varint(1, 1) + w.f_bytes(2, "Sqrt") + w.f_bytes(6, CPU)
                         + w.f_bytes(10, w.f_bytes(2, w.tensor_proto(1, (), float_val=[4.0]))))

        def requests():
            yield _enqueue(context_id, sqrt)
            for i in range(total):
                sent[0] += 1
                yield _enqueue(context_id, _send_tensor(100 + i, floats))

        stream = ch.stream_stream("/tensorflow.eager.EagerService/StreamingEnqueue",
                                  request_serializer=None, response_deserializer=None)
        responses = stream(requests(), timeout=120)
        # Wait until the client's sends stop (no progress for 3 s), at most 60 s.
        deadline, last, still_since = time.monotonic() + 60, -1, time.monotonic()
        while time.monotonic() < deadline:
            now = sent[0]
            if now != last:
                last, still_since = now, time.monotonic()
            elif time.monotonic() - still_since > 3:
                break
            time.sleep(0.2)
        held_at = sent[0]
        # Pipelining works (the server read well ahead of its answers), but not without bound: 2000 x 128 KiB
        # would be 256 MiB; the server takes its 256 and what the windows hold (~16 MiB each side).
        assert 200 <= held_at < total // 2, held_at
        # The server goes on: the same context answers a unary call, a new context runs, health is SERVING.
        w.call(ch, "/tensorflow.eager.EagerService/KeepAlive", w.tag(1, 1) + context_id.to_bytes(8, "little"))
        with grpc.insecure_channel(server.address) as other:
            _create_context(other, context_id + 1)
            out = w.call(other, "/tensorflow.eager.EagerService/Enqueue",
                         _enqueue(context_id + 1, _send_tensor(1, 4)), timeout=30)
            assert w.first(out, 1) is not None  # one queue response
            assert w.health_check(other) == w.SERVING
        # The server ends the held-back stream (as it does when the adapter reports a wait that cannot end):
        # the client gets ABORTED, and the server lets go of all the stream held, so it stops promptly.
        time.sleep(1)
        answer = w.call(ch, "/salus.v1.PythonCallbacks/EndStalledWait",
                        w.f_varint(1, context_id) + w.tag(2, 1) + struct.pack("<d", 1.0), timeout=10)
        assert w.first(answer, 1) == 1, answer
        with pytest.raises(grpc.RpcError) as err:
            for _ in responses:
                pass
        assert err.value.code() == grpc.StatusCode.ABORTED, err.value
        ch.close()
        assert server.proc.poll() is None, server.stderr_tail()
    finally:
        started = time.monotonic()
        assert server.stop() == 0, server.stderr_tail()
    assert time.monotonic() - started < 20, "the server waited for the held-back stream"
