"""Caffe2 minidb files (specs/caffe2.md §2-§6, §11): length-prefixed records whose values are
BlobProto messages. The record and protobuf *headers* are walked through a
:class:`~.cursor.Window` and every data field is skipped by its length, so tensor payloads are
never read; :func:`tensor_values` decodes one TensorProto once its bytes are read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..io import TruncatedError
from .cursor import Window
from .protobuf import (
    LEN,
    VARINT,
    DecodeError,
    decode,
    read_varint,
    signed,
    varint_array,
    walk,
    walk_bytes,
)

_II = struct.Struct("<ii").unpack
WINDOW = 64 << 10  # bytes per listing read: small records share one request
MAX_SMALL = 1 << 20  # names, keys, dims, segments: larger is corrupt
#: records listed per file: a budget (each costs ~40 µs and ~1 KiB listed); CheckpointManager
#: writes one record per blob or chunk, far fewer than this
MAX_RECORDS = 50_000


CHUNK_SEP = "#%"


DTYPES: dict[int, str | None] = {
    0: None, 1: "float32", 2: "int32", 3: "uint8", 4: "object", 5: "bool", 6: "uint8",
    7: "int8", 8: "uint16", 9: "int16", 10: "int64", 12: "float16", 13: "float64",
    14: None, 15: None,
}  # fmt: skip


DTYPE_NAMES = {
    0: "UNDEFINED", 1: "FLOAT", 2: "INT32", 3: "BYTE", 4: "STRING", 5: "BOOL", 6: "UINT8",
    7: "INT8", 8: "UINT16", 9: "INT16", 10: "INT64", 12: "FLOAT16", 13: "DOUBLE",
    14: "ZERO_COLLISION_HASH", 15: "REBATCHING_BUFFER",
}  # fmt: skip


DATA_FIELDS = (3, 4, 5, 6, 9, 10, 13)  # float, int32, byte, string, double, int64, raw


SMALL_RECORD = 4096  # a record value up to this size is read whole and walked in memory


def _fields(win: Window, start: int, end: int):
    """The fields of the message at ``[start, end)``: walked in memory when the window already
    holds it (small records share one read), else field by field (payloads never read)."""
    held = win.cached(start, end - start) if end - start <= SMALL_RECORD else None
    if held is not None:
        return walk_bytes(held, start)
    return walk(win.get, start, end)


def _small(win: Window, offset: int, length: int, what: str) -> bytes:
    if length > MAX_SMALL:
        raise DecodeError(f"{what} of {length} bytes is implausibly large")
    return win.get(offset, length)


@dataclass(slots=True)
class Chunk:
    """One record of a blob: where its TensorProto lies and what its header says."""

    key: str
    tensor: tuple[int, int] | None = None  # (offset, length) of BlobProto.tensor
    content: tuple[int, int] | None = None  # (offset, length) of BlobProto.content
    qtensor: tuple[int, int] | None = None  # (offset, length) of BlobProto.qtensor
    dims: tuple[int, ...] = ()
    data_type: int | None = None
    data_format: int = 0
    segment: tuple[int, int] | None = None
    data_bytes: int = 0
    fields: set[int] = field(default_factory=set)
    num_chunks: int | None = None
    chunk_id: int | None = None


@dataclass(slots=True)
class BlobRecord:
    name: str
    type: str
    chunks: list[Chunk] = field(default_factory=list)
    error: str | None = None


def _tensor_head(win: Window, start: int, end: int, chunk: Chunk) -> None:
    for number, wire, value, pos in _fields(win, start, end):
        if number == 1:  # dims: unpacked varints, or packed
            if wire == VARINT:
                chunk.dims += (signed(value),)
            else:
                chunk.dims += tuple(int(x) for x in varint_array(_small(win, pos, value, "dims")))
        elif number == 2 and wire == VARINT:
            chunk.data_type = value
        elif number in DATA_FIELDS:
            chunk.fields.add(number)
            chunk.data_bytes += value if wire != VARINT else 1
        elif number == 11 and wire == LEN:
            seg = decode(_small(win, pos, value, "segment"))
            begin, stop = (
                signed(seg[k][-1]) if seg.get(k) and isinstance(seg[k][-1], int) else None
                for k in (1, 2)
            )
            if begin is None or stop is None:
                raise DecodeError("segment without begin/end")
            chunk.segment = (begin, stop)
        elif number == 15 and wire == VARINT:
            chunk.data_format = value


def _record(win: Window, key: str, start: int, end: int) -> tuple[str, str, Chunk]:
    """Name, type and header facts of one BlobProto value at [start, end)."""
    chunk = Chunk(key)
    name = type_ = None
    for number, wire, value, pos in _fields(win, start, end):
        if wire == LEN and number in (1, 2):
            text = _small(win, pos, value, "name").decode("utf-8", "replace")
            name, type_ = (text, type_) if number == 1 else (name, text)
        elif number == 3 and wire == LEN:
            chunk.tensor = (pos, value)
            _tensor_head(win, pos, pos + value, chunk)
        elif number == 4 and wire == LEN:
            chunk.content = (pos, value)
        elif number == 5 and wire == LEN:
            chunk.qtensor = (pos, value)
        elif number == 6 and wire == VARINT:
            chunk.num_chunks = signed(value, 32)
        elif number == 7 and wire == VARINT:
            chunk.chunk_id = signed(value, 32)
    if not name:  # LoadOp names blobs by the key up to the first "#%"
        name = key.split(CHUNK_SEP, 1)[0]
    return name, type_ or "", chunk


def read_records(win: Window, size: int) -> tuple[dict[str, BlobRecord], list[str]]:
    """Walk every record; return the blobs in file order and the problems met."""
    blobs: dict[str, BlobRecord] = {}
    problems: list[str] = []
    pos = index = 0
    while pos < size:
        if index >= MAX_RECORDS:
            problems.append(
                f"listing stopped after {MAX_RECORDS:,} records at offset {pos} of {size} "
                "(a budget: no Caffe2 checkpoint writes this many)"
            )
            break
        left = size - pos
        if left < 4:
            problems.append(
                f"truncated: {left} stray byte(s) at offset {pos} inside record {index}'s key "
                f"length (Caffe2 itself would stop here silently and load the {index} "
                "record(s) before)"
            )
            break
        if left < 8:
            problems.append(f"truncated: file ends inside record {index}'s value length")
            break
        key_len, value_len = _II(win.get(pos, 8))
        if key_len <= 0 or value_len <= 0:
            problems.append(
                f"corrupt record {index} at offset {pos}: key length {key_len}, value length "
                f"{value_len} (both must be > 0)"
            )
            break
        if 8 + key_len + value_len > left:
            problems.append(
                f"truncated: record {index} at offset {pos} needs {8 + key_len + value_len} "
                f"bytes, the file has {left} left"
            )
            break
        key = _small(win, pos + 8, key_len, "key").decode("utf-8", "replace")
        start = pos + 8 + key_len
        error = None
        try:
            name, type_, chunk = _record(win, key, start, start + value_len)
        except (DecodeError, TruncatedError) as e:
            error = f"record {index} ({key!r}): undecodable BlobProto: {e}"
            name, type_, chunk = key.split(CHUNK_SEP, 1)[0], "", Chunk(key)
        blob = blobs.setdefault(name, BlobRecord(name, type_))
        blob.type = blob.type or type_
        blob.chunks.append(chunk)
        blob.error = blob.error or error
        pos = start + value_len
        index += 1
    if size == 0:
        problems.append("empty file: no records (Caffe2 would load it as an empty db)")
    return blobs, problems


def ints(values: list) -> np.ndarray:
    parts = [
        np.array([signed(v)], np.int64) if isinstance(v, int) else varint_array(v) for v in values
    ]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def fixed_array(values: list, fmt: str) -> np.ndarray:
    parts = [np.frombuffer(bytes(v), fmt) for v in values]
    return np.concatenate(parts) if parts else np.empty(0, fmt)


def joined(values: list, fmt: str) -> np.ndarray:
    raw = b"".join(bytes(v) for v in values)
    if len(raw) % np.dtype(fmt).itemsize:
        raise DecodeError(f"byte field of {len(raw)} bytes is not a whole number of {fmt}")
    return np.frombuffer(raw, fmt)


def tensor_values(msg: dict, data_type: int, data_format: int) -> np.ndarray:
    """The flat values of one decoded TensorProto (spec §5)."""
    dtype = DTYPES.get(data_type)
    if data_type == 1:
        if data_format == 1:  # FMT_BFLOAT16: raw_data holds the upper halves
            return (joined(msg.get(13, []), "<u2").astype(np.uint32) << 16).view(np.float32)
        return fixed_array(msg.get(3, []), "<f4").astype(np.float32)
    if data_type == 13:
        return fixed_array(msg.get(9, []), "<f8").astype(np.float64)
    if data_type == 2:
        return ints(msg.get(4, [])).astype(np.int32)
    if data_type == 10:
        return ints(msg.get(10, []))
    if data_type == 4:
        out = np.empty(len(msg.get(6, [])), dtype=object)
        out[:] = [bytes(v) for v in msg.get(6, [])]
        return out
    if data_type == 12:
        if msg.get(5):
            return joined(msg[5], "<f2").astype(np.float16)
        return (ints(msg.get(4, [])) & 0xFFFF).astype(np.uint16).view(np.float16)
    if data_type in (3, 5, 6, 7, 8, 9):
        if msg.get(5):
            disk = "u1" if dtype == "bool" else "<" + np.dtype(dtype).str[1:]
            return joined(msg[5], disk).astype(dtype)
        return ints(msg.get(4, [])).astype(dtype)
    if data_type == 0:
        return np.empty(0, np.float32)
    raise DecodeError(f"caffe2 data type {DTYPE_NAMES.get(data_type, data_type)} not decoded")


def sniff(head: bytes, size: int | None = None) -> bool:
    """Does ``head`` look like the start of a minidb file (spec §11)?"""
    if len(head) < 9:
        return False
    key_len, value_len = struct.unpack_from("<ii", head)
    if key_len <= 0 or value_len <= 0:
        return False
    if size is not None and 8 + key_len + value_len > size:
        return False
    if size is None and len(head) < 4096 and 8 + key_len + value_len > len(head):
        return False  # the head is the whole file and the record does not fit
    start = 8 + key_len
    if start >= len(head):
        return False  # a key longer than the first block: not a checkpoint
    if head[start] != 0x0A:  # BlobProto.name
        return False
    try:
        name_len, at = read_varint(head, start + 1)
    except DecodeError:
        return False
    key = head[8:start].split(CHUNK_SEP.encode(), 1)[0]
    name = head[at : at + name_len]
    return name_len == len(key) and (at + name_len > len(head) or name == key)
