"""An unmodified TF1-style script: it knows nothing about Salus (no salus import, no target, no hints).

Run with SALUS_SERVER set (and salus-tf installed) its sessions go to the server; without, it runs
in-process. Uses the three TF1 session kinds: tf.Session (with the script's own ConfigProto),
tf.InteractiveSession and tf.train.MonitoredTrainingSession.

Test hook only (not Salus-specific): with WORKLOAD_HOLD=1 the script prints "HOLD" after training and
waits for a line on stdin while its first session is still open, so a test can look at the server's jobs.

prints one JSON line: {"losses": [...], "interactive_loss": x, "monitored_losses": [...], ...}
"""

import json
import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

rng = np.random.RandomState(0)
X = rng.normal(size=(128, 4)).astype(np.float32)
Y = (X @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.25).astype(np.float32)

tf.set_random_seed(7)
x = tf.placeholder(tf.float32, [None, 4], name="x")
y = tf.placeholder(tf.float32, [None, 1], name="y")
w = tf.get_variable("w", [4, 1], initializer=tf.glorot_uniform_initializer(seed=1))
b = tf.get_variable("b", [1], initializer=tf.zeros_initializer())
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
global_step = tf.train.get_or_create_global_step()
train_op = tf.train.GradientDescentOptimizer(0.05).minimize(loss, global_step=global_step)
init = tf.global_variables_initializer()
feed = {x: X, y: Y}

# 1. tf.Session with the script's own config.
config = tf.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2,
                        allow_soft_placement=True)
sess = tf.Session(config=config)
sess.run(init)
losses = [float(sess.run([loss, train_op], feed)[0]) for _ in range(15)]
if os.environ.get("WORKLOAD_HOLD"):
    print("HOLD", flush=True)
    sys.stdin.readline()
losses.append(float(sess.run(loss, feed)))
sess.close()

# 2. InteractiveSession (installs itself as the default session).
isess = tf.InteractiveSession()
init.run()
for _ in range(3):
    train_op.run(feed)
interactive_loss = float(loss.eval(feed))
isess.close()

# 3. MonitoredTrainingSession (no checkpoints: nothing to restore, starts from the initializers).
monitored = []
with tf.train.MonitoredTrainingSession(checkpoint_dir=None, config=config) as mon:
    for _ in range(5):
        monitored.append(float(mon.run([loss, train_op], feed)[0]))
    step = int(mon.run(global_step))

print(json.dumps({"losses": losses, "interactive_loss": interactive_loss, "monitored_losses": monitored,
                  "monitored_step": step, "salus_loaded": "salus" in sys.modules}))
