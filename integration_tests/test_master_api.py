"""The rest of the MasterService surface, driven by TensorFlow's own Python client.

ListDevices, Reset, make_callable (RunStep) and callables from options (MakeCallable / RunCallable /
ReleaseCallable, what tf-keras uses), partial runs, runtime errors, and a round trip of every feedable dtype.
Each test builds its own tf.Graph, so eager execution stays on in the pytest process.
"""

import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

# --- ListDevices ---------------------------------------------------------------------------------------


def test_list_devices_shows_cpu(salus_target):
    with tf.Graph().as_default(), tf.compat.v1.Session(salus_target) as sess:
        devices = sess.list_devices()
    names = [d.name for d in devices]
    cpus = [d for d in devices if d.device_type == "CPU"]
    assert cpus, f"no CPU device in {names}"
    assert any("device:CPU:0" in d.name for d in cpus), names
    assert len(set(names)) == len(names), f"duplicate device names {names}"


def test_list_devices_exact_on_salus(salus_target, salus_only):
    with tf.Graph().as_default(), tf.compat.v1.Session(salus_target) as sess:
        devices = sess.list_devices()
    cpus = [d for d in devices if d.device_type == "CPU"]
    # Exactly one CPU device, named like every TF server names its first CPU.
    assert len(cpus) == 1, [d.name for d in devices]
    assert re.fullmatch(r"/job:[a-z_]+/replica:0/task:0/device:CPU:0", cpus[0].name), cpus[0].name


# --- Reset ---------------------------------------------------------------------------------------------


def _read_all(target, variables):
    """{name: value or the error raised reading it} in a new session."""
    out = {}
    with tf.compat.v1.Session(target) as sess:
        for v in variables:
            try:
                out[v.op.name] = sess.run(v)
            except tf.errors.OpError as e:
                out[v.op.name] = e
    return out


def _assert_uninitialized(result, name):
    assert isinstance(result, tf.errors.FailedPreconditionError), f"{name}: expected uninitialized, got {result!r}"
    assert re.search(r"uninitialized|not initialized", str(result)), str(result)[:500]


def test_reset_clears_only_named_containers(salus_target):
    g = tf.Graph()
    with g.as_default():
        with tf.compat.v1.container("c1"):
            v1 = tf.compat.v1.get_variable("reset_v1", initializer=1.0, use_resource=True)
        with tf.compat.v1.container("c2"):
            v2 = tf.compat.v1.get_variable("reset_v2", initializer=2.0, use_resource=True)
        v3 = tf.compat.v1.get_variable("reset_v3", initializer=3.0, use_resource=True)  # default container
        probe = tf.compat.v1.get_variable("reset_probe", initializer=4.0, use_resource=True)
        init = tf.compat.v1.variables_initializer([v1, v2, v3])

        # Does variable state outlive a session on this server? TensorFlow's own server shares it
        # between sessions (that is why Reset exists); a server may instead give every session its own
        # state. Reset must behave correctly in either model, so find out which one this is.
        with tf.compat.v1.Session(salus_target) as sess:
            sess.run(probe.initializer)
        shared = not isinstance(_read_all(salus_target, [probe])["reset_probe"], tf.errors.OpError)

        if shared:
            # TF master semantics: Reset clears the named containers on the server; a new session sees
            # c1's variable uninitialised and the others still holding their values.
            with tf.compat.v1.Session(salus_target) as sess:
                sess.run(init)
            tf.compat.v1.Session.reset(salus_target, ["c1"])
            after = _read_all(salus_target, [v1, v2, v3])
            _assert_uninitialized(after["reset_v1"], "reset_v1")
            assert after["reset_v2"] == 2.0 and after["reset_v3"] == 3.0, after
            tf.compat.v1.Session.reset(salus_target, ["c2"])
            after = _read_all(salus_target, [v2, v3])
            _assert_uninitialized(after["reset_v2"], "reset_v2")
            assert after["reset_v3"] == 3.0, after
        else:
            # Per-session state: Reset clears the named containers of the sessions that are open.
            with tf.compat.v1.Session(salus_target) as sess:
                sess.run(init)
                tf.compat.v1.Session.reset(salus_target, ["c1"])
                with pytest.raises(tf.errors.FailedPreconditionError, match="uninitialized|not initialized"):
                    sess.run(v1)
                assert sess.run([v2, v3]) == [2.0, 3.0]


# --- callables -----------------------------------------------------------------------------------------


def test_make_callable(salus_target):
    with tf.Graph().as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None], name="a")
        b = tf.compat.v1.placeholder(tf.int32, [], name="b")
        out = tf.reduce_sum(a) * tf.cast(b, tf.float32)
        with tf.compat.v1.Session(salus_target) as sess:
            f = sess.make_callable([out, tf.size(a)], feed_list=[a, b])
            for n in (1, 5, 100):
                total, size = f(np.arange(n, dtype=np.float32), n)
                assert size == n
                assert total == np.float32(np.arange(n).sum() * n)


def test_callable_from_options_make_run_release(salus_target):
    """Session._make_callable_from_options is exactly the MakeCallable/RunCallable path tf-keras uses."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        v = tf.compat.v1.get_variable("callable_v", initializer=tf.constant([1.0, 2.0, 3.0]))
        y = tf.reduce_sum(x * v, axis=1, name="y")
        bump = v.assign_add(tf.ones([3]), name="bump").op
        with tf.compat.v1.Session(salus_target) as sess:
            sess.run(v.initializer)
            run_y = sess._make_callable_from_options(config_pb2.CallableOptions(feed=["x:0"], fetch=["y:0"]))
            run_bump = sess._make_callable_from_options(config_pb2.CallableOptions(target=["bump"]))
            xs = np.arange(6, dtype=np.float32).reshape(2, 3)
            np.testing.assert_array_equal(run_y(xs)[0], xs @ np.array([1, 2, 3], np.float32))
            run_bump()  # a callable with targets only; state changes are visible to the next call
            np.testing.assert_array_equal(run_y(xs)[0], xs @ np.array([2, 3, 4], np.float32))
            del run_bump  # ReleaseCallable; the other callable keeps working
            np.testing.assert_array_equal(run_y(xs[:1])[0], xs[:1] @ np.array([2, 3, 4], np.float32))
            with pytest.raises((tf.errors.NotFoundError, tf.errors.InvalidArgumentError), match="nope"):
                sess._make_callable_from_options(config_pb2.CallableOptions(feed=["x:0"], fetch=["nope:0"]))
            # The session is still usable after a failed MakeCallable.
            np.testing.assert_array_equal(run_y(xs)[0], xs @ np.array([2, 3, 4], np.float32))


# --- runtime errors come back as TF exceptions -----------------------------------------------------------


def test_runtime_errors_are_tf_exceptions(salus_target):
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        checked = tf.debugging.assert_positive(x, message="x must be positive for salus")
        with tf.control_dependencies([checked]):
            y = tf.identity(x * 2.0, name="y")
        with tf.compat.v1.Session(salus_target) as sess:
            np.testing.assert_array_equal(sess.run(y, {x: [1.0, 2.0]}), [2.0, 4.0])
            # A data-dependent failure inside the graph (RunStep; error in the response body).
            with pytest.raises(tf.errors.InvalidArgumentError, match="x must be positive for salus"):
                sess.run(y, {x: [1.0, -2.0]})
            # Missing feed for a placeholder.
            with pytest.raises(tf.errors.InvalidArgumentError, match="x"):
                sess.run(y)
            # The same failure through RunCallable (errors come back as a gRPC status there).
            f = sess._make_callable_from_options(config_pb2.CallableOptions(feed=["x:0"], fetch=["y:0"]))
            with pytest.raises(tf.errors.InvalidArgumentError, match="x must be positive for salus"):
                f(np.array([-1.0], np.float32))
            np.testing.assert_array_equal(f(np.array([3.0], np.float32))[0], [6.0])
            # And the session still serves normal runs.
            np.testing.assert_array_equal(sess.run(y, {x: [5.0]}), [10.0])


# --- partial runs --------------------------------------------------------------------------------------


def test_partial_run(salus_target):
    with tf.Graph().as_default():
        a = tf.compat.v1.placeholder(tf.float32, [], name="a")
        b = tf.compat.v1.placeholder(tf.float32, [], name="b")
        c = tf.compat.v1.placeholder(tf.float32, [], name="c")
        r1 = tf.add(a, b, name="r1")
        r2 = tf.multiply(r1, c, name="r2")
        with tf.compat.v1.Session(salus_target) as sess:
            h = sess.partial_run_setup([r1, r2], [a, b, c])
            assert sess.partial_run(h, r1, feed_dict={a: 1.0, b: 2.0}) == 3.0
            assert sess.partial_run(h, r2, feed_dict={c: 4.0}) == 12.0
            # Two partial runs of one session in flight at once keep their own feeds.
            h1 = sess.partial_run_setup([r1, r2], [a, b, c])
            h2 = sess.partial_run_setup([r1, r2], [a, b, c])
            assert sess.partial_run(h1, r1, feed_dict={a: 10.0, b: 1.0}) == 11.0
            assert sess.partial_run(h2, r1, feed_dict={a: 20.0, b: 2.0}) == 22.0
            assert sess.partial_run(h2, r2, feed_dict={c: 2.0}) == 44.0
            assert sess.partial_run(h1, r2, feed_dict={c: 3.0}) == 33.0


# --- dtype round trip ----------------------------------------------------------------------------------

_BF16 = tf.bfloat16.as_numpy_dtype
DTYPE_VALUES = {
    # Special values matter: -0.0, inf, nan, subnormals and extremes must survive bit for bit.
    tf.float16: np.array([1.5, -0.0, np.inf, -np.inf, np.nan, 65504, 6e-8], np.float16),
    tf.float32: np.array([1.5, -0.0, np.inf, np.nan, 3.4028235e38, 1e-45, -7.25], np.float32),
    tf.float64: np.array([1.5, -0.0, -np.inf, np.nan, 1.7976931348623157e308, 5e-324], np.float64),
    tf.bfloat16: np.array([1.5, -2.0, 3.0e38, np.nan, np.inf, -0.0], _BF16),
    tf.int8: np.array([-128, 127, 0, -1], np.int8),
    tf.int16: np.array([-32768, 32767, 0, -1], np.int16),
    tf.int32: np.array([-2**31, 2**31 - 1, 0, -1], np.int32),
    tf.int64: np.array([-2**63, 2**63 - 1, 0, -1], np.int64),
    tf.uint8: np.array([0, 255, 1], np.uint8),
    tf.uint16: np.array([0, 65535, 1], np.uint16),
    tf.uint32: np.array([0, 2**32 - 1, 1], np.uint32),
    tf.uint64: np.array([0, 2**64 - 1, 1], np.uint64),
    tf.bool: np.array([True, False, True]),
    # Empty, non-UTF-8 with an embedded NUL, UTF-8, and one long enough to live outside TF_TString's
    # inline buffer.
    tf.string: np.array([b"", b"\xff\xfe\x00abc\x80", "héllo wörld".encode(), b"x" * 1000], object),
    tf.complex64: np.array([1 + 2j, -3.5j, complex(np.inf, -0.0)], np.complex64),
    tf.complex128: np.array([1 + 2j, -3.5j, complex(1e300, -1e-300)], np.complex128),
}


def _shapes(values):
    """The array itself, a 2-D view, a scalar, and two empty shapes."""
    return {
        "vector": values,
        "matrix": np.stack([values, values[::-1]]),
        "scalar": values[1],
        "empty": values[:0],
        "empty_2x0x3": values[:0].reshape(2, 0, 3),
    }


@pytest.fixture(scope="module")
def identity_session(salus_target):
    """One graph with a placeholder + identity per dtype, one session (one CreateSession)."""
    g = tf.Graph()
    with g.as_default():
        ports = {dt: tf.identity(tf.compat.v1.placeholder(dt, None, name=f"in_{dt.name}"), name=f"out_{dt.name}")
                 for dt in DTYPE_VALUES}
        sess = tf.compat.v1.Session(salus_target)
        yield sess, ports
        sess.close()


def _assert_same(got, want, label):
    got = np.asarray(got, dtype=object if want.dtype == object else None)
    assert got.shape == want.shape, f"{label}: shape {got.shape} != {want.shape}"
    if want.dtype == object:
        assert got.ravel().tolist() == want.ravel().tolist(), label
    else:
        assert got.dtype == want.dtype, f"{label}: dtype {got.dtype} != {want.dtype}"
        assert got.tobytes() == want.tobytes(), f"{label}: {got!r} != {want!r}"  # bit for bit


@pytest.mark.parametrize("dtype", list(DTYPE_VALUES), ids=lambda d: d.name)
def test_dtype_round_trip(identity_session, dtype):
    sess, ports = identity_session
    out = ports[dtype]
    placeholder = out.op.inputs[0]
    for shape_name, value in _shapes(DTYPE_VALUES[dtype]).items():
        want = np.asarray(value, dtype=DTYPE_VALUES[dtype].dtype)
        got = sess.run(out, {placeholder: want})
        _assert_same(got, want, f"{dtype.name}/{shape_name}")


def test_all_dtypes_in_one_step(identity_session):
    """Many feeds and fetches of mixed dtypes in one RunStep keep their pairing."""
    sess, ports = identity_session
    feeds = {out.op.inputs[0]: DTYPE_VALUES[dt] for dt, out in ports.items()}
    got = sess.run({dt.name: out for dt, out in ports.items()}, feeds)
    for dt in DTYPE_VALUES:
        _assert_same(got[dt.name], DTYPE_VALUES[dt], dt.name)


# --- large messages ------------------------------------------------------------------------------------


def test_tensors_larger_than_grpc_default_message_limit(salus_target):
    """Real input batches exceed gRPC's 4 MiB default message size; TF's own client and server allow
    them, so the server must too (in both directions)."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, None)
        y = tf.identity(x)
        with tf.compat.v1.Session(salus_target) as sess:
            batch = np.random.RandomState(0).rand(32, 224, 224, 3).astype(np.float32)  # 18 MiB
            got = sess.run(y, {x: batch})
            assert got.tobytes() == batch.tobytes()
