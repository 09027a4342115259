"""Issued tokens survive a server restart (`--state-dir`, issue 40): a cluster agent's token (a Slurm Prolog's, a
pod's, a Ray placement's) issued before the restart is accepted after it, with its memory reservation held again
before any job is admitted; tokens that expired meanwhile, and revoked ones, stay gone.

One state directory and one server at a time, all `--isolation tenant` (the default; the token tenants are no Unix
user, so their executors run as uids of --tenant-uid-range): tokens are issued, then
- SIGTERM and a restart: `ctl token list` and the reservations in `ctl jobs` come back before any client connects,
  and a TF2 script and a TF1 script carrying the pre-restart tokens run, each job listed under its token's tenant
  beside its reservation;
- SIGKILL of the supervisor right after an issue: the new token and the earlier ones come back, and a TF2 script
  with one runs;
- a corrupt tokens file: the server starts, logs which file it dropped and why, keeps the bytes as
  tokens.json.bad-<unix time>, and saves new tokens to a fresh file (0600 in a 0700 directory).

Costs 14-27 s on 2 cores (measured): four server starts, three TensorFlow client processes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import time

import pytest

from conftest import WORKLOADS, SalusProcess, executors_of, last_json_line, reachable_tmpdir, server_bin, venv_python, wait_until
from server_ctl import ctl, ctl_json, require_server_flag
from test_python_adapter import salus_package  # noqa: F401  (autouse: the venv has this tree's python/)
from tf2_common import SERVER_JOB, tf2_env

# Reservations (64 + 32 MiB) fit the 256 MiB the servers share; the jobs' own memory fits the reservations.
SERVER_ARGS = ("--isolation", "tenant", "--memory-capacity", "256MiB")
CLIENT_TIMEOUT_S = 180


def start(node: dict) -> SalusProcess:
    """A server on the node's state directory, each start with a log of its own."""
    node["starts"] += 1
    server = SalusProcess(node["dir"] / f"salus-server-{node['starts']}.stderr.log",
                          (*SERVER_ARGS, "--state-dir", str(node["state"])))
    node["server"] = server
    return server


@pytest.fixture(scope="module")
def node():
    require_server_flag("--state-dir", "durable server state")
    # Executors run as uids of no account: the server's working directory (per-job checkpoint directories) must be passable.
    directory = reachable_tmpdir("salus-durable-")
    state = {"dir": directory, "state": directory / "state", "starts": 0, "tokens": {}}
    start(state)
    yield state
    if state["server"].proc.poll() is None:
        assert state["server"].stop() == 0, state["server"].stderr_tail()
    shutil.rmtree(directory, ignore_errors=True)


def issue(address: str, tenant: str, *limits: str) -> dict:
    return ctl_json(address, "token", "issue", "--tenant", tenant, *limits)


def listed_ids(address: str) -> set[str]:
    return {t["id"] for t in ctl_json(address, "token", "list")}


def reserved_line(address: str, tenant: str) -> str:
    """The `ctl jobs` line on `tenant`'s reservation ("" without one)."""
    text = ctl(address, "jobs").stdout
    return next((line for line in text.splitlines() if line.startswith(f"reserved for {tenant}:")), "")


def held_client(script: str, args: tuple[str, ...], env: dict) -> subprocess.Popen:
    """A TensorFlow script that prints HOLD and waits for a line on stdin while its job is open."""
    return subprocess.Popen([venv_python(), str(WORKLOADS / script), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_hold(proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == "HOLD":
            return
        if not line and proc.poll() is not None:
            break
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"{what} never held its job (exit {proc.returncode})\nstdout:\n{out[-2000:]}\nstderr:\n{err[-4000:]}")


def release(proc: subprocess.Popen, what: str) -> str:
    try:
        out, err = proc.communicate("\n", timeout=CLIENT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    assert proc.returncode == 0, f"{what} exited with {proc.returncode}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-4000:]}"
    return out


def test_tokens_survive_sigterm_and_their_tf2_and_tf1_jobs_run(node):
    server = node["server"]
    tokens = node["tokens"]
    tokens["tf2"] = issue(server.address, "tf2-job", "--memory", "64MiB", "--expires", "1h")
    tokens["tf1"] = issue(server.address, "tf1-job", "--memory", "32MiB", "--max-priority", "2")
    brief = issue(server.address, "brief", "--expires", "1s")
    revoked = issue(server.address, "revoked-job", "--memory", "16MiB")
    ctl(server.address, "token", "revoke", revoked["id"])
    assert server.stop() == 0, server.stderr_tail()
    # The brief token's second is over before the next start has even loaded TensorFlow.
    time.sleep(max(0.0, brief["expires_unix_s"] - time.time()))

    server = start(node)
    # Before any client: the tokens and their reservations are back, the expired and the revoked ones are not.
    assert listed_ids(server.address) == {tokens["tf2"]["id"], tokens["tf1"]["id"]}
    assert "reserved for tf2-job: 64 MiB (0 B claimed" in reserved_line(server.address, "tf2-job")
    assert "reserved for tf1-job: 32 MiB (0 B claimed" in reserved_line(server.address, "tf1-job")
    assert ctl_json(server.address, "capacity")["unreserved_mib"] == 256 - 96
    log = server.stderr_tail(20000)
    assert f'expired while the server was down: dropped file={node["state"] / "tokens.json"} id="{brief["id"]}"' in log, log
    assert "restored=2 expired=1 rejected=0" in log, log

    tf2 = held_client("tf2_steps.py", ("4", "2"), tf2_env(SALUS_SERVER=server.address,
                                                          SALUS_TOKEN=tokens["tf2"]["token"],
                                                          SALUS_JOB_NAME="after-restart-tf2"))
    tf1 = held_client("plain_tf1.py", (), tf2_env(SALUS_SERVER=server.address, SALUS_TOKEN=tokens["tf1"]["token"],
                                                  SALUS_JOB_NAME="after-restart-tf1", SALUS_PRIORITY="9",
                                                  WORKLOAD_HOLD="1"))
    try:
        wait_hold(tf2, "the TF2 script")
        wait_hold(tf1, "the TF1 script")
        rows = ctl_json(server.address, "jobs")["jobs"]
        tenants = {r["tenant"] for r in rows}
        assert {"tf2-job", "tf1-job"} <= tenants, rows
        # The restored token's max-priority lowers the 9 the TF1 script asks for.
        assert {r["priority"] for r in rows if r["tenant"] == "tf1-job"} == {2}, rows
        # The reservations stay listed beside the jobs, with the tokens' ids.
        line = reserved_line(server.address, "tf2-job")
        assert "reserved for tf2-job: 64 MiB" in line and tokens["tf2"]["id"] in line, line
        line = reserved_line(server.address, "tf1-job")
        assert "reserved for tf1-job: 32 MiB" in line and tokens["tf1"]["id"] in line, line
    finally:
        tf2_out = release(tf2, "the TF2 script")
        tf1_out = release(tf1, "the TF1 script")
    steps = last_json_line(tf2_out)
    assert "error" not in steps and steps["steps"] == 4 and steps["device"].startswith(SERVER_JOB), steps
    losses = last_json_line(tf1_out)["losses"]
    assert losses[-1] < losses[0], losses


def test_tokens_survive_sigkill_of_the_supervisor(node):
    server = node["server"]
    tokens = node["tokens"]
    if set(tokens) != {"tf2", "tf1"}:
        pytest.skip("needs the tokens of test_tokens_survive_sigterm_and_their_tf2_and_tf1_jobs_run")
    # Issued the moment before the crash: saved (and fsynced) before ctl printed it.
    tokens["late"] = issue(server.address, "late-job", "--memory", "8MiB", "--expires", "1h")
    server.kill()
    assert server.proc.returncode == -signal.SIGKILL
    # Its executors outlive it, and the restarted server adopts them (docs/src/operator/restarts.md).
    survivors = set(executors_of(node["state"]))

    server = start(node)
    adopted = {e["pid"] for e in ctl_json(server.address, "info")["executors"] if e["adopted"]}
    assert survivors == adopted, (survivors, adopted)
    assert listed_ids(server.address) == {t["id"] for t in tokens.values()}
    assert "reserved for late-job: 8 MiB" in reserved_line(server.address, "late-job")
    assert ctl_json(server.address, "capacity")["unreserved_mib"] == 256 - 104
    tf2 = held_client("tf2_steps.py", ("2", "1"), tf2_env(SALUS_SERVER=server.address,
                                                          SALUS_TOKEN=tokens["late"]["token"],
                                                          SALUS_JOB_NAME="after-kill"))
    try:
        wait_hold(tf2, "the TF2 script")
        assert "late-job" in {r["tenant"] for r in ctl_json(server.address, "jobs")["jobs"]}
    finally:
        out = release(tf2, "the TF2 script")
    steps = last_json_line(out)
    assert "error" not in steps and steps["steps"] == 2 and steps["device"].startswith(SERVER_JOB), steps


def test_a_corrupt_tokens_file_is_kept_aside_and_the_server_starts(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    garbage = b'{"version": 1, "data": {"tokens": [{"id": "abc", '
    (state / "tokens.json").write_bytes(garbage)
    server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--isolation", "none", "--state-dir", str(state)))
    try:
        log = server.stderr_tail(20000)
        assert "the issued tokens file cannot be used" in log and f"file={state / 'tokens.json'}" in log, log
        assert "not a state file of this server" in log, log
        kept = [p for p in state.iterdir() if p.name.startswith("tokens.json.bad-")]
        assert len(kept) == 1 and kept[0].read_bytes() == garbage, list(state.iterdir())
        assert str(kept[0]) in log, log
        assert ctl_json(server.address, "token", "list") == []
        issued = issue(server.address, "fresh-job")
        saved = json.loads((state / "tokens.json").read_text())
        assert saved["version"] == 1 and [t["id"] for t in saved["data"]["tokens"]] == [issued["id"]], saved
        assert issued["token"] not in (state / "tokens.json").read_text(), "only the token's hash is kept"
        assert stat.S_IMODE(os.stat(state / "tokens.json").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
        # A second server on the same directory is refused, saying why.
        refused = subprocess.run([str(server_bin()), "--listen", "127.0.0.1:0", "--isolation", "none",
                                  "--state-dir", str(state)], capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL)
        assert refused.returncode != 0 and "in use by another salus-server" in refused.stderr, refused.stderr
    finally:
        assert server.stop() == 0, server.stderr_tail()


