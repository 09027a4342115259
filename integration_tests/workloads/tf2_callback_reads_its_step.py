"""A tf.function step whose tf.py_function reads a variable: in-process the read happens while the step runs.
Through the server the read is an op of the same eager context, which the server runs after the step, and the
step waits for the callback: the adapter's watchdog ends that wait with an error after
SALUS_CALLBACK_SERVER_WAIT_S instead of both waiting forever. Prints one JSON line: the step's value or its
error, and what the variable holds afterwards (the context goes on working after the error)."""

import json

import tensorflow as tf

v = tf.Variable(1.0)


@tf.function
def step(x):
    return tf.py_function(lambda a: a + v.numpy(), [x], tf.float32)


try:
    result = {"step": float(step(tf.constant(1.0)).numpy())}
except tf.errors.OpError as e:
    result = {"error": type(e).__name__, "message": e.message[-3000:]}
v.assign_add(1.0)
result["after"] = float(v.numpy())
print(json.dumps(result))
