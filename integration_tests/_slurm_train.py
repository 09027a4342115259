"""An unmodified TF1-style training script for test_slurm.py: it knows nothing about Salus or Slurm (no salus
import, no target). Run under a Slurm job with salusmem, the job's TaskProlog sets SALUS_SERVER and SALUS_TOKEN
and its session goes to the node's salus-server; run without them, it trains in-process.

Test hook only (not Salus-specific): with WORKLOAD_HOLD_FILE=PATH the script prints "HOLD" after its training
steps and waits, its session still open, until PATH exists, so a test can look at the server's jobs.

prints one JSON line: {"losses": [...], "salus_loaded": bool}
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

rng = np.random.RandomState(0)
X = rng.normal(size=(64, 4)).astype(np.float32)
Y = (X @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.25).astype(np.float32)

tf.set_random_seed(7)
x = tf.placeholder(tf.float32, [None, 4], name="x")
y = tf.placeholder(tf.float32, [None, 1], name="y")
w1 = tf.get_variable("w1", [4, 8], initializer=tf.glorot_uniform_initializer(seed=1))
b1 = tf.get_variable("b1", [8], initializer=tf.zeros_initializer())
w2 = tf.get_variable("w2", [8, 1], initializer=tf.glorot_uniform_initializer(seed=2))
b2 = tf.get_variable("b2", [1], initializer=tf.zeros_initializer())
pred = tf.matmul(tf.tanh(tf.matmul(x, w1) + b1), w2) + b2
loss = tf.reduce_mean(tf.square(pred - y))
train_op = tf.train.GradientDescentOptimizer(0.05).minimize(loss)
feed = {x: X, y: Y}

with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    losses = [float(sess.run([loss, train_op], feed)[0]) for _ in range(10)]
    hold = os.environ.get("WORKLOAD_HOLD_FILE")
    if hold:
        print("HOLD", flush=True)
        deadline = time.monotonic() + 300
        while not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.1)
    losses.append(float(sess.run(loss, feed)))

print(json.dumps({"losses": losses, "salus_loaded": "salus" in sys.modules}), flush=True)
