"""An unmodified TF2 script that tries the server's files: reads, writes and lists them eagerly and inside a
tf.function, then saves a tf.train.Checkpoint (relative path), saves one outside (absolute path elsewhere),
and restores from the absolute path it is told (argv[1]: the job's checkpoint directory on the server).
Prints one JSON line: the outcome (error class, or "ok") of each attempt, and the restored value.
"""

import json
import sys

import tensorflow as tf

job_dir = sys.argv[1]
outcomes = {}


def _sync():
    from tensorflow.python.eager import context
    context.async_wait()


def attempt(name, fn):
    try:
        fn()
        # Remote eager ops run asynchronously: an op without outputs reports its error at the next sync.
        _sync()
        outcomes[name] = "ok"
    except tf.errors.OpError as e:
        outcomes[name] = type(e).__name__
        outcomes[name + "_message"] = e.message[:300]
        _settle()


def _settle():
    """TF's remote client marks its executor failed only after it woke the caller of a failed op, so the next
    attempt could meet that late mark and fail with the old error: wait for the executor, then clear its error."""
    from tensorflow.python.eager import context
    try:
        context.async_wait()
    except tf.errors.OpError:
        pass
    context.async_clear_error()


attempt("read_eager", lambda: tf.io.read_file("/etc/hostname").numpy())
attempt("write_eager", lambda: tf.io.write_file("/tmp/salus-tenant-test", "x"))
attempt("list_eager", lambda: tf.io.matching_files("/etc/*").numpy())


@tf.function
def read_in_function():
    return tf.io.read_file("/etc/hostname")


@tf.function
def list_in_function():
    return tf.io.matching_files("/etc/*")


attempt("read_function", lambda: read_in_function().numpy())
attempt("list_function", lambda: list_in_function().numpy())
attempt("still_works", lambda: (tf.constant(2.0) * 3).numpy())

v = tf.Variable([1.0, 2.0, 3.0])
ckpt = tf.train.Checkpoint(v=v)
attempt("save_relative", lambda: ckpt.write("ckpt/model"))
attempt("save_outside", lambda: ckpt.write("/tmp/salus-escape/model"))
v.assign([0.0, 0.0, 0.0])
attempt("restore", lambda: ckpt.read(job_dir + "/ckpt/model").assert_consumed())
print(json.dumps({"outcomes": outcomes, "restored": v.numpy().tolist(), "device": v.device}), flush=True)
