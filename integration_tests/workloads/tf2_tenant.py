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


# Errors where they happen: a refused op without outputs is not waited for by TensorFlow's client, so it is
# reported (with its own message) by the next call, never as a later, unrelated symptom.
def at_which_call(name, first, then):
    for step, fn in (("first", first), ("next", then)):
        try:
            fn()
        except tf.errors.OpError as e:
            outcomes[name] = [step, type(e).__name__, e.message[:400]]
            _settle()
            return
    outcomes[name] = ["none"]


at_which_call("late_write", lambda: tf.io.write_file("/tmp/salus-tenant-test", "x"),
              lambda: (tf.constant(1.0) + 1).numpy())
with open("vocab.txt", "w") as f:
    f.write("a\nb\n")
table_init = tf.lookup.TextFileInitializer("vocab.txt", tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
                                           tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER)
tables = []
at_which_call("late_table", lambda: tables.append(tf.lookup.StaticHashTable(table_init, -1)),
              lambda: tables[0].lookup(tf.constant(["b"])).numpy())


@tf.function
def python_inside(x):
    return tf.py_function(lambda a: a * 2.0, [x], tf.float32) + 1.0


# Python inside a tf.function and in a pipeline runs (in the script's process), for this tenant too.
attempt("py_function_in_function", lambda: outcomes.update(
    py_function_in_function_value=float(python_inside(tf.constant(1.0)).numpy())))
attempt("python_pipeline", lambda: outcomes.update(python_pipeline_values=[int(x) for x in tf.data.Dataset.range(
    4).map(lambda x: tf.py_function(lambda a: a * 2, [x], tf.int64))]))
print(json.dumps({"outcomes": outcomes, "restored": v.numpy().tolist(), "device": v.device}), flush=True)
# The script's last op is refused, and no call follows that could report it: the adapter does, at exit.
tf.io.write_file("/tmp/salus-tenant-test-last", "x")
