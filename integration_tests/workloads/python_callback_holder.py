"""A TF1 script that builds a py_func (which opens its Python callback stream to the server), prints "ready",
then either waits for stdin to close (`hold`) or runs the op, whose Python kills this process (`die`)."""

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()


def dies(a):
    os.kill(os.getpid(), signal.SIGKILL)
    return a


y = tf1.py_func(dies, [tf.constant(np.float32(1.0))], tf.float32)
with tf1.Session() as sess:
    print("ready", flush=True)
    if sys.argv[1] == "hold":
        sys.stdin.read()
    else:
        sess.run(y)
