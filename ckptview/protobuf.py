"""A minimal protobuf wire-format decoder (no schema, no generated code).

Checkpoint headers (Caffe2 BlobProto, Paddle TensorDesc/ProgramDesc, TF BundleEntryProto)
are small protobuf messages; decoding them by field number keeps protobuf out of the core.
Every length is checked against the buffer, so a hostile header cannot make us allocate.
"""

from __future__ import annotations

import struct
from collections import defaultdict

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class DecodeError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a varint at ``pos``; return (value, next position)."""
    result = shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise DecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DecodeError("varint too long")


def encode_varint(value: int) -> bytes:
    """A varint; negative values as protobuf writes int64 (two's complement, 10 bytes)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_field(number: int, value: int | bytes) -> bytes:
    """One field: a varint for an int, length-delimited for bytes (writers of test/demo files)."""
    if isinstance(value, int):
        return encode_varint(number << 3 | VARINT) + encode_varint(value)
    return encode_varint(number << 3 | LEN) + encode_varint(len(value)) + bytes(value)


def iter_fields(buf: bytes | memoryview):
    """Yield (field number, wire type, value) for each field; LEN values are memoryviews."""
    mv = memoryview(buf)
    pos, n = 0, len(mv)
    while pos < n:
        key, pos = read_varint(mv, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise DecodeError("field number 0")
        if wire == VARINT:
            value, pos = read_varint(mv, pos)
        elif wire == I64:
            if pos + 8 > n:
                raise DecodeError("truncated fixed64")
            value, pos = bytes(mv[pos : pos + 8]), pos + 8
        elif wire == LEN:
            length, pos = read_varint(mv, pos)
            if length > n - pos:
                raise DecodeError(f"field {field} claims {length} bytes, {n - pos} left")
            value, pos = mv[pos : pos + length], pos + length
        elif wire == I32:
            if pos + 4 > n:
                raise DecodeError("truncated fixed32")
            value, pos = bytes(mv[pos : pos + 4]), pos + 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")
        yield field, wire, value


def decode(buf: bytes | memoryview) -> dict[int, list]:
    """All fields of a message: field number -> list of raw values in order."""
    out: dict[int, list] = defaultdict(list)
    for field, _wire, value in iter_fields(buf):
        out[field].append(value)
    return out


def signed(v: int, bits: int = 64) -> int:
    """Two's complement reinterpretation of a varint (proto int32/int64)."""
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def varints(values: list) -> list[int]:
    """A repeated integer field, accepting both packed and unpacked encodings."""
    out: list[int] = []
    for v in values:
        if isinstance(v, int):
            out.append(signed(v))
        elif isinstance(v, memoryview):
            pos = 0
            while pos < len(v):
                x, pos = read_varint(v, pos)
                out.append(signed(x))
        else:
            raise DecodeError("expected a varint field")
    return out


def string(values: list, default: str = "") -> str:
    """The last value of a string field, decoded as UTF-8."""
    return bytes(values[-1]).decode("utf-8", "replace") if values else default


def fixed(values: list, fmt: str) -> list:
    """A repeated fixed-width field (``fmt`` a struct code like '<f'), packed or not."""
    size = struct.calcsize(fmt)
    out = []
    for v in values:
        b = bytes(v)
        if len(b) % size:
            raise DecodeError("bad packed fixed field")
        out.extend(x[0] for x in struct.iter_unpack(fmt, b))
    return out
