"""A GPU node's build on this machine (issue 39): the suites that drive the server and the adapter, run again
against TensorFlow's GPU wheel (tensorflow[and-cuda], the same release; without a GPU it runs on the CPU).

scripts/test.sh makes .venv-gpu (the GPU wheel, the test tools, the adapter) beside `cargo test` and builds the
server with the `cuda` feature and its rpath on that wheel's TensorFlow (target/gpu-wheel/) beside pytest;
conftest.py runs this file after the rest of the suite. It waits for that build, checks that the binary loads
the GPU wheel's libtensorflow, then runs SUITES with .venv-gpu's pytest, that binary as the server and
.venv-gpu's interpreter for every TensorFlow program (the in-process references included), and fails with
their output if one fails. Skipped when pytest runs without scripts/test.sh, or where the main run already
uses the GPU wheel (SALUS_TF=gpu) or SALUS_GPU_WHEEL=0. Costs the suites' own time (~2-3 min on 2 cores);
the venv and the build run beside other phases (their times are printed with the phases).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, TESTS, wait_until

BACKGROUND = Path(os.environ.get("SALUS_CI_BACKGROUND", "/nonexistent")) / "gpu-wheel"
VENV = REPO / ".venv-gpu"
BINARY = REPO / "target" / "gpu-wheel" / "release" / "salus-server"
# The server's protocols (TF1 master, TF2 remote eager), the adapter, the C API's training paths and the
# memory the allocator statistics give, which the GPU wheel's allocators keep.
SUITES = ("test_master_api.py", "test_tf1_training.py", "test_tf2_eager.py", "test_python_adapter.py",
          "test_allocator_memory.py")
# The venv's download and the build run beside the suite; under load they take several minutes.
BUILD_LIMIT_S = 40 * 60
SUITES_LIMIT_S = 20 * 60

pytestmark = pytest.mark.skipif(not BACKGROUND.is_dir(),
                                reason="no GPU-wheel build: pytest was not started by scripts/test.sh, "
                                       "or the main run uses the GPU wheel, or SALUS_GPU_WHEEL=0")


def test_the_gpu_wheels_server_and_adapter_pass_the_server_and_adapter_suites():
    rc = BACKGROUND / "rc"
    assert wait_until(rc.exists, timeout=BUILD_LIMIT_S, interval=1.0), \
        f"the GPU wheel's venv and build ran past {BUILD_LIMIT_S} s"
    log = (BACKGROUND / "log").read_text(errors="replace")
    assert rc.read_text().strip() == "0", f"making .venv-gpu or building target/gpu-wheel failed:\n{log[-8000:]}"

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
