"""What a TF1 graph script does with files, run as whichever Unix user starts it: against a Salus server
(`--target grpc://...`) or in its own process (`--target ""`), so the two can be compared.

Each attempt runs in a session of its own and records ["ok", value] or [error class, message]:
read_own / read_other (tf.io.read_file of the user's file and of another user's 0600 file), write_own /
write_other (tf.io.write_file into the user's directory and into another user's), checkpoint (Saver.save into
the user's directory, then restore in a new session), summary (a TensorBoard scalar written by summary ops),
tfrecord (trains a linear model for a few steps on a TFRecord file the user wrote). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--own-file", required=True)
    p.add_argument("--other-file", required=True)
    p.add_argument("--out-dir", required=True, help="a directory of the user's own; created if missing")
    p.add_argument("--other-dir", required=True)
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    outcomes: dict[str, list] = {}

    def attempt(name, build, after=None):
        g = tf.Graph()
        with g.as_default():
            fetches, init = build()
            try:
                with tf.compat.v1.Session(args.target, graph=g) as sess:
                    if init is not None:
                        sess.run(init)
                    value = sess.run(fetches)
                    if after is not None:
                        value = after(sess, value)
                outcomes[name] = ["ok", to_json(value)]
            except tf.errors.OpError as err:
                outcomes[name] = [type(err).__name__, err.message[:400]]

    attempt("read_own", lambda: (tf.io.read_file(args.own_file), None))
    attempt("read_other", lambda: (tf.io.read_file(args.other_file), None))

    written = os.path.join(args.out_dir, "written.txt")
    attempt("write_own", lambda: (tf.io.write_file(written, "written by the graph"), None),
            lambda sess, _: open(written).read())
    attempt("write_other",
            lambda: (tf.io.write_file(os.path.join(args.other_dir, "intruder.txt"), "x"), None))

    ckpt = os.path.join(args.out_dir, "ckpt", "model")

    def checkpoint_graph():
        v = tf.compat.v1.get_variable("v", initializer=tf.constant([1.5, -2.0, 3.25]))
        checkpoint_graph.saver = tf.compat.v1.train.Saver([v])
        checkpoint_graph.v = v
        return tf.compat.v1.assign_add(v, [0.5, 0.5, 0.5]), tf.compat.v1.global_variables_initializer()

    def save_and_restore(sess, _):
        path = checkpoint_graph.saver.save(sess, ckpt)
        sess.run(checkpoint_graph.v.assign([0.0, 0.0, 0.0]))
        checkpoint_graph.saver.restore(sess, path)
        return {"restored": sess.run(checkpoint_graph.v).tolist(),
                "index_exists": os.path.exists(ckpt + ".index")}

    attempt("checkpoint", checkpoint_graph, save_and_restore)

    logdir = os.path.join(args.out_dir, "logs")

    def summary_graph():
        writer = tf.summary.create_file_writer(logdir)
        with writer.as_default():
            # tf.summary.write is the op TensorBoard's tf.summary.scalar uses (TensorBoard is not installed).
            wrote = tf.summary.write("loss", tf.constant(0.25), step=7)
        with tf.control_dependencies([wrote]):
            flushed = writer.flush()
        return [wrote, flushed], writer.init()

    def summary_files(sess, value):
        events = [f for f in os.listdir(logdir) if f.startswith("events.out.tfevents")]
        return {"wrote": bool(value[0]), "event_files": len(events)}

    attempt("summary", summary_graph, summary_files)

    records = os.path.join(args.out_dir, "train.tfrecord")
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(64, 3)).astype(np.float32)
    ys = (xs @ np.array([[0.5], [-1.0], [2.0]], np.float32) + 0.25).astype(np.float32)
    with tf.io.TFRecordWriter(records) as w:
        for x, y in zip(xs, ys):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=y)),
            }))
            w.write(example.SerializeToString())

    def tfrecord_graph():
        spec = {"x": tf.io.FixedLenFeature([3], tf.float32), "y": tf.io.FixedLenFeature([1], tf.float32)}
        ds = tf.data.TFRecordDataset(records).map(lambda r: tf.io.parse_single_example(r, spec)).batch(16)
        batch = tf.compat.v1.data.make_one_shot_iterator(ds.repeat()).get_next()
        w = tf.compat.v1.get_variable("w", initializer=tf.zeros([3, 1]))
        b = tf.compat.v1.get_variable("b", initializer=tf.zeros([1]))
        loss = tf.reduce_mean(tf.square(tf.matmul(batch["x"], w) + b - batch["y"]))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        tfrecord_graph.w, tfrecord_graph.b = w, b
        return train, tf.compat.v1.global_variables_initializer()

    def train_more(sess, _):
        for _ in range(19):
            sess.run(tf.compat.v1.get_default_graph().get_operation_by_name("GradientDescent"))
        return {"w": sess.run(tfrecord_graph.w).ravel().tolist(), "b": sess.run(tfrecord_graph.b).tolist()}

    def tfrecord_train(sess, value):
        with sess.graph.as_default():
            return train_more(sess, value)

    attempt("tfrecord", tfrecord_graph, tfrecord_train)
    print(json.dumps({"uid": os.getuid(), "outcomes": outcomes}), flush=True)


def to_json(value):
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


if __name__ == "__main__":
    main()
