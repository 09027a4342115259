"""Several runs of sched_job.py's training job, one after another in one process, to give the server a job history.

Each run is a session of its own (a job arriving, training, and closing normally: a completed run) with its own
session_metadata name, the name its history is kept under; every run builds the same graph (mlp_small), so runs of
one name share one identity. One process instead of one per run saves TensorFlow's import (~3 s) per run.

CLI: python history_runs.py --target grpc://127.0.0.1:PORT RUN [RUN ...]   (RUN: NAME:STEPS, e.g. short:100)
prints one JSON line per run: {"name", "steps", "seconds"} (wall time from session creation to close).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import tensorflow as tf

import sched_job


def run(target: str, name: str, steps: int) -> dict:
    m = sched_job.build(seed=1)
    begin = time.monotonic()
    with m.graph.as_default(), tf.compat.v1.Session(target, config=sched_job.config(name)) as sess:
        sess.run(m.init)
        for _ in range(steps):
            sess.run([m.loss, m.train_op])
    return {"name": name, "steps": steps, "seconds": round(time.monotonic() - begin, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("runs", nargs="+", help="NAME:STEPS, run in this order")
    args = ap.parse_args()
    for spec in args.runs:
        name, _, steps = spec.rpartition(":")
        print(json.dumps(run(args.target, name, int(steps))), flush=True)
    os._exit(0)  # skip TensorFlow's teardown (as sched_job.py does)


if __name__ == "__main__":
    main()
