"""Python callbacks: ops that call the script's Python (tf.py_function, tf.numpy_function, tf.compat.v1.py_func,
Dataset.from_generator) run on the server inside tf.functions and TF1 graphs, their Python in the script's
process (salus.v1.PythonCallbacks). Each workload runs in-process and through the server: every number and every
callback count must be the same, and a callback's exception must reach the script with its type.

Also: a TF1 client without the adapter gets FAILED_PRECONDITION saying what to install; a script killed inside
its own callback fails only its step (the server serves the next job); a server stops promptly while a script
holds its callback stream open.

Cost: six script runs and one extra server (about 40 s here).
"""

from __future__ import annotations

import signal
import subprocess

from conftest import WORKLOADS, SalusProcess, child_env, last_json_line, start_python, venv_python
from test_python_adapter import salus_package  # noqa: F401  (module fixture: python/ installed)
from tf2_common import SERVER_JOB, assert_same_numbers, run_workload, salus_lines, tf2_env


def _both(script, salus_address, **env):
    local = last_json_line(run_workload(script, tf2_env(**env)).stdout)
    proc = run_workload(script, tf2_env(SALUS_SERVER=salus_address, **env))
    assert not salus_lines(proc.stderr), f"the adapter warned:\n{proc.stderr[-4000:]}"
    return local, last_json_line(proc.stdout)


def test_tf_functions_call_python_with_in_process_numbers(salus_address):
    local, remote = _both("tf2_python_callbacks.py", salus_address)
    assert remote["device"].startswith(SERVER_JOB), remote["device"]
    assert remote["raising"] == ["InvalidArgumentError", True], remote["raising"]
    assert remote["calls"] == local["calls"], (local["calls"], remote["calls"])
    assert_same_numbers(local, remote, ignore=("device",))


def test_tf1_graphs_call_python_with_in_process_numbers(salus_address):
    local, remote = _both("tf1_python_callbacks.py", salus_address)
    assert remote["raising"] == ["InvalidArgumentError", True], remote["raising"]
    assert remote["calls"] == local["calls"] == {"generator": 12, "py_func": 12, "numpy_function": 12}, remote
    assert_same_numbers(local, remote)


def test_a_client_without_the_adapter_is_told_what_to_install(salus_target):
    # A TF1 session opened on the server by hand, without SALUS_SERVER: no adapter serves the py_func.
    code = ("import numpy as np, tensorflow as tf; tf1 = tf.compat.v1; tf1.disable_eager_execution()\n"
            "y = tf1.py_func(lambda a: a, [tf.constant(np.float32(1))], tf.float32)\n"
            f"s = tf1.Session({salus_target!r})\n"
            "try:\n    s.run(y)\nexcept tf.errors.OpError as e:\n    print(type(e).__name__, '|', e.message)\n")
    env = {k: v for k, v in child_env().items() if not k.startswith("SALUS_")}
    out = subprocess.run([venv_python(), "-c", code], env=env,
                         capture_output=True, text=True, timeout=240).stdout
    assert out.startswith("FailedPreconditionError |"), out
    assert "salus adapter" in out and "PyFunc" in out, out


def test_a_script_killed_inside_its_callback_fails_only_its_step(salus_address):
    env = tf2_env(SALUS_SERVER=salus_address)
    dying = start_python(WORKLOADS / "python_callback_holder.py", "die", env=env)
    dying.communicate(timeout=240)
    assert dying.returncode == -signal.SIGKILL, dying.returncode
    # The server serves the next script, Python callbacks and all.
    local, remote = _both("tf1_python_callbacks.py", salus_address)
    assert_same_numbers(local, remote)


def test_a_held_callback_stream_does_not_delay_shutdown(tmp_path, salus_package):  # noqa: F811
    server = SalusProcess(tmp_path / "salus-server.stderr.log", ("--shutdown-grace", "120s"))
    holder = subprocess.Popen([venv_python(), str(WORKLOADS / "python_callback_holder.py"), "hold"],
                              env=tf2_env(SALUS_SERVER=server.address), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        # Within half the grace period: the server ends the stream once its work has drained.
        assert server.stop(timeout=60) == 0, server.stderr_tail()
    finally:
        holder.kill()
        holder.wait(30)
