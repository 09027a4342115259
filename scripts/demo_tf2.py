#!/usr/bin/env python3
"""Salus TF2 demo: an unmodified Keras 3 script, run on salus-server with only SALUS_SERVER set.

The same Keras 3 code (a small classifier, fit with validation data, then evaluate) runs twice in child
processes: once in-process, once with SALUS_SERVER pointing at the server, where the adapter (python/) connects
TensorFlow's eager context to it. Prints both runs' losses and where the model's variables live; exit status 0
only if the server run trained on the server and matched the in-process numbers.

  salus-server --listen 127.0.0.1:5501 &
  .venv/bin/python scripts/demo_tf2.py --server 127.0.0.1:5501
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SCRIPT = r'''
import json
import numpy as np
import keras
keras.utils.set_random_seed(0)
rng = np.random.RandomState(0)
x = rng.normal(size=(512, 16)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64")
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dropout(0.1), keras.layers.Dense(2)])
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
history = model.fit(x[:384], y[:384], validation_data=(x[384:], y[384:]), epochs=3, batch_size=32, verbose=0)
loss, accuracy = model.evaluate(x[384:], y[384:], verbose=0)
print(json.dumps({"loss": history.history["loss"], "val_loss": history.history["val_loss"],
                  "evaluate": [loss, accuracy], "device": model.weights[0].value.device}))
'''


def run(server: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SALUS_")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("TF_USE_LEGACY_KERAS", None)
    if server:
        env.update(SALUS_SERVER=server, SALUS_JOB_NAME="demo-tf2")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"demo-tf2: the {'server' if server else 'in-process'} run failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="127.0.0.1:5501", help="HOST:PORT of salus-server")
    args = ap.parse_args()
    remote = run(args.server)
    local = run(None)
    for name, r in (("salus", remote), ("in-process", local)):
        losses = ", ".join(f"{v:.4f}" for v in r["loss"])
        print(f"demo-tf2: {name:10s} Keras 3 fit loss per epoch [{losses}], evaluate loss {r['evaluate'][0]:.4f} "
              f"accuracy {r['evaluate'][1]:.3f}; variables on {r['device']}")
    on_server = remote["device"].startswith("/job:worker")
    same = all(abs(a - b) <= 1e-6 * max(1.0, abs(b)) for key in ("loss", "val_loss", "evaluate")
               for a, b in zip(remote[key], local[key]))
    print(f"demo-tf2: variables on the server: {on_server}; numbers equal to in-process: {same}")
    return 0 if on_server and same else 1


if __name__ == "__main__":
    sys.exit(main())
