"""An unmodified tf-keras script in graph mode: it knows nothing about Salus.

With eager execution disabled tf-keras runs everything in its global backend session, which the
salus-tf hook sends to the server when SALUS_SERVER is set. WORKLOAD_HOLD=1: print "HOLD" after fit and
wait for a line on stdin (session still open) so a test can look at the server's jobs.

prints one JSON line: {"loss": [...], "eval": [...], "predict": [...]}
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf
import tf_keras as keras

tf.compat.v1.disable_eager_execution()
tf.compat.v1.set_random_seed(3)

rng = np.random.RandomState(1)
x = rng.normal(size=(96, 6)).astype(np.float32)
y = (x[:, :2].sum(axis=1) > 0).astype(np.float32)

init = keras.initializers.glorot_uniform
model = keras.Sequential([
    keras.layers.Dense(16, activation="relu", input_shape=(6,), kernel_initializer=init(seed=1)),
    keras.layers.Dense(1, activation="sigmoid", kernel_initializer=init(seed=2)),
])
model.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss="binary_crossentropy", metrics=["accuracy"])
hist = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
if os.environ.get("WORKLOAD_HOLD"):
    print("HOLD", flush=True)
    sys.stdin.readline()
ev = model.evaluate(x, y, batch_size=32, verbose=0)
pred = model.predict(x[:8], verbose=0)

print(json.dumps({"loss": [float(v) for v in hist.history["loss"]], "eval": [float(v) for v in ev],
                  "predict": np.asarray(pred, np.float64).ravel().tolist()}))
