"""Stock clients of TensorFlow 2.16: two workloads (eager ops, Keras 3 fit) run with the interpreter of
.venv-tf2.16 (tensorflow-cpu 2.16.2 and the adapter; scripts/setup.sh makes it with SALUS_OLD_TF=1 or under CI)
against the server, under both oneDNN settings (server and references alike).

The server computes with TensorFlow 2.21's kernels, so a 2.16 client gets 2.21's numbers: the exact comparison is
with the same script run in-process under 2.21 (both venvs have the same Keras; the client's TF version is the
one number allowed to differ). Against the 2.16 client's own in-process run only a float32 tolerance holds: the
two releases' CPU kernels sum in different orders (measured with oneDNN off: Keras 3 predictions 3.2e-6 apart
after 24 Adam steps; with oneDNN on, bitwise equal), so 1e-4 relative (30x the measured spread, far below the
1e-2 and more that a wrong computation shows)."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO, SalusProcess, last_json_line
from tf2_common import SERVER_JOB, assert_devices, assert_same_numbers, run_workload, salus_lines, tf2_env

OLD_PYTHON = REPO / ".venv-tf2.16" / "bin" / "python"
OLD_TF = "2.16"


@pytest.fixture(scope="module")
def old_python() -> str:
    if not OLD_PYTHON.exists():
        pytest.skip(f"{OLD_PYTHON} is absent: run `SALUS_OLD_TF=1 scripts/setup.sh` to test a TF {OLD_TF} client")
    probe = "import tensorflow as tf, salus; print(tf.__version__)"
    proc = subprocess.run([str(OLD_PYTHON), "-c", probe], capture_output=True, text=True, timeout=120,
                          env=tf2_env())
    if proc.returncode != 0:
        pytest.fail(f"{OLD_PYTHON} cannot import tensorflow and salus:\n{proc.stderr[-3000:]}")
    version = proc.stdout.strip().splitlines()[-1]
    assert version.startswith(OLD_TF + "."), f"{OLD_PYTHON} has TensorFlow {version}, expected {OLD_TF}.x"
    return str(OLD_PYTHON)


# What two TensorFlow releases' float32 kernels may differ by after a few dozen training steps (see above).
ACROSS_RELEASES_REL_TOL = 1e-4
ACROSS_RELEASES_ABS_TOL = 1e-6


@pytest.fixture(scope="module")
def server_address(onednn, tmp_path_factory) -> str:
    """A server of this module's own, one per oneDNN setting."""
    server = SalusProcess(tmp_path_factory.mktemp("old-client") / "salus-server.stderr.log", env=onednn)
    yield server.address
    server.stop()


@pytest.mark.parametrize("script", ["tf2_eager_ops.py", "tf2_keras3.py"])
def test_tf216_client_runs_on_server_with_identical_numbers(script, old_python, onednn, server_address):
    remote_proc = run_workload(script, tf2_env(SALUS_SERVER=server_address, **onednn), python=old_python)
    local_new_proc = run_workload(script, tf2_env(**onednn))
    local_old_proc = run_workload(script, tf2_env(**onednn), python=old_python)
    assert not salus_lines(remote_proc.stderr), remote_proc.stderr[-4000:]
    remote = last_json_line(remote_proc.stdout)
    local_new, local_old = last_json_line(local_new_proc.stdout), last_json_line(local_old_proc.stdout)
    if "tf" in remote:
        assert remote["tf"].startswith(OLD_TF + ".")
    assert_devices(local_old, "/job:localhost")
    assert_devices(remote, SERVER_JOB)
    # The server's kernels are 2.21's: exactly the numbers of a 2.21 in-process run of the same script.
    assert_same_numbers(local_new, remote, ignore=("devices", "tf"))
    # The client's own release computes within float32 noise of it.
    assert_same_numbers(local_old, remote, rel_tol=ACROSS_RELEASES_REL_TOL, abs_tol=ACROSS_RELEASES_ABS_TOL)
