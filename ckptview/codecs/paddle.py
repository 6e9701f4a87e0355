"""Paddle binary tensor streams (specs/paddle.md §1-§3): per-variable DenseTensor/LoDTensor
files, SelectedRows files, and ``save_combine`` files (streams back to back, named through the
program desc). Also the 2018 trainer's ``epoch_id``/``step_id`` text files."""

from __future__ import annotations

import json
import posixpath
import re
import struct
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import protobuf as pb
from ..io import HEAD_BLOCK, Blob, Storage, TruncatedError
from ..kinds import guess_kind
from ..model import HintsLike, PaddleHints, Span, VarInfo
from .base import Codec, CodecTier, PartialRead

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
ITEMSIZE[22] = 2

MAX_LOD_LEVELS = 64
MAX_DESC_LEN = 4096
MAX_LOD_BYTES = 1 << 20  # larger LoD tables are described, not loaded
MAX_PROGRAM_BYTES = 256 << 20
WINDOW = 4096  # bytes fetched per header read past the cached first block
#: bytes fetched at a SelectedRows height: the height, the tensor version, desc length and
#: TensorDesc (a few dozen bytes; a longer desc costs one more read)
SR_WINDOW = 256

#: VarType codes never saved as tensors (FEED_MINIBATCH, FETCH_LIST, READER, RAW)
NOT_SAVED = {9, 10, 15, 17}
DENSE_TYPES = {7}  # LOD_TENSOR / DENSE_TENSOR

_OPTIMIZER = re.compile(
    r"_(moment\d*|velocity|beta\d_pow_acc|mean_square|mean_grad|squared|linear|inf_norm"
    r"|avg_squared_grad|avg_squared_update|fp32_master|master)_\d+$"
    r"|^learning_rate_\d+$|@LR_DECAY_COUNTER@|^global_step$"
)


def paddle_kind(name: str) -> str:
    """A Paddle variable's kind: accumulators and the learning rate are optimizer state."""
    return "optimizer" if _OPTIMIZER.search(name) else guess_kind(name)


class FormatError(ValueError):
    """The bytes are not (or no longer) a Paddle tensor stream."""


class _Reader:
    """Ranged header reads over a blob: the cached first block, then small windows."""

    def __init__(self, blob: Blob):
        self.blob = blob
        self.size = blob.size
        self._start = 0
        self._buf = blob.head()

    def get(self, offset: int, length: int, window: int = WINDOW) -> bytes:
        end = offset + length
        if offset < 0 or length < 0 or end > self.size:
            raise TruncatedError(
                f"{self.blob.name}: header needs bytes {offset}..{end} but the file has {self.size}"
            )
        if self._start <= offset and end <= self._start + len(self._buf):
            return self._buf[offset - self._start : end - self._start]
        want = max(length, min(window, self.size - offset))
        self._buf, self._start = self.blob.read(offset, want), offset
        return self._buf[:length]

    def cached(self, offset: int, length: int) -> bytes | None:
        """Bytes already at hand (no read), or None."""
        if self._start <= offset and offset + length <= self._start + len(self._buf):
            return self._buf[offset - self._start : offset + length - self._start]
        return None

    def u32(self, offset: int) -> int:
        return struct.unpack("<I", self.get(offset, 4))[0]

    def u64(self, offset: int) -> int:
        return struct.unpack("<Q", self.get(offset, 8))[0]

    def i32(self, offset: int) -> int:
        return struct.unpack("<i", self.get(offset, 4))[0]

    def i64(self, offset: int) -> int:
        return struct.unpack("<q", self.get(offset, 8))[0]


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


def _tensor_body(r: _Reader, pos: int, attrs: dict) -> Stream:
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


def parse_dense(r: _Reader, pos: int) -> Stream:
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


def parse_selected_rows(r: _Reader, pos: int) -> Stream:
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
        self.storage, self.path, self.offset, self.count = storage, path, offset, int(count)
        self._values = None if data is None else _rows_array(data, self.count)
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
                    n = 8 * self.count
                    data = self.storage.read_range(self.path, self.offset, self.offset + n)
                    if len(data) < n:
                        raise TruncatedError(
                            f"{posixpath.basename(self.path)}: SelectedRows rows end "
                            f"{n - len(data)} bytes early"
                        )
                    self._values = _rows_array(data, self.count)
        return self._values

    def tolist(self) -> list[int]:
        return self.array().tolist()

    def __len__(self) -> int:
        return self.count

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
        if other.shape != (self.count,):
            return False
        return bool(np.array_equal(self.array(), other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:  # never reads
        if self._values is None:
            return f"RowIndex({self.count} rows at byte {self.offset}, not read)"
        head = ", ".join(map(str, self._values[:8].tolist()))
        return f"RowIndex([{head}{', …' if self.count > 8 else ''}], {self.count} rows)"


def _rows_array(data: bytes, count: int) -> np.ndarray:
    return np.frombuffer(data, "<i8", count=count).astype(np.int64, copy=False)


def _stream_bytes_plausible(head: bytes, exact: bool) -> bool:
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
    found = _desc_dims(head, pos)
    return None if found is None else found[0]


def _desc_dims(head: bytes, pos: int) -> tuple[int, tuple[int, ...]] | None:
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


def _selected_rows_beyond(head: bytes) -> int | None:
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


class PaddleStreamCodec(Codec):
    """Paddle DenseTensor/LoDTensor and SelectedRows streams, single or ``save_combine``d.

    Hints: ``program`` (path of a ``__model__``/``*.pdmodel`` ProgramDesc or PIR ``*.json``
    naming combined streams), ``names`` (explicit names), ``stream`` (``"selected_rows"`` or
    ``"dense"`` to prefer one interpretation of a one-stream file).
    """

    name = "paddle"
    suffixes = (".pdiparams",)
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        if filename == "__params__" or filename.lower().endswith(self.suffixes):
            return True
        return _stream_bytes_plausible(head, len(head) < 4096)

    def guess_can_open_blob(self, filename: str, head: bytes, blob: Blob) -> bool:
        """A loose SelectedRows file whose row index fills the first block: one small read at
        its height (``12 + 8N``) checks the tensor header and that the stream ends the file."""
        at = _selected_rows_beyond(head)
        if at is None or at + 16 > blob.size:
            return False
        try:
            tail = blob.read(at, min(SR_WINDOW, blob.size - at))
            found = _desc_dims(tail, 8)
            if found is None:  # a TensorDesc longer than the window
                tail = blob.read(at, min(16 + MAX_DESC_LEN, blob.size - at))
                found = _desc_dims(tail, 8)
        except (FormatError, pb.DecodeError, struct.error, TruncatedError):
            return False
        if found is None:
            return False
        end, dims = found
        count = (at - 12) // 8
        height = struct.unpack_from("<q", tail)[0]
        return at + end == blob.size and height >= 0 and bool(dims) and dims[0] == count

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        hints = PaddleHints.of(hints)
        if blob.size == 0:
            raise FormatError("empty file (0 bytes)")
        r = _Reader(blob)
        first = self._first_stream(r, hints.stream)
        streams = [first]
        error = None
        while streams[-1].end < r.size:
            try:
                streams.append(parse_dense(r, streams[-1].end))
            except (FormatError, TruncatedError, pb.DecodeError) as e:
                error = f"stream {len(streams)} at byte {streams[-1].end}: {e}"
                break
        variables = [s.var for s in streams]
        if len(variables) > 1 or hints.program or hints.names:
            self._name_combined(blob, variables, hints, error is not None)
        if error:
            raise PartialRead(variables, f"save_combine file cut or corrupt: {error}")
        return variables

    @staticmethod
    def _first_stream(r: _Reader, prefer: str | None) -> Stream:
        parsers = [parse_dense, parse_selected_rows]
        if prefer == "selected_rows":
            parsers.reverse()
        found, errors = [], []
        for parse in parsers:
            try:
                found.append(parse(r, 0))
            except (FormatError, TruncatedError, pb.DecodeError) as e:
                errors.append(e)
                continue
            if found[-1].end == r.size:
                return found[-1]
        dense = [s for s in found if not s.var.attrs.get("selected_rows")]
        if dense:  # more bytes follow: save_combine
            return dense[0]
        if isinstance(errors[0], TruncatedError):
            raise errors[0]
        raise FormatError(f"not a Paddle tensor stream: {errors[0]}")

    def _name_combined(self, blob: Blob, variables: list[VarInfo], hints: PaddleHints, cut: bool):
        names, source = hints.names, "hint"
        program = hints.program
        if not names and program:
            try:
                names = program_param_names(blob, program, len(variables), cut)
                source = f"program {posixpath.basename(program)}"
            except Exception as e:  # noqa: BLE001 - naming never fails the listing
                names, source = None, f"program {posixpath.basename(program)} unreadable: {e}"
        if len(variables) == 1 and not cut and blob.name in (names or []):
            return  # a per-variable file in a directory with a program: keep the file name
        fits = names is not None and (
            len(names) == len(variables) or (cut and len(names) > len(variables))
        )
        for i, var in enumerate(variables):
            var.attrs["index"] = i
            if fits:
                var.name = names[i]
                var.kind = paddle_kind(var.name)
                var.attrs["name_source"] = source
            else:
                var.name = str(i)
                var.attrs["name_source"] = (
                    "position in save_combine order (sorted names); "
                    + (f"{source} names {len(names)} variables, file has {len(variables)}"
                       if names is not None else source if program else "no program desc found")
                )  # fmt: skip


def program_param_names(blob: Blob, path: str, count: int, cut: bool = False) -> list[str]:
    """Sorted names of the persistable variables a ``save_combine`` of ``program`` holds.

    Tries persistable vars minus FEED/FETCH/RAW/READER first; if that count does not match the
    file, only DENSE_TENSOR ones (save_combine never writes SelectedRows).
    """
    store = blob.storage.blob(path)
    if store.size > MAX_PROGRAM_BYTES:
        raise FormatError(f"program of {store.size} bytes is too large")
    data = store.read(0, store.size)
    if path.lower().endswith(".json") or data[:1] == b"{":
        return sorted(pir_persistable_names(data))
    candidates = program_desc_vars(data)
    names = sorted({n for n, t in candidates if t not in NOT_SAVED})
    if len(names) != count and not cut:
        dense = sorted({n for n, t in candidates if t in DENSE_TYPES})
        if len(dense) == count:
            return dense
    return names


def program_dtypes(storage, path: str) -> dict[str, str]:
    """name -> dtype of the persistable dense variables a program declares (legacy desc or PIR
    JSON); lets pickle readers tell bfloat16 from the uint16 bit patterns pickles hold.

    Remembered per storage and file identity: the ``.pdparams`` and ``.pdopt`` beside one
    program (listed concurrently) read it once.
    """
    info = storage.info(path)
    key = (path, info["size"], info.get("mtime"), info.get("etag"))
    with _PROGRAMS_LOCK:
        memo = _PROGRAMS.setdefault(storage, {})
        if key not in memo:
            memo.clear()  # one program at a time is plenty; keeps the memo bounded
            memo[key] = _program_dtypes(storage.blob(path, info["size"]), path)
        return dict(memo[key])


_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PROGRAMS_LOCK = threading.Lock()


def _program_dtypes(blob: Blob, path: str) -> dict[str, str]:
    if blob.size > MAX_PROGRAM_BYTES:
        raise FormatError(f"program of {blob.size} bytes is too large")
    data = blob.read(0, blob.size)
    if path.lower().endswith(".json") or data[:1] == b"{":
        return _pir_dtypes(json.loads(data))
    out = {}
    for raw in pb.decode(pb.decode(data).get(1, [b""])[0]).get(3, []):
        var = pb.decode(raw)
        if not (var.get(3) and var[3][-1]):
            continue
        vtype = pb.decode(var[2][-1]) if var.get(2) else {}
        tensor = vtype.get(3) or vtype.get(2)  # dense_tensor.tensor, or selected_rows
        if not tensor:
            continue
        desc = pb.decode(tensor[-1])
        desc = pb.decode(desc[1][-1]) if vtype.get(3) and desc.get(1) else desc
        code = desc.get(1, [None])[-1]
        if code in DTYPES:
            out[pb.string(var.get(1, []))] = DTYPES[code][0]
    return out


def _pir_dtypes(doc: dict) -> dict[str, str]:
    out = {}
    for region in doc.get("program", {}).get("regions", []):
        for block in region.get("blocks", [])[:1]:
            for op in block.get("ops", []):
                name = _pir_persistable(op)
                outs = op.get("O")
                first = outs[0] if isinstance(outs, list) and outs else outs
                try:
                    code = first["TT"]["D"][0]["#"]
                except (KeyError, IndexError, TypeError):
                    continue
                dtype = _PIR_DTYPES.get(str(code).rsplit(".", 1)[-1])
                if name and dtype:
                    out[name] = dtype
    return out


_PIR_DTYPES = {
    "t_bool": "bool", "t_i8": "int8", "t_ui8": "uint8", "t_i16": "int16", "t_i32": "int32",
    "t_i64": "int64", "t_f16": "float16", "t_bf16": "bfloat16", "t_f32": "float32",
    "t_f64": "float64", "t_c64": "complex64", "t_c128": "complex128",
    "t_f8e4m3fn": "float8_e4m3fn", "t_f8e5m2": "float8_e5m2", "t_ui16": "uint16",
    "t_ui32": "uint32", "t_ui64": "uint64",
}  # fmt: skip


def program_desc_vars(data: bytes) -> list[tuple[str, int]]:
    """(name, VarType code) of the persistable variables of block 0 of a ProgramDesc."""
    blocks = pb.decode(data).get(1, [])
    if not blocks:
        raise FormatError("ProgramDesc has no blocks")
    out = []
    for raw in pb.decode(blocks[0]).get(3, []):
        var = pb.decode(raw)
        if not (var.get(3) and var[3][-1]):
            continue
        vtype = pb.decode(var[2][-1]).get(1, [-1])[-1] if var.get(2) else -1
        out.append((pb.string(var.get(1, [])), vtype))
    return out


def pir_persistable_names(data: bytes) -> list[str]:
    """Names of the persistable values of a PIR program JSON (parameters, persistable data)."""
    doc = json.loads(data)
    names: set[str] = set()
    for region in doc.get("program", {}).get("regions", []):
        for block in region.get("blocks", [])[:1]:
            for op in block.get("ops", []):
                name = _pir_persistable(op)
                if name:
                    names.add(name)
    return sorted(names)


def _pir_persistable(op: dict) -> str | None:
    kind = str(op.get("#", ""))
    attrs = op.get("A")
    if any(word in kind for word in ("feed", "fetch", "shadow_output")):
        return None
    if kind in ("p", "0.p", "builtin.parameter", "0.parameter") and isinstance(attrs, list):
        strings = [a for a in attrs if isinstance(a, str)]
        if strings:
            return strings[-1]
    if isinstance(attrs, list):
        named = {a.get("N"): a.get("AT", {}).get("D") for a in attrs if isinstance(a, dict)}
        out = {a.get("N"): a.get("AT", {}) for a in op.get("OA", []) if isinstance(a, dict)}
        flag = out.get("persistable", {}).get("D")
        persistable = isinstance(flag, list) and any(
            isinstance(f, dict) and f.get("D") is True for f in flag
        )
        if persistable and isinstance(named.get("name"), str):
            return named["name"]
    return None


class PaddleTextIntCodec(Codec):
    """The 2018 trainer's ``epoch_id``/``step_id`` files: ``str(int)`` ASCII, one int64 0-d.

    Never guessed; layouts assign it by name.
    """

    name = "paddle-text-int"
    priority = CodecTier.ASSIGNED

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return False

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        if blob.size > 64:
            raise FormatError(f"{blob.size} bytes is too long for an integer text file")
        text = blob.read(0, blob.size).decode("ascii", "replace").strip()
        try:
            value = int(text)
        except ValueError:
            raise FormatError(f"not an integer: {text[:40]!r}") from None
        return [VarInfo("", "int64", (), nbytes=blob.size, kind="trainer", locator=value)]

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        return np.array(var.locator, dtype=np.int64)


def read_text_int(text: str) -> int | None:
    """``int(f.read().strip())`` as the trainer does; None when it is not an integer."""
    try:
        return int(text.strip())
    except ValueError:
        return None
