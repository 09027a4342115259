"""A small protobuf decoder for the one TensorFlow message the TF2 adapter reads:
tensorflow.WorkerService/GetStatus's device list (`_eager.server_device`).

It is hand-written on purpose. The adapter runs inside the user's TensorFlow process, and generated
code for a tensorflow.* message would register it in protobuf's default descriptor pool, where
TensorFlow's own definitions of the same names live (a clash, or a different version of them). The
salus.v1.Admin messages are generated from admin.proto instead (salus.v1.admin_pb2, see
python/hatch_build.py): their names are Salus's own.

Decoding fills proto3 defaults for absent fields and skips unknown ones.
"""

from __future__ import annotations

import struct

VARINT, I64, LEN, I32 = 0, 1, 2, 5

# kind: "string" | "uint" | "int32" | "int64" | "double" | message name; repeated as a trailing "*".
SCHEMAS: dict[str, dict[int, tuple[str, str]]] = {
    # tensorflow.WorkerService/GetStatus (name and device_type of DeviceAttributes).
    "GetStatusResponse": {1: ("device_attributes", "DeviceAttributes*")},
    "DeviceAttributes": {1: ("name", "string"), 2: ("device_type", "string")},
}

_SCALAR_DEFAULTS = {"string": "", "uint": 0, "int32": 0, "int64": 0, "double": 0.0}


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
        if shift > 70:
            raise ValueError("varint too long")


def _raw_fields(buf: bytes):
    i = 0
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
        elif wt == I64:
            if i + 8 > len(buf):
                raise ValueError("truncated fixed64")
            v, i = buf[i:i + 8], i + 8
        elif wt == I32:
            if i + 4 > len(buf):
                raise ValueError("truncated fixed32")
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield field, wt, v


def _signed(n: int, bits: int) -> int:
    n &= (1 << 64) - 1
    if n >= 1 << 63:
        n -= 1 << 64
    return n if bits == 64 else max(-(1 << 31), min((1 << 31) - 1, n))


def _scalar(kind: str, wt: int, v):
    if kind == "string":
        return bytes(v).decode("utf-8", errors="replace")
    if kind == "double":
        return struct.unpack("<d", v)[0] if wt == I64 else 0.0
    if kind == "uint":
        return v
    if kind == "int32":
        return _signed(v, 32)
    if kind == "int64":
        return _signed(v, 64)
    raise ValueError(kind)


def decode(message: str, buf: bytes) -> dict:
    schema = SCHEMAS[message]
    out: dict = {}
    for number, (name, kind) in schema.items():
        repeated = kind.endswith("*")
        base = kind.rstrip("*")
        if repeated:
            out[name] = []
        elif base in _SCALAR_DEFAULTS:
            out[name] = _SCALAR_DEFAULTS[base]
        else:
            out[name] = decode(base, b"")
    for number, wt, v in _raw_fields(bytes(buf)):
        if number not in schema:
            continue
        name, kind = schema[number]
        base = kind.rstrip("*")
        if base in _SCALAR_DEFAULTS:
            if kind.endswith("*") and wt == LEN and base in ("uint", "int32", "int64"):  # packed
                j, vals = 0, []
                while j < len(v):
                    x, j = _read_varint(v, j)
                    vals.append(_scalar(base, VARINT, x))
                out[name].extend(vals)
                continue
            value = _scalar(base, wt, v)
        else:
            value = decode(base, v)
        if kind.endswith("*"):
            out[name].append(value)
        else:
            out[name] = value
    return out
