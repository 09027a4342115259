"""An unmodified tf-keras script (TF_USE_LEGACY_KERAS=1, eager) whose input pipelines call Python: fit and
evaluate on Dataset.from_generator (length unknown), on a dataset mapping tf.py_function (steps_per_execution
2), on a Python generator (steps_per_epoch) and on a keras.utils.Sequence. Every callback counts its calls.

prints one JSON line: each case's losses and weights, the callbacks' call counts, and the weights' device.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

keras = tf.keras
rng = np.random.RandomState(0)
X = rng.normal(size=(64, 4)).astype(np.float32)
Y = (X[:, :1] * 0.5 - X[:, 1:2]).astype(np.float32)
SPEC = (tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None, 1), tf.float32))
calls = {}
out = {}


def count(case):
    calls[case] = calls.get(case, 0) + 1


def fit(case, data, spe=1, **kwargs):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.layers.Dense(6, activation="relu", input_shape=(4,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=spe)
    history = model.fit(data, epochs=2, verbose=0, **kwargs)
    out[case] = {"loss": [float(v) for v in history.history["loss"]],
                 "weights": [float(w.numpy().sum()) for w in model.weights]}
    out["device"] = model.weights[0].device
    return model


def gen():
    for i in range(0, 64, 16):
        count("from_generator")
        yield X[i:i + 16], Y[i:i + 16]


ds = tf.data.Dataset.from_generator(gen, output_signature=SPEC)
model = fit("from_generator", ds)
out["from_generator"]["evaluate"] = float(model.evaluate(ds, verbose=0))


def halve(x):
    count("py_function_map")
    return x / 2


mapped = tf.data.Dataset.from_tensor_slices((X, Y)).map(
    lambda x, y: (tf.ensure_shape(tf.py_function(halve, [x], tf.float32), (4,)), y)).batch(8)
fit("py_function_map", mapped, spe=2)


def endless():
    while True:
        for i in range(0, 64, 16):
            count("python_generator")
            yield X[i:i + 16], Y[i:i + 16]


fit("python_generator", endless(), steps_per_epoch=4)


class Batches(keras.utils.Sequence):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        count("sequence")
        return X[i * 16:(i + 1) * 16], Y[i * 16:(i + 1) * 16]


fit("sequence", Batches(), shuffle=False)
out["calls"] = calls
print(json.dumps(out), flush=True)
sys.stderr.flush()
os._exit(0)  # see tf2_python_pipeline.py: no exit-time collection of a prefetch left mid-stream
