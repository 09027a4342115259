"""A paced training job for the restart tests: an unmodified TF1 graph session (`--kind tf1`, tf1_train.py's
model) or a Keras 3 `fit` (`--kind keras`; with SALUS_SERVER set its eager work goes to the server). It prints
{"step": N} after every step (flushed), so a test can restart the server while it trains, and sleeps `--pace`
seconds between steps (which changes no number). Last line: {"losses": [...], "final": x}.

CLI: python restart_job.py --kind tf1|keras [--target grpc://HOST:PORT] [--steps N] [--pace S]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def tf1(target: str, steps: int, pace: float) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tensorflow as tf
    import tf1_train

    m = tf1_train.build(seed=3, hidden=16)
    losses = []
    with m.graph.as_default(), tf.compat.v1.Session(target) as sess:
        sess.run(m.init)
        for step in range(steps):
            loss, _ = sess.run([m.loss, m.train_op])
            losses.append(float(loss))
            say(step=step + 1, t=time.time())
            time.sleep(pace)
        final = float(sess.run(m.eval_loss))
    return {"losses": losses, "final": final}


def keras_fit(steps: int, pace: float) -> dict:
    import keras
    import numpy as np

    keras.utils.set_random_seed(11)
    rng = np.random.RandomState(5)
    x = rng.normal(size=(32 * steps, 8)).astype(np.float32)
    y = (x[:, :1] * 0.5 - x[:, 2:3] + 0.1 * rng.normal(size=(32 * steps, 1))).astype(np.float32)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    losses = []

    class Paced(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            losses.append(float(logs["loss"]))
            say(step=len(losses), t=time.time())
            time.sleep(pace)

    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0, callbacks=[Paced()])
    final = float(model.evaluate(x[:64], y[:64], batch_size=64, verbose=0))
    return {"losses": losses, "final": final}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["tf1", "keras"], required=True)
    ap.add_argument("--target", default="")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--pace", type=float, default=0.0)
    args = ap.parse_args()
    started = time.time()
    if args.kind == "tf1":
        result = tf1(args.target, args.steps, args.pace)
    else:
        result = keras_fit(args.steps, args.pace)
    say(**result, started=started, ended=time.time())


if __name__ == "__main__":
    main()
