"""One executor process per tenant (`--isolation tenant`, the default), running as the tenant's Unix user.

Real Unix users: salus-ta crashes TensorFlow (a tf.data pipeline that segfaults it) eagerly, inside a tf.function
and in a TF1 session, and has its executor SIGKILLed mid-step, while salus-tb trains: salus-tb's numbers equal
its in-process run, salus-ta gets a clear error at once (not a retry), and its next job works. Each user's file
operations on the server behave exactly as in its own process: its own files are read and written, checkpoints,
summaries and TFRecord training work; the other user's 0600 file and 0700 directory are refused by the OS.
A main iteration of salus-ta that blocks (a dequeue from a queue nobody fills) holds the lane only until
--lane-hold-limit: salus-tb's training runs beside it. salus-ta printing 10 MiB to stderr grows the server's log
only by --executor-log-rate's allowance.

--max-tenant-connections: salus-ta holding its cap of raw connections gets the rest refused with the reason, and
salus-tb still connects and runs.

Costs about 2 minutes (on one of two pytest workers): three servers, two executors at a time, about twenty-three
TensorFlow client processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import WORKLOADS, SalusProcess, as_user, last_json_line, run_as, venv_python, wait_until
from server_ctl import ctl_json, jobs_by_name
from tf2_common import tf2_env

# salus-tb's training runs at least this many steps, then on until salus-ta's three crashes (one after the other:
# each a TensorFlow import) are over: it trains through them on any CPU, and its numbers are compared with an
# in-process run of as many steps. (Run at once, one crash can kill the executor while another script's adapter
# connects, and that adapter then runs its eager work in its own process.)
TRAIN_STEPS = 100


@pytest.fixture(scope="module")
def server(tmp_path_factory, unix_users):
    s = SalusProcess(tmp_path_factory.mktemp("isolation") / "salus-server.stderr.log", ("--isolation", "tenant"))
    yield s
    assert s.stop() == 0, s.stderr_tail()


def executor_pids(server: SalusProcess) -> dict[str, list[int]]:
    """The server's executor processes: {tenant name: [pid, ...]}, from /proc (a tenant may briefly have two:
    one stopping, one new)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != server.pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except (OSError, ValueError, IndexError):
            continue
        tenant = env.get(b"SALUS_EXECUTOR_TENANT")
        if tenant:
            found.setdefault(tenant.decode(), []).append(int(entry))
    return found


def start_training(user, target: str, name: str, steps: int = TRAIN_STEPS, stop_file: Path | None = None,
                   gap_ms: float = 0) -> subprocess.Popen:
    cmd = [venv_python(), str(WORKLOADS / "sched_job.py"), "--target", target, "--name", name,
           "--steps", str(steps), "--digest-only", "--seed", "3"]
    if stop_file:
        cmd += ["--stop-file", str(stop_file)]
    if gap_ms:
        cmd += ["--gap-ms", str(gap_ms)]
    env = {**os.environ, "HOME": user.pw_dir}
    return subprocess.Popen(as_user(user, cmd), env=env, cwd=user.pw_dir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def digest_of(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return last_json_line(out)["digest"]


def crash(user, mode: str, server: SalusProcess) -> dict:
    cmd = [venv_python(), str(WORKLOADS / "crasher.py"), mode]
    if mode == "tf1":
        cmd += ["--target", server.target]
        env = {}
    else:
        env = tf2_env(SALUS_SERVER=server.address)
    proc = run_as(user, cmd, env=env, timeout=120)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return last_json_line(proc.stdout)


def small_job_works(user, server: SalusProcess) -> None:
    script = ("import sys, tensorflow as tf\n"
              "tf.compat.v1.disable_eager_execution()\n"
              "with tf.compat.v1.Session(sys.argv[1]) as s:\n"
              "    print('RESULT', s.run(tf.constant([1.0, 2.0]) * 3.0).tolist())\n")
    proc = run_as(user, [venv_python(), "-c", script, server.target])
    assert "RESULT [3.0, 6.0]" in proc.stdout, proc.stderr[-3000:]


def test_a_tenants_crashes_end_only_its_own_jobs(server, unix_users):
    ta, tb = unix_users["salus-ta"], unix_users["salus-tb"]
    stop = Path(tb.pw_dir) / "stop-training"
    stop.unlink(missing_ok=True)
    # A step every ~20 ms: training all along, with a few thousand steps less for both runs to do.
    trainer = start_training(tb, server.target, "tb-train", stop_file=stop, gap_ms=15)
    try:
        # Training is under way before the first crash: the job has run iterations (not a clock guess).
        assert wait_until(lambda: jobs_by_name(server.address).get("tb-train", {}).get("iterations", 0) >= 20
                          or trainer.poll() is not None, timeout=120, interval=0.2), "salus-tb never trained"
        outcomes = {mode: crash(ta, mode, server) for mode in ("eager", "function", "tf1")}
        print(json.dumps(outcomes, indent=1))
        for mode, outcome in outcomes.items():
            # TF1: the master client retries the closed connection and the tenant's next executor answers
            # INTERNAL with how its predecessor died. TF2's eager client does not retry: it reports the
            # supervisor's GOAWAY for the dead executor's connection, with the same cause, as UNAVAILABLE.
            want = "InternalError" if mode == "tf1" else "UnavailableError"
            assert outcome["error"] == want, (mode, outcome)
            assert "executor process of tenant salus-ta" in outcome["message"], (mode, outcome)
            # In TensorFlow's own process the pipeline segfaults; in an executor (glibc's malloc entry points
            # behind the server's counting hooks) the same allocation usually ends in std::bad_alloc and SIGABRT,
            # with libstdc++'s "terminate called ..." as its last words (or, thrown on an executor thread of the
            # server's own, Rust's abort, which the supervisor explains): the executor writes fd 2 straight into
            # the supervisor's pipe, so the words written before the abort are all there.
            message = outcome["message"]
            assert "killed by signal" in message, (mode, outcome)
            assert "SIGSEGV" in message or "SIGABRT" in message, (mode, outcome)
            if "SIGABRT" in message:
                assert ("it said: terminate called after throwing" in message and "what():" in message
                        or "it said: TensorFlow threw a C++ exception" in message), (mode, outcome)
        assert trainer.poll() is None, "salus-tb's training ended during salus-ta's crashes"
        small_job_works(ta, server)
        stop.touch()
        out, err = trainer.communicate(timeout=600)
    finally:
        stop.touch()
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode == 0, err[-3000:]
    trained = last_json_line(out)
    assert trained["steps"] >= TRAIN_STEPS, trained
    # The same training in salus-tb's own process, as many steps: the same numbers.
    assert trained["digest"] == digest_of(start_training(tb, "", "tb-local", steps=trained["steps"]))
    assert server.proc.poll() is None, "the server died"


def test_the_supervisor_runs_no_tensorflow(server):
    """The process users start (salus-server execs into salus-supervisor) does not map TensorFlow's libraries:
    its binary does not link them, the devices are listed by a child (`probe-devices`), and none of TensorFlow's
    threads (tf_Compute, tf_graph_runner) are among its own, while `ctl info` names TensorFlow's version and
    devices."""
    maps = Path(f"/proc/{server.pid}/maps").read_text()
    assert Path(f"/proc/{server.pid}/exe").resolve().name == "salus-supervisor"
    assert "libtensorflow" not in maps, [line for line in maps.splitlines() if "libtensorflow" in line][:3]
    threads = sorted(Path(f"/proc/{server.pid}/task/{tid}/comm").read_text().strip()
                     for tid in os.listdir(f"/proc/{server.pid}/task"))
    assert threads and not [t for t in threads if t.startswith("tf_")], threads
    info = ctl_json(server.address, "info")
    assert info["tensorflow_version"] and any(d["name"].endswith("device:CPU:0") for d in info["devices"]), info
    rss = next(line for line in Path(f"/proc/{server.pid}/status").read_text().splitlines()
               if line.startswith("VmRSS"))
    print(f"supervisor threads {threads}; {rss} (with TensorFlow linked and no runtime started it was 290 MB)")


def test_an_executor_killed_mid_step_fails_its_tenant_at_once(server, unix_users):
    ta = unix_users["salus-ta"]
    # It trains on until it is killed (a file nobody makes): a busy machine's poll cannot see it end first.
    victim = start_training(ta, server.target, "ta-victim", stop_file=Path(ta.pw_dir) / "never-made")
    try:
        # Training is under way: the job has run iterations (not a clock guess).
        assert wait_until(lambda: jobs_by_name(server.address).get("ta-victim", {}).get("iterations", 0) >= 20,
                          timeout=120, interval=0.2), "the victim never trained"
        for pid in executor_pids(server)["salus-ta"]:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.time()
        out, err = victim.communicate(timeout=120)
        gave_up_after = time.time() - killed_at
    finally:
        if victim.poll() is None:
            victim.kill()
    assert victim.returncode != 0
    assert "InternalError" in err and "SIGKILL" in err and "executor process of tenant salus-ta" in err, err[-3000:]
    assert gave_up_after < 30, f"the client took {gave_up_after:.0f} s to give up"
    small_job_works(ta, server)
    assert "salus-ta" in executor_pids(server), "a new executor serves the tenant"


def test_each_user_does_with_files_what_it_does_in_its_own_process(server, unix_users):
    ta, tb = unix_users["salus-ta"], unix_users["salus-tb"]
    own = os.path.join(ta.pw_dir, "private.txt")
    other = os.path.join(tb.pw_dir, "private.txt")
    for user, path in ((ta, own), (tb, other)):
        with open(path, "w") as f:
            f.write(f"{user.pw_name}'s secret\n")
        os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(path, 0o600)
    runs = {}
    for where, target in (("salus", server.target), ("in_process", "")):
        cmd = [venv_python(), str(WORKLOADS / "tenant_files.py"), "--target", target, "--own-file", own,
               "--other-file", other, "--out-dir", os.path.join(ta.pw_dir, where), "--other-dir", tb.pw_dir]
        proc = run_as(ta, cmd)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[where] = last_json_line(proc.stdout)["outcomes"]
    print(json.dumps(runs, indent=1))
    assert runs["salus"] == runs["in_process"]
    ok = runs["salus"]
    assert ok["read_own"] == ["ok", "salus-ta's secret\n"], ok
    assert ok["read_other"][0] == "PermissionDeniedError" and ok["write_other"][0] == "PermissionDeniedError", ok
    for attempt in ("write_own", "checkpoint", "summary", "tfrecord"):
        assert ok[attempt][0] == "ok", (attempt, ok[attempt])
    assert not os.path.exists(os.path.join(tb.pw_dir, "intruder.txt"))
    written = os.path.join(ta.pw_dir, "salus", "written.txt")
    assert os.stat(written).st_uid == ta.pw_uid, "the file was written as the tenant's user"


# Prints 8 x 1.25 MiB of 10-byte lines to the executor's stderr (tf.print in a TF1 session, as in the tenant's own
# process, where it would reach the script's terminal).
PRINTER = """
import sys, tensorflow as tf
tf.compat.v1.disable_eager_execution()
text = tf.strings.reduce_join(tf.fill([1 << 17], "xxxxxxxxx\\n"))
printed = tf.print(text, output_stream=sys.stderr)
with tf.control_dependencies([printed]):
    done = tf.constant(1)
with tf.compat.v1.Session(sys.argv[1]) as s:
    for _ in range(8):
        s.run(done)
print("PRINTED", flush=True)
"""
DROP_NOTE = "of this executor's output were not copied here"


def test_a_tenant_printing_without_end_cannot_fill_the_servers_log(server, unix_users):
    """The server copies an executor's stderr into its log within --executor-log-rate (64 KiB/s after a burst of
    16 s of it, 1 MiB) and notes what it dropped: 10 MiB printed (34 MiB in the log with the executor's label)."""
    log = server.log_path
    before = log.stat().st_size
    start = time.monotonic()
    proc = run_as(unix_users["salus-ta"], [venv_python(), "-c", PRINTER, server.target])
    assert "PRINTED" in proc.stdout, proc.stderr[-3000:]
    # The copy may still be reading the pipe: its note of the drops comes once it is past the burst.
    assert wait_until(lambda: DROP_NOTE.encode() in log.read_bytes()[before:], timeout=120, interval=0.5), \
        "the server never noted the lines it dropped"
    size = log.stat().st_size
    while True:  # until the copy has caught up: the log stops growing
        time.sleep(1)
        if log.stat().st_size == size:
            break
        size = log.stat().st_size
    grown = size - before
    allowed = (1 << 20) + (64 << 10) * (time.monotonic() - start + 2) + (256 << 10)
    print(f"the log grew by {grown} bytes in {time.monotonic() - start:.1f} s (allowed {allowed:.0f})")
    assert grown <= allowed, f"the log grew by {grown} bytes, more than {allowed:.0f} in {time.monotonic() - start:.0f} s"
    small_job_works(unix_users["salus-ta"], server)


# A TF1 main iteration (a fetch named salus_main_iter) that waits on a queue nobody fills, up to a deadline of its
# own (so the test ends even when the lane is never given up); prints a line when it is about to block.
BLOCKER = """
import sys, tensorflow as tf
tf.compat.v1.disable_eager_execution()
queue = tf.queue.FIFOQueue(1, tf.float32, shapes=[])
step = tf.identity(queue.dequeue(), name="salus_main_iter")
config = tf.compat.v1.ConfigProto()
config.experimental.session_metadata.name = "ta-blocker"
with tf.compat.v1.Session(sys.argv[1], config=config) as s:
    print("blocking", flush=True)
    try:
        s.run(step, options=tf.compat.v1.RunOptions(timeout_in_ms=int(sys.argv[2])))
    except tf.errors.DeadlineExceededError:
        print("deadline", flush=True)
"""


@pytest.fixture(scope="module")
def short_hold_server(tmp_path_factory, unix_users):
    s = SalusProcess(tmp_path_factory.mktemp("hold") / "salus-server.stderr.log",
                     ("--isolation", "tenant", "--lane-hold-limit", "2s", "--shutdown-grace", "5s"))
    yield s
    assert s.stop() == 0, s.stderr_tail()


def test_a_blocked_iteration_holds_the_lane_only_until_the_limit(short_hold_server, unix_users):
    server = short_hold_server
    ta, tb = unix_users["salus-ta"], unix_users["salus-tb"]
    env = {**os.environ, "HOME": ta.pw_dir}
    blocker = subprocess.Popen(as_user(ta, [venv_python(), "-c", BLOCKER, server.target, "600000"]),
                               env=env, cwd=ta.pw_dir, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert blocker.stdout.readline().strip() == "blocking", blocker.stderr.read()[-3000:]
        # Its iteration has the lane (the supervisor's core runs it), then salus-tb trains on the same lane.
        assert wait_until(lambda: any(q["running"] for q in ctl_json(server.address, "stats")["lanes"]),
                          timeout=60, interval=0.2), "the blocking iteration never started"
        trainer = run_as(tb, [venv_python(), str(WORKLOADS / "sched_job.py"), "--target", server.target,
                              "--name", "tb-beside", "--steps", "200", "--tiny", "--force-main", "--digest-only"],
                         timeout=240)
        assert trainer.returncode == 0, trainer.stderr[-3000:]
        assert last_json_line(trainer.stdout)["steps"] == 200
        stats = ctl_json(server.address, "stats")
        # Without the limit salus-tb's steps would have waited for salus-ta's deadline (10 min: the trainer's
        # timeout ends the test first), and nothing is counted; with it the lane moved on while the blocked
        # iteration ran on (its deadline is far enough off that a loaded machine does not end it first).
        assert stats["lane_holds_released"] >= 1, stats
        assert blocker.poll() is None, "salus-ta's iteration was ended, not left running"
    finally:
        blocker.kill()
        blocker.communicate()
    assert server.proc.poll() is None, "the server died"


# Opens N raw TCP connections to the server and holds them; prints what the refused ones were told (the server's
# SETTINGS, then a GOAWAY frame whose debug text starts at byte 9 + 17), then waits for stdin to close.
HOLDER = r"""
import json, socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
n, expect = int(sys.argv[2]), int(sys.argv[3])
socks = [socket.create_connection((host, int(port))) for _ in range(n)]
for s in socks:
    s.setblocking(False)
got = [b""] * n
# Until the expected refusals came (none expected: for a second), and 30 s at most.
deadline = time.time() + (30 if expect else 1)
told = []
while time.time() < deadline:
    time.sleep(0.1)
    for i, s in enumerate(socks):
        try:
            got[i] += s.recv(65536)
        except BlockingIOError:
            pass
    told = [g[26:].decode(errors="replace") for g in got if len(g) > 26 and g[12] == 7]  # type GOAWAY
    if expect and len(told) >= expect:
        break
print(json.dumps({"refused": len(told), "said": told[:1]}), flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory, unix_users):
    s = SalusProcess(tmp_path_factory.mktemp("capped") / "salus-server.stderr.log",
                     ("--isolation", "tenant", "--max-tenant-connections", "8"))
    yield s
    assert s.stop() == 0, s.stderr_tail()


def hold_connections(user, server: SalusProcess, n: int, expect_refused: int) -> tuple[subprocess.Popen, dict]:
    holder = subprocess.Popen(as_user(user, [venv_python(), "-c", HOLDER, server.address, str(n),
                                             str(expect_refused)]), cwd=user.pw_dir,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = holder.stdout.readline()
    assert line, holder.stderr.read()[-3000:]
    return holder, json.loads(line)


def test_a_user_holding_its_connection_cap_does_not_lock_others_out(capped_server, unix_users):
    server = capped_server
    ta, tb = unix_users["salus-ta"], unix_users["salus-tb"]
    holder, seen = hold_connections(ta, server, 12, 4)
    try:
        # The 9th to 12th connections were told why and closed; the first 8 stay open.
        assert seen["refused"] == 4, seen
        said = seen["said"][0]
        assert f"Unix user {ta.pw_uid} already has 8 connections open" in said, said
        assert "--max-tenant-connections" in said, said
        # salus-tb's job runs while salus-ta holds its whole share (without the cap a user could hold every
        # descriptor the server has: 20,000 here, and then nobody else could connect).
        small_job_works(tb, server)
    finally:
        holder.stdin.close()
        holder.wait(30)
    # salus-ta's places come back as its connections close.
    def all_admitted():
        again, seen = hold_connections(ta, server, 8, 0)
        again.stdin.close()
        again.wait(30)
        return seen["refused"] == 0
    assert wait_until(all_admitted, timeout=30, interval=0.5)
    small_job_works(ta, server)
    assert server.proc.poll() is None, "the server died"
