"""TensorFlow tensor bundles (``P.index`` + ``P.data-*``): the BundleEntryProto and header of
each ``.index`` entry, OrderedCode slice keys of partitioned variables, DT_STRING payloads and
the object graph's names. The ``.index`` table itself is :mod:`.sstable`.
"""

from __future__ import annotations

import posixpath
import struct
from dataclasses import dataclass

import numpy as np

from ..io import Storage
from ..model import Span
from . import protobuf as pb
from .sstable import FormatError

OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


TF_DTYPES: dict[int, tuple[str, str | None]] = {
    1: ("float32", None), 2: ("float64", None), 3: ("int32", None), 4: ("uint8", None),
    5: ("int16", None), 6: ("int8", None), 7: ("object", "string"), 8: ("complex64", None),
    9: ("int64", None), 10: ("bool", None), 11: ("int8", "qint8"), 12: ("uint8", "quint8"),
    13: ("int32", "qint32"), 14: ("bfloat16", None), 15: ("int16", "qint16"),
    16: ("uint16", "quint16"), 17: ("uint16", None), 18: ("complex128", None),
    19: ("float16", None), 20: ("object", "resource"), 21: ("object", "variant"),
    22: ("uint32", None), 23: ("uint64", None), 24: ("float8_e5m2", None),
    25: ("float8_e4m3fn", None), 26: ("float8_e4m3fnuz", None), 27: ("float8_e4m3b11fnuz", None),
    28: ("float8_e5m2fnuz", None), 29: ("int4", None), 30: ("uint4", None),
    33: ("float4_e2m1fn", None),
}  # fmt: skip


DT_STRING = 7


_LENGTH_TO_MASK = [0, 0x80, 0xC000, 0xE00000, 0xF0000000, 0xF800000000, 0xFC0000000000,
                   0xFE000000000000, 0xFF00000000000000, 0x8000000000000000, 0]  # fmt: skip


def _num_increasing(key: bytes, pos: int) -> tuple[int, int]:
    if pos >= len(key) or key[pos] > 8 or pos + 1 + key[pos] > len(key):
        raise FormatError("bad OrderedCode number")
    n = key[pos]
    return int.from_bytes(key[pos + 1 : pos + 1 + n], "big"), pos + 1 + n


def _string(key: bytes, pos: int) -> tuple[bytes, int]:
    out = bytearray()
    while pos + 1 < len(key):
        b, nxt = key[pos], key[pos + 1]
        if b == 0x00 and nxt == 0x01:
            return bytes(out), pos + 2
        if b in (0x00, 0xFF):
            if nxt != (0xFF if b == 0x00 else 0x00):
                raise FormatError("bad OrderedCode string escape")
            out.append(b)
            pos += 2
        else:
            out.append(b)
            pos += 1
    raise FormatError("unterminated OrderedCode string")


def signed_num_increasing(key: bytes, pos: int) -> tuple[int, int]:
    """Decode OrderedCode ``WriteSignedNumIncreasing`` (1..10 bytes) at ``pos``."""
    if pos >= len(key):
        raise FormatError("truncated OrderedCode signed number")
    xor = 0xFF if not key[pos] & 0x80 else 0
    first = key[pos] ^ xor
    if first != 0xFF:
        length = 7 - ((first ^ 0xFF).bit_length() - 1)
        if pos + length > len(key):
            raise FormatError("truncated OrderedCode signed number")
        x = int.from_bytes(key[pos : pos + length], "big")
        if xor:
            x |= ((1 << 64) - 1) ^ ((1 << (8 * length)) - 1)
    else:
        length = 8
        if pos + 2 > len(key):
            raise FormatError("truncated OrderedCode signed number")
        second = key[pos + 1] ^ xor
        if second >= 0x80:
            if second < 0xC0:
                length = 9
            elif second == 0xC0 and pos + 2 < len(key) and key[pos + 2] ^ xor < 0x80:
                length = 10
            else:
                raise FormatError("OrderedCode signed number too long")
        if pos + length > len(key):
            raise FormatError("truncated OrderedCode signed number")
        x = int.from_bytes(key[pos + length - 8 : pos + length], "big")
    x ^= _LENGTH_TO_MASK[length]
    return pb.signed(x & ((1 << 64) - 1)), pos + length


def decode_slice_key(key: bytes) -> tuple[str, tuple[tuple[int, int], ...]]:
    """(tensor name, ((start, length or -1 for full), …)) of a partitioned tensor's slice key."""
    zero, pos = _num_increasing(key, 0)
    if zero != 0:
        raise FormatError("slice key does not start with 0")
    name, pos = _string(key, pos)
    rank, pos = _num_increasing(key, pos)
    extents = []
    for _ in range(rank):
        start, pos = signed_num_increasing(key, pos)
        length, pos = signed_num_increasing(key, pos)
        extents.append((start, length))
    return name.decode("utf-8", "replace"), tuple(extents)


@dataclass
class BundleEntry:
    """A decoded BundleEntryProto."""

    dtype: int
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int | None
    slices: list[tuple[tuple[int, int], ...]]


def _shape(buf) -> tuple[int, ...]:
    fields = pb.decode(buf)
    if fields.get(3) and fields[3][-1]:
        raise FormatError("tensor of unknown rank")
    dims = []
    for dim in fields.get(2, []):
        size = pb.signed(pb.decode(dim).get(1, [0])[-1])
        if size < 0:
            raise FormatError("tensor with an unknown dimension")
        dims.append(size)
    return tuple(dims)


def _slice(buf, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    extents = []
    for ext in pb.decode(buf).get(1, []):
        f = pb.decode(ext)
        start = pb.signed(f.get(1, [0])[-1])
        extents.append((start, pb.signed(f[2][-1]) if 2 in f else -1))
    if len(extents) != len(shape):
        raise FormatError("slice rank differs from the tensor's")
    return tuple(extents)


def decode_entry(value) -> BundleEntry:
    f = pb.decode(value)
    shape = _shape(f[2][-1]) if 2 in f else ()
    crc = f.get(6)
    return BundleEntry(
        dtype=f.get(1, [0])[-1],
        shape=shape,
        shard_id=pb.signed(f.get(3, [0])[-1]),
        offset=pb.signed(f.get(4, [0])[-1]),
        size=pb.signed(f.get(5, [0])[-1]),
        crc32c=struct.unpack("<I", crc[-1])[0] if crc else None,
        slices=[_slice(s, shape) for s in f.get(7, [])],
    )


#: (dtype, shape, shard_id, offset, size, crc32c) of a BundleEntryProto without slices
PlainEntry = tuple[int, tuple[int, ...], int, int, int, "int | None"]
_SIGN = 1 << 63
_WRAP = 1 << 64


def _plain_shape(raw: bytes) -> tuple[int, ...] | None:
    """The dims of a TensorShapeProto made only of ``dim { size: n }`` (n >= 0), else None."""
    dims = []
    pos, n = 0, len(raw)
    read_varint = pb.read_varint
    while pos < n:
        if raw[pos] != 0x12:  # dim (field 2, LEN)
            return None
        length = raw[pos + 1]
        pos += 2
        stop = pos + length
        if length >= 0x80 or stop > n:
            return None
        if length == 0:  # Dim {} : size 0
            dims.append(0)
            continue
        if raw[pos] != 0x08:  # size (field 1, varint) only: no dim names
            return None
        size, pos = read_varint(raw, pos + 1)
        if pos != stop or size >= _SIGN:  # an unknown (-1) dim: decode_entry says why
            return None
        dims.append(size)
    return tuple(dims)


def plain_entry(buf: bytes, pos: int, end: int, shapes: dict) -> PlainEntry | None:
    """:func:`decode_entry` of the BundleEntryProto at ``buf[pos:end]``, fast, for entries as TF
    writes them (fields 1–6 with their wire types, a shape of plain dims, no slices); None
    for anything else (slices, other fields, a malformed or truncated message): then
    :func:`decode_entry` decides. ``shapes`` memoises shape bytes -> dims (per table)."""
    dtype = shard = offset = size = 0
    shape: tuple[int, ...] = ()
    crc = None
    read_varint = pb.read_varint
    try:
        while pos < end:
            tag = buf[pos]
            pos += 1
            if tag == 0x12:  # shape
                length = buf[pos]
                pos += 1
                stop = pos + length
                if length >= 0x80 or stop > end:
                    return None
                raw = buf[pos:stop]
                dims = shapes.get(raw)
                if dims is None:
                    dims = _plain_shape(raw)
                    if dims is None:
                        return None
                    shapes[raw] = dims
                shape, pos = dims, stop
            elif tag == 0x35:  # crc32c, fixed32
                if pos + 4 > end:
                    return None
                crc = int.from_bytes(buf[pos : pos + 4], "little")
                pos += 4
            elif tag == 0x08 or tag == 0x18 or tag == 0x20 or tag == 0x28:
                x = buf[pos]
                if x < 0x80:
                    pos += 1
                elif buf[pos + 1] < 0x80:  # two bytes: offsets and sizes below 16 KiB
                    x = (x & 0x7F) | (buf[pos + 1] << 7)
                    pos += 2
                elif buf[pos + 2] < 0x80:  # three bytes: below 2 MiB
                    x = (x & 0x7F) | ((buf[pos + 1] & 0x7F) << 7) | (buf[pos + 2] << 14)
                    pos += 3
                else:
                    x, pos = read_varint(buf, pos)
                if tag == 0x08:
                    dtype = x  # an enum: decode_entry keeps it unsigned
                    continue
                if x >= _SIGN:
                    x -= _WRAP  # int32/int64: two's complement
                if tag == 0x18:
                    shard = x
                elif tag == 0x20:
                    offset = x
                else:
                    size = x
            else:
                return None
    except (IndexError, pb.DecodeError):
        return None
    if pos != end:  # the last field ran past the entry
        return None
    return dtype, shape, shard, offset, size, crc


def decode_header(value) -> tuple[int, bool]:
    """(num_shards, big_endian) from a BundleHeaderProto."""
    f = pb.decode(value)
    return pb.signed(f.get(1, [0])[-1]), f.get(2, [0])[-1] == 1


def object_graph_names(graph: bytes) -> dict[str, dict]:
    """checkpoint_key -> {full_name, slot_name?, original_key?} from a TrackableObjectGraph:
    one pass over the bytes (:func:`_object_graph_fast`) when the graph is as TF writes it,
    else :func:`object_graph_names_general` (which also says what is wrong)."""
    try:
        return _object_graph_fast(graph)
    except (ValueError, IndexError):  # pb.DecodeError is a ValueError
        return object_graph_names_general(graph)


def object_graph_names_general(graph: bytes) -> dict[str, dict]:
    """:func:`object_graph_names` field by field with :func:`pb.decode` (any graph)."""
    nodes = [pb.decode(n) for n in pb.decode(graph).get(1, [])]
    keys: dict[int, str] = {}
    out: dict[str, dict] = {}
    for i, node in enumerate(nodes):
        for attr in node.get(2, []):
            a = pb.decode(attr)
            key = pb.string(a.get(3, []))
            if key and pb.string(a.get(1, [])) == "VARIABLE_VALUE":
                keys[i] = key
            if key:
                out.setdefault(key, {"full_name": pb.string(a.get(2, []))})
    for node in nodes:
        for ref in node.get(3, []):
            r = pb.decode(ref)
            slot_key = keys.get(r.get(3, [-1])[-1])
            if slot_key in out:
                out[slot_key]["slot_name"] = pb.string(r.get(2, []))
                original = keys.get(r.get(1, [-1])[-1])
                if original:
                    out[slot_key]["original_key"] = original
    return out


def _skip(buf: bytes, pos: int, end: int, wire: int) -> int:
    """The position after a field's value (``pos`` just after its tag) as :func:`pb.decode`
    would step over it; ValueError where it would raise."""
    if wire == 0:
        _, pos = pb.read_varint(buf, pos)
    elif wire == 2:
        length, pos = pb.read_varint(buf, pos)
        pos += length
    elif wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    else:
        raise ValueError(wire)
    if pos > end:
        raise ValueError(pos)
    return pos


def _tag(buf: bytes, pos: int) -> tuple[int, int, int]:
    """(field number, wire type, position after the tag); ValueError for field 0."""
    tag = buf[pos]
    if tag < 0x80:
        pos += 1
    else:
        tag, pos = pb.read_varint(buf, pos)
    if tag < 8:
        raise ValueError("field number 0")
    return tag >> 3, tag & 7, pos


def _len(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """(start, stop) of a LEN value whose length varint is at ``pos``."""
    length = buf[pos]
    if length < 0x80:
        pos += 1
    else:
        length, pos = pb.read_varint(buf, pos)
    if pos + length > end:
        raise ValueError(length)
    return pos, pos + length


def _object_graph_fast(graph: bytes) -> dict[str, dict]:
    """:func:`object_graph_names` in one pass over the bytes, for graphs made of the fields
    with the wire types TF writes; ValueError (or IndexError) for anything else."""
    buf = bytes(graph)
    n = len(buf)
    attrs: list[tuple[int, bytes, bytes, bytes]] = []  # (node, name, full_name, checkpoint_key)
    slots: list[tuple[int, bytes, int]] = []  # (original node, slot name, slot node)
    pos = node = 0
    while pos < n:
        field, wire, pos = _tag(buf, pos)
        if field != 1 or wire != 2:  # nodes (TrackableObject) only
            raise ValueError(field)
        start, stop = _len(buf, pos, n)
        pos = start
        while pos < stop:  # a node: children, attributes, slot_variables, ...
            field, wire, pos = _tag(buf, pos)
            if field != 2 and field != 3:
                pos = _skip(buf, pos, stop, wire)
                continue
            if wire != 2:
                raise ValueError(wire)
            a, b = _len(buf, pos, stop)
            pos = b
            if field == 2:  # SerializedTensor: name, full_name, checkpoint_key
                strings = [b"", b"", b""]
                while a < b:
                    f, w, a = _tag(buf, a)
                    if 1 <= f <= 3:
                        if w != 2:
                            raise ValueError(w)
                        s, a = _len(buf, a, b)
                        strings[f - 1] = buf[s:a]
                    else:
                        a = _skip(buf, a, b, w)
                attrs.append((node, strings[0], strings[1], strings[2]))
            else:  # SlotVariableReference: original node, slot name, slot node
                original, slot_name, slot_node = -1, b"", -1
                while a < b:
                    f, w, a = _tag(buf, a)
                    if f == 2:
                        if w != 2:
                            raise ValueError(w)
                        s, a = _len(buf, a, b)
                        slot_name = buf[s:a]
                    elif f == 1 or f == 3:
                        if w != 0:
                            raise ValueError(w)
                        x, a = pb.read_varint(buf, a)
                        if a > b:
                            raise ValueError(a)
                        if f == 1:
                            original = x
                        else:
                            slot_node = x
                    else:
                        a = _skip(buf, a, b, w)
                slots.append((original, slot_name, slot_node))
        if pos != stop:
            raise ValueError(pos)
        node += 1
    keys: dict[int, str] = {}
    out: dict[str, dict] = {}
    for i, name, full_name, key in attrs:
        if key:
            text = key.decode("utf-8", "replace")
            if name == b"VARIABLE_VALUE":
                keys[i] = text
            if text not in out:
                out[text] = {"full_name": full_name.decode("utf-8", "replace")}
    for original, slot_name, slot_node in slots:
        slot_key = keys.get(slot_node)
        if slot_key in out:
            out[slot_key]["slot_name"] = slot_name.decode("utf-8", "replace")
            original_key = keys.get(original)
            if original_key:
                out[slot_key]["original_key"] = original_key
    return out


def read_strings(storage: Storage, span: Span, shape: tuple[int, ...]) -> np.ndarray:
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    data = storage.read_range(span.path, span.offset, span.offset + span.length)
    if len(data) < span.length:
        raise FormatError(f"{posixpath.basename(span.path)} ends early")
    if numel > len(data):
        raise FormatError(f"{numel} strings cannot fit in {len(data)} bytes")
    pos, lengths = 0, []
    for _ in range(numel):
        n, pos = pb.read_varint(data, pos)
        lengths.append(n)
    pos += 4  # masked crc32c of the lengths
    if pos + sum(lengths) != len(data):
        raise FormatError("string lengths do not add up to the entry's size")
    out = np.empty(numel, dtype=object)
    for i, n in enumerate(lengths):
        out[i] = data[pos : pos + n]
        pos += n
    return out.reshape(shape)


def data_path(index_path: str, shard: int, num_shards: int) -> str:
    prefix = index_path[: -len(".index")] if index_path.endswith(".index") else index_path
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"
