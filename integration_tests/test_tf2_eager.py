"""TF2 eager work through the adapter: unmodified TF2 scripts (workloads/tf2_*.py, no salus import) run once
in-process (SALUS_SERVER unset) and once with SALUS_SERVER set; every number they print must be the same, and
their variables must have lived on the server (/job:worker/...).

Runs against any target: SALUS_TEST_TARGET=grpc://HOST:PORT of TensorFlow's own tf.distribute.Server checks
the client side (the adapter and the workloads) independently of salus-server's eager front end.
"""

from __future__ import annotations

import pytest

from conftest import last_json_line
from test_python_adapter import salus_package, sessions_created  # noqa: F401  (module fixture: python/ installed)
from tf2_common import SERVER_JOB, assert_devices, assert_same_numbers, run_workload, salus_lines, tf2_env

WORKLOADS_TF2 = {
    "keras3": ("tf2_keras3.py", {}),
    "custom_loop": ("tf2_custom_loop.py", {}),
    "legacy_tf_keras": ("tf2_legacy_keras.py", {"TF_USE_LEGACY_KERAS": "1"}),
    "eager_ops": ("tf2_eager_ops.py", {}),
}


def local_and_remote(script: str, address: str, extra: dict):
    local = run_workload(script, tf2_env(**extra))
    assert not salus_lines(local.stderr), local.stderr
    remote = run_workload(script, tf2_env(SALUS_SERVER=address, **extra))
    assert not salus_lines(remote.stderr), \
        f"the adapter warned (eager work not on the server?):\n{remote.stderr[-4000:]}"
    return last_json_line(local.stdout), last_json_line(remote.stdout)


@pytest.mark.parametrize("workload", list(WORKLOADS_TF2))
def test_tf2_script_runs_on_server_with_identical_numbers(workload, salus_address):
    script, extra = WORKLOADS_TF2[workload]
    local, remote = local_and_remote(script, salus_address, extra)
    assert_devices(local, "/job:localhost")
    assert_devices(remote, SERVER_JOB)
    assert_same_numbers(local, remote)


def test_tf1_session_and_tf2_eager_in_one_process(salus_address, channel, is_salus):
    before = sessions_created(channel) if is_salus else None
    local, remote = local_and_remote("tf2_mixed_session.py", salus_address, {})
    assert_devices(remote, SERVER_JOB)
    assert_same_numbers(local, remote)
    if is_salus:  # the graph session went to the master front end (the server may count the eager context too)
        assert sessions_created(channel) - before in (1, 2)
