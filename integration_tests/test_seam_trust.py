"""The seam is a trust boundary (issue 58): a tenant owns its executor process, so it can stop it; that must cost
the other tenants nothing beyond their share.

Real Unix users on one server (--isolation tenant) with no --lane-hold-limit and no --silence-limit, so that
the only thing that can free a lane a stopped executor holds is the supervisor seeing the stop (waitid
WSTOPPED/WCONTINUED on its child):
- salus-ta trains and SIGSTOPs its own executor (as salus-ta, with kill(1)) mid-training: `ctl info` shows it
  "stopped", salus-tb's job runs to its end with its in-process numbers (without the fix it waits forever), and
  once salus-ta continues it, salus-ta's job trains on to its end with its in-process numbers.
- salus-ta stops and continues its executor in a loop while salus-tb trains: salus-tb ends with its in-process
  numbers and salus-ta's job still ends cleanly.
What a rogue executor can send (forged, malformed, oversized frames; jobs and lanes not its own; floods; not
reading) is the Rust harness node/src/supervisor/link/rogue_tests.rs; the step times are
scripts/bench_seam_stop.py's.

Costs about 60 s: one server, two executors, six TensorFlow client processes (two of them in-process runs).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from conftest import SalusProcess, as_user, last_json_line, run_as, wait_until
from server_ctl import ctl_json, jobs_by_name
from test_tenant_isolation import digest_of, executor_pids, start_training

TB_STEPS = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory, unix_users):
    s = SalusProcess(tmp_path_factory.mktemp("seam-trust") / "salus-server.stderr.log",
                     ("--isolation", "tenant", "--lane-hold-limit", "0", "--silence-limit", "0"))
    yield s
    assert s.stop() == 0, s.stderr_tail()


@pytest.fixture(scope="module")
def tb_reference(unix_users) -> str:
    """salus-tb's job in its own process: the numbers it must get through the server."""
    tb = unix_users["salus-tb"]
    return digest_of(start_training(tb, "", "tb-local", steps=TB_STEPS))


def standing_of(server: SalusProcess, tenant: str) -> str | None:
    for e in ctl_json(server.address, "info")["executors"]:
        if e["tenant"].split(" ")[0] == tenant:  # "salus-ta (uid 1001)"
            return e["standing"]
    return None


def ta_training(server: SalusProcess, ta, name: str) -> tuple[subprocess.Popen, Path, int]:
    """salus-ta trains until its stop file exists; returns it once it has run iterations, with its executor."""
    stop = Path(ta.pw_dir) / f"stop-{name}"
    stop.unlink(missing_ok=True)
    trainer = start_training(ta, server.target, name, steps=20, stop_file=stop)
    assert wait_until(lambda: jobs_by_name(server.address).get(name, {}).get("iterations", 0) >= 5
                      or trainer.poll() is not None, timeout=120, interval=0.2), "salus-ta never trained"
    assert trainer.poll() is None, trainer.communicate()[1][-3000:]
    pids = executor_pids(server).get("salus-ta", [])
    assert len(pids) == 1, pids
    return trainer, stop, pids[0]


def tb_trains(server: SalusProcess, tb) -> str:
    return digest_of(start_training(tb, server.target, "tb-beside", steps=TB_STEPS))


def test_a_tenant_that_stops_its_executor_stalls_no_other(server, unix_users, tb_reference):
    ta, tb = unix_users["salus-ta"], unix_users["salus-tb"]
    trainer, stop, pid = ta_training(server, ta, "ta-stopped")
    try:
        # The tenant's own doing: its executor runs as salus-ta.
        assert run_as(ta, ["kill", "-STOP", str(pid)]).returncode == 0
        assert wait_until(lambda: standing_of(server, "salus-ta") == "stopped", timeout=30, interval=0.1)
        # Its iteration in flight held the one lane; nothing but the stop frees it here.
        assert tb_trains(server, tb) == tb_reference
        assert run_as(ta, ["kill", "-CONT", str(pid)]).returncode == 0
        assert wait_until(lambda: standing_of(server, "salus-ta") == "serving", timeout=30, interval=0.1)
        stop.touch()
        out, err = trainer.communicate(timeout=300)
    finally:
        subprocess.run(["kill", "-CONT", str(pid)], check=False)
        stop.touch()
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode == 0, err[-3000:]
    trained = last_json_line(out)
    # Stopped and continued, its job lost nothing: the same numbers as in its own process.
    assert trained["digest"] == digest_of(start_training(ta, "", "ta-local", steps=trained["steps"]))
    assert server.proc.poll() is None


def test_stopping_and_continuing_in_a_loop_stalls_no_other(server, unix_users, tb_reference):
    ta, tb = unix_users["salus-ta"], unix_users["salus-tb"]
    trainer, stop, pid = ta_training(server, ta, "ta-flapping")
    # As salus-ta: stopped 0.2 s, running 0.2 s, for as long as salus-tb trains.
    flapper = subprocess.Popen(as_user(ta, [
        "sh", "-c", f"while :; do kill -STOP {pid} || exit; sleep 0.2; kill -CONT {pid} || exit; sleep 0.2; done"]))
    try:
        assert tb_trains(server, tb) == tb_reference
    finally:
        flapper.kill()
        flapper.wait()
        subprocess.run(["kill", "-CONT", str(pid)], check=False)
        stop.touch()
    out, err = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, err[-3000:]
    assert server.proc.poll() is None
