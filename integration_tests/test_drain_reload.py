"""Drain, reload and settings that persist (issue 53, items 4 and 5), against the real binary.

One `--isolation tenant` server (the default) started with `--config FILE` and a state directory of its own, in
order:
- the config file applies (its policy, not the default), and `ctl info` names it;
- `ctl drain` while a TF1 session runs: the command lists the open job, a new session is refused with UNAVAILABLE
  naming the drain, `drain --wait --timeout` runs out listing the job, the running session goes on and finishes,
  then `drain --wait` returns, and after `ctl undrain` a new session opens;
- a policy and a tenant's limit set with ctl, and a drain, survive SIGTERM and a start on the same state directory;
- the config file edited, then SIGHUP: the new policy applies live (the ctl policy it overrode is dropped) and the
  log names a changed flag that needs a restart; edited again, `ctl reload` answers the same; a key that names no
  flag changes nothing and is named in the error.
And one `--isolation none` server: a drained node refuses a TF1 session there too.

Costs about 30-40 s on 2 cores: three server starts, two TensorFlow client processes.
"""

from __future__ import annotations

import json
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import WORKLOADS, SalusProcess, child_env, reachable_tmpdir, venv_python, wait_until
from server_ctl import ctl, ctl_json, require_server_flag, stop_cleanly

CLIENT_TIMEOUT_S = 120
DRAIN_WORDS = "this node is draining for maintenance"


class DrainClient:
    """workloads/drain_client.py: a held TF1 session, and probes for new ones, driven a command at a time."""

    def __init__(self, target: str):
        self.proc = subprocess.Popen([venv_python(), str(WORKLOADS / "drain_client.py"), target],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=child_env())
        self.events: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put(None)

    def next(self) -> dict:
        try:
            event = self.events.get(timeout=CLIENT_TIMEOUT_S)
        except queue.Empty:
            event = None
        if event is None:
            self.proc.poll()
            pytest.fail(f"the TF1 client gave no answer (exit {self.proc.returncode}); stderr tail:\n"
                        f"{''.join(self.stderr)[-4000:]}")
        return event

    def send(self, command: str) -> dict | None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return None if command == "quit" else self.next()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()  # our own child, by its Popen handle
                self.proc.wait(10)


def write_config(path: Path, **keys) -> None:
    lines = [f"{key} = {json.dumps(value)}" for key, value in keys.items()]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(path)  # whole: a reload never reads half a file


def policy(address: str) -> str:
    return ctl(address, "policy").stdout.strip().removeprefix("policy: ")


@pytest.fixture(scope="module")
def node():
    require_server_flag("--config", "config files (issue 53)")
    directory = reachable_tmpdir("salus-drain-")
    state = {"dir": directory, "config": directory / "salus.toml", "state": directory / "state", "starts": 0}
    write_config(state["config"], policy="srtf", **{"shutdown-grace": 3, "anticipation-us": 1500})
    start(state)
    yield state
    if state["server"].proc.poll() is None:
        stop_cleanly(state["server"])
    shutil.rmtree(directory, ignore_errors=True)


def start(node: dict) -> SalusProcess:
    node["starts"] += 1
    server = SalusProcess(node["dir"] / f"salus-server-{node['starts']}.stderr.log",
                          ("--config", str(node["config"]), "--state-dir", str(node["state"])))
    node["server"] = server
    return server


def test_the_config_file_applies(node):
    address = node["server"].address
    assert policy(address) == "srtf"
    info = ctl_json(address, "info")
    assert info["config_file"] == str(node["config"]), info
    assert info["draining"] is False, info


def test_drain_refuses_new_jobs_while_open_ones_finish(node):
    address = node["server"].address
    client = DrainClient(node["server"].target)
    try:
        assert client.next() == {"held": True}
        drained = ctl_json(address, "drain")
        assert drained["draining"] is True and len(drained["jobs"]) == 1, drained
        text = ctl(address, "drain").stdout
        assert "1 job(s) still open:" in text and "salus undrain" in text, text

        refused = client.send("probe")
        assert refused["probe"] == "UnavailableError", refused
        assert DRAIN_WORDS in refused["message"] and "salus undrain" in refused["message"], refused

        waited = ctl(address, "drain", "--wait", "--timeout", "1s", check=False)
        assert waited.returncode == 1, waited
        assert "1 job(s) still open after --timeout" in waited.stderr, waited.stderr

        finished = client.send("finish")
        losses = finished["losses"]
        assert len(losses) == 10 and losses[-1] < losses[0], finished
        done = ctl(address, "drain", "--wait", "--timeout", "60s")
        assert "no job is open" in done.stdout, done.stdout

        undrained = ctl_json(address, "undrain")
        assert undrained["draining"] is False, undrained
        assert client.send("probe") == {"probe": "ok"}
    finally:
        client.close()


def test_limits_policy_and_drain_survive_a_restart(node):
    server = node["server"]
    assert ctl(server.address, "policy", "fifo").stdout.strip() == "policy: srtf -> fifo"
    ctl(server.address, "limits", "alice", "--weight", "3", "--max-jobs", "4")
    ctl(server.address, "drain")
    stop_cleanly(server)

    server = start(node)
    assert policy(server.address) == "fifo"
    shown = ctl(server.address, "limits", "alice").stdout
    assert shown.strip() == "limits of alice: weight=3 max-jobs=4", shown
    info = ctl_json(server.address, "info")
    assert info["draining"] is True, info
    assert "this node is drained" in server.stderr_tail(20000)
    ctl(server.address, "undrain")
    assert ctl_json(server.address, "info")["draining"] is False


def test_sighup_and_ctl_reload_apply_the_edited_config(node):
    server = node["server"]
    address = server.address
    # The file's policy changes from srtf: `ctl policy fifo`, set over srtf, gives way to it.
    write_config(node["config"], policy="las", **{"shutdown-grace": "3s", "anticipation": "1500us",
                                                  "max-sessions": 77})
    server.send_signal(signal.SIGHUP)
    assert wait_until(lambda: policy(address) == "las", timeout=30, interval=0.2), server.stderr_tail()
    assert wait_until(lambda: "max-sessions: 1024 -> 77 (needs a restart)" in server.stderr_tail(20000),
                      timeout=10), server.stderr_tail()
    log = server.stderr_tail(20000)
    assert "policy fifo set with `salus policy set` is dropped" in log, log

    write_config(node["config"], policy="dlas", **{"shutdown-grace": "3s", "anticipation": "1500us",
                                                   "max-sessions": 77})
    report = ctl_json(address, "reload")
    assert report["config_file"] == str(node["config"]), report
    assert "policy: las -> dlas" in report["applied"], report
    assert "max-sessions: 1024 -> 77 (needs a restart)" in report["needs_restart"], report
    assert policy(address) == "dlas"

    write_config(node["config"], policy="fifo", **{"lane_hold_limit": 5})
    failed = ctl(address, "reload", check=False)
    assert failed.returncode == 1 and "unknown key `lane_hold_limit`" in failed.stderr, failed
    assert policy(address) == "dlas", "an invalid file changes nothing"
    # The server still runs jobs after all of it.
    assert server.proc.poll() is None


def test_isolation_none_refuses_new_jobs_while_drained(tmp_path):
    server = SalusProcess(tmp_path / "salus-none.stderr.log", ("--isolation", "none", "--shutdown-grace", "3s"))
    client = None
    try:
        client = DrainClient(server.target)
        assert client.next() == {"held": True}
        assert ctl_json(server.address, "drain")["jobs"], "the held session is listed"
        refused = client.send("probe")
        assert refused["probe"] == "UnavailableError" and DRAIN_WORDS in refused["message"], refused
        ctl(server.address, "undrain")
        assert client.send("probe") == {"probe": "ok"}
        assert len(client.send("finish")["losses"]) == 10
    finally:
        if client:
            client.close()
        stop_cleanly(server)
