"""Per-iteration memory measured the way the device sees it (issue 39): the device allocator's statistics.

The server samples a job's main iterations (the 2nd and 10th calls of a function or runs of a signature) and reads the
allocator behind the job's device, as `tf.config.experimental.get_memory_info` does: its peak above what it held at
the iteration's start. On a GPU that is TensorFlow's GPU BFC allocator. On the CPU TensorFlow's default allocator
keeps no statistics (the server runs oneDNN on the system allocator), so these tests start the server, and the
in-process references, with TF_CPU_ALLOCATOR_USE_BFC=true: the same code path as on a GPU. `ctl jobs --json` gives
the allocator's figure (`ephemeral_allocator_bytes`) and what the need was taken from (`ephemeral_meter`: on the
host the heap's rise is added, for the kernels' malloc'ed scratch the allocator never sees).

Checked against TensorFlow's own figure for the same job in a process of its own:
- a TF2 tf.function step (tf2_steps.py) and a TF1 CNN (mem_job.py cnn_small_infer): within 5% of TensorFlow's figure
  for the same calls (they agree to the byte here: their steps run their ops in one order; the TF2 step's variable
  may be copied on write once, see its test);
- a Keras 3 model trained with fit: within a factor of 2, the figures printed. TensorFlow's own figure for a
  training step is not one number on this CPU: the order in which inter-op threads run the gradients (and BFC's
  chunk rounding after it) decides what is live at once. Measured in-process, the same Keras script gave
  4.2-4.8 MB in one process, 6.0-6.6 MB in another and 5.3-6.6 MB in a third (through the server: 5.2-6.9 MB), and
  the TF1 cnn_train graph 9.57 MB or 12.09 MB (12.4-13.3 MB on one thread; 10.5-12.2 MB through the server). A 5%
  bound there would test TensorFlow's scheduling, not the server's accounting.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import WORKLOADS, SalusProcess, child_env, last_json_line, venv_python, wait_until
from server_ctl import ctl_json
from tf2_common import tf2_env

# The server's own allocator settings (node/src/tf_env.rs), and the CPU allocator that keeps statistics.
ALLOCATOR_ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR": "true",
                 "MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1)}
SAMPLED_CALLS = (2, 10)  # the main iterations the server samples (run_class::MEMORY_SAMPLE_RUNS, below 100)
TIMEOUT_S = 240


def reference(args: list[str], env: dict) -> subprocess.Popen:
    """An in-process run of a workload, started now and read later."""
    return subprocess.Popen([venv_python(), *args], env={**env, **ALLOCATOR_ENV}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, err[-4000:]
    return last_json_line(out)


def job_row(address: str, name: str) -> dict | None:
    return next((j for j in ctl_json(address, "jobs")["jobs"] if j["name"] == name), None)


def held_row(proc: subprocess.Popen, marker: str, address: str, name: str) -> dict:
    """The job's row once the client printed `marker` (its iterations done, its job still open)."""
    for line in proc.stdout:
        if line.startswith(marker):
            break
    else:
        pytest.fail(f"{name} ended before {marker!r}: {proc.stderr.read()[-4000:]}")
    assert wait_until(lambda: (job_row(address, name) or {}).get("ephemeral_meter"), timeout=30), \
        job_row(address, name)
    return job_row(address, name)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("allocator-memory")
    refs = {
        "tf2_steps": reference([str(WORKLOADS / "tf2_steps.py"), "12"],
                               tf2_env(TF2_STEPS_MEMORY="allocator")),
        "keras": reference([str(WORKLOADS / "tf2_keras_memory.py"), "reference", "dense"], tf2_env()),
        "cnn": reference([str(WORKLOADS / "mem_job.py"), "--model", "cnn_small_infer", "--allocator-peak",
                          "--steps", "10"], child_env()),
    }
    server = SalusProcess(tmp / "server.log", ("--memory-capacity", "8GiB"), env=ALLOCATOR_ENV)
    rows = {}
    try:
        env = tf2_env(SALUS_SERVER=server.address)
        steps = subprocess.Popen([venv_python(), str(WORKLOADS / "tf2_steps.py"), "12", "11"],
                                 env={**env, "SALUS_JOB_NAME": "tf2-steps"}, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rows["tf2_steps"] = held_row(steps, "HOLD", server.address, "tf2-steps")
        steps.communicate("\n", timeout=TIMEOUT_S)
        keras = subprocess.Popen([venv_python(), str(WORKLOADS / "tf2_keras_memory.py"), "fit", "dense"],
                                 env={**env, "SALUS_JOB_NAME": "keras-dense"}, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rows["keras"] = held_row(keras, "HOLD", server.address, "keras-dense")
        keras.communicate("\n", timeout=TIMEOUT_S)
        close = tmp / "close-cnn"
        cnn = subprocess.Popen([venv_python(), str(WORKLOADS / "mem_job.py"), "--model", "cnn_small_infer", "--target",
                                server.target, "--name", "cnn", "--steps", "12", "--close-file", str(close)],
                               env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
        rows["cnn"] = held_row(cnn, '{"phase": "holding"', server.address, "cnn")
        close.touch()
        cnn.communicate(timeout=TIMEOUT_S)
        assert cnn.returncode == 0
    finally:
        server.stop()
    return {"rows": rows, "refs": {name: result(proc) for name, proc in refs.items()}}


def sampled(rises: list[int]) -> int:
    """TensorFlow's figure for the iterations the server samples: the larger of the two."""
    return max(rises[i - 1] for i in SAMPLED_CALLS)


def compare(name: str, row: dict, tf_bytes: int, low: float, high: float) -> None:
    salus = row["ephemeral_allocator_bytes"]
    print(f"{name}: allocator peak through the server {salus} vs TensorFlow in-process {tf_bytes} "
          f"({salus / tf_bytes:.3f}x); need {row['ephemeral_estimate_bytes']} ({row['ephemeral_meter']})")
    assert row["ephemeral_source"] == "measured", row
    assert row["ephemeral_meter"] in ("allocator", "allocator+heap"), row
    assert low * tf_bytes <= salus <= high * tf_bytes, (row, tf_bytes)
    # The need (with Salus's 5% margin) covers the allocator's figure.
    assert row["ephemeral_estimate_bytes"] >= salus, row


def test_a_tf2_step_is_measured_as_tensorflows_allocator_counts_it(measured):
    # Like with like: TensorFlow's figure for the calls the server samples.
    rises = measured["refs"]["tf2_steps"]["step_allocator_rises"]
    row, tf_bytes = measured["rows"]["tf2_steps"], sampled(rises)
    print(f"tf2_steps in-process rises: {rises}")
    # The step reads its variable (1 MiB) in each matmul and then assigns to it: TensorFlow copies the variable on
    # write when a read of it is still held, which the inter-op threads' timing decides (seen once, in CI, on a
    # loaded machine: 4193280 through the server against 3145472). Either outcome is TensorFlow's own figure for
    # the step; anything else is not.
    copy_on_write = 512 * 512 * 4
    if row["ephemeral_allocator_bytes"] > 1.05 * tf_bytes:
        tf_bytes += copy_on_write
        print(f"tf2_steps: compared with TensorFlow's figure plus one copy of the variable ({tf_bytes})")
    compare("tf2_steps", row, tf_bytes, 0.95, 1.05)


def test_a_tf1_cnn_is_measured_as_tensorflows_allocator_counts_it(measured):
    row = measured["rows"]["cnn"]
    compare("tf1 cnn", row, sampled(measured["refs"]["cnn"]["rises"]), 0.95, 1.05)
    assert row["persistent_source"] == "graph", row


def test_a_keras_training_step_is_measured_by_the_allocator(measured):
    compare("keras dense", measured["rows"]["keras"], sampled(measured["refs"]["keras"]["rises"]), 0.5, 2.0)


def test_the_rows_say_which_meter_without_allocator_statistics(tmp_path):
    """Without TF_CPU_ALLOCATOR_USE_BFC the CPU allocator keeps no statistics here: an eager job's need is the
    heap's rise, said so, and no allocator figure is claimed."""
    server = SalusProcess(tmp_path / "server.log", ("--memory-capacity", "8GiB"))
    try:
        proc = subprocess.Popen([venv_python(), str(WORKLOADS / "tf2_steps.py"), "12", "11"],
                                env=tf2_env(SALUS_SERVER=server.address, SALUS_JOB_NAME="heap-steps"),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        row = held_row(proc, "HOLD", server.address, "heap-steps")
        out, _ = proc.communicate("\n", timeout=TIMEOUT_S)
        assert "error" not in json.loads(out.splitlines()[-1]), out
    finally:
        server.stop()
    assert (row["ephemeral_meter"], row["ephemeral_allocator_bytes"]) == ("heap", 0), row
