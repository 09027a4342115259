"""Hostile and careless clients: malformed bytes, lying tensors, unknown handles, bad graphs.

Requests are hand-encoded (salus_wire) and sent raw, so the server sees exactly the bytes under test. Every
test is followed by a check that the server still serves: health SERVING (Salus) and a small graph run
with the right answer (autouse fixture below).

Error codes: where Salus's contract names a code it is asserted exactly against Salus. TensorFlow's own server
answers some of these differently (e.g. INTERNAL "Unable to parse request" for malformed bytes); those
codes are accepted only when SALUS_TEST_TARGET points at such a reference server.
"""

from __future__ import annotations

import re
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, tensor_pb2

import salus_wire as w

C = grpc.StatusCode
CODE_BY_NUMBER = {s.value[0]: s for s in grpc.StatusCode}
UNKNOWN_SESSION_CODES = {C.NOT_FOUND, C.INVALID_ARGUMENT, C.ABORTED}


# --- fixtures and helpers ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_graph() -> graph_pb2.GraphDef:
    """a: float[None] placeholder; c = a * 2 + 1."""
    g = tf.Graph()
    with g.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None], name="a")
        tf.add(a * 2.0, 1.0, name="c")
    return g.as_graph_def()


def create_session(channel, graph: graph_pb2.GraphDef) -> str:
    resp = w.call(channel, "CreateSession", w.create_session_request(graph.SerializeToString()))
    handle = w.first(resp, 1, b"").decode()
    assert handle, "CreateSession returned no session handle"
    return handle


def float_feed(values) -> bytes:
    return w.tensor_proto(w.DT_FLOAT, [len(values)], float_val=values)


def run_step(channel, handle, feeds=(), fetches=(), targets=(), store_errors=True):
    """(code, message, {name: ndarray}) whether the error came in the body or as a gRPC status."""
    try:
        raw = w.call(channel, "RunStep",
                     w.run_step_request(handle, feeds, fetches, targets, store_errors=store_errors))
    except grpc.RpcError as e:
        return e.code(), e.details() or "", {}
    res = w.RunStepResult(raw)
    tensors = {k: tf.make_ndarray(tensor_pb2.TensorProto.FromString(v)) for k, v in res.tensors.items()}
    return CODE_BY_NUMBER[res.status_code], res.status_error_message, tensors


def rpc_code(channel, method, request) -> tuple[grpc.StatusCode, str]:
    try:
        w.call(channel, method, request)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return C.OK, ""


def allowed(is_salus: bool, salus: set, reference_also: set = frozenset()) -> set:
    return set(salus) if is_salus else set(salus) | set(reference_also)


def assert_serves(channel, graph, is_salus):
    """Health SERVING (Salus) and a small graph computes the right answer in a new session."""
    if is_salus:
        assert w.health_check(channel) == w.SERVING
    handle = create_session(channel, graph)
    code, msg, out = run_step(channel, handle, [("a:0", float_feed([1.0, 2.0, 3.0]))], ["c:0"])
    assert code == C.OK, msg
    np.testing.assert_array_equal(out["c:0"], np.array([3.0, 5.0, 7.0], np.float32))
    w.call(channel, "CloseSession", w.close_session_request(handle))


@pytest.fixture(autouse=True)
def still_serving_afterwards(channel, tiny_graph, is_salus):
    yield
    assert_serves(channel, tiny_graph, is_salus)


@pytest.fixture
def session(channel, tiny_graph):
    handle = create_session(channel, tiny_graph)
    yield handle
    rpc_code(channel, "CloseSession", w.close_session_request(handle))  # may already be closed


# --- malformed protobuf ----------------------------------------------------------------------------------

GARBAGE = {
    "truncated_tag_varint": b"\xff\xff\xff\xff",
    "truncated_length_delimited": b"\x0a\xff\x01abc",  # field 1, says 255 bytes, has 3
    "invalid_wire_type_7": b"\x0f",
    # Field 1 is a proto3 string (session_handle) in every request but CreateSession, where it is the
    # GraphDef, and these bytes are no valid GraphDef either.
    "invalid_utf8_string": w.f_bytes(1, b"\xff\xfe\xfd"),
}
METHODS = ["RunStep", "CreateSession", "ExtendSession", "CloseSession", "PartialRunSetup", "MakeCallable",
           "RunCallable", "ReleaseCallable"]


@pytest.mark.parametrize("payload", list(GARBAGE), ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_malformed_request_bytes(channel, is_salus, method, payload):
    code, msg = rpc_code(channel, method, GARBAGE[payload])
    assert code in allowed(is_salus, {C.INVALID_ARGUMENT}, {C.INTERNAL}), (code, msg)


def test_malformed_graph_def_in_create_session(channel, is_salus):
    code, msg = rpc_code(channel, "CreateSession", w.create_session_request(b"\x0a\x05hello\xff"))
    assert code in allowed(is_salus, {C.INVALID_ARGUMENT}, {C.INTERNAL}), (code, msg)


def test_create_session_with_unregistered_op(channel):
    g = graph_pb2.GraphDef()
    n = g.node.add(name="bad", op="NoSuchOpXyz")
    assert n.op == "NoSuchOpXyz"
    code, msg = rpc_code(channel, "CreateSession", w.create_session_request(g.SerializeToString()))
    assert code in {C.INVALID_ARGUMENT, C.NOT_FOUND}, (code, msg)
    assert "NoSuchOpXyz" in msg


# --- unknown / closed sessions ---------------------------------------------------------------------------

def test_unknown_session_handle_run_step(channel):
    for store_errors in (True, False):
        code, msg, _ = run_step(channel, "no-such-session-42", [("a:0", float_feed([1.0]))], ["c:0"],
                                store_errors=store_errors)
        assert code in UNKNOWN_SESSION_CODES, (code, msg)
        assert "no-such-session-42" in msg or "session" in msg.lower(), msg


@pytest.mark.parametrize("method,request_bytes", [
    ("ExtendSession", w.f_bytes(1, "no-such-session-42")),
    ("CloseSession", w.close_session_request("no-such-session-42")),
    ("PartialRunSetup", w.f_bytes(1, "no-such-session-42") + w.f_bytes(2, "a:0") + w.f_bytes(3, "c:0")),
    ("MakeCallable", w.f_bytes(1, "no-such-session-42") + w.f_bytes(2, w.f_bytes(2, "c:0"))),
    ("RunCallable", w.f_bytes(1, "no-such-session-42") + w.f_varint(2, 5)),
], ids=lambda x: x if isinstance(x, str) else "")
def test_unknown_session_handle_other_methods(channel, method, request_bytes):
    code, msg = rpc_code(channel, method, request_bytes)
    assert code in UNKNOWN_SESSION_CODES, (code, msg)
    assert "no-such-session-42" in msg or "session" in msg.lower(), msg


def test_close_twice_then_run(channel, tiny_graph):
    handle = create_session(channel, tiny_graph)
    code, msg = rpc_code(channel, "CloseSession", w.close_session_request(handle))
    assert code == C.OK, msg
    # A second close is either accepted (idempotent) or a clean "unknown session" error.
    code, msg = rpc_code(channel, "CloseSession", w.close_session_request(handle))
    assert code in {C.OK} | UNKNOWN_SESSION_CODES | {C.FAILED_PRECONDITION}, (code, msg)
    # Running on a closed session is a clean error naming the session.
    code, msg, out = run_step(channel, handle, [("a:0", float_feed([1.0]))], ["c:0"])
    assert code in UNKNOWN_SESSION_CODES | {C.FAILED_PRECONDITION, C.CANCELLED}, (code, msg)
    assert handle in msg or "session" in msg.lower(), msg
    assert not out


def test_unknown_callable_handle(channel, session):
    code, msg = rpc_code(channel, "RunCallable", w.f_bytes(1, session) + w.f_varint(2, 12345))
    assert code in {C.INVALID_ARGUMENT, C.NOT_FOUND}, (code, msg)
    assert "12345" in msg or "callable" in msg.lower(), msg
    # Releasing an unknown callable must not take anything down (TF answers OK).
    code, msg = rpc_code(channel, "ReleaseCallable", w.f_bytes(1, session) + w.f_varint(2, 12345))
    assert code in {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND}, (code, msg)


# --- bad feeds and fetches ---------------------------------------------------------------------------

def test_wrong_dtype_feed(channel, session, is_salus):
    feed = w.tensor_proto(w.DT_STRING, [1], string_val=[b"not a float"])
    code, msg, _ = run_step(channel, session, [("a:0", feed)], ["c:0"])
    # TensorFlow's own server reports this as INTERNAL; Salus's contract says INVALID_ARGUMENT.
    assert code in allowed(is_salus, {C.INVALID_ARGUMENT}, {C.INTERNAL}), (code, msg)
    assert re.search("string", msg, re.I) and re.search("float", msg, re.I), msg


def test_missing_feed(channel, session):
    code, msg, _ = run_step(channel, session, [], ["c:0"])
    assert code == C.INVALID_ARGUMENT, (code, msg)
    assert re.search(r"'a'|a:0|node a\b", msg), msg


def test_nonexistent_fetch_and_feed(channel, session):
    code, msg, _ = run_step(channel, session, [("a:0", float_feed([1.0]))], ["nope:0"])
    assert code in {C.INVALID_ARGUMENT, C.NOT_FOUND}, (code, msg)
    assert "nope" in msg, msg
    code, msg, _ = run_step(channel, session, [("zz:0", float_feed([1.0])), ("a:0", float_feed([1.0]))],
                            ["c:0"])
    assert code in {C.INVALID_ARGUMENT, C.NOT_FOUND}, (code, msg)
    assert "zz" in msg, msg
    code, msg, _ = run_step(channel, session, [("a:0", float_feed([1.0]))], ["c:0"], ["no_such_target"])
    assert code in {C.INVALID_ARGUMENT, C.NOT_FOUND}, (code, msg)
    assert "no_such_target" in msg, msg


LYING_TENSORS = {
    "content_too_short": w.tensor_proto(w.DT_FLOAT, [3], tensor_content=b"\0" * 8),
    "content_too_long": w.tensor_proto(w.DT_FLOAT, [3], tensor_content=b"\0" * 16),
    "unknown_dtype_9999": w.tensor_proto(9999, [1], float_val=[1.0]),
    "dtype_invalid_0": w.tensor_proto(0, [1], float_val=[1.0]),
    "negative_dim": w.tensor_proto(w.DT_FLOAT, [-5], float_val=[1.0]),
    "element_count_overflows_int64": w.tensor_proto(w.DT_FLOAT, [2**62, 4], float_val=[1.0]),
}
# These would make a server that trusts them allocate terabytes (TF's "one value fills the shape" rule);
# only sent to Salus, which must reject them before allocating.
HUGE_LYING_TENSORS = {
    "float_1e12_elements_one_value": w.tensor_proto(w.DT_FLOAT, [1_000_000, 1_000_000], float_val=[1.0]),
    "float_1e12_elements_4_bytes_content": w.tensor_proto(w.DT_FLOAT, [10**12], tensor_content=b"\0" * 4),
    "string_1e9_elements_one_value": w.tensor_proto(w.DT_STRING, [10**9], string_val=[b"x"]),
    "bool_1e12_elements_no_value": w.tensor_proto(w.DT_BOOL, [10**6, 10**6]),
}


@pytest.mark.parametrize("name", list(LYING_TENSORS))
def test_lying_tensor_proto(channel, session, name):
    code, msg, out = run_step(channel, session, [("a:0", LYING_TENSORS[name])], ["c:0"])
    assert code == C.INVALID_ARGUMENT, (code, msg)
    assert re.search("tensor", msg, re.I), msg
    assert not out


def _vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("name", list(HUGE_LYING_TENSORS))
def test_huge_lying_tensor_proto_rejected_without_allocating(channel, session, salus_only, salus_server,
                                                             name):
    proc = salus_server[1]
    rss_before = _vm_rss_kib(proc.pid) if proc else None
    t0 = time.monotonic()
    code, msg, out = run_step(channel, session, [("a:0", HUGE_LYING_TENSORS[name])], ["c:0"])
    elapsed = time.monotonic() - t0
    assert code == C.INVALID_ARGUMENT, (code, msg)
    assert not out
    assert elapsed < 10, f"rejecting a lying tensor took {elapsed:.1f}s (did it allocate?)"
    if proc:
        grown_mib = (_vm_rss_kib(proc.pid) - rss_before) / 1024
        assert grown_mib < 512, f"server RSS grew by {grown_mib:.0f} MiB for a 30-byte request"


# --- graph growth errors (ExtendSession) ------------------------------------------------------------

def _extend(channel, handle, graph: graph_pb2.GraphDef, current_version: int = 0):
    req = w.f_bytes(1, handle) + w.f_bytes(2, graph.SerializeToString())
    if current_version:
        req += w.f_varint(3, current_version)
    return rpc_code(channel, "ExtendSession", req)


def _identity_node(name: str, inp: str) -> graph_pb2.GraphDef:
    g = graph_pb2.GraphDef()
    n = g.node.add(name=name, op="Identity")
    n.input.append(inp)
    n.attr["T"].type = 1  # DT_FLOAT
    return g


def test_bad_extend_session_leaves_session_usable(channel, session, tiny_graph):
    # A node name that already exists.
    dup = graph_pb2.GraphDef()
    dup.node.add().CopyFrom([n for n in tiny_graph.node if n.name == "c"][0])
    code, msg = _extend(channel, session, dup)
    assert code == C.INVALID_ARGUMENT and re.search(r"'c'|\"c\"|node c\b", msg), (code, msg)
    # An input naming a node that exists nowhere.
    code, msg = _extend(channel, session, _identity_node("bad_in", "missing_node"))
    assert code == C.INVALID_ARGUMENT and "missing_node" in msg, (code, msg)
    # An op type nobody registered.
    bad_op = graph_pb2.GraphDef()
    bad_op.node.add(name="bad_op", op="NoSuchOpXyz")
    code, msg = _extend(channel, session, bad_op)
    assert code in {C.INVALID_ARGUMENT, C.NOT_FOUND} and "NoSuchOpXyz" in msg, (code, msg)
    # A client whose view of the graph version is wrong.
    code, msg = _extend(channel, session, _identity_node("stale", "c"), current_version=77)
    assert code in {C.ABORTED, C.INVALID_ARGUMENT, C.FAILED_PRECONDITION}, (code, msg)

    # None of those changed the graph: the session still runs, and a good delta still applies.
    code, msg, out = run_step(channel, session, [("a:0", float_feed([1.0]))], ["c:0"])
    assert code == C.OK and out["c:0"].tolist() == [3.0], (code, msg)
    code, msg = _extend(channel, session, _identity_node("good", "c"))
    assert code == C.OK, msg
    code, msg, out = run_step(channel, session, [("a:0", float_feed([2.0]))], ["good:0"])
    assert code == C.OK and out["good:0"].tolist() == [5.0], (code, msg)
    for name in ("bad_in", "bad_op", "stale"):
        code, msg, _ = run_step(channel, session, [("a:0", float_feed([1.0]))], [f"{name}:0"])
        assert code in {C.INVALID_ARGUMENT, C.NOT_FOUND}, f"{name} exists after a rejected ExtendSession"
