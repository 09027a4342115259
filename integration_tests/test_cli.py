"""The `salus` CLI (cli/) against one real server (`--isolation none`, shared by every case).

- `--json` of every command parses and has the keys docs/src/reference/json.md documents;
- exit statuses: 0 ok, 1 refused (the server's INVALID_ARGUMENT), 2 usage, 3 unreachable (a free port with
  nothing listening), and the error keeps the gRPC code, the server's message and the connection's cause;
- `hints JOB --iterations N` keeps the job's priority (it once reset it to 0);
- the old spellings still work and warn: `salus-server ctl ...`, `policy NAME`, the Python console script.

The job is workloads/plain_tf1.py started through `salus run` (its session held open while the cases run), so
TensorFlow runs only in that child. Costs about 10 s on 2 cores: one server start, one TF1 script, some 40 CLI
runs.
"""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from conftest import WORKLOADS, SalusProcess, child_env, cli_bin, server_bin, venv_python

# The keys each command's JSON has (docs/src/reference/json.md).
JOB_KEYS = {"id", "handle", "name", "tenant", "uid", "kind", "state", "lane", "policy", "iterations", "attained_s",
            "mean_iteration_ms", "queue_wait_s", "queued", "priority", "expected_iterations", "expected_seconds",
            "note", "memory_state", "age_s", "idle_s"}
INFO_KEYS = {"version", "tensorflow_version", "isolation", "policy", "uptime_seconds", "draining", "devices",
             "memory", "executors", "cuda"}
STATS_KEYS = {"policy", "iterations_total", "iterations_per_s", "queued", "switch_latency_us", "queue_wait_us",
              "lanes", "share", "tenants", "server_counters"}
TOKEN_KEYS = {"id", "tenant", "uid", "weight", "max_jobs", "max_priority", "memory_bytes", "issued_unix_s",
              "expires_unix_s"}
DRAIN_KEYS = {"draining", "since_unix_s", "by", "until_restart", "jobs"}
TIMELINE_KEYS = {"seconds", "now_uptime_s", "now_unix_s", "capacity", "recorded_total", "spans"}


def salus(*args: str, binary=None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary or cli_bin()), *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, env=env)


def salus_json(address: str, *args: str):
    r = salus("--server", address, *args, "--json")
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return json.loads(r.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not cli_bin().exists():
        pytest.fail(f"the salus CLI is not at {cli_bin()}: build it (cargo build --release) or set SALUS_CLI_BIN")
    proc = SalusProcess(tmp_path_factory.mktemp("cli") / "salus-server.stderr.log",
                        ("--isolation", "none", "--memory-capacity", "2GiB", "--shutdown-grace", "1"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def job(server):
    """A TF1 training script started through `salus run` (WORKLOAD_HOLD: it holds its session open after
    training, until a line on stdin), so that the job is the scheduler's."""
    proc = subprocess.Popen([str(cli_bin()), "--server", server.address, "run", "--name", "cli-job", "--",
                             venv_python(), str(WORKLOADS / "plain_tf1.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(WORKLOAD_HOLD="1"))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.strip() == "HOLD":
            break
    if not lines or lines[-1].strip() != "HOLD":
        proc.kill()
        pytest.fail(f"plain_tf1.py did not hold (exit {proc.wait()}): {''.join(lines)[-2000:]}"
                    f"{proc.stderr.read()[-3000:]}")
    yield "cli-job"
    proc.stdin.write("\n")
    proc.stdin.close()
    out = proc.stdout.read()
    assert proc.wait(120) == 0 and '"losses"' in out, out + proc.stderr.read()[-3000:]


def test_every_command_prints_json_with_the_documented_keys(server, job):
    a = server.address
    listed = salus_json(a, "jobs")
    assert set(listed) == {"jobs", "reservations"}
    row = next(j for j in listed["jobs"] if j["name"] == job)
    assert JOB_KEYS <= set(row), JOB_KEYS - set(row)
    assert INFO_KEYS <= set(salus_json(a, "info"))
    assert STATS_KEYS <= set(salus_json(a, "stats"))
    assert salus_json(a, "policy") == {"policy": "fair"} or set(salus_json(a, "policy")) == {"policy"}
    capacity = salus_json(a, "capacity")
    assert capacity["capacity_bytes"] == 2 << 30 and capacity["capacity_mib"] == 2048, capacity
    limits = salus_json(a, "limits", "cli-tenant", "--max-jobs", "3")
    assert limits == {"tenant": "cli-tenant", "weight": None, "max_jobs": 3, "max_priority": None,
                      "memory_bytes": None}, limits
    issued = salus_json(a, "token", "issue", "--tenant", "cli-bot", "--expires", "1h")
    assert TOKEN_KEYS | {"token"} <= set(issued) and issued["tenant"] == "cli-bot"
    assert issued["expires_unix_s"] - issued["issued_unix_s"] == pytest.approx(3600, abs=5)
    listed_tokens = salus_json(a, "token", "list")
    assert [t["id"] for t in listed_tokens] == [issued["id"]] and TOKEN_KEYS <= set(listed_tokens[0])
    revoked = salus_json(a, "token", "revoke", issued["id"])
    assert [t["id"] for t in revoked] == [issued["id"]]
    assert {"identities", "max_identities", "max_runs", "file"} <= set(salus_json(a, "history"))
    assert set(salus_json(a, "history", "erase", "--tenant", "anonymous")) == {"erased_identities"}
    assert {"config_file", "tenants_file", "applied", "needs_restart", "notes"} <= set(salus_json(a, "reload"))
    assert TIMELINE_KEYS <= set(salus_json(a, "timeline", "--seconds", "0"))
    frames = salus("--server", a, "top", "--iterations", "2", "--interval", "100ms", "--json")
    assert frames.returncode == 0, frames.stderr
    lines = frames.stdout.splitlines()
    assert len(lines) == 2, frames.stdout
    frame = json.loads(lines[0])
    assert set(frame) == {"server", "info", "stats", "jobs"} and any(j["name"] == job for j in frame["jobs"])
    drained = salus_json(a, "drain")
    assert DRAIN_KEYS <= set(drained) and drained["draining"] is True
    undrained = salus_json(a, "undrain")
    assert undrained["draining"] is False and undrained["since_unix_s"] is None


def test_hints_change_only_the_fields_given(server, job):
    a = server.address
    before = salus_json(a, "hints", job, "--priority", "5", "--iterations", "100")
    assert (before["priority"], before["expected_iterations"]) == (5, 100), before
    after = salus_json(a, "hints", job, "--iterations", "400")
    assert (after["priority"], after["expected_iterations"]) == (5, 400), after
    after = salus_json(a, "hints", job, "--priority", "-2")
    assert (after["priority"], after["expected_iterations"]) == (-2, 400), after
    text = salus("--server", a, "hints", job, "--seconds", "30")
    assert text.returncode == 0 and text.stdout.startswith("ID  "), text.stdout + text.stderr
    row = next(j for j in salus_json(a, "jobs")["jobs"] if j["name"] == job)
    assert (row["priority"], row["expected_iterations"], row["expected_seconds"]) == (-2, 400, 30.0), row


def test_exit_statuses_and_error_causes(server):
    a = server.address
    ok = salus("--server", a, "policy", "show")
    assert ok.returncode == 0 and ok.stdout.startswith("policy: "), ok.stderr
    refused = salus("--server", a, "policy", "set", "no-such-policy")
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("salus: refused (INVALID_ARGUMENT): ") and "no-such-policy" in refused.stderr
    missing = salus("--server", a, "hints", "no-such-job", "--priority", "1")
    assert missing.returncode == 1 and "refused (INVALID_ARGUMENT)" in missing.stderr, missing.stderr
    usage = salus("--server", a, "jobs", "--no-such-flag")
    assert usage.returncode == 2 and "--no-such-flag" in usage.stderr, usage.stderr
    assert salus("drain", "--timeout", "5s").returncode == 2  # --timeout needs --wait
    bad_address = salus("--server", "no-port-here", "jobs")
    assert bad_address.returncode == 2 and "HOST:PORT" in bad_address.stderr, bad_address.stderr
    port = free_port()
    unreachable = salus("--server", f"127.0.0.1:{port}", "jobs")
    assert unreachable.returncode == 3, unreachable.stderr
    # The address and the cause under tonic's "transport error" are kept.
    assert f"salus: cannot reach salus-server at 127.0.0.1:{port}: " in unreachable.stderr, unreachable.stderr
    assert "Connection refused" in unreachable.stderr, unreachable.stderr
    run_unreachable = salus("--server", f"127.0.0.1:{port}", "run", "--", "true")
    assert run_unreachable.returncode == 3 and "--no-check" in run_unreachable.stderr, run_unreachable.stderr
    help_text = salus("--help")
    assert help_text.returncode == 0 and "3    unreachable" in help_text.stdout


def test_run_sets_the_environment_and_passes_the_status_through(server):
    script = "import json, os, sys; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('SALUS_')})); sys.exit(7)"
    env = {"PATH": "/usr/bin:/bin", "SALUS_PRIORITY": "3"}
    r = salus("--server", f"grpc://{server.address}", "run", "--name", "n1", "--iterations", "10", "--",
              venv_python(), "-c", script, env=env)
    assert r.returncode == 7, r.stderr
    assert json.loads(r.stdout) == {"SALUS_SERVER": server.address, "SALUS_JOB_NAME": "n1", "SALUS_PRIORITY": "3",
                                    "SALUS_EXPECTED_ITERATIONS": "10"}
    r = salus("--server", server.address, "run", "--", "no-such-command-salus")
    assert r.returncode == 127 and "command not found: no-such-command-salus" in r.stderr, r.stderr
    r = salus("--server", server.address, "run", "--priority", "high", "--", "true")
    assert r.returncode == 2 and "--priority" in r.stderr, r.stderr


def test_old_spellings_work_and_warn(server):
    a = server.address
    r = salus("ctl", "--server", a, "policy", "--json", binary=server_bin())
    assert r.returncode == 0 and set(json.loads(r.stdout)) == {"policy"}, r.stderr
    assert "`salus-server ctl` is deprecated" in r.stderr, r.stderr
    policy = json.loads(r.stdout)["policy"]
    r = salus("--server", a, "policy", policy)
    assert r.returncode == 0 and r.stdout == f"policy: {policy} -> {policy}\n", r.stdout + r.stderr
    assert f"use `salus policy set {policy}`" in r.stderr, r.stderr
    r = salus("ctl", "--server", f"127.0.0.1:{free_port()}", "jobs", binary=server_bin())
    assert r.returncode == 3 and "cannot reach" in r.stderr, r.stderr


def test_the_python_console_script_execs_the_binary(server):
    from pathlib import Path
    script = Path(venv_python()).parent / "salus"
    if not script.exists():
        pytest.skip(f"salus-tf is not installed in {Path(venv_python()).parent.parent}")
    env = {"PATH": "/usr/bin:/bin", "SALUS_BIN_DIR": str(cli_bin().parent)}
    r = salus("--server", server.address, "policy", "--json", binary=script, env=env)
    assert r.returncode == 0 and set(json.loads(r.stdout)) == {"policy"}, r.stderr
    r = subprocess.run([venv_python(), "-m", "salus", "--version"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0 and r.stdout.startswith("salus "), r.stdout + r.stderr
