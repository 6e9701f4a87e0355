"""safetensors: an 8-byte header length, a JSON header, then one flat little-endian buffer.

Listing costs two reads (the length, then the header); values are Spans into the buffer.
The header's ``__metadata__`` (string -> string) is kept in every variable's
``attrs["metadata"]``.
"""

from __future__ import annotations

import gc
import json
import struct
import threading
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np

from ..dtypes import np_dtype, packed_nbytes, unpack_bits
from ..formats.safetensors import DTYPES, PACKED, gap_problem, metadata_problem
from ..formats.small import check_depth, loads_json
from ..io import Blob
from ..model import Piece, Span, VarColumns, VarInfo
from .base import Codec, CodecTier, PartialRead

#: the reference parser refuses larger headers
MAX_HEADER = 100 * 1024 * 1024


class SafetensorsCodec(Codec):
    """``*.safetensors`` files (huggingface/safetensors format)."""

    name = "safetensors"
    suffixes = (".safetensors",)
    save_suffixes = suffixes
    priority = CodecTier.FORMAT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        if filename.lower().endswith(self.suffixes):
            return True
        if len(head) < 10 or head[8:10] not in (b'{"', b"{ ", b"{}"):
            return False
        (n,) = struct.unpack("<Q", head[:8])
        return 2 <= n <= MAX_HEADER

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo] | VarColumns:
        raw, data_start = header_bytes(blob)
        with gc_paused() if len(raw) >= GC_PAUSE_BYTES else nullcontext():
            header = parse_header(blob, raw, walk=False, dupes=False)
            columns = _columns(blob, header, data_start)
            if columns is not None:
                meta = header.get("__metadata__")
                extra = 1 if type(meta) is dict and "data_offsets" in meta else 0
                check_duplicates(blob, raw, header, len(columns) + extra)
                begins = np.asarray(columns.offsets, np.int64) - data_start
                gap = gap_problem(begins, begins + np.asarray(columns.nbytes, np.int64),
                                  blob.size - data_start)  # fmt: skip
                if gap:
                    raise PartialRead(columns, f"{blob.name}: {gap}")
                return columns
            check_depth(header)  # the unusual entries and metadata are kept: check them all
            check_duplicates(blob, raw, header)
            return self._variables(blob, header, data_start)

    @staticmethod
    def _variables(blob: Blob, header: dict, data_start: int) -> list[VarInfo]:
        meta = header.pop("__metadata__", None)
        if meta is not None and not isinstance(meta, dict):
            raise ValueError("__metadata__ is not a JSON object")
        refused = metadata_problem(meta)  # a tensor named __metadata__, a value not a string
        path, size = blob.path, blob.size
        meta = dict(meta) if meta else None  # one copy, shared by the file's variables
        out: list[VarInfo] = []
        append = out.append
        beyond: list[str] = []
        info_of = _INFO.get
        # hot loop (a million entries on big trees, tests/test_scale.py): well-formed entries
        # are checked and built inline; anything unusual goes through _entry_var
        for name, entry in header.items():
            if type(entry) is dict:
                code = entry.get("dtype")
                shape = entry.get("shape")
                offsets = entry.get("data_offsets")
                info = info_of(code) if type(code) is str else None
                if (
                    info is not None
                    and type(shape) is list
                    and type(offsets) is list
                    and len(offsets) == 2
                ):
                    begin, end = offsets
                    if type(begin) is int and type(end) is int and 0 <= begin <= end:
                        numel = 1
                        for d in shape:
                            if type(d) is not int or d < 0:
                                break
                            numel *= d
                        else:
                            nbytes = end - begin
                            if numel * info[1] == nbytes:
                                offset = data_start + begin
                                if offset + nbytes > size:
                                    beyond.append(name)
                                    continue
                                attrs = {"safetensors_dtype": code}
                                if meta:
                                    attrs["metadata"] = meta
                                span = Span(path, offset, nbytes, "C", info[2])
                                append(VarInfo(name, info[0], tuple(shape), nbytes, None, None,
                                               span, None, attrs))  # fmt: skip
                                continue
            var = _entry_var(path, name, entry, data_start)
            if meta:
                var.attrs["metadata"] = meta
            if var.span is not None and var.span.offset + var.span.length > size:
                beyond.append(name)
                continue
            append(var)
        clash = overlapping(out)
        if clash:
            raise ValueError(
                f"{blob.name}: tensors {clash[0]!r} and {clash[1]!r} share bytes (the "
                "safetensors loader refuses overlapping data_offsets)"
            )
        if meta and "DCP_SHARDING_INFO" in meta:
            _mark_pieces(out, meta["DCP_SHARDING_INFO"])
        if beyond:
            raise PartialRead(
                out,
                f"truncated: {len(beyond)} tensor(s) end beyond the file "
                f"(buffer holds {size - data_start} bytes), e.g. {beyond[0]!r}",
            )
        if refused is None and all(v.span is not None for v in out):
            spans = [(v.span.offset - data_start, v.span.length) for v in out if v.span]
            refused = gap_problem([b for b, _ in spans], [b + n for b, n in spans],
                                  size - data_start)  # fmt: skip
        if refused:
            raise PartialRead(out, f"{blob.name}: {refused}")
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        if var.dtype == "object":  # unknown dtype code: the raw bytes
            data = blob.read(var.span.offset, var.span.length)
            return np.frombuffer(data, dtype=np.uint8)
        packed = PACKED.get(var.attrs.get("safetensors_dtype", ""))
        if packed is not None:
            data = blob.read(var.span.offset, var.span.length)
            codes = unpack_bits(data, var.numel, packed[1])
            return codes.view(np_dtype(var.dtype)).reshape(var.shape)
        return super().read(blob, var)

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int):
        if var.attrs.get("safetensors_dtype") in PACKED:
            yield self.read(blob, var).reshape(-1)
            return
        yield from super().iter_chunks(blob, var, max_bytes)


def _columns(blob: Blob, header: dict, data_start: int) -> VarColumns | None:
    """A header's variables as columns when every entry is well formed, lies inside the
    file and none overlaps; None (the caller's general path) for anything else: a malformed
    or packed entry, DCP sharding info, metadata that is not a flat string map."""
    meta = header.get("__metadata__")
    if meta is not None:
        if type(meta) is not dict or "DCP_SHARDING_INFO" in meta:
            return None
        if any(type(v) is not str for v in meta.values()):
            return None
        meta = dict(meta) or None
    size = blob.size
    items = {k: v for k, v in header.items() if k != "__metadata__"} if meta else header
    if "__metadata__" in items or "" in items:  # null metadata, an unnamed tensor
        return None
    names = list(items)
    entries = list(items.values())
    if not entries:
        return VarColumns(blob.path, [], [], [], *(np.empty(0, np.int64) for _ in range(3)),
                          [], [], "safetensors_dtype", meta)  # fmt: skip
    if len(entries) <= SMALL_HEADER:
        return _small_columns(blob.path, names, entries, size, data_start, meta)
    # column by column (comprehensions and C-level maps, no per-entry appends); anything
    # unusual (a missing field, a list where a dict is, an unhashable code) returns None
    try:
        if set(map(type, entries)) != {dict}:
            return None
        infos = list(map(_INFO.get, [e["dtype"] for e in entries]))
        raw_shapes = [e["shape"] for e in entries]
        spans = [e["data_offsets"] for e in entries]
        if None in infos or set(map(type, raw_shapes)) != {list}:
            return None
        if set(map(type, spans)) != {list} or set(map(len, spans)) != {2}:
            return None
        begins = [b for b, _ in spans]
        ends = [e for _, e in spans]
        if set(map(type, begins)) != {int} or set(map(type, ends)) != {int}:
            return None
        keys = list(map(tuple, raw_shapes))
        numel_of: dict[tuple, int] = {}
        for key in set(keys):  # each distinct shape once
            numel = _dims_numel(key)
            if numel is None:
                return None
            numel_of[key] = numel
        canon = {key: key for key in numel_of}  # one tuple per distinct shape
        shapes = list(map(canon.__getitem__, keys))
        numels = list(map(numel_of.__getitem__, keys))
        numel_a = np.array(numels, np.int64)
        begin_a = np.array(begins, np.int64)
        end_a = np.array(ends, np.int64)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    nbytes_a = end_a - begin_a
    offsets_a = begin_a + data_start
    itemsize_a = np.array([i[1] for i in infos], np.int64)
    if (
        int(begin_a.min()) < 0
        or int(nbytes_a.min()) < 0
        or not np.array_equal(numel_a * itemsize_a, nbytes_a)
        or int((offsets_a + nbytes_a).max()) > size
        or _overlap(offsets_a, nbytes_a) is not None
    ):
        return None  # the general path says which entry and why
    dtypes = [i[0] for i in infos]
    disks = [i[2] for i in infos]
    codes = [i[3] for i in infos]
    return VarColumns(blob.path, names, dtypes, shapes, numel_a, nbytes_a, offsets_a, disks,
                      codes, "safetensors_dtype", meta)  # fmt: skip


def _dims_numel(dims: tuple) -> int | None:
    """The element count of a shape whose dims are all non-negative ints, else None."""
    numel = 1
    for d in dims:
        if type(d) is not int or d < 0:
            return None
        numel *= d
    return numel


#: headers of at most this many entries are checked in one Python loop: below it, the
#: column-wise pass's fixed cost (a dozen passes, numpy checks) is most of a file's listing
SMALL_HEADER = 256


def _small_columns(path: str, names: list[str], entries: list, size: int, data_start: int,
                   meta: dict | None) -> VarColumns | None:  # fmt: skip
    """:func:`_columns` for a small header: the same checks, entry by entry, and the same
    columns (None where it gives None)."""
    dtypes: list[str] = []
    shapes: list[tuple] = []
    numels: list[int] = []
    begins: list[int] = []
    nbytes: list[int] = []
    disks: list[str] = []
    codes: list[str] = []
    known: dict[tuple, tuple[int, tuple]] = {}  # shape -> (numel, the one tuple kept for it)
    info_of = _INFO.get
    try:
        for e in entries:
            if type(e) is not dict:
                return None
            code, shape, span = e["dtype"], e["shape"], e["data_offsets"]
            info = info_of(code)
            if info is None or type(shape) is not list or type(span) is not list:
                return None
            if len(span) != 2:
                return None
            begin, end = span
            if type(begin) is not int or type(end) is not int or begin < 0 or end < begin:
                return None
            seen = known.get(key := tuple(shape))
            if seen is None:
                numel = _dims_numel(key)
                if numel is None:
                    return None
                seen = known[key] = (numel, key)
            numel, key = seen
            if numel * info[1] != end - begin:
                return None
            dtypes.append(info[0])
            shapes.append(key)
            numels.append(numel)
            begins.append(begin)
            nbytes.append(end - begin)
            disks.append(info[2])
            codes.append(info[3])
    except (KeyError, TypeError):
        return None
    order = sorted(zip(begins, nbytes))  # by offset, then end: empty tensors first
    if max(b + n for b, n in order) + data_start > size:
        return None
    for (b0, n0), (b1, _) in zip(order, order[1:]):
        if b1 < b0 + n0:
            return None  # overlapping spans: the general path names them
    offsets = np.array(begins, np.int64)
    offsets += data_start
    return VarColumns(path, names, dtypes, shapes, np.array(numels, np.int64),
                      np.array(nbytes, np.int64), offsets, disks, codes, "safetensors_dtype",
                      meta)  # fmt: skip


def _overlap(begin: np.ndarray, sizes: np.ndarray) -> int | None:
    """The position (in byte order) of a span overlapping the next, else None."""
    if len(begin) < 2:
        return None
    end = begin + sizes
    order = np.lexsort((end, begin))  # empty tensors first at a shared offset
    bad = np.nonzero(begin[order][1:] < end[order][:-1])[0]
    return int(bad[0]) if len(bad) else None


def read_header(blob: Blob) -> tuple[dict, int]:
    """The parsed JSON header and the absolute offset of the byte buffer (two reads)."""
    raw, data_start = header_bytes(blob)
    return parse_header(blob, raw), data_start


def header_bytes(blob: Blob) -> tuple[bytes, int]:
    """The raw JSON header and the absolute offset of the byte buffer (two reads)."""
    if blob.size < 8:
        raise ValueError(f"{blob.name}: {blob.size} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", blob.read(0, 8))
    if n > MAX_HEADER:
        raise ValueError(f"{blob.name}: header length {n} exceeds the {MAX_HEADER}-byte limit")
    if 8 + n > blob.size:
        raise ValueError(f"{blob.name}: header length {n} runs past the end of the file")
    return blob.read(8, n), 8 + n


def parse_header(blob: Blob, raw: bytes, walk: bool = True, dupes: bool = True) -> dict:
    """The header as a dict; ``walk=False``: not checked for deep nesting (the caller checks
    what it keeps); ``dupes=False``: not checked for names given twice (the caller calls
    :func:`check_duplicates`)."""
    try:
        header = loads_json(raw.decode("utf-8"), walk)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{blob.name}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{blob.name}: header is not a JSON object")
    if dupes:
        check_duplicates(blob, raw, header)
    return header


def check_duplicates(blob: Blob, raw: bytes, header: dict, entries: int | None = None) -> None:
    """ValueError when the header names a tensor twice (JSON keeps the last); ``entries``:
    how many of the header's values are objects with ``data_offsets``, when known."""
    if entries is None:
        entries = sum(1 for e in header.values() if type(e) is dict and "data_offsets" in e)
    if raw.count(b'"data_offsets"') != entries:  # a name twice, or the word in a string
        dupes = _duplicate_names(raw)
        if dupes:
            raise ValueError(
                f"{blob.name}: header names {dupes[0]!r} twice (the safetensors loader "
                "refuses duplicate keys)"
            )


def _duplicate_names(raw: bytes) -> list[str]:
    """Top-level names a header holds more than once (the slow, exact check)."""
    dupes: list[str] = []

    def pairs(items: list) -> dict:
        seen: dict = {}
        for k, v in items:
            if k in seen and isinstance(v, dict) and "data_offsets" in v:
                dupes.append(k)
            seen[k] = v
        return seen

    json.loads(raw, object_pairs_hook=pairs)
    return dupes


def overlapping(variables: list[VarInfo]) -> tuple[str, str] | None:
    """Two variables whose byte spans overlap (the safetensors loader refuses the file)."""
    spans = [(v.span.offset, v.span.length, v.name) for v in variables if v.span is not None]
    if len(spans) < 2:
        return None
    begin = np.fromiter((s[0] for s in spans), np.int64, len(spans))
    end = begin + np.fromiter((s[1] for s in spans), np.int64, len(spans))
    order = np.lexsort((end, begin))  # empty tensors first at a shared offset
    bad = np.nonzero(begin[order][1:] < end[order][:-1])[0]
    if not len(bad):
        return None
    i = int(bad[0])
    return spans[order[i]][2], spans[order[i + 1]][2]


#: headers at least this long are parsed with the cyclic GC paused: parsing allocates a few
#: acyclic containers per entry, and the collector's passes over them (and over everything
#: else alive) cost more than the parse itself on big trees
GC_PAUSE_BYTES = 16 << 10
_GC_LOCK = threading.Lock()
_GC_HOLDS = 0
_GC_RESTORE = False


@contextmanager
def gc_paused():
    """Pause the cyclic garbage collector; nests across threads (the last one out restores
    it, and only if it was enabled when the first one came in)."""
    global _GC_HOLDS, _GC_RESTORE
    with _GC_LOCK:
        if _GC_HOLDS == 0:
            _GC_RESTORE = gc.isenabled()
            gc.disable()
        _GC_HOLDS += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_HOLDS -= 1
            if _GC_HOLDS == 0 and _GC_RESTORE:
                gc.enable()


def _entry_var(path: str, name: str, entry: object, data_start: int) -> VarInfo:
    """One header entry as a VarInfo; a malformed entry becomes a variable with an error."""
    if not isinstance(entry, dict):
        return VarInfo(name, "object", (), error="header entry is not an object")
    code = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not (isinstance(shape, list) and all(_is_uint(d) for d in shape)):
        return VarInfo(name, "object", (), error=f"bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
        return VarInfo(name, "object", tuple(shape), error=f"bad data_offsets {offsets!r}")
    begin, end = offsets
    if end < begin:
        return VarInfo(name, "object", tuple(shape), error=f"data_offsets {offsets} decrease")
    span = Span(path, data_start + begin, end - begin)
    attrs = {"safetensors_dtype": code}
    if not isinstance(code, str):
        return VarInfo(name, "object", tuple(shape), error=f"bad dtype {code!r}"[:200])
    if code in PACKED:
        dtype, bits = PACKED[code]
        var = VarInfo(name, dtype, tuple(shape), nbytes=end - begin, span=span, attrs=attrs)
        span.disk_dtype = f"packed{bits}"
        want = packed_nbytes(var.numel, bits)
        if want != end - begin:
            var.error = f"{code}{list(shape)} needs {want} bytes, data_offsets give {end - begin}"
        return var
    info = _INFO.get(code) if isinstance(code, str) else None
    if info is None:  # safetensors refuses a dtype it does not define: the raw bytes, in error
        return VarInfo(name, "object", tuple(shape), nbytes=end - begin, span=span, attrs=attrs,
                       error=f"unknown safetensors dtype {code!r}: safe_open refuses the file")
    dtype, itemsize, disk, _ = info
    var = VarInfo(name, dtype, tuple(shape), nbytes=end - begin, span=span, attrs=attrs)
    want = var.numel * itemsize
    if want != end - begin:
        var.error = f"{code}{list(shape)} needs {want} bytes, data_offsets give {end - begin}"
    else:
        span.disk_dtype = disk
    return var


def _dtype_info(code: str, name: str) -> tuple[str, int, str | None, str]:
    """(dtype name, itemsize, little-endian disk dtype for multi-byte numeric types, code)."""
    dt = np_dtype(name)
    disk = dt.newbyteorder("<").str if dt.kind in "iufc" and dt.itemsize > 1 else None
    return name, dt.itemsize, disk, code


#: safetensors dtype code -> (ckptview dtype, itemsize, Span.disk_dtype, the code itself: one
#: string shared by every variable), computed once
_INFO = {code: _dtype_info(code, name) for code, name in DTYPES.items()}


def _is_uint(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _mark_pieces(variables: list[VarInfo], info: Any) -> None:
    """DCP-written shards (``HuggingFaceStorageWriter``): each tensor's ``saved_offsets`` in
    the full tensor, from ``__metadata__["DCP_SHARDING_INFO"]`` (a JSON object)."""
    try:
        table = loads_json(info) if isinstance(info, str) else None
    except ValueError:
        table = None
    if not isinstance(table, dict):
        for var in variables:
            var.error = var.error or "DCP_SHARDING_INFO is not a JSON object"
        return
    for var in variables:
        entry = table.get(var.name)
        offsets = entry.get("saved_offsets") if isinstance(entry, dict) else None
        if offsets is None:
            continue
        if not (isinstance(offsets, list) and len(offsets) == len(var.shape)
                and all(type(o) is int and o >= 0 for o in offsets)):  # fmt: skip
            var.error = var.error or f"bad saved_offsets {offsets!r:.80}"
            continue
        var.attrs["piece"] = Piece(None, tuple(offsets), placement="DCP saved_offsets")
