"""A wait nothing can end (issue 42): against a server started with SALUS_FAULT_STALL_OP=Sqrt, which never
answers a request executing Sqrt, reading the op's result waits for a reply that cannot come. The adapter's
watchdog asks the server (SALUS_STALLED_WAIT_CHECK_S later); the server, with nothing queued or running for
the context, ends the context's stream, and the read raises its reason. Then the context goes on.

prints one JSON line: the error's type and message, how long the read waited, and a value computed after.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

x = tf.constant([4.0, 9.0])
before = (x * 2).numpy().tolist()
started = time.monotonic()
try:
    tf.sqrt(x).numpy()
    error = None
except tf.errors.OpError as e:
    error = {"type": type(e).__name__, "message": e.message}
waited = time.monotonic() - started
after = (x + 1).numpy().tolist()
print(json.dumps({"before": before, "error": error, "waited_s": waited, "after": after}))
