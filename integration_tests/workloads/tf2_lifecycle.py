"""An unmodified TF2 script for the lifecycle tests: a variable and a tf.function on the (remote) default device.

WORKLOAD_MODE=train: trains forever, printing READY after the first steps (the test kills it).
WORKLOAD_MODE=wait: prints READY, waits for a line on stdin, then runs one more step and prints the outcome as
JSON (the error class and message if the step failed).
"""

import json
import os
import sys

import tensorflow as tf

v = tf.Variable(tf.ones([256, 256]))


@tf.function
def step(x):
    v.assign_add(tf.matmul(x, v) * 1e-6)
    return tf.reduce_sum(v)


x = tf.ones([256, 256])
total = step(x).numpy()
print("READY", v.device, flush=True)
if os.environ.get("WORKLOAD_MODE") == "train":
    while True:
        step(x).numpy()
sys.stdin.readline()
try:
    result = {"ok": True, "value": float(step(x).numpy())}
except Exception as e:  # the test checks which error a reclaimed context gives
    result = {"ok": False, "error": type(e).__name__, "message": str(e)[:2000]}
print(json.dumps(result), flush=True)
