"""TF1 graph training through the server equals the same script run in-process, bit for bit.

Same graph-building code, same graph and op seeds, same CPU kernels: the losses must be identical, not just
close. Covers variables, AdamOptimizer slots, global_step, a tf.data one-shot iterator, Saver
save/restore into a fresh session on the server, and a QueueRunner input pipeline (enqueue runs from
threads beside the training steps that dequeue).
"""

import time

import numpy as np
import pytest
import tensorflow as tf

from workloads import tf1_train

STEPS = 20
MORE_STEPS = 5


def save_restore_continue(target: str, ckpt_dir, isolate: bool) -> dict:
    """Train, save, restore into a new session (after re-initialising it), train a few more steps."""
    m = tf1_train.build(seed=3, hidden=16)
    config = tf1_train.session_config(isolate)
    with m.graph.as_default():
        with tf.compat.v1.Session(target, config=config) as sess:
            sess.run(m.init)
            losses = tf1_train.run_steps(sess, m, STEPS)
            trained = tf1_train.snapshot(sess, m)
            path = m.saver.save(sess, str(ckpt_dir / "model"), global_step=m.global_step)
        with tf.compat.v1.Session(target, config=config) as sess:
            # Initialise first so the restore has to bring every value back (TF's own server shares
            # variables between sessions; this makes the check independent of that).
            sess.run(m.init)
            fresh = tf1_train.snapshot(sess, m)
            m.saver.restore(sess, path)
            restored = tf1_train.snapshot(sess, m)
            # Adam's slots and beta powers come from the checkpoint too, so these steps match only if
            # they were restored exactly.
            more = tf1_train.run_steps(sess, m, MORE_STEPS)
            after = tf1_train.snapshot(sess, m)
    return dict(losses=losses, trained=trained, fresh=fresh, restored=restored, more=more, after=after,
                path=path)


@pytest.fixture(scope="module")
def reference_training():
    return tf1_train.train("", steps=STEPS)


@pytest.fixture(scope="module")
def reference_save_restore(tmp_path_factory):
    return save_restore_continue("", tmp_path_factory.mktemp("ckpt_local"), isolate=False)


def test_training_losses_equal_in_process(salus_target, reference_training):
    remote = tf1_train.train(salus_target, steps=STEPS)
    assert remote["global_step"] == STEPS
    assert len(remote["losses"]) == STEPS
    # Training really happened (guards against a server that returns stale or constant values).
    assert remote["losses"][-1] < remote["losses"][0]
    np.testing.assert_array_equal(remote["losses"], reference_training["losses"])
    assert remote["eval_loss"] == reference_training["eval_loss"]
    np.testing.assert_array_equal(remote["param_sums"], reference_training["param_sums"])


def test_saver_restore_into_fresh_session(salus_target, is_salus, tmp_path, reference_save_restore):
    remote = save_restore_continue(salus_target, tmp_path, isolate=not is_salus)
    ref = reference_save_restore

    # The checkpoint was written by the server, to the path the client asked for.
    assert remote["path"].endswith(f"model-{STEPS}")
    assert list(tmp_path.glob(f"model-{STEPS}.index")), "checkpoint index file missing"

    # The fresh session really started from the initial values ...
    assert remote["fresh"]["global_step"] == 0
    assert remote["fresh"]["eval_loss"] != remote["trained"]["eval_loss"]
    # ... and restore brought back exactly what was trained.
    assert remote["restored"] == remote["trained"]
    assert remote["after"]["global_step"] == STEPS + MORE_STEPS

    # Everything equals the in-process run.
    for key in ("losses", "trained", "fresh", "restored", "more", "after"):
        assert remote[key] == ref[key], key


QUEUE_STEPS = 100


def queue_runner_training(target: str) -> tuple[np.ndarray, list[float]]:
    """TF1's queue input pipeline: two QueueRunner threads enqueue into a queue of capacity 1 while the training
    loop's steps dequeue from it. Through the server the enqueue runs are not iterations (they would hold the
    lane while the queue is full, and the step that empties it would wait for the lane)."""
    g = tf.Graph()
    with g.as_default():
        batch = tf.reshape(tf.range(64, dtype=tf.float32) / 64.0, [4, 16])
        queue = tf.queue.FIFOQueue(1, [tf.float32], shapes=[[4, 16]])
        enqueue = queue.enqueue([batch])
        tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(queue, [enqueue] * 2))
        w = tf.compat.v1.get_variable("w", [16, 1], initializer=tf.compat.v1.constant_initializer(0.5))
        loss = tf.reduce_mean(tf.square(tf.matmul(queue.dequeue(), w) - 1.0))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with tf.compat.v1.Session(target) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            coord = tf.train.Coordinator()
            threads = tf.compat.v1.train.start_queue_runners(sess, coord)
            started = time.monotonic()
            losses = []
            for _ in range(QUEUE_STEPS):
                losses.append(float(sess.run([loss, train])[0]))
                # A watchdog, not a timing: 100 tiny steps take well under a second here; a pipeline that
                # deadlocks with the steps stalls for the server's lane hold limit (60 s) each time.
                if time.monotonic() - started > 120:
                    pytest.fail(f"the queue pipeline stalled the training steps ({len(losses)} steps in 120 s)")
            coord.request_stop()
            sess.run(queue.close(cancel_pending_enqueues=True))
            coord.join(threads, stop_grace_period_secs=10)
            return sess.run(w), losses


def test_queue_runner_pipeline_trains_as_in_process(salus_target):
    remote_w, remote_losses = queue_runner_training(salus_target)
    local_w, local_losses = queue_runner_training("")
    assert remote_losses[-1] < remote_losses[0]
    np.testing.assert_array_equal(remote_losses, local_losses)
    np.testing.assert_array_equal(remote_w, local_w)
