"""An unmodified TF2 script whose tf.functions call Python: a tf.py_function and a tf.numpy_function inside a
tf.function that also reads a tf.Variable (values and a gradient through the py_function), a tf.function that
sums a Dataset.from_generator, a custom training loop whose tf.function takes the next batch from a
from_generator iterator, and a py_function that raises inside a tf.function. Every Python callback counts its
calls in this process.

Prints one JSON line: each case's numbers, the error type and the start of its message for the raising case,
the callback counts, and the device of the variable.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

calls = {}


def count(case):
    calls[case] = calls.get(case, 0) + 1


out = {}
v = tf.Variable(1.5)


def doubled(a):
    count("py_function")
    return a * 2.0


@tf.function
def with_py_function(x):
    return tf.py_function(doubled, [x], tf.float32) * v


def squared(a):
    count("numpy_function")
    return (a * a).astype(np.float32)


@tf.function
def with_numpy_function(x):
    return tf.numpy_function(squared, [x], tf.float32) + v


x = tf.constant([1.0, 2.0, 3.0])
out["py_function"] = with_py_function(x).numpy().tolist()
out["numpy_function"] = with_numpy_function(x).numpy().tolist()


@tf.function
def gradient_through_python(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.reduce_sum(tf.py_function(doubled, [x], tf.float32) * x)
    return tape.gradient(y, x)


out["gradient"] = gradient_through_python(x).numpy().tolist()

rng = np.random.RandomState(0)
X = rng.normal(size=(64, 4)).astype(np.float32)
Y = (X @ np.array([[0.5], [-1.0], [0.25], [2.0]], np.float32)).astype(np.float32)


def batches():
    for i in range(0, 64, 16):
        count("generator")
        yield X[i:i + 16], Y[i:i + 16]


SPEC = (tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None, 1), tf.float32))
dataset = tf.data.Dataset.from_generator(batches, output_signature=SPEC)


@tf.function
def total(ds):
    s = tf.constant(0.0)
    for features, labels in ds:
        s += tf.reduce_sum(features) + tf.reduce_sum(labels)
    return s


out["sum_over_dataset"] = float(total(dataset).numpy())

w = tf.Variable(tf.zeros((4, 1)))
optimizer = tf.keras.optimizers.SGD(0.1)


@tf.function
def train_step(iterator):
    features, labels = next(iterator)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((features @ w - labels) ** 2)
    optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    return loss


losses = []
for _ in range(3):
    iterator = iter(dataset)
    for _ in range(4):
        losses.append(float(train_step(iterator).numpy()))
out["custom_loop"] = losses
out["trained"] = w.numpy().ravel().tolist()


def fails(a):
    raise ValueError("no negative numbers here")


@tf.function
def raising(x):
    return tf.py_function(fails, [x], tf.float32)


try:
    raising(x).numpy()
    out["raising"] = None
except tf.errors.OpError as e:
    out["raising"] = [type(e).__name__, "ValueError: no negative numbers here" in e.message]
out["calls"] = calls
out["device"] = v.device
print(json.dumps(out), flush=True)
