"""Paddle's binary tensor streams (specs/paddle.md §1-§3): a DenseTensor/LoDTensor or a
SelectedRows header walked with ranged reads (:class:`~.cursor.Window`), giving the variable
and where its data lies; save_combine files are such streams back to back.
"""

from __future__ import annotations

import posixpath
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..io import HEAD_BLOCK, Storage, TruncatedError
from ..model import Span, VarInfo
from . import protobuf as pb
from .cursor import Window

#: VarType.Type code -> (ckptview dtype, on-disk numpy dtype or None when the name is enough)
DTYPES: dict[int, tuple[str, str | None]] = {
    0: ("bool", None),
    1: ("int16", "<i2"),
    2: ("int32", "<i4"),
    3: ("int64", "<i8"),
    4: ("float16", "<f2"),
    5: ("float32", "<f4"),
    6: ("float64", "<f8"),
    19: ("uint64", "<u8"),  # SIZE_T
    20: ("uint8", None),
    21: ("int8", None),
    22: ("bfloat16", None),
    23: ("complex64", "<c8"),
    24: ("complex128", "<c16"),
    32: ("float8_e4m3fn", None),
    33: ("float8_e5m2", None),
    36: ("uint16", "<u2"),
    37: ("uint32", "<u4"),
    38: ("uint64", "<u8"),
}


ITEMSIZE = {code: np.dtype(disk or "u1").itemsize for code, (_, disk) in DTYPES.items()}
ITEMSIZE[22] = 2  # bfloat16


MAX_LOD_LEVELS = 64


MAX_DESC_LEN = 4096


MAX_LOD_BYTES = 1 << 20  # larger LoD tables are described, not loaded

#: bytes fetched at a SelectedRows height: the height, the tensor version, desc length and
#: TensorDesc (a few dozen bytes; a longer desc costs one more read)
SR_WINDOW = 256


class FormatError(ValueError):
    """The bytes are not (or no longer) a Paddle tensor stream."""


def parse_tensor_desc(buf: bytes) -> tuple[int, tuple[int, ...]]:
    """``VarType.TensorDesc`` -> (data_type code, dims); strict: only fields 1 and 2."""
    code, dims = None, []
    for field, wire, value in pb.iter_fields(buf):
        if field == 1 and wire == pb.VARINT:
            code = value
        elif field == 2 and wire in (pb.VARINT, pb.LEN):
            dims.extend(pb.varints([value]))
        else:
            raise FormatError(f"unexpected TensorDesc field {field} (wire type {wire})")
    if code is None:
        raise FormatError("TensorDesc has no data_type")
    if code not in DTYPES:
        raise FormatError(f"unknown Paddle data_type {code}")
    if any(d < 0 for d in dims):
        raise FormatError(f"negative dimension in {dims}")
    return code, tuple(dims)


@dataclass
class Stream:
    """One parsed stream: its variable and the offset just past it."""

    var: VarInfo
    end: int


def _tensor_body(r: Window, pos: int, attrs: dict) -> Stream:
    """``TensorToStream``: u32 version, i32 desc_len, TensorDesc, raw C-order data."""
    if r.u32(pos) != 0:
        raise FormatError(f"tensor version at byte {pos} is not 0")
    desc_len = r.i32(pos + 4)
    if not 0 <= desc_len <= MAX_DESC_LEN:
        raise FormatError(f"TensorDesc length {desc_len} out of range")
    try:
        code, dims = parse_tensor_desc(r.get(pos + 8, desc_len))
    except pb.DecodeError as e:
        raise FormatError(f"bad TensorDesc: {e}") from None
    data = pos + 8 + desc_len
    numel = 1
    for d in dims:
        numel *= d
    nbytes = numel * ITEMSIZE[code]
    if nbytes > r.size - data:
        raise TruncatedError(
            f"{r.blob.name}: tensor {list(dims)} needs {nbytes} data bytes at {data},"
            f" the file has {max(0, r.size - data)} left"
        )
    dtype, disk = DTYPES[code]
    span = Span(r.blob.path, data, nbytes, disk_dtype=disk)
    var = VarInfo("", dtype, dims, nbytes=nbytes, span=span, attrs=attrs)
    return Stream(var, data + nbytes)


_PLAIN_PREFIX = bytes(16)  # LoDTensor version 0, no LoD levels, tensor version 0
_I32 = struct.Struct("<i")


def _plain_desc(buf: bytes, pos: int, end: int) -> tuple[int, tuple[int, ...]] | None:
    """``parse_tensor_desc`` of ``buf[pos:end]`` for the usual encoding (data_type, then
    each dim as an unpacked field 2, every varint short of 2^63), inline; None for anything
    else (the general decoder decides)."""
    if end - pos < 2 or buf[pos] != 0x08:
        return None
    code = buf[pos + 1]
    if code & 0x80 or code not in DTYPES:
        return None
    pos += 2
    dims = []
    while pos < end:
        if buf[pos] != 0x10:
            return None
        pos += 1
        value = shift = 0
        while True:
            if pos >= end or shift > 56:
                return None
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
        dims.append(value)
    return code, tuple(dims)


def plain_dense(blob, head: bytes) -> VarInfo | None:
    """The one variable of a file holding exactly one DenseTensor without LoD whose header
    lies in ``head`` (a per-variable file of ``save_persistables``, the common case), parsed
    straight from those bytes; None for anything else (the general parsers decide)."""
    if head[:16] != _PLAIN_PREFIX or len(head) < 20:
        return None
    desc_len = _I32.unpack_from(head, 16)[0]
    if not 0 <= desc_len <= MAX_DESC_LEN or 20 + desc_len > len(head):
        return None
    data = 20 + desc_len
    found = _plain_desc(head, 20, data)
    if found is None:
        try:
            found = parse_tensor_desc(head[20:data])
        except (FormatError, pb.DecodeError):
            return None
    code, dims = found
    numel = 1
    for d in dims:
        numel *= d
    nbytes = numel * ITEMSIZE[code]
    if data + nbytes != blob.size:
        return None  # cut, or more streams follow (save_combine)
    dtype, disk = DTYPES[code]
    span = Span(blob.path, data, nbytes, disk_dtype=disk)
    return VarInfo("", dtype, dims, nbytes=nbytes, span=span, attrs={"lod": []})


def parse_dense(r: Window, pos: int) -> Stream:
    """``SerializeToStream`` of a DenseTensor: version, LoD levels, tensor body."""
    if r.u32(pos) != 0:
        raise FormatError(f"LoDTensor version at byte {pos} is not 0")
    levels = r.u64(pos + 4)
    if levels > MAX_LOD_LEVELS:
        raise FormatError(f"lod_level {levels} exceeds {MAX_LOD_LEVELS}")
    at, lod, lod_bytes = pos + 12, [], 0
    for _ in range(levels):
        length = r.u64(at)
        if length % 8:
            raise FormatError(f"LoD level of {length} bytes is not a multiple of 8")
        if length > r.size - at - 8:
            raise TruncatedError(f"{r.blob.name}: LoD level of {length} bytes past the end")
        lod_bytes += length
        if lod_bytes <= MAX_LOD_BYTES:
            raw = r.get(at + 8, length)
            lod.append(np.frombuffer(raw, "<u8").astype(np.int64).tolist())
        at += 8 + length
    attrs: dict = {"lod": lod if lod_bytes <= MAX_LOD_BYTES else None}
    if lod_bytes > MAX_LOD_BYTES:
        attrs["lod_note"] = f"{levels} LoD levels, {lod_bytes} bytes: not loaded"
    return _tensor_body(r, at, attrs)


def parse_selected_rows(r: Window, pos: int) -> Stream:
    """SelectedRows: version, row count, int64 rows, int64 height, tensor body (no LoD).

    Only the row count is needed to list it: the header after the rows is at
    ``pos + 12 + 8N`` (spec §3), so the row index itself is read on demand
    (``attrs["rows"]``, a :class:`RowIndex`), unless it already lies in the bytes at hand.
    """
    if r.u32(pos) != 0:
        raise FormatError(f"SelectedRows version at byte {pos} is not 0")
    count = r.u64(pos + 4)
    if count * 8 > r.size - pos - 12:
        raise TruncatedError(f"{r.blob.name}: {count} SelectedRows rows past the end")
    rows_at = pos + 12
    at_hand = r.cached(rows_at, 8 * count)
    after = rows_at + 8 * count
    height = struct.unpack("<q", r.get(after, 8, window=SR_WINDOW))[0]
    rows = RowIndex(r.blob.storage, r.blob.path, rows_at, count, at_hand)
    attrs: dict = {"height": height, "rows": rows, "rows_span": (rows_at, count)}
    stream = _tensor_body(r, after + 8, attrs)
    if stream.var.shape and stream.var.shape[0] != count:
        raise FormatError(f"SelectedRows: {count} rows but value shape {stream.var.shape}")
    stream.var.attrs["selected_rows"] = True
    return stream


class RowIndex(Sequence):
    """The int64 row ids of a SelectedRows tensor, read on first use (one ranged read).

    ``len()`` needs no read; ``array()`` gives them as an int64 ndarray, ``tolist()`` as
    ints; indexing, iteration and ``==`` (against a list, an array or another RowIndex) read
    them too. Pickles without the values it read (a header cache stores the listing only).
    """

    def __init__(self, storage: Storage, path: str, offset: int, count: int,
                 data: bytes | None = None):  # fmt: skip
        self.storage, self.path, self.offset, self.n_rows = storage, path, offset, int(count)
        self._values = None if data is None else _rows_array(data, self.n_rows)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]
        values = state["_values"]
        if values is not None and values.nbytes > 4096:
            state["_values"] = None  # read again when asked
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    @property
    def loaded(self) -> bool:
        return self._values is not None

    def array(self) -> np.ndarray:
        """The row ids (int64, read-only)."""
        if self._values is None:
            with self._lock:
                if self._values is None:
                    n = 8 * self.n_rows
                    data = self.storage.read_range(self.path, self.offset, self.offset + n)
                    if len(data) < n:
                        raise TruncatedError(
                            f"{posixpath.basename(self.path)}: SelectedRows rows end "
                            f"{n - len(data)} bytes early"
                        )
                    self._values = _rows_array(data, self.n_rows)
        return self._values

    def tolist(self) -> list[int]:
        return self.array().tolist()

    def __len__(self) -> int:
        return self.n_rows

    def __getitem__(self, i):
        return self.array()[i].tolist()

    def __iter__(self):
        return iter(self.tolist())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        values = self.array()
        return values if dtype is None else values.astype(dtype)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowIndex):
            other = other.array()
        elif not isinstance(other, (Sequence, np.ndarray)) or isinstance(other, (str, bytes)):
            return NotImplemented
        other = np.asarray(other)
        if other.shape != (self.n_rows,):
            return False
        return bool(np.array_equal(self.array(), other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:  # never reads
        if self._values is None:
            return f"RowIndex({self.n_rows} rows at byte {self.offset}, not read)"
        head = ", ".join(map(str, self._values[:8].tolist()))
        return f"RowIndex([{head}{', …' if self.n_rows > 8 else ''}], {self.n_rows} rows)"


def _rows_array(data: bytes, count: int) -> np.ndarray:
    return np.frombuffer(data, "<i8", count=count).astype(np.int64, copy=False)


def stream_bytes_plausible(head: bytes, exact: bool) -> bool:
    """Cheap detection on the first block only (``exact``: the block is the whole file).

    Every header field visible in the block must be valid; in a whole-file block the bytes
    after a stream must start another stream (``save_combine``).
    """
    pos = 0
    while True:
        rest = head[pos:]
        if len(rest) < 20 or rest[:4] != b"\0\0\0\0":
            return pos > 0 and not exact and len(rest) < 20
        ends = []
        for parse in (_plausible_dense, _plausible_selected_rows):
            try:
                end = parse(rest)
            except (FormatError, pb.DecodeError, struct.error, IndexError):
                continue
            if end is not None:  # the header, TensorDesc included, lies in the block
                ends.append(end)
        if not ends:
            return False
        if any(e >= len(rest) for e in ends):
            return True  # the data runs past the block (or the file is cut: an error row)
        pos += min(ends)


def _desc_end(head: bytes, pos: int) -> int | None:
    """Validate a tensor body header at ``pos``; the end of its data, or None past the head."""
    found = desc_dims(head, pos)
    return None if found is None else found[0]


def desc_dims(head: bytes, pos: int) -> tuple[int, tuple[int, ...]] | None:
    """``_desc_end`` and the tensor's dims."""
    if pos + 8 > len(head):
        return None
    if struct.unpack_from("<I", head, pos)[0] != 0:
        raise FormatError("tensor version")
    desc_len = struct.unpack_from("<i", head, pos + 4)[0]
    if not 0 <= desc_len <= MAX_DESC_LEN:
        raise FormatError("desc length")
    if pos + 8 + desc_len > len(head):
        return None
    code, dims = parse_tensor_desc(head[pos + 8 : pos + 8 + desc_len])
    numel = 1
    for d in dims:
        numel *= d
    return pos + 8 + desc_len + numel * ITEMSIZE[code], dims


def _plausible_dense(head: bytes) -> int | None:
    levels = struct.unpack_from("<Q", head, 4)[0]
    if levels > MAX_LOD_LEVELS:
        raise FormatError("lod_level")
    at = 12
    for _ in range(levels):
        if at + 8 > len(head):
            return None
        length = struct.unpack_from("<Q", head, at)[0]
        if length % 8 or length > 1 << 40:
            raise FormatError("lod length")
        visible = head[at + 8 : min(len(head), at + 8 + length)]
        offsets = np.frombuffer(visible[: len(visible) // 8 * 8], "<u8")
        if len(offsets) and (offsets[0] != 0 or np.any(np.diff(offsets.astype(np.int64)) < 0)):
            raise FormatError("lod offsets")
        at += 8 + length
    return _desc_end(head, at)


def _plausible_selected_rows(head: bytes) -> int | None:
    count = struct.unpack_from("<Q", head, 4)[0]
    if count > 1 << 40:
        raise FormatError("row count")
    visible = head[12 : min(len(head), 12 + 8 * count)]
    rows = np.frombuffer(visible[: len(visible) // 8 * 8], "<i8")
    if len(rows) and (rows.min() < 0 or rows.max() >= 1 << 48):
        raise FormatError("rows")
    at = 12 + 8 * count
    if at + 8 > len(head):
        return None
    return _desc_end(head, at + 8)


def selected_rows_beyond(head: bytes) -> int | None:
    """The height offset ``12 + 8N`` of a SelectedRows stream whose visible row ids are all
    valid but whose header lies past a full first block; None otherwise."""
    if len(head) < HEAD_BLOCK or head[:4] != b"\0\0\0\0":
        return None
    try:
        if _plausible_selected_rows(head) is not None:
            return None  # the header is in the block: guess_can_open decided
    except (FormatError, pb.DecodeError, struct.error, IndexError):
        return None
    return 12 + 8 * struct.unpack_from("<Q", head, 4)[0]
