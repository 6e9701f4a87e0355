"""Caffe2 minidb files: length-prefixed records of BlobProto values (specs/caffe2.md §2-§6).

Listing walks record and protobuf *headers* with buffered ranged reads and skips every
data field by its length, so tensor payloads are never read. A tensor split into chunks
(keys ``name#%k``, records in any order) is one variable, reassembled by ``segment`` on read.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..io import Blob, TruncatedError
from ..model import VarInfo
from ..protobuf import LEN, VARINT, DecodeError, decode, read_varint, signed
from .base import Codec, CodecTier, PartialRead

CHUNK_SEP = "#%"
WINDOW = 64 << 10  # bytes per listing read: small records share one request
MAX_SMALL = 1 << 20  # names, keys, dims, segments: larger is corrupt
MAX_BLOB_NAMES = 4 << 20  # the blob_names cross-check reads at most this much

#: TensorProto.DataType -> numpy dtype name (None: opaque, catalogued as object)
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
TRAINER_TYPES = ("Counter", "TreeCursor", "DBReader")


# -- buffered ranged reads and header-only protobuf walking ---------------------------------
class _Window:
    """Ranged reads of a blob through one sliding buffer (header walks, payloads skipped)."""

    def __init__(self, blob: Blob):
        self.blob = blob
        self.start = 0
        self.buf = blob.head() if blob.size else b""

    def get(self, offset: int, n: int) -> bytes:
        if not (self.start <= offset and offset + n <= self.start + len(self.buf)):
            self.buf = self.blob.read_upto(offset, max(n, WINDOW))
            self.start = offset
            if len(self.buf) < n:
                raise TruncatedError(f"{self.blob.name}: needs {n} bytes at {offset}")
        a = offset - self.start
        return self.buf[a : a + n]


def _varint_at(win: _Window, pos: int, end: int) -> tuple[int, int]:
    value, used = read_varint(win.get(pos, min(10, end - pos)), 0)
    return value, pos + used


def _walk(win: _Window, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field, wire, value, offset) per field of the message at [start, end); for LEN fields
    ``value`` is the length and ``offset`` where the bytes start (they are not read)."""
    pos = start
    while pos < end:
        key, pos = _varint_at(win, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise DecodeError(f"field number 0 at offset {pos}")
        if wire == VARINT:
            value, pos = _varint_at(win, pos, end)
            yield number, wire, value, pos
            continue
        if wire == LEN:
            length, pos = _varint_at(win, pos, end)
        elif wire in (1, 5):
            length = 8 if wire == 1 else 4
        else:
            raise DecodeError(f"unsupported wire type {wire} at offset {pos}")
        if length > end - pos:
            raise DecodeError(f"field {number} claims {length} bytes, {end - pos} left")
        yield number, wire, length, pos
        pos += length


def _small(win: _Window, offset: int, length: int, what: str) -> bytes:
    if length > MAX_SMALL:
        raise DecodeError(f"{what} of {length} bytes is implausibly large")
    return win.get(offset, length)


# -- what listing learns about one record --------------------------------------------------
@dataclass
class _Chunk:
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


@dataclass
class _Blob:
    name: str
    type: str
    chunks: list[_Chunk] = field(default_factory=list)
    error: str | None = None


@dataclass
class Locator:
    """How to read a blob: its records' TensorProto ranges, sorted by segment."""

    kind: str  # "tensor" | "blob" | "opaque"
    data_type: int | None
    dims: tuple[int, ...]
    chunks: list[tuple[int, int, tuple[int, int] | None, int]]  # offset, length, segment, fmt
    contents: list[tuple[int, int]]  # BlobProto.content ranges, in chunk-id order
    blob_type: str = ""


def _tensor_head(win: _Window, start: int, end: int, chunk: _Chunk) -> None:
    for number, wire, value, pos in _walk(win, start, end):
        if number == 1:  # dims: unpacked varints, or packed
            if wire == VARINT:
                chunk.dims += (signed(value),)
            else:
                chunk.dims += tuple(_varint_list(_small(win, pos, value, "dims")))
        elif number == 2 and wire == VARINT:
            chunk.data_type = value
        elif number in DATA_FIELDS:
            chunk.fields.add(number)
            chunk.data_bytes += value if wire != VARINT else 1
        elif number == 11 and wire == LEN:
            seg = decode(_small(win, pos, value, "segment"))
            begin, stop = (signed(seg[k][-1]) if seg.get(k) else None for k in (1, 2))
            if begin is None or stop is None:
                raise DecodeError("segment without begin/end")
            chunk.segment = (begin, stop)
        elif number == 15 and wire == VARINT:
            chunk.data_format = value


def _record(win: _Window, key: str, start: int, end: int) -> tuple[str, str, _Chunk]:
    """Name, type and header facts of one BlobProto value at [start, end)."""
    chunk = _Chunk(key)
    name = type_ = None
    for number, wire, value, pos in _walk(win, start, end):
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


def _records(win: _Window, size: int) -> tuple[dict[str, _Blob], list[str]]:
    """Walk every record; return the blobs in file order and the problems met."""
    blobs: dict[str, _Blob] = {}
    problems: list[str] = []
    pos = index = 0
    while pos < size:
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
        key_len, value_len = struct.unpack("<ii", win.get(pos, 8))
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
            name, type_, chunk = key.split(CHUNK_SEP, 1)[0], "", _Chunk(key)
        blob = blobs.setdefault(name, _Blob(name, type_))
        blob.type = blob.type or type_
        blob.chunks.append(chunk)
        blob.error = blob.error or error
        pos = start + value_len
        index += 1
    if size == 0:
        problems.append("empty file: no records (Caffe2 would load it as an empty db)")
    return blobs, problems


# -- from records to variables ---------------------------------------------------------------
def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _coverage(chunks: list[_Chunk], numel: int) -> str | None:
    """Why the chunks do not cover [0, numel) exactly once (LoadOp's checks), or None."""
    if len(chunks) == 1 and chunks[0].segment is None:
        return None
    if any(c.segment is None for c in chunks):
        return "a chunk without a segment among several"
    at = 0
    for begin, stop in sorted(c.segment for c in chunks):
        if not 0 <= begin <= stop <= numel:
            return f"segment [{begin},{stop}) outside [0,{numel})"
        if begin != at:
            return f"chunks cover {at} then jump to {begin} of {numel} elements"
        at = stop
    return None if at == numel else f"chunks cover {at} of {numel} elements"


def _tensor_var(blob: _Blob) -> VarInfo:
    first = blob.chunks[0]
    dims, code = first.dims, first.data_type
    error = None
    if code is None:
        error = "TensorProto without data_type"
    elif any(c.dims != dims or c.data_type != code or c.tensor is None for c in blob.chunks):
        error = "chunks disagree on dims or data type"
    elif any(d < 0 for d in dims):
        error = f"negative dimension in {dims}"
    numel = _numel(dims) if error is None else 0
    dtype = DTYPES.get(code) if code is not None else None
    if code == 0 and numel == 0:
        dtype = "float32"  # UNDEFINED with no elements: an empty float tensor
    data_bytes = sum(c.data_bytes for c in blob.chunks)
    if error is None:
        error = _coverage(blob.chunks, numel)
    if error is None and data_bytes < numel:
        error = f"dims {list(dims)} claim {numel} elements, the records hold {data_bytes} bytes"
    kind = "tensor" if dtype is not None else "opaque"
    dtype = dtype or "object"
    chunks = sorted(blob.chunks, key=lambda c: c.segment or (0, 0))
    nbytes = data_bytes if dtype == "object" else numel * np.dtype(dtype).itemsize
    return VarInfo(
        name=blob.name,
        dtype=dtype,
        shape=tuple(dims) if error is None else (),
        nbytes=nbytes,
        kind="other" if blob.name == "blob_names" else None,
        error=error,
        locator=Locator(kind, code, tuple(dims), [_tensor_ref(c) for c in chunks if c.tensor], []),
        attrs={
            "caffe2_data_type": DTYPE_NAMES.get(code, str(code)),
            "n_records": len(blob.chunks),
            "storage_fields": sorted({_FIELD_NAMES[f] for c in blob.chunks for f in c.fields}),
        },
    )


_FIELD_NAMES = {3: "float_data", 4: "int32_data", 5: "byte_data", 6: "string_data",
                9: "double_data", 10: "int64_data", 13: "raw_data"}  # fmt: skip


def _other_var(blob: _Blob) -> VarInfo:
    """A non-tensor blob (std::string, Counter, TreeCursor, mutex, qtensor …): opaque; its
    value is the content (or the serialized QTensorProto) bytes."""
    chunks = blob.chunks
    error = None
    n = chunks[0].num_chunks
    ids = sorted(c.chunk_id if c.chunk_id is not None else -1 for c in chunks)
    if n is None and len(chunks) > 1:
        error = f"blob duplicated ({len(chunks)} records)"
    elif n is not None and ids != list(range(n)):
        error = f"content chunks {ids} do not cover 0..{n - 1}"
    ordered = sorted(chunks, key=lambda c: c.chunk_id or 0)
    contents = [c.content or c.qtensor for c in ordered if c.content or c.qtensor]
    tensors = [_tensor_ref(c) for c in ordered if c.tensor]
    nbytes = sum(r[1] for r in contents) + sum(t[1] for t in tensors)
    kind = "trainer" if any(t in blob.type for t in TRAINER_TYPES) else "other"
    first = chunks[0]
    return VarInfo(
        name=blob.name,
        dtype="object",
        shape=(),
        nbytes=nbytes,
        kind=kind,
        error=error,
        locator=Locator("blob", first.data_type, first.dims, tensors, contents, blob.type),
        attrs={"blob_type": blob.type, "n_records": len(chunks)},
    )


def _tensor_ref(chunk: _Chunk) -> tuple:
    return (*chunk.tensor, chunk.segment, chunk.data_format)


def _variable(blob: _Blob) -> VarInfo:
    if blob.error:
        return VarInfo(blob.name, "object", (), nbytes=0, kind="other", error=blob.error)
    return _tensor_var(blob) if _is_tensor(blob) else _other_var(blob)


def _is_tensor(blob: _Blob) -> bool:
    if blob.type:
        return blob.type == "Tensor"
    return all(c.tensor is not None and c.content is None for c in blob.chunks)


# -- decoding values -------------------------------------------------------------------------
def _varint_array(buf: bytes | memoryview) -> np.ndarray:
    """A packed run of varints as int64 (two's complement), decoded with numpy."""
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


def _varint_list(buf: bytes | memoryview) -> list[int]:
    return [int(x) for x in _varint_array(buf)]


def _ints(values: list) -> np.ndarray:
    parts = [
        np.array([signed(v)], np.int64) if isinstance(v, int) else _varint_array(v) for v in values
    ]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _fixed(values: list, fmt: str) -> np.ndarray:
    parts = [np.frombuffer(bytes(v), fmt) for v in values]
    return np.concatenate(parts) if parts else np.empty(0, fmt)


def _joined(values: list, fmt: str) -> np.ndarray:
    raw = b"".join(bytes(v) for v in values)
    if len(raw) % np.dtype(fmt).itemsize:
        raise DecodeError(f"byte field of {len(raw)} bytes is not a whole number of {fmt}")
    return np.frombuffer(raw, fmt)


def tensor_values(msg: dict, data_type: int, data_format: int) -> np.ndarray:
    """The flat values of one decoded TensorProto (spec §5)."""
    dtype = DTYPES.get(data_type)
    if data_type == 1:
        if data_format == 1:  # FMT_BFLOAT16: raw_data holds the upper halves
            return (_joined(msg.get(13, []), "<u2").astype(np.uint32) << 16).view(np.float32)
        return _fixed(msg.get(3, []), "<f4").astype(np.float32)
    if data_type == 13:
        return _fixed(msg.get(9, []), "<f8").astype(np.float64)
    if data_type == 2:
        return _ints(msg.get(4, [])).astype(np.int32)
    if data_type == 10:
        return _ints(msg.get(10, []))
    if data_type == 4:
        out = np.empty(len(msg.get(6, [])), dtype=object)
        out[:] = [bytes(v) for v in msg.get(6, [])]
        return out
    if data_type == 12:
        if msg.get(5):
            return _joined(msg[5], "<f2").astype(np.float16)
        return (_ints(msg.get(4, [])) & 0xFFFF).astype(np.uint16).view(np.float16)
    if data_type in (3, 5, 6, 7, 8, 9):
        if msg.get(5):
            disk = "u1" if dtype == "bool" else "<" + np.dtype(dtype).str[1:]
            return _joined(msg[5], disk).astype(dtype)
        return _ints(msg.get(4, [])).astype(dtype)
    if data_type == 0:
        return np.empty(0, np.float32)
    raise DecodeError(f"caffe2 data type {DTYPE_NAMES.get(data_type, data_type)} not decoded")


def _chunk_values(blob: Blob, loc: Locator, chunk: tuple, numel: int) -> np.ndarray:
    offset, length, segment, data_format = chunk
    msg = decode(blob.read(offset, length))
    values = tensor_values(msg, loc.data_type, data_format)
    want = numel if segment is None else segment[1] - segment[0]
    if values.size != want:
        raise ValueError(f"a chunk holds {values.size} values, its segment says {want}")
    return values


# -- the codec -------------------------------------------------------------------------------
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


class Caffe2Codec(Codec):
    """Caffe2 minidb: one file per node per epoch (or loose ``.minidb`` files)."""

    name = "caffe2"
    suffixes = (".minidb",)
    priority = CodecTier.LOOSE

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return filename.lower().endswith(self.suffixes) or sniff(head)

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        win = _Window(blob)
        blobs, problems = _records(win, blob.size)
        variables = [_variable(b) for b in blobs.values()]
        for var in variables:
            if var.error:
                problems.append(f"{var.name}: {var.error}")
        missing = self._missing_from_blob_names(blob, variables)
        if missing:
            shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
            problems.append(f"blob_names lists {len(missing)} blob(s) absent here: {shown}")
        if problems:
            raise PartialRead(variables, "; ".join(problems))
        return variables

    def _missing_from_blob_names(self, blob: Blob, variables: list[VarInfo]) -> list[str]:
        """Blobs a checkpoint's own ``blob_names`` list (it names itself) that are absent."""
        var = next((v for v in variables if v.name == "blob_names"), None)
        if var is None or var.error or var.dtype != "object" or len(var.shape) != 1:
            return []
        if var.nbytes > MAX_BLOB_NAMES:
            return []
        try:
            names = {bytes(x).decode("utf-8", "replace") for x in self.read(blob, var)}
        except (DecodeError, ValueError):
            return []
        if "blob_names" not in names:
            return []  # not CheckpointManager's list
        return sorted(names - {v.name for v in variables})

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        loc: Locator = var.locator
        if loc.kind == "blob":
            return _blob_value(blob, loc)
        if loc.kind == "opaque":
            raw = [blob.read(off, n) for off, n, _s, _f in loc.chunks]
            out = np.empty((), dtype=object)
            out[()] = b"".join(raw)
            return out
        numel = _numel(loc.dims)
        dtype = np.dtype(var.dtype)
        if len(loc.chunks) == 1:
            flat = _chunk_values(blob, loc, loc.chunks[0], numel)
        else:
            flat = np.empty(numel, dtype=dtype)
            for chunk in loc.chunks:
                begin, stop = chunk[2]
                flat[begin:stop] = _chunk_values(blob, loc, chunk, numel)
        return flat.astype(dtype, copy=False).reshape(loc.dims)

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
        """Chunked tensors stream record by record, in segment order."""
        loc: Locator = var.locator
        if loc.kind != "tensor" or len(loc.chunks) < 2:
            yield np.asarray(self.read(blob, var)).reshape(-1)
            return
        numel = _numel(loc.dims)
        for chunk in loc.chunks:
            yield _chunk_values(blob, loc, chunk, numel).astype(var.dtype, copy=False)


def _blob_value(blob: Blob, loc: Locator) -> np.ndarray:
    """A non-tensor blob as a 0-d object array: its content bytes (std::string), or a dict
    ``{"type", "content", "tensor"}`` when it also carries a tensor (Counter, TreeCursor)."""
    content = b"".join(blob.read(off, n) for off, n in loc.contents)
    out = np.empty((), dtype=object)
    if not loc.chunks:
        out[()] = content
        return out
    offset, length, _segment, data_format = loc.chunks[0]
    msg = decode(blob.read(offset, length))
    code = signed(msg[2][-1]) if msg.get(2) else 1
    dims = tuple(_ints(msg.get(1, [])).tolist())
    values = tensor_values(msg, code, data_format)
    if values.size == _numel(dims):
        values = values.reshape(dims)
    out[()] = {"type": loc.blob_type, "content": content, "tensor": values}
    return out
