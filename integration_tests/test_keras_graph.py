"""tf-keras graph-mode fit / evaluate / predict through the server equals the in-process run exactly.

Uses MakeCallable / RunCallable (one callable per Keras function), several ExtendSession as the graph grows,
BatchNormalization moving statistics (state updated by the train function) and seeded Dropout. Runs in one
subprocess (eager execution off, global Keras session), in-process first, then through the server.
"""

import numpy as np

from conftest import WORKLOADS, last_json_line, run_python


def test_keras_fit_evaluate_predict_grow_equal_in_process(salus_target, is_salus):
    args = ["--targets", "", salus_target]
    if not is_salus:
        args.append("--isolate-session-state")  # TF's own server shares variables between sessions
    proc = run_python(WORKLOADS / "keras_graph.py", *args, timeout=600)
    results = last_json_line(proc.stdout)
    local, remote = results[""], results[salus_target]

    # Training did something (a server that ignored the train op would still return numbers).
    assert local["loss"][-1] < local["loss"][0]
    assert local["loss2"][-1] < local["loss2"][0]
    assert len(remote["predict"]) == 32 and len(remote["predict2"]) == 32
    # The grown model shares layers with the first one, so the first model's predictions changed.
    assert remote["predict_again"] != remote["predict"][:8]

    for key in local:
        np.testing.assert_array_equal(remote[key], local[key], err_msg=key)
