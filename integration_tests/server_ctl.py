"""Shared helpers for suites that drive their own salus-server through the `salus` CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import SalusProcess, cli_bin, server_bin, wait_until


def require_server_flag(flag: str, feature: str) -> Path:
    """Fail once, clearly, when the binary predates `feature` (it would refuse `flag`)."""
    binary = server_bin()
    if not binary.exists():
        pytest.fail(f"salus-server binary not found at {binary}")
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30).stdout
    if flag not in out:
        pytest.fail(f"{binary} has no {flag} flag: it predates {feature} (rebuild it)")
    return binary


def ctl(address: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(cli_bin()), "--server", address, *args], capture_output=True,
                          text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        pytest.fail(f"ctl {' '.join(args)} exited with {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\n"
                    f"stderr:\n{proc.stderr[-2000:]}")
    return proc


def ctl_json(address: str, *args: str):
    proc = ctl(address, *args, "--json")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"ctl {' '.join(args)} --json printed no valid JSON ({e}):\n{proc.stdout[-2000:]}")


def jobs_by_name(address: str) -> dict[str, dict]:
    """ctl jobs --json, keyed by the job name without its hints (the server may keep either form)."""
    return {row["name"].split("?")[0]: row for row in ctl_json(address, "jobs")["jobs"]}


def wait_state(address: str, key: str, pred, timeout: float = 30) -> dict:
    """Polls the job list until job `key` satisfies `pred`; returns the whole list seen then."""
    seen: dict = {}

    def check() -> bool:
        seen.clear()
        seen.update(jobs_by_name(address))
        return key in seen and pred(seen[key])

    assert wait_until(check, timeout=timeout, interval=0.1), f"job {key} never reached the state: {seen}"
    return dict(seen)


def stop_cleanly(server: SalusProcess) -> None:
    code = server.stop()
    assert code == 0, f"salus-server exited with {code} after SIGINT; stderr tail:\n{server.stderr_tail()}"
