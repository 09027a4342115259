"""Stock clients of TensorFlow 2.16: two workloads (eager ops, Keras 3 fit) run with the interpreter of
.venv-tf2.16 (tensorflow-cpu 2.16.2 and the adapter; scripts/setup.sh makes it with SALUS_OLD_TF=1 or under CI)
against the server, compared with the same interpreter's in-process run."""

from __future__ import annotations

import subprocess

import pytest

from conftest import REPO, last_json_line
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


@pytest.mark.parametrize("script", ["tf2_eager_ops.py", "tf2_keras3.py"])
def test_tf216_client_runs_on_server_with_identical_numbers(script, old_python, salus_address):
    local_proc = run_workload(script, tf2_env(), python=old_python)
    remote_proc = run_workload(script, tf2_env(SALUS_SERVER=salus_address), python=old_python)
    assert not salus_lines(remote_proc.stderr), remote_proc.stderr[-4000:]
    local, remote = last_json_line(local_proc.stdout), last_json_line(remote_proc.stdout)
    if "tf" in remote:
        assert remote["tf"].startswith(OLD_TF + ".")
    assert_devices(local, "/job:localhost")
    assert_devices(remote, SERVER_JOB)
    assert_same_numbers(local, remote)
