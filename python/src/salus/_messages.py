"""Protobuf messages as plain dicts, the same on every protobuf runtime the package supports.

json_format.MessageToDict is not used: its keyword arguments differ between protobuf 4 and 7, and it
turns 64-bit integers into strings and leaves out default values.
"""

from __future__ import annotations


def _repeated(field) -> bool:
    # protobuf 7 has is_repeated and no label; protobuf 4 only label.
    if hasattr(field, "is_repeated"):
        return field.is_repeated
    return field.label == field.LABEL_REPEATED


def to_dict(message) -> dict:
    """Every field by its proto name: proto3 defaults for absent ones (a submessage as a dict of its
    defaults), None for an absent `optional` scalar, lists for repeated fields."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if _repeated(field):
            out[field.name] = [to_dict(v) for v in value] if field.message_type else list(value)
        elif field.message_type:
            out[field.name] = to_dict(value)
        elif field.has_presence and not message.HasField(field.name):
            out[field.name] = None
        else:
            out[field.name] = value
    return out
