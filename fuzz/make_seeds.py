"""Writes the fuzz targets' seed corpus (fuzz/seeds/) with TensorFlow's own protos.

Run from the repository root: .venv/bin/python fuzz/make_seeds.py
The messages are what a stock TF 2.x client sends; the request_decode and
eager_decode seeds start with the byte that selects the request type (see
fuzz_targets/request_decode.rs and eager_decode.rs). The TensorFlow wheel ships no
master_pb2, eager_service_pb2 or worker_pb2, so the request envelopes (a handful of
fields, numbered as in TensorFlow's master.proto, eager_service.proto and
worker.proto) are encoded here by hand around TensorFlow's own GraphDef,
FunctionDef, ServerDef, ConfigProto, RunOptions, CallableOptions, AttrValue and
TensorProto.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, tensor_pb2, types_pb2
from tensorflow.core.protobuf import cluster_pb2, config_pb2, tensorflow_server_pb2


def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class Fixed64(int):
    """A fixed64 field's value (eager context ids)."""


class Msg:
    """A message as {field number: value}: int or bool -> varint; Fixed64 -> 8
    bytes; str, bytes or a protobuf message -> length-delimited; a list -> repeated."""

    def __init__(self, fields):
        self.fields = fields

    def SerializeToString(self, deterministic=True):
        out = b""
        for number, value in self.fields.items():
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, Fixed64):
                    out += varint(number << 3 | 1) + (int(v) & (1 << 64) - 1).to_bytes(8, "little")
                elif isinstance(v, (bool, int)):
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
    # The EagerService requests (TensorFlow's eager_service.proto) and RecvTensor.
    "EnqueueRequest": dict(context_id=1, queue=3),
    "QueueItem": dict(handle_to_decref=1, operation=2, send_tensor=3, register_function=4,
                      cleanup_function=5, sync_remote_executor_for_stream=6,
                      send_packed_handle=7, remove_function=8),
    "RemoteTensorHandle": dict(op_id=1, output_num=2, device=3, op_device=4, dtype=5),
    "Operation": dict(id=1, name=2, control_op_ids=4, attrs=5, device=6,
                      is_component_function=7, func_step_id=8, is_function=9, op_inputs=10),
    "Input": dict(remote_handle=1, tensor=2),
    "MapEntry": dict(key=1, value=2),
    "SendTensorOp": dict(op_id=1, tensors=2, device_name=3),
    "RegisterFunctionOp": dict(function_def=1, is_component_function=2, library=3),
    "FunctionDefLibrary": dict(function=1),
    "RemoveFunctionOp": dict(function_name=1),
    "CleanupFunctionOp": dict(step_id=1),
    "CreateContextRequest": dict(server_def=1, keep_alive_secs=3, version_def=4,
                                 context_id=7, context_view_id=8,
                                 lazy_copy_remote_function_inputs=9),
    "RunComponentFunctionRequest": dict(context_id=1, operation=2, output_num=3),
    "KeepAliveRequest": dict(context_id=1),
    "CloseContextRequest": dict(context_id=1, context_view_id=2),
    "WaitQueueDoneRequest": dict(context_id=1, op_id=2),
    "RecvTensorRequest": dict(step_id=1, rendezvous_key=2, dma_ok=3, request_id=7),
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


EAGER_KINDS = [
    "enqueue", "create_context", "run_component_function", "recv_tensor", "keep_alive",
    "close_context", "wait_queue_done", "update_context",
]
# (selector // 8) % 3 picks how the client names the server (eager_decode.rs).
EAGER_NAMES = ["worker", "ps", "localhost"]
CONTEXT_ID = Fixed64(0x82C5DF4E6707A1E6)
SERVER = "/job:worker/replica:0/task:0/device:CPU:0"
CLIENT = "/job:localhost/replica:0/task:0/device:CPU:0"


def eager(name, kind, message, names="worker"):
    selector = EAGER_KINDS.index(kind) + len(EAGER_KINDS) * EAGER_NAMES.index(names)
    write("eager_decode", name, bytes([selector]) + message.SerializeToString())


def request(name, kind, message):
    write("request_decode", name, bytes([KINDS.index(kind)]) + message.SerializeToString())


def tensor(name, proto):
    write("tensor_proto", name, proto.SerializeToString(deterministic=True))


def frame(message):
    """A seam frame: a 4-byte little-endian length, then the message."""
    body = message.SerializeToString()
    return len(body).to_bytes(4, "little") + body


def seam(name, *messages, tail=b""):
    """A stream of seam frames (seam_decode reads it both as ToSupervisor and ToExecutor frames)."""
    write("seam_decode", name, b"".join(frame(m) for m in messages) + tail)


def seam_seeds():
    """Frames as an executor and its supervisor exchange them (seam.proto's field numbers)."""
    hello = Msg({1: Msg({1: "0.1.0", 2: 4242, 3: 1000, 4: 1})})
    add_job = Msg({2: Msg({1: 1 << 40, 2: 0, 3: Msg({})})})
    want = Msg({5: Msg({1: 7, 2: 1 << 40, 3: 0, 4: False})})
    done = Msg({6: Msg({1: 7, 2: 12345})})
    report = Msg({13: Msg({1: 3, 3: 2, 4: 1, 5: 9, 6: 120, 7: 1 << 30})})
    seam("executor_start", hello, add_job, want, done)
    seam("executor_report", report)
    go = Msg({1: Msg({1: 7, 2: 987654321})})
    dropped = Msg({2: Msg({1: 8, 2: "the job was cancelled"})})
    answer = Msg({3: Msg({1: 4, 2: True, 3: 1})})
    seam("supervisor_answers", go, dropped, answer)
    # A length over MAX_FRAME (64 MiB), and one that claims more than follows.
    seam("oversized_length", tail=(0x7FFFFFFF).to_bytes(4, "little") + b"\x0a\x00")
    seam("short_body", want, tail=(1000).to_bytes(4, "little") + b"\x2a\x02\x08\x07")


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

    eager_seeds()


def attrs(**values):
    """Operation.attrs: map<string, bytes> of serialized AttrValues, sorted."""
    return [master("MapEntry", key=k, value=v) for k, v in sorted(values.items())]


def item(**one):
    return master("QueueItem", **one)


def handle(op_id, output=0, device=SERVER):
    return master("Input", remote_handle=master("RemoteTensorHandle",
        op_id=op_id, output_num=output, device=device, op_device=device,
        dtype=types_pb2.DT_FLOAT))


def functions():
    """A tf.function calling another, traced under the server's device scope as
    a TF2 client does once connected: its FunctionDef and library."""
    @tf.function
    def scale(x):
        return x * 2.0

    @tf.function
    def step(x, y):
        with tf.device(SERVER):
            return tf.reduce_sum(scale(x) + y)

    spec = tf.TensorSpec([2], tf.float32)
    concrete = step.get_concrete_function(spec, spec)
    fdef = concrete.function_def
    library = [f for f in concrete.graph.as_graph_def().library.function
               if f.signature.name != fdef.signature.name]
    return fdef, library


def eager_seeds():
    float_attr = attr_value_pb2.AttrValue(type=types_pb2.DT_FLOAT)
    x = tf.make_tensor_proto(np.arange(4, dtype=np.float32).reshape(2, 2))
    send_attrs = attrs(
        T=float_attr,
        tensor_name=attr_value_pb2.AttrValue(s=b"123_4"),
        send_device=attr_value_pb2.AttrValue(s=SERVER.encode()),
        send_device_incarnation=attr_value_pb2.AttrValue(i=-4113417405435006490),
        recv_device=attr_value_pb2.AttrValue(s=CLIENT.encode()),
        client_terminated=attr_value_pb2.AttrValue(b=False))
    # x pushed to the server, y = Mul(x, 3.0 inline), y sent back for the client's pull.
    eager("enqueue_send_mul_send", "enqueue", master("EnqueueRequest", context_id=CONTEXT_ID, queue=[
        item(send_tensor=master("SendTensorOp", op_id=1, tensors=[x], device_name=SERVER)),
        item(operation=master("Operation", id=2, name="Mul", device=SERVER, attrs=attrs(T=float_attr),
            op_inputs=[handle(1), master("Input", tensor=tf.make_tensor_proto(3.0))])),
        item(operation=master("Operation", id=3, name="_Send", device=SERVER, attrs=send_attrs,
            op_inputs=[handle(2)])),
    ]))
    fdef, library = functions()
    name = fdef.signature.name
    eager("enqueue_register_function", "enqueue", master("EnqueueRequest", context_id=CONTEXT_ID, queue=[
        item(register_function=master("RegisterFunctionOp", function_def=fdef,
            library=master("FunctionDefLibrary", function=library))),
        item(send_tensor=master("SendTensorOp", op_id=4, device_name=SERVER,
            tensors=[tf.make_tensor_proto(np.ones(2, dtype=np.float32))] * 2)),
        item(operation=master("Operation", id=5, name=name, device=SERVER, is_function=True,
            op_inputs=[handle(4, 0), handle(4, 1)],
            attrs=attrs(_read_only_resource_inputs=attr_value_pb2.AttrValue(
                list=attr_value_pb2.AttrValue.ListValue())))),
    ]))
    eager("enqueue_cleanup", "enqueue", master("EnqueueRequest", context_id=CONTEXT_ID, queue=[
        item(handle_to_decref=master("RemoteTensorHandle", op_id=5, output_num=0, device=SERVER)),
        item(remove_function=master("RemoveFunctionOp", function_name=name)),
        item(cleanup_function=master("CleanupFunctionOp", step_id=7)),
        item(sync_remote_executor_for_stream=b""),
    ]))
    # The server as replica 1, task 2 of job ps; an op on the client's device is refused.
    eager("enqueue_ps_client_device", "enqueue", master("EnqueueRequest", context_id=CONTEXT_ID, queue=[
        item(operation=master("Operation", id=6, name="AddV2", attrs=attrs(T=float_attr),
            device="/job:ps/replica:1/task:2/device:GPU:0",
            op_inputs=[master("Input", tensor=x), master("Input", tensor=x)])),
        item(operation=master("Operation", id=7, name="Identity", attrs=attrs(T=float_attr),
            device="/job:chief/replica:0/task:0/device:CPU:0", op_inputs=[handle(6)])),
    ]), names="ps")

    config = config_pb2.ConfigProto(allow_soft_placement=True)
    config.experimental.session_metadata.name = "resnet?priority=5&iterations=100&ephemeral=256MiB"
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=cluster_pb2.ClusterDef(job=[
            cluster_pb2.JobDef(name="worker", tasks={0: "salus.example:5501"}),
            cluster_pb2.JobDef(name="localhost", tasks={0: "localhost:40123"}),
        ]),
        job_name="worker", task_index=0, protocol="grpc", default_session_config=config)
    eager("create_context", "create_context", master("CreateContextRequest",
        server_def=server_def, keep_alive_secs=600, context_id=CONTEXT_ID,
        context_view_id=Fixed64(0), lazy_copy_remote_function_inputs=True))
    eager("run_component_function", "run_component_function", master("RunComponentFunctionRequest",
        context_id=CONTEXT_ID, output_num=[0],
        operation=master("Operation", id=8, name=name, is_component_function=True, func_step_id=3)))
    eager("recv_tensor", "recv_tensor", master("RecvTensorRequest",
        step_id=0x82C5DF4E6707A1E6 - (1 << 64), request_id=11,
        rendezvous_key=SERVER + ";82c5df4e6707a1e6;" + CLIENT + ";123_4;0:0"))
    eager("keep_alive", "keep_alive", master("KeepAliveRequest", context_id=CONTEXT_ID))
    eager("close_context", "close_context", master("CloseContextRequest",
        context_id=CONTEXT_ID, context_view_id=Fixed64(0)))
    eager("wait_queue_done", "wait_queue_done", master("WaitQueueDoneRequest",
        context_id=CONTEXT_ID, op_id=[2, 3]))

    seam_seeds()


if __name__ == "__main__":
    main()
