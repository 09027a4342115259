"""A tiny protobuf wire codec for hand-built MasterService and Health requests.

Why hand-encoded: the TensorFlow wheel ships no master_pb2 and there is no protoc here, and hostile tests
need to send bytes that no generated class would produce anyway (unknown dtypes, lying shapes, truncated
messages). The codec is independent of the project's own .proto files, so these tests also catch a
wire incompatibility in them. Field numbers are TensorFlow's (master.proto, tensor.proto, ...).

Only what the tests need is here: varint, length-delimited and fixed32 fields, and a flat decoder.
TensorProto / NamedTensorProto from TensorFlow's own tensor_pb2 can be used for well-formed tensors.
"""

from __future__ import annotations

import struct

import grpc

# --- wire types -------------------------------------------------------------------------------------
VARINT, I64, LEN, I32 = 0, 1, 2, 5

# TensorFlow DataType enum values (types.proto).
DT_FLOAT, DT_DOUBLE, DT_INT32, DT_STRING, DT_INT64, DT_BOOL = 1, 2, 3, 7, 9, 10


def varint(n: int) -> bytes:
    if n < 0:
        n &= (1 << 64) - 1  # negative int32/int64 are encoded as 10-byte two's complement
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def f_varint(field: int, value: int) -> bytes:
    return tag(field, VARINT) + varint(value)


def f_bytes(field: int, value: bytes | str) -> bytes:
    if isinstance(value, str):
        value = value.encode()
    return tag(field, LEN) + varint(len(value)) + value


def f_packed_floats(field: int, values) -> bytes:
    return f_bytes(field, b"".join(struct.pack("<f", v) for v in values))


def decode(buf: bytes) -> list[tuple[int, int, object]]:
    """Flat decode: [(field, wire_type, value)], value an int for varint/fixed, bytes for LEN."""
    out, i = [], 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == VARINT:
            v, i = _read_varint(buf, i)
        elif wt == LEN:
            n, i = _read_varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated length-delimited field")
            v, i = buf[i:i + n], i + n
        elif wt == I32:
            v, i = struct.unpack_from("<I", buf, i)[0], i + 4
        elif wt == I64:
            v, i = struct.unpack_from("<Q", buf, i)[0], i + 8
        else:
            raise ValueError(f"unsupported wire type {wt}")
        out.append((field, wt, v))
    return out


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, i


def fields(buf: bytes, field: int) -> list:
    return [v for f, _, v in decode(buf) if f == field]


def first(buf: bytes, field: int, default=None):
    vals = fields(buf, field)
    return vals[0] if vals else default


# --- messages ----------------------------------------------------------------------------------------

def tensor_shape(dims) -> bytes:
    """TensorShapeProto{dim=2 repeated Dim{size=1}}."""
    return b"".join(f_bytes(2, f_varint(1, d)) for d in dims)


def tensor_proto(dtype: int, dims=(), *, float_val=None, tensor_content=None,
                 string_val=None, int_val=None) -> bytes:
    """TensorProto{dtype=1, tensor_shape=2, tensor_content=4, float_val=5, int_val=7, string_val=8}."""
    msg = f_varint(1, dtype) + f_bytes(2, tensor_shape(dims))
    if tensor_content is not None:
        msg += f_bytes(4, tensor_content)
    if float_val is not None:
        msg += f_packed_floats(5, float_val)
    if int_val is not None:
        msg += f_bytes(7, b"".join(varint(v) for v in int_val))
    for s in string_val or ():
        msg += f_bytes(8, s)
    return msg


def named_tensor(name: str, tensor: bytes) -> bytes:
    return f_bytes(1, name) + f_bytes(2, tensor)


def create_session_request(graph_def: bytes, config: bytes = b"") -> bytes:
    msg = f_bytes(1, graph_def)
    if config:
        msg += f_bytes(2, config)
    return msg


def run_step_request(handle: str, feeds=(), fetches=(), targets=(), *, store_errors=True,
                     request_id: int = 0) -> bytes:
    """RunStepRequest; feeds is [(name, TensorProto bytes)]."""
    msg = f_bytes(1, handle)
    for name, tensor in feeds:
        msg += f_bytes(2, named_tensor(name, tensor))
    for name in fetches:
        msg += f_bytes(3, name)
    for name in targets:
        msg += f_bytes(4, name)
    if store_errors:
        msg += f_varint(7, 1)
    if request_id:
        msg += f_varint(8, request_id)
    return msg


def close_session_request(handle: str) -> bytes:
    return f_bytes(1, handle)


class RunStepResult:
    """Decoded RunStepResponse: tensors {name: TensorProto bytes}, status_code, status_error_message."""

    def __init__(self, raw: bytes):
        self.tensors = {}
        for nt in fields(raw, 1):
            self.tensors[first(nt, 1, b"").decode()] = first(nt, 2, b"")
        self.status_code = first(raw, 3, 0)
        self.status_error_message = first(raw, 4, b"").decode(errors="replace")

    def __repr__(self):
        return (f"RunStepResult(tensors={list(self.tensors)}, status_code={self.status_code}, "
                f"msg={self.status_error_message[:200]!r})")


# --- raw gRPC calls -----------------------------------------------------------------------------------

MASTER = "/tensorflow.MasterService/"


def call(channel: grpc.Channel, method: str, request: bytes, timeout: float = 30.0) -> bytes:
    """Unary call with raw bytes in and out (no (de)serializer)."""
    path = method if method.startswith("/") else MASTER + method
    return channel.unary_unary(path, request_serializer=None, response_deserializer=None)(
        request, timeout=timeout)


def health_check(channel: grpc.Channel, service: str = "", timeout: float = 5.0) -> int:
    """grpc.health.v1.Health/Check; returns the status enum (1 = SERVING)."""
    resp = call(channel, "/grpc.health.v1.Health/Check", f_bytes(1, service) if service else b"",
                timeout=timeout)
    return first(resp, 1, 0)


SERVING = 1
