"""The tenant boundary, with stock TF1 clients, for tenants whose computation runs with permissions not their own
(here `--auth off`: every client is the anonymous tenant): ops that reach the server's machine are refused with an
error naming the op (also inside functions), checkpoint paths are confined to the job's directory, and the session
and graph-size limits hold. Every refusal leaves the server serving (checked by a small run after each). A tenant
that is the server's own Unix user gets its own permissions instead (test_tenant_identity.py)."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

from conftest import SalusProcess, reachable_tmpdir

tf.compat.v1.disable_eager_execution()


def run_small(target: str) -> None:
    """The server still serves: a small graph gives the right answer."""
    g = tf.Graph()
    with g.as_default():
        y = tf.constant([1.0, 2.0]) * 3.0
    with tf.compat.v1.Session(target, graph=g) as sess:
        np.testing.assert_allclose(sess.run(y), [3.0, 6.0])


def saver_graph():
    g = tf.Graph()
    with g.as_default():
        v = tf.compat.v1.get_variable("v", initializer=tf.constant([1.0, 2.0, 3.0]))
        init = tf.compat.v1.global_variables_initializer()
        saver = tf.compat.v1.train.Saver([v])
    return g, v, init, saver


@pytest.fixture(scope="module")
def confined_target(tmp_path_factory):
    """This module's own server: anonymous tenants (--auth off) in one process, checkpoints confined under
    pytest's base."""
    external = os.environ.get("SALUS_TEST_TARGET")
    if external:  # a server the tests did not start: used as it is
        yield external
        return
    root = str(tmp_path_factory.getbasetemp())
    # One process: the shared checkpoint root is pytest's own directory, which only root may write (under
    # --isolation tenant an anonymous tenant's executor runs as nobody).
    server = SalusProcess(tmp_path_factory.mktemp("confined") / "salus-server.stderr.log",
                          ("--isolation", "none", "--auth", "off", "--checkpoint-root", root))
    yield server.target
    assert server.stop() == 0


def named_config(name: str) -> config_pb2.ConfigProto:
    config = config_pb2.ConfigProto()
    config.experimental.session_metadata.name = name
    return config


def test_a_file_reading_op_is_refused_by_name(confined_target, is_salus):
    if not is_salus:
        pytest.skip("TensorFlow's own server has no tenant boundary")
    g = tf.Graph()
    with g.as_default():
        content = tf.io.read_file("/etc/hostname")
    with tf.compat.v1.Session(confined_target, graph=g) as sess:
        with pytest.raises(tf.errors.PermissionDeniedError, match="op ReadFile is not allowed"):
            sess.run(content)
    run_small(confined_target)


def test_ops_inside_functions_are_checked_too(confined_target, is_salus):
    if not is_salus:
        pytest.skip("TensorFlow's own server has no tenant boundary")
    g = tf.Graph()
    with g.as_default():
        @tf.function
        def length_of(path):
            return tf.strings.length(tf.io.read_file(path))

        n = length_of(tf.constant("/etc/hostname"))
    with tf.compat.v1.Session(confined_target, graph=g) as sess:
        with pytest.raises(tf.errors.PermissionDeniedError, match="function library.*ReadFile"):
            sess.run(n)
    run_small(confined_target)


def test_checkpoints_inside_the_root_work_and_outside_fail_the_step(confined_target, is_salus, tmp_path):
    if not is_salus:
        pytest.skip("TensorFlow's own server has no tenant boundary")
    g, v, init, saver = saver_graph()
    escape = f"/tmp/salus_escape_{os.getpid()}"
    with tf.compat.v1.Session(confined_target, graph=g) as sess:
        sess.run(init)
        path = saver.save(sess, str(tmp_path / "inside"), write_state=False)
        assert os.path.exists(path + ".index")
        with pytest.raises(tf.errors.InvalidArgumentError, match="checkpoint path outside this job"):
            saver.save(sess, escape, write_state=False)
        # A real checkpoint outside the root (saved in-process; the client checks that it exists).
        with tf.compat.v1.Session(graph=g) as local:
            local.run(init)
            outside = saver.save(local, os.path.join(tempfile.mkdtemp(prefix="salus_outside_"), "m"),
                                 write_state=False)
        with pytest.raises(tf.errors.InvalidArgumentError, match="checkpoint path outside this job"):
            saver.restore(sess, outside)
        shutil.rmtree(os.path.dirname(outside))
        # The session is intact: restore what was saved.
        sess.run(v.assign([0.0, 0.0, 0.0]))
        saver.restore(sess, path)
        np.testing.assert_allclose(sess.run(v), [1.0, 2.0, 3.0])
    assert not any(name.startswith(os.path.basename(escape)) for name in os.listdir("/tmp"))
    run_small(confined_target)


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory):
    """No --checkpoint-root (per-job directories under the server's working directory), at most 2
    sessions, graphs of at most 64 KiB."""
    # The per-job checkpoint directories are below the server's working directory, which the anonymous
    # tenant's executor (it runs as nobody) must be able to reach.
    home = reachable_tmpdir("salus-limited-")
    server = SalusProcess(tmp_path_factory.mktemp("limited") / "salus-server.stderr.log",
                          ("--auth", "off", "--max-sessions", "2", "--max-graph-bytes", "64KiB"), cwd=home)
    yield server, home
    assert server.stop() == 0
    shutil.rmtree(home, ignore_errors=True)


def test_relative_checkpoints_land_in_the_jobs_own_directory(limited_server):
    server, home = limited_server
    g, v, init, saver = saver_graph()
    with tf.compat.v1.Session(server.target, graph=g, config=named_config("ckpt_job")) as sess:
        sess.run(init)
        saver.save(sess, "model", write_state=False, write_meta_graph=False)
    assert (home / "salus-checkpoints" / "ckpt_job" / "model.index").exists()
    assert not os.path.exists("model.index")


def test_session_and_graph_size_limits_give_clear_errors(limited_server):
    server, _ = limited_server
    g = tf.Graph()
    with g.as_default():
        big = tf.constant(np.zeros(100_000, np.float32)) + 1.0
    with tf.compat.v1.Session(server.target, graph=g) as sess:
        with pytest.raises(tf.errors.ResourceExhaustedError, match="--max-graph-bytes"):
            sess.run(big)
    # Two sessions fit; the third is refused until one closes.
    graphs = []
    for _ in range(3):
        h = tf.Graph()
        with h.as_default():
            graphs.append((h, tf.constant([2.0]) * 2.0))
    first = tf.compat.v1.Session(server.target, graph=graphs[0][0])
    second = tf.compat.v1.Session(server.target, graph=graphs[1][0])
    try:
        first.run(graphs[0][1])
        second.run(graphs[1][1])
        with tf.compat.v1.Session(server.target, graph=graphs[2][0]) as third:
            with pytest.raises(tf.errors.ResourceExhaustedError, match="--max-sessions"):
                third.run(graphs[2][1])
    finally:
        first.close()
        second.close()
    run_small(server.target)
