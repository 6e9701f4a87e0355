"""A minimal protobuf wire-format decoder (no schema, no generated code).

Checkpoint headers (Caffe2 BlobProto, Paddle TensorDesc/ProgramDesc, TF BundleEntryProto)
are small protobuf messages; decoding them by field number keeps protobuf out of the core.
Every length is checked against the buffer, so a hostile header cannot make us allocate.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from collections.abc import Callable, Iterator

import numpy as np

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
        value: int | bytes | memoryview
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


def walk(
    get: Callable[[int, int], bytes], start: int, end: int
) -> Iterator[tuple[int, int, int, int]]:
    """Fields of the message at file offsets ``[start, end)``, read through ``get(offset, n)``
    (a :class:`~.cursor.Window`): (field, wire, value, offset) each; for LEN and fixed fields
    ``value`` is the length and ``offset`` where the bytes start (they are not read)."""

    def varint_at(pos: int) -> tuple[int, int]:
        value, used = read_varint(get(pos, min(10, end - pos)), 0)
        return value, pos + used

    pos = start
    while pos < end:
        key, pos = varint_at(pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError(f"field number 0 at offset {pos}")
        if wire == VARINT:
            value, pos = varint_at(pos)
            yield number, wire, value, pos
            continue
        if wire == LEN:
            length, pos = varint_at(pos)
        elif wire in (I64, I32):
            length = 8 if wire == I64 else 4
        else:
            raise DecodeError(f"unsupported wire type {wire} at offset {pos}")
        if length > end - pos:
            raise DecodeError(f"field {number} claims {length} bytes, {end - pos} left")
        yield number, wire, length, pos
        pos += length


def walk_bytes(buf: bytes, base: int = 0) -> Iterator[tuple[int, int, int, int]]:
    """:func:`walk` over a message already read (``buf``, at file offset ``base``): the same
    fields and offsets, without a read per field."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError(f"field number 0 at offset {base + pos}")
        if wire == VARINT:
            value, pos = read_varint(buf, pos)
            yield number, wire, value, base + pos
            continue
        if wire == LEN:
            length, pos = read_varint(buf, pos)
        elif wire in (I64, I32):
            length = 8 if wire == I64 else 4
        else:
            raise DecodeError(f"unsupported wire type {wire} at offset {base + pos}")
        if length > end - pos:
            raise DecodeError(f"field {number} claims {length} bytes, {end - pos} left")
        yield number, wire, length, base + pos
        pos += length


def decode(buf: bytes | memoryview) -> dict[int, list]:
    """All fields of a message: field number -> list of raw values in order."""
    out: dict[int, list] = defaultdict(list)
    for field, _wire, value in iter_fields(buf):
        out[field].append(value)
    return out


def signed(v: int, bits: int = 64) -> int:
    """Two's complement reinterpretation of a varint (proto int32/int64)."""
    if type(v) is not int:  # a length-delimited or fixed field where a varint belongs
        raise DecodeError(f"expected a varint, got {type(v).__name__}")
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


def varint_array(buf: bytes | memoryview) -> np.ndarray:
    """A packed run of varints as int64 (two's complement), decoded with numpy at once."""
    b = np.frombuffer(buf, np.uint8)
    if b.size == 0:
        return np.empty(0, np.int64)
    if b[-1] & 0x80:
        raise DecodeError("truncated packed varint")
    if not (b & 0x80).any():
        return b.astype(np.int64)
    ends = np.flatnonzero(b < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise DecodeError("varint too long")
    shift = (np.arange(b.size) - np.repeat(starts, lengths)) * 7
    parts = (b & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    return np.add.reduceat(parts, starts).view(np.int64)


def string(values: list, default: str = "") -> str:
    """The last value of a string field, decoded as UTF-8."""
    return bytes(values[-1]).decode("utf-8", "replace") if values else default


def fixed(values: list, fmt: str) -> list:
    """A repeated fixed-width field (``fmt`` a struct code like '<f'), packed or not."""
    size = struct.calcsize(fmt)
    out: list = []
    for v in values:
        b = bytes(v)
        if len(b) % size:
            raise DecodeError("bad packed fixed field")
        out.extend(x[0] for x in struct.iter_unpack(fmt, b))
    return out
