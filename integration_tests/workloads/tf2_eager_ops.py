"""Plain TF2 eager ops outside any tf.function: float, int, bool and string tensors and a resource
(tf.Variable). No salus import.

Test hook only (not Salus-specific): with WORKLOAD_HOLD=1 the script prints "HOLD" and waits for a line on stdin
while its variables are alive, so a test can look at the server's jobs.

prints one JSON line: {"float": ..., "int": ..., "bool": ..., "string": ..., "variable": ..., "devices": [...]}
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

a = tf.constant(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4))
f = tf.reduce_sum(tf.matmul(a, a, transpose_b=True) * 1.5) + tf.math.reduce_std(a)
d = tf.cast(a, tf.float64) ** 3
i = tf.range(10, dtype=tf.int64) * 3 % 7
i32 = tf.math.cumsum(tf.constant([5, -2, 9], tf.int32))
bools = tf.logical_and(a > -0.5, a < 0.6)
s = tf.strings.join([tf.constant(["ab", "cd", "é"]), tf.strings.as_string(tf.constant([1, 2, 3]))], "-")
upper = tf.strings.upper(s)
length = tf.strings.length(s, unit="UTF8_CHAR")
v = tf.Variable(tf.ones([2, 2]), name="v")
v.assign_add(tf.fill([2, 2], 0.5))
v.assign(v * tf.constant([[1.0, 2.0], [3.0, 4.0]]))
v[0, 1].assign(-7.0)
counter = tf.Variable(0, dtype=tf.int64)
for k in range(5):
    counter.assign_add(k)
u, idx = tf.unique(tf.constant([3, 1, 3, 2, 1]))

if os.environ.get("WORKLOAD_HOLD") == "1":
    import sys
    print("HOLD", flush=True)
    sys.stdin.readline()

print(json.dumps({
    "float": float(f), "float64": d.numpy().ravel().tolist(), "int": i.numpy().tolist(),
    "int32": i32.numpy().tolist(), "bool": bools.numpy().ravel().tolist(), "bool_count": int(tf.reduce_sum(
        tf.cast(bools, tf.int32))), "string": [x.decode() for x in s.numpy()],
    "upper": [x.decode() for x in upper.numpy()], "length": length.numpy().tolist(),
    "variable": v.numpy().ravel().tolist(), "counter": int(counter.numpy()),
    "unique": [u.numpy().tolist(), idx.numpy().tolist()],
    "devices": sorted({a.device, f.device, i.device, bools.device, s.device, v.device, counter.device,
                       v.handle.device}),
}))
