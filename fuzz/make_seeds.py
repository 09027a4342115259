"""Writes the fuzz targets' seed corpus (fuzz/seeds/) with TensorFlow's own protos.

Run from the repository root: .venv/bin/python fuzz/make_seeds.py
The messages are what a stock TF 2.x client sends; the request_decode seeds start
with the byte that selects the request type (see fuzz_targets/request_decode.rs).
The TensorFlow wheel ships no master_pb2, so the request envelopes (a handful of
fields, numbered as in TensorFlow's master.proto) are encoded here by hand around
TensorFlow's own GraphDef, ConfigProto, RunOptions, CallableOptions and TensorProto.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow.core.protobuf import config_pb2


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class Msg:
    """A message as {field number: value}: int or bool -> varint; str, bytes or a
    protobuf message -> length-delimited; a list -> repeated."""

    def __init__(self, fields):
        self.fields = fields

    def SerializeToString(self, deterministic=True):
        out = b""
        for number, value in self.fields.items():
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, (bool, int)):
                    out += varint(number << 3) + varint(int(v))
                else:
                    if isinstance(v, str):
                        v = v.encode()
                    elif not isinstance(v, bytes):
                        v = v.SerializeToString(deterministic=True)
                    out += varint(number << 3 | 2) + varint(len(v)) + v
        return out


# The MasterService requests (TensorFlow's master.proto field numbers).
NUMBERS = {
    "CreateSessionRequest": dict(graph_def=1, config=2, target=3),
    "ExtendSessionRequest": dict(session_handle=1, graph_def=2, current_graph_version=3),
    "RunStepRequest": dict(session_handle=1, feed=2, fetch=3, target=4, options=5,
                           partial_run_handle=6, store_errors_in_response_body=7, request_id=8),
    "NamedTensorProto": dict(name=1, tensor=2),
    "PartialRunSetupRequest": dict(session_handle=1, feed=2, fetch=3, target=4, request_id=5),
    "CloseSessionRequest": dict(session_handle=1),
    "ResetRequest": dict(container=1, device_filters=2),
    "ListDevicesRequest": dict(session_handle=1),
    "MakeCallableRequest": dict(session_handle=1, options=2, request_id=3),
    "RunCallableRequest": dict(session_handle=1, handle=2, feed=3, request_id=4),
    "ReleaseCallableRequest": dict(session_handle=1, handle=2),
}


def master(type_name, **fields):
    """A MasterService message, with its fields given by name."""
    return Msg({NUMBERS[type_name][name]: value for name, value in fields.items()})

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = [
    "create_session", "extend_session", "run_step", "make_callable", "run_callable",
    "partial_run_setup", "close_session", "list_devices", "reset", "release_callable",
]
HANDLE = "salus-0-3f2a9c41d07be815"


def write(target, name, data):
    path = os.path.join(HERE, "seeds", target, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def request(name, kind, message):
    write("request_decode", name, bytes([KINDS.index(kind)]) + message.SerializeToString())


def tensor(name, proto):
    write("tensor_proto", name, proto.SerializeToString(deterministic=True))


def graph():
    """A small TF1-style training graph, as the stock client sends it."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        w = tf.compat.v1.get_variable("w", [2, 1], initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.matmul(x, w), name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train")
        tf.compat.v1.global_variables_initializer()
    return g.as_graph_def()


def delta():
    """An ExtendSession delta using the fuzz target's existing nodes x, y, v, init."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, name="x")
        y = tf.identity(x, name="y")
        with tf.control_dependencies([tf.no_op(name="init")]):
            tf.add(y, x, name="z")
    d = g.as_graph_def()
    keep = [n for n in d.node if n.name not in ("x", "y", "init")]
    del d.node[:]
    d.node.extend(keep)
    return d


def main():
    config = config_pb2.ConfigProto(
        device_count={"CPU": 1, "GPU": 0}, intra_op_parallelism_threads=2,
        allow_soft_placement=True)
    config.experimental.session_metadata.name = "mnist?priority=10&iterations=2000&persistent=64MiB"
    request("create_session", "create_session", master("CreateSessionRequest",
        graph_def=graph(), config=config, target="grpc://127.0.0.1:5501"))
    request("create_session_empty", "create_session", master("CreateSessionRequest",
        config=config_pb2.ConfigProto(device_count={"CPU": 1})))
    request("extend_session", "extend_session", master("ExtendSessionRequest",
        session_handle=HANDLE, graph_def=delta(), current_graph_version=0))

    feed = tf.make_tensor_proto(np.arange(4, dtype=np.float32).reshape(2, 2))
    options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE)
    run = master("RunStepRequest",
        session_handle=HANDLE, feed=[master("NamedTensorProto", name="x:0", tensor=feed)],
        fetch=["y:0"], target=["init"], options=options,
        store_errors_in_response_body=True, request_id=42)
    request("run_step", "run_step", run)
    prun = master("RunStepRequest",
        session_handle=HANDLE,
        feed=[master("NamedTensorProto", name="x", tensor=tf.make_tensor_proto([b"ab", b"c"]))],
        fetch=["y:0"], partial_run_handle=HANDLE + "-prun-0",
        store_errors_in_response_body=True)
    request("run_step_partial", "run_step", prun)

    callable_options = config_pb2.CallableOptions(
        feed=["x:0"], fetch=["y:0"], target=["init"], run_options=options)
    request("make_callable", "make_callable", master("MakeCallableRequest",
        session_handle=HANDLE, options=callable_options, request_id=7))
    request("run_callable", "run_callable", master("RunCallableRequest",
        session_handle=HANDLE, handle=0,
        feed=[tf.make_tensor_proto(7, dtype=tf.int64, shape=[3])], request_id=8))
    request("partial_run_setup", "partial_run_setup", master("PartialRunSetupRequest",
        session_handle=HANDLE, feed=["x:0"], fetch=["y:0"], target=["init"], request_id=9))
    request("close_session", "close_session", master("CloseSessionRequest", session_handle=HANDLE))
    request("list_devices", "list_devices", master("ListDevicesRequest", session_handle=HANDLE))
    request("reset", "reset", master("ResetRequest", container=["", "c"], device_filters=["/cpu:0"]))
    request("release_callable", "release_callable", master("ReleaseCallableRequest",
        session_handle=HANDLE, handle=0))

    tensor("float_content", tf.make_tensor_proto(np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)))
    tensor("int64_content", tf.make_tensor_proto(np.arange(5, dtype=np.int64)))
    tensor("int32_fill", tf.make_tensor_proto(3, dtype=tf.int32, shape=[2, 2]))
    tensor("double_vals", tensor_pb2.TensorProto(
        dtype=types_pb2.DT_DOUBLE, tensor_shape=tf.TensorShape([3]).as_proto(), double_val=[1.5, -2.0]))
    tensor("half_vals", tensor_pb2.TensorProto(
        dtype=types_pb2.DT_HALF, tensor_shape=tf.TensorShape([2]).as_proto(), half_val=[15360, 16384]))
    tensor("bool_vals", tf.make_tensor_proto([True, False, True]))
    tensor("complex64", tf.make_tensor_proto(np.array([1 + 2j, 3 - 1j], dtype=np.complex64)))
    tensor("strings", tf.make_tensor_proto([b"hello", b"", b"salus"]))
    tensor("string_scalar", tf.make_tensor_proto(b"a string longer than the short-string buffer"))
    tensor("uint8_matrix", tf.make_tensor_proto(np.arange(12, dtype=np.uint8).reshape(3, 2, 2)))
    # Lying protos: a few bytes claiming a huge tensor, or content of the wrong size.
    tensor("huge_fill", tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, tensor_shape=tf.TensorShape([1 << 20, 1 << 20]).as_proto(),
        float_val=[1.0]))
    tensor("short_content", tensor_pb2.TensorProto(
        dtype=types_pb2.DT_INT32, tensor_shape=tf.TensorShape([4]).as_proto(),
        tensor_content=b"\x01\x00\x00\x00"))
    # Regressions (fuzz/README.md): an empty batch as the stock client sends it (no
    # tensor_content: TensorFlow leaves such a tensor without a buffer), and a
    # shape over TensorFlow's 254 dimensions (TF_AllocateTensor aborts on it).
    tensor("empty_batch", tf.make_tensor_proto(np.zeros((0, 3), dtype=np.float32)))
    tensor("rank255", tensor_pb2.TensorProto(
        dtype=types_pb2.DT_UINT8, tensor_shape=tf.TensorShape([1] * 255).as_proto(),
        tensor_content=b"\x01"))


if __name__ == "__main__":
    main()
