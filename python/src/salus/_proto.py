"""A small protobuf codec for the salus.v1.Admin messages (no generated code, no protobuf dependency).

Field numbers are those of proto/salus/v1/admin.proto. Decoding fills proto3 defaults for absent fields and
skips unknown ones, so a newer server stays readable.
"""

from __future__ import annotations

import struct

VARINT, I64, LEN, I32 = 0, 1, 2, 5

# kind: "string" | "uint" | "int32" | "int64" | "double" | message name; repeated as a trailing "*".
SCHEMAS: dict[str, dict[int, tuple[str, str]]] = {
    "ServerInfo": {1: ("version", "string"), 2: ("tensorflow_version", "string"), 3: ("devices", "Device*"),
                   4: ("open_sessions", "uint"), 5: ("sessions_created", "uint"),
                   6: ("runs_completed", "uint"), 7: ("uptime_seconds", "double"), 8: ("policy", "string"),
                   9: ("memory_capacity_bytes", "uint"), 10: ("memory_free_bytes", "uint"),
                   12: ("open_eager_contexts", "uint"), 13: ("heap_in_use_bytes", "uint")},
    "Device": {1: ("name", "string"), 2: ("device_type", "string"), 3: ("memory_limit_bytes", "int64")},
    "ListJobsResponse": {1: ("jobs", "JobInfo*")},
    # tensorflow.WorkerService/GetStatus (name and device_type of DeviceAttributes).
    "GetStatusResponse": {1: ("device_attributes", "DeviceAttributes*")},
    "DeviceAttributes": {1: ("name", "string"), 2: ("device_type", "string")},
    "JobHints": {1: ("priority", "int32"), 2: ("expected_iterations", "uint"), 3: ("expected_seconds", "double")},
    "JobInfo": {1: ("id", "uint"), 2: ("handle", "string"), 3: ("name", "string"), 4: ("state", "string"),
                5: ("lane", "uint"), 6: ("policy", "string"), 7: ("iterations", "uint"),
                8: ("attained_seconds", "double"), 9: ("mean_iteration_ms", "double"),
                10: ("queue_wait_seconds", "double"), 11: ("queued", "uint"), 12: ("hints", "JobHints"),
                13: ("note", "string"), 14: ("graph_version", "int64"), 15: ("graph_nodes", "uint"),
                16: ("runs_completed", "uint"), 17: ("runs_failed", "uint"), 18: ("age_seconds", "double"),
                19: ("idle_seconds", "double"), 20: ("variable_bytes", "uint"), 21: ("variables", "uint"),
                22: ("variables_of_unknown_size", "uint"), 23: ("memory_state", "string"),
                24: ("persistent_estimate_bytes", "uint"), 25: ("ephemeral_estimate_bytes", "uint"),
                26: ("persistent_source", "string"), 27: ("ephemeral_source", "string"),
                28: ("kind", "string")},
    "LatencySummary": {1: ("count", "uint"), 2: ("p50_us", "double"), 3: ("p99_us", "double"),
                       4: ("max_us", "double"), 5: ("buckets", "uint*")},
    "LaneQueue": {1: ("lane", "uint"), 2: ("queued", "uint"), 3: ("running", "uint")},
    "SchedulerStats": {1: ("policy", "string"), 2: ("iterations_total", "uint"),
                       3: ("iterations_per_second", "double"), 4: ("queued", "uint"),
                       5: ("switch_latency", "LatencySummary"), 6: ("lanes", "LaneQueue*"),
                       7: ("cheap_runs_total", "uint"), 8: ("dropped_iterations", "uint")},
    "SetPolicyRequest": {1: ("policy", "string")},
    "SetPolicyResponse": {1: ("previous", "string"), 2: ("policy", "string")},
    "SetJobHintsRequest": {1: ("job", "string"), 2: ("hints", "JobHints")},
    "Empty": {},
}

_SCALAR_DEFAULTS = {"string": "", "uint": 0, "int32": 0, "int64": 0, "double": 0.0}


def _varint(n: int) -> bytes:
    if n < 0:
        n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


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


def encode(message: str, values: dict) -> bytes:
    schema = SCHEMAS[message]
    out = bytearray()
    for number, (name, kind) in schema.items():
        if name not in values or values[name] is None:
            continue
        base = kind.rstrip("*")
        items = values[name] if kind.endswith("*") else [values[name]]
        for v in items:
            if base == "string":
                data = str(v).encode()
                if data or kind.endswith("*"):
                    out += _varint(number << 3 | LEN) + _varint(len(data)) + data
            elif base in ("uint", "int32", "int64"):
                if int(v) != 0:
                    out += _varint(number << 3 | VARINT) + _varint(int(v))
            elif base == "double":
                if float(v) != 0.0:
                    out += _varint(number << 3 | I64) + struct.pack("<d", float(v))
            else:
                data = encode(base, v)
                out += _varint(number << 3 | LEN) + _varint(len(data)) + data
    return bytes(out)
