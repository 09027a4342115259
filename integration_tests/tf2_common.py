"""Helpers of the TF2 suites (test_tf2_*.py): run a workload in-process and through the adapter, compare
every number the two runs print, and check where the variables lived."""

from __future__ import annotations

import math
import subprocess
import warnings
from pathlib import Path

import pytest

import reference_runs
from conftest import WORKLOADS, child_env, last_json_line, venv_python

TF_TIMEOUT = 240
SERVER_JOB = "/job:worker"


def tf2_env(**extra: str) -> dict:
    """child_env without the caller's SALUS_* variables and without TF_USE_LEGACY_KERAS (Keras 3)."""
    env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_") and k != "TF_USE_LEGACY_KERAS"}
    env.update(extra)
    return env


def run_workload(script: str, env: dict, python: str | None = None, check: bool = True,
                 timeout: float = TF_TIMEOUT) -> subprocess.CompletedProcess:
    """Runs a workload; an in-process one (no SALUS_* variable) may be replayed from the cache of reference
    runs (reference_runs.py)."""
    path = WORKLOADS / script if not Path(script).is_absolute() else Path(script)
    proc = reference_runs.run([python or venv_python(), str(path)], env, timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"{script} exited with {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\n"
                    f"stderr:\n{proc.stderr[-6000:]}")
    return proc


def salus_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("salus:")]


def _compare(a, b, path: str, inexact: list[str], rel_tol: float, abs_tol: float) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _compare(a[k], b[k], f"{path}.{k}", inexact, rel_tol, abs_tol)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _compare(x, y, f"{path}[{i}]", inexact, rel_tol, abs_tol)
    elif isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        if a != b and not (math.isnan(a) and math.isnan(b)):
            assert math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol), \
                f"{path}: in-process {a!r} != remote {b!r} (rel_tol {rel_tol}, abs_tol {abs_tol})"
            inexact.append(f"{path}: {a!r} vs {b!r}")
    else:
        assert a == b, f"{path}: in-process {a!r} != remote {b!r}"


def assert_same_numbers(local: dict, remote: dict, ignore=("devices",), rel_tol: float = 1e-6,
                        abs_tol: float = 1e-9) -> None:
    """Every number equal to 1e-6 relative (or the tolerance given); a warning lists those not bitwise equal."""
    inexact: list[str] = []
    _compare({k: v for k, v in local.items() if k not in ignore},
             {k: v for k, v in remote.items() if k not in ignore}, "result", inexact, rel_tol, abs_tol)
    if inexact:
        warnings.warn(f"{len(inexact)} numbers within rel_tol {rel_tol} but not bitwise: {inexact[:5]}")


def assert_devices(result: dict, prefix: str) -> None:
    devices = result["devices"]
    assert devices and all(d.startswith(prefix) for d in devices), f"expected devices on {prefix}: {devices}"


def start_workload(script: str, env: dict, *args: str, stdin: bool = False,
                   python: str | None = None) -> subprocess.Popen:
    """A workload as a child process (text pipes for stdout and stderr; stdin a pipe when asked)."""
    path = WORKLOADS / script if not Path(script).is_absolute() else Path(script)
    return subprocess.Popen([python or venv_python(), str(path), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                            text=True, env=env)
