"""An op's error is raised once, and leaves nothing broken (issue 42): Keras's pattern of a step call and a
sync in one `try` (the step fails its assertion, or reads past the end of a Dataset.from_generator), then more
work outside it: a read of an earlier value, ops with Python numbers, a sync. Through the server the step's
call returns before the server has answered, so its error reaches the script at the call or at the sync,
depending on timing (a pause before the sync varies it); wherever it comes, it must come once.

Then the same with an op right behind the step (`x + 1`), sent before the server has answered: it fails with
the step, and everything after must still work, the next `x + 1` included (the copy of the number 1 it sent
failed too). TensorFlow's remote client forgets an error that arrives before its next op starts (each op of a
synchronous executor clears the executor's error first), so there the error is raised once or not at all.

prints one JSON line: per case and pause, how many times the error was raised and the values read after it.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

PAUSES = (0.0, 0.01, 0.1, 0.5)


@tf.function
def failing(x):
    tf.debugging.assert_less(x, 0.0, message="x must be negative")
    return x * 2


@tf.function
def step(iterator):
    return tf.reduce_sum(next(iterator))


def numbers():
    yield from ([1.0], [2.0])


def run(failing_step, error, pause, x, earlier, op_behind):
    raised = 0
    try:
        failing_step()
        if op_behind:
            x + 1  # sent behind the step: fails with it through the server, never runs in-process
        time.sleep(pause)  # the server's answer arrives while the script goes on
        context.async_wait()
    except error:
        raised += 1
    return {"raised": raised, "earlier": earlier.numpy().tolist(), "plus one": (x + 1).numpy().tolist(),
            "after sync": (context.async_wait(), (x * 3).numpy().tolist())[1]}


x = tf.constant([1.0, 2.0])
dataset = tf.data.Dataset.from_generator(numbers, output_signature=tf.TensorSpec((1,), tf.float32))
out = {}
for op_behind in (False, True):
    for pause in PAUSES:
        name = f"{'op behind, ' if op_behind else ''}{pause}"
        out[f"assert, {name}"] = run(lambda: failing(x), tf.errors.InvalidArgumentError, pause, x, x * 2,
                                     op_behind)
        iterator = iter(dataset)
        steps = [step(iterator), step(iterator)]  # the two elements; the third step reads past the end
        out[f"end of data, {name}"] = run(lambda: step(iterator), tf.errors.OutOfRangeError, pause, x, steps[1],
                                          op_behind)
print(json.dumps(out))
