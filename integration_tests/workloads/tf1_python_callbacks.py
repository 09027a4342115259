"""An unmodified TF1 graph script that calls Python: tf.compat.v1.py_func and tf.numpy_function in the graph of
a session that trains a linear model on batches from a Dataset.from_generator one-shot iterator, and a py_func
that raises. Every Python callback counts its calls in this process.

Prints one JSON line: the losses, the trained weights, the error of the raising op, and the callback counts.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()
calls = {}


def count(case):
    calls[case] = calls.get(case, 0) + 1


rng = np.random.RandomState(0)
X = rng.normal(size=(64, 4)).astype(np.float32)
Y = (X @ np.array([[0.5], [-1.0], [0.25], [2.0]], np.float32)).astype(np.float32)


def batches():
    for i in range(0, 64, 16):
        count("generator")
        yield X[i:i + 16], Y[i:i + 16]


def scaled(a):
    count("py_func")
    return (a * 0.5).astype(np.float32)


def shifted(a):
    count("numpy_function")
    return (a + 1.0).astype(np.float32)


def fails(a):
    raise ValueError("no negative numbers here")


dataset = tf.data.Dataset.from_generator(
    batches, output_signature=(tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None, 1), tf.float32)))
features, labels = tf1.data.make_one_shot_iterator(dataset.repeat(3)).get_next()
features = tf1.py_func(scaled, [features], tf.float32)
features = tf.numpy_function(shifted, [features], tf.float32)
features.set_shape((None, 4))
w = tf1.get_variable("w", shape=(4, 1), initializer=tf1.zeros_initializer())
loss = tf.reduce_mean((tf.matmul(features, w) - labels) ** 2)
train = tf1.train.GradientDescentOptimizer(0.05).minimize(loss)
raising = tf1.py_func(fails, [tf.constant(1.0)], tf.float32)

out = {"losses": []}
with tf1.Session() as sess:
    sess.run(tf1.global_variables_initializer())
    for _ in range(12):
        out["losses"].append(float(sess.run([loss, train])[0]))
    out["trained"] = sess.run(w).ravel().tolist()
    try:
        sess.run(raising)
        out["raising"] = None
    except tf.errors.OpError as e:
        out["raising"] = [type(e).__name__, "ValueError: no negative numbers here" in e.message]
out["calls"] = calls
print(json.dumps(out), flush=True)
