"""Two TF1 training scripts run at the same time against one server; each gets exactly its in-process result.

Both scripts use the same variable names ("mlp/w1", ...) but different seeds and layer sizes, so any leak of
state between the two sessions (jobs) shows up as wrong numbers or shape errors.
"""

from conftest import WORKLOADS, child_env, last_json_line, start_python, wait_until
from workloads import tf1_train

JOBS = {"a": dict(seed=11, hidden=16), "b": dict(seed=22, hidden=24)}
STEPS = 150


def test_two_scripts_at_once(salus_target, is_salus, tmp_path):
    procs = {}
    try:
        for name, cfg in JOBS.items():
            args = ["--target", salus_target, "--seed", str(cfg["seed"]), "--hidden", str(cfg["hidden"]),
                    "--steps", str(STEPS), "--barrier-dir", str(tmp_path), "--name", name]
            if not is_salus:
                args.append("--isolate-session-state")  # TF's own server shares the default container
            procs[name] = start_python(WORKLOADS / "tf1_train.py", *args, env=child_env())

        # Compute the references while the children import TensorFlow.
        refs = {name: tf1_train.train("", steps=STEPS, **cfg) for name, cfg in JOBS.items()}

        ready = wait_until(lambda: all((tmp_path / f"{n}.ready").exists() for n in JOBS) or
                           any(p.poll() is not None for p in procs.values()), timeout=180)
        assert ready and all(p.poll() is None for p in procs.values()), "a job died before the barrier"
        (tmp_path / "go").touch()

        results = {}
        for name, p in procs.items():
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, f"job {name} failed:\n{err[-4000:]}"
            results[name] = last_json_line(out)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()  # our own child, by its Popen handle
                p.wait()

    # The two runs really overlapped in time (otherwise this is not a concurrency test).
    a, b = results["a"], results["b"]
    assert a["start"] < b["end"] and b["start"] < a["end"]
    for name in JOBS:
        assert results[name]["global_step"] == STEPS
        assert results[name]["losses"] == refs[name]["losses"], f"job {name} losses differ from in-process"
        assert results[name]["param_sums"] == refs[name]["param_sums"]
        assert results[name]["eval_loss"] == refs[name]["eval_loss"]
    # Different jobs, different numbers (guards against both getting one job's results).
    assert results["a"]["losses"] != results["b"]["losses"]
