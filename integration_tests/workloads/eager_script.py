"""An unmodified TF2 eager script (GradientTape, tf.function): no graph session; with SALUS_SERVER set its eager
work goes to the server's eager front end (SALUS_EAGER=0: locally, with a warning). prints one JSON line:
{"losses": [...]}
"""

import json

import numpy as np
import tensorflow as tf

rng = np.random.RandomState(0)
x = tf.constant(rng.normal(size=(64, 3)).astype(np.float32))
y = tf.constant((rng.normal(size=(64, 1))).astype(np.float32))
w = tf.Variable(tf.zeros([3, 1]))


@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss


print(json.dumps({"losses": [float(step()) for _ in range(5)]}))
