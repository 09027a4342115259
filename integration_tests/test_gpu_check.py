"""scripts/gpu_check.sh, the one command for a GPU node, as far as a machine without a GPU can check it:

1. --dry-run lists every claim (its name and one-line statement) and exits 0, starting nothing;
2. without an NVIDIA driver (and without --rehearse-on-cpu) it says so in one line and exits 0 (skipped where a
   driver is present: there it would run the claims);
3. --only with an unknown claim name exits 2 naming it and the claims there are;
4. a rehearsal of three claims on the CPU (--rehearse-on-cpu --only driver,server-sees-gpu,tf1-on-gpu): the
   GPU-only claim is skipped with its reason; server-sees-gpu starts a real server and reads `ctl info --json`;
   tf1-on-gpu runs the check's own TF1 client through a server and in-process, reads the MatMuls' device from the
   FULL_TRACE step stats and compares the numbers. Both pass, the summary line counts them, the logs are where
   --keep-logs says, and no process of the check is left. (The rehearsal hides any GPU, so this holds on a GPU
   node too.)

The other claims that run TensorFlow jobs are rehearsed by hand (scripts/gpu_check.sh --rehearse-on-cpu, about a
minute on 2 cores), not here. Measured cost of this file on a 2-core machine: 4 to 8 s, nearly all of it the
tf1-on-gpu rehearsal (two TensorFlow processes).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, server_bin

WRAPPER = REPO / "scripts" / "gpu_check.sh"
EXPECTED = ["driver", "server-sees-gpu", "tf1-on-gpu", "tf2-on-gpu", "memory-admission", "gpu-lanes",
            "tenant-contexts", "mps", "switch-latency"]


def gpu_check(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALUS_") or k == "SALUS_SERVER_BIN"}
    return subprocess.run([str(WRAPPER), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)


def claims_module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def driver_present() -> bool:
    return shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia").exists()


def test_dry_run_lists_every_claim():
    module = claims_module()
    assert [c.name for c in module.CLAIMS] == EXPECTED
    proc = gpu_check("--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for i, claim in enumerate(module.CLAIMS, 1):
        listed = [line for line in lines if line.startswith(f"{i}. {claim.name}: ")]
        assert len(listed) == 1, proc.stdout
        assert claim.statement in listed[0]
    assert lines[-1] == f"gpu_check: {len(EXPECTED)} claim(s) listed, nothing started (dry run)", proc.stdout


@pytest.mark.skipif(driver_present(), reason="an NVIDIA driver is present: gpu_check.sh would run the claims")
def test_no_gpu_says_so_in_one_line_and_exits_0():
    proc = gpu_check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert re.fullmatch(r"gpu_check: no NVIDIA GPU here \(.+\): nothing to prove; --dry-run lists the claims",
                        lines[0]), lines[0]


def test_unknown_claim_exits_2_and_names_the_claims():
    proc = gpu_check("--only", "driver,no-such-claim")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert "unknown claim 'no-such-claim'" in proc.stderr, proc.stderr
    assert all(name in proc.stderr for name in EXPECTED), proc.stderr


def test_rehearsal_of_three_claims_passes_and_leaves_nothing_running(tmp_path):
    if not server_bin().exists():
        pytest.fail(f"salus-server binary not found at {server_bin()}")
    logs = tmp_path / "logs"
    proc = gpu_check("--rehearse-on-cpu", "--only", "tf1-on-gpu,driver,server-sees-gpu", "--keep-logs", str(logs),
                     timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 5, lines
    assert lines[0].startswith("gpu_check: rehearsal on CPU:0; 3 claim(s); logs in "), lines
    assert lines[1].startswith("SKIP driver: rehearsal on a CPU: "), lines
    assert lines[2].startswith("PASS server-sees-gpu: rehearsal: ctl info --json has every field"), lines
    assert lines[3].startswith("PASS tf1-on-gpu: MatMuls on /job:localhost/replica:0/task:0/device:CPU:0 "), lines
    assert re.match(r"gpu_check: 2 passed, 0 failed, 1 skipped \(", lines[-1]), lines
    for log in ("server-sees-gpu.server.log", "tf1-on-gpu.server.log", "tf1-through-server.client.out",
                "tf1-in-process.client.out"):
        assert (logs / log).exists(), (log, sorted(p.name for p in logs.iterdir()))
    # The server (and any executor) the claim started is gone: no process names the check's log directory.
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(logs).encode() in (entry / "cmdline").read_bytes():
                    left.append(int(entry.name))
            except OSError:
                pass
    assert not left, f"processes of the check still running: {left}"
