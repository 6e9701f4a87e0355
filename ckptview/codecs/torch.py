"""PyTorch ``torch.save`` files: the zip format (any archive prefix, zip64) and the legacy format.

The pickle (``data.pkl``) goes through the restricted unpickler; storages are located from the
zip's central directory (zip) or from the storage table after the pickles (legacy). A tensor
whose view is C- or F-contiguous gets a ``Span``; other views (shared storages with their own
offset/stride) are read from the storage range with ``as_strided``. Non-tensor leaves become
small variables: numbers as 0-d, lists of numbers as 1-d, strings as ``object``. See
specs/modern.md §1.

**Requests per zip file: a constant, whatever the number of tensors.** Listing reads the tail
(end of central directory), the central directory, and ``data.pkl`` with the small records
written next to it (``byteorder``, ``.storage_alignment``), headers and payloads in one ranged
read -- 3 or 4 requests, the first 4 KiB being the Blob's cached head. The storages' local
headers are not read: PyTorchStreamWriter aligns every payload (:func:`._zip.aligned_offset`),
so each offset is predicted from the directory. A prediction is trusted for listing only when

* the records read with ``data.pkl`` sit exactly where the prediction puts them (the archive was
  written with that alignment: 64, or the ``.storage_alignment`` record's), and
* the directory agrees with it for this record (:func:`._zip.packed`: the next record starts
  right after the predicted payload and its data descriptor);

any other record (archives of other zip writers, hand-made ones) has its local header read, all
of them in one batch, as before. A predicted offset is still *verified when the values are
read*: a var holds ``Span(offset=predicted)`` and ``locator=("check", ZipRecord)``, and
:meth:`TorchCodec.read` / :meth:`TorchCodec.iter_chunks` fetch the local header in the same
ranged read as the values (the read starts at the header, ≤ ~128 bytes earlier), compare it
with the prediction and, if it disagrees, read again at the exact offset. Records whose header
lay in bytes read anyway (the cached head) are verified at listing and carry no check.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import dtype_name, np_dtype
from ..io import HEAD_BLOCK, Blob, TruncatedError
from ..model import Span, VarInfo
from ..unpickle import (
    ArrayRef,
    LazyBytes,
    Record,
    StorageRef,
    TensorRef,
    Unpickler,
    flatten,
    torch_persistent_load,
)
from ._zip import (
    DEFAULT_ALIGNMENT,
    Directory,
    ZipEntry,
    aligned_offset,
    header_check,
    locate,
    packed,
    read_directory,
    read_members,
    read_ranges,
)
from ._zip import read as zip_read
from .base import Codec, PartialRead, iter_span_chunks

ZIP_MAGIC = b"PK\x03\x04"
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
MAX_LIST = 4096  # lists of numbers longer than this are not shown as variables
PICKLE_PREFETCH = 1 << 20  # data.pkl bytes read with its header; the rest streams (lazily)
FAR = 64 << 10  # values this far into a record: its header is fetched as a range of its own


# -- zip directory ----------------------------------------------------------------------------
def zip_entries(blob: Blob) -> Directory:
    """The archive's members from its central directory (see :mod:`._zip`)."""
    return read_directory(blob)


def payload_offsets(blob: Blob, entries: dict, names: list[str]) -> dict[str, tuple[int, int]]:
    """name -> (payload offset, size) of STORED records, from their local headers (one batch)."""
    names = [n for n in names if n in entries]
    found = locate(blob, [entries[n] for n in names])
    out = {}
    for name, got in zip(names, found, strict=True):
        e = entries[name]
        if isinstance(got, Exception):
            raise got
        if e.compress_type != 0 or e.compress_size != e.file_size:
            raise ValueError(f"zip record {name} is compressed (torch writes stored records)")
        out[name] = (got[0], e.file_size)
    return out


@dataclass(frozen=True)
class ZipRecord:
    """A storage's bytes: ``size`` bytes at ``offset``. ``entry`` is set while the offset is a
    prediction from the central directory that no local header has confirmed yet."""

    offset: int
    size: int
    entry: ZipEntry | None = None

    def fetch(self, blob: Blob, at: int, n: int) -> tuple[int, bytes]:
        """``n`` bytes at ``at`` within the record, and the record's checked offset. A
        predicted offset is checked against the local header, read in the same request when
        the bytes are near the record's start (else in the same batch); if it is wrong, the
        bytes are read again at the exact offset."""
        if at < 0 or n < 0 or at + n > self.size:
            raise ValueError(f"bytes {at}+{n} outside a storage record of {self.size}")
        e = self.entry
        if e is None:
            return self.offset, blob.read(self.offset + at, n)
        lead = self.offset - e.header_offset  # local header + name + extra, as predicted
        if at <= FAR:
            data = zip_read(blob, e.header_offset, lead + at + n)
            header, values = data[:lead], data[lead + at :]
        else:
            header, values = read_ranges(
                blob, [(e.header_offset, self.offset), (self.offset + at, self.offset + at + n)]
            )
        exact = header_check(e, header)
        if exact == self.offset:
            return exact, values
        if exact + self.size > blob.size:
            raise TruncatedError(f"zip member {e.filename} runs past the end of the file")
        return exact, blob.read(exact + at, n)


def _zip_records(blob: Blob, entries: Directory, names: list[str],
                 alignment: int | None) -> dict[str, ZipRecord]:  # fmt: skip
    """name -> ZipRecord: predicted (to check on read) where ``alignment`` is known and the
    directory agrees with it, else from the local headers (one batch)."""
    out: dict[str, ZipRecord] = {}
    trusted = packed(entries, alignment) if alignment else set()
    held = min(HEAD_BLOCK, blob.size)
    rest = []
    for name in names:
        e = entries[name]
        if name not in trusted:
            rest.append(name)
            continue
        offset = aligned_offset(e, alignment)
        if offset <= held:  # its local header is in the cached head: check it now
            try:
                exact = header_check(e, blob.head()[e.header_offset : offset])
            except ValueError:
                exact = -1
            if exact != offset:
                rest.append(name)
                continue
            out[name] = ZipRecord(offset, e.file_size)
        else:
            out[name] = ZipRecord(offset, e.file_size, e)
    for name, (offset, size) in payload_offsets(blob, entries, rest).items():
        out[name] = ZipRecord(offset, size)
    return out


# -- leaves to variables ----------------------------------------------------------------------
def _scalar_list(node: Any) -> bool:
    if not isinstance(node, (list, tuple)) or not node or len(node) > MAX_LIST:
        return False
    return all(isinstance(v, (bool, int, float)) for v in node) or all(
        isinstance(v, str) for v in node
    )


def _contiguous(size: tuple[int, ...], stride: tuple[int, ...], order: str) -> bool:
    dims = list(zip(size, stride, strict=True))
    if order == "C":
        dims.reverse()
    expect = 1
    for n, s in dims:
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _disk_dtype(dtype: str, big_endian: bool) -> str | None:
    if not big_endian:
        return None
    dt = np_dtype(dtype)
    return dt.newbyteorder(">").str if dt.itemsize > 1 else None


def tensor_var(name: str, t: TensorRef, record: ZipRecord | tuple[int, int] | None, path: str,
               big_endian: bool = False) -> VarInfo:  # fmt: skip
    """A torch tensor's VarInfo: a Span when the view is contiguous, else a strided locator.
    A record whose offset is a prediction adds ``locator=("check", record)`` to the Span."""
    attrs = {"storage_offset": t.storage_offset, "stride": t.stride}
    if t.requires_grad:
        attrs["requires_grad"] = True
    if t.is_parameter:
        attrs["parameter"] = True
    var = VarInfo(name, t.dtype, t.size, attrs=attrs)
    if t.array is not None:
        return array_var(name, t.array, path)
    try:
        dt = np_dtype(t.dtype)
    except TypeError:
        var.error = f"dtype {t.dtype} is not supported"
        return var
    var.nbytes = var.numel * dt.itemsize
    st = t.storage
    if st is None:
        var.error = "tensor without storage (meta tensor)"
        return var
    attrs.update(storage=st.key, storage_nbytes=st.nbytes)
    if record is None:
        var.error = f"storage record {st.key} missing"
        return var
    if not isinstance(record, ZipRecord):
        record = ZipRecord(*record)
    rec_offset, rec_size = record.offset, record.size
    storage_bytes = st.nbytes
    if rec_size < storage_bytes:
        var.error = f"storage {st.key} holds {rec_size} bytes, needs {storage_bytes}"
        return var
    if len(t.stride) != len(t.size) or min(t.stride, default=0) < 0 or t.storage_offset < 0:
        var.error = "tensor with an invalid stride or offset"
        return var
    if var.numel:
        last = t.storage_offset + sum((n - 1) * s for n, s in zip(t.size, t.stride, strict=True))
        if (last + 1) * dt.itemsize > storage_bytes:
            var.error = f"view reaches element {last} beyond storage {st.key}"
            return var
    start = rec_offset + t.storage_offset * dt.itemsize
    disk = _disk_dtype(t.dtype, big_endian)
    native = disk is not None or not big_endian
    for order in ("C", "F"):
        if native and _contiguous(t.size, t.stride, order):
            var.span = Span(path, start, var.nbytes, order=order, disk_dtype=disk)
            if record.entry is not None:
                var.locator = ("check", record)
            return var
    where = record if record.entry is not None else rec_offset
    var.locator = ("strided", where, t.storage_offset, t.size, t.stride, big_endian)
    return var


def array_var(name: str, a: ArrayRef, path: str) -> VarInfo:
    """A pickled numpy array's VarInfo (a Span when its bytes are a raw file range)."""
    if a.dtype is None:
        return VarInfo(name, "object", (), error="numpy array without a dtype")
    dtype = dtype_name(a.dtype)
    var = VarInfo(name, dtype, a.shape, attrs={"numpy": True})
    if a.dtype.hasobject:
        var.nbytes = 0
        var.locator = ("array", a)
        return var
    var.nbytes = a.nbytes
    data = a.data
    have = len(data) if data is not None else 0
    if isinstance(data, LazyBytes) and data.transform is None and data.blob is not None:
        if have < a.nbytes:
            var.error = f"array data holds {have} bytes, needs {a.nbytes}"
            return var
        order = "F" if a.fortran_order else "C"
        disk = a.dtype.str if a.dtype.byteorder not in ("=", "|") else None
        if a.dtype.kind == "V" or (disk and disk[0] == ("<" if sys.byteorder == "little" else ">")):
            disk = None
        var.span = Span(data.blob.path, data.offset, a.nbytes, order=order, disk_dtype=disk)
        return var
    if not isinstance(data, LazyBytes) and have < a.nbytes:
        var.error = f"array data holds {have} bytes, needs {a.nbytes}"
        return var
    var.locator = ("array", a)
    return var


def value_var(name: str, value: Any) -> VarInfo | None:
    """A non-tensor leaf: numbers as 0-d, lists of numbers as 1-d, strings as object."""
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, str) for v in value):
            return VarInfo(name, "object", (len(value),), nbytes=0, locator=("value", list(value)))
        arr = np.asarray(value)
        if arr.dtype == object or arr.ndim != 1:
            return None
    elif isinstance(value, (bool, int, float, complex, np.generic)):
        arr = np.asarray(value)
        if arr.dtype == object:
            return VarInfo(name, "object", (), nbytes=0, locator=("value", value))
    elif isinstance(value, (str, bytes)):
        return VarInfo(name, "object", (), nbytes=0, locator=("value", value))
    elif isinstance(value, Record):
        return VarInfo(name, "object", (), nbytes=0, locator=("value", repr(value)))
    else:
        return None
    return VarInfo(
        name, dtype_name(arr.dtype), arr.shape, nbytes=arr.nbytes, locator=("value", arr)
    )


def leaves(obj: Any) -> list[tuple[str, Any]]:
    """Flattened leaves, lists of plain scalars kept whole."""
    return flatten(obj, keep=_scalar_list)


def leaf_var(name: str, leaf: Any, blob: Blob, records: dict, big_endian: bool) -> VarInfo | None:
    if isinstance(leaf, TensorRef):
        rec = records.get(leaf.storage.key) if leaf.storage is not None else None
        return tensor_var(name, leaf, rec, blob.path, big_endian)
    if isinstance(leaf, StorageRef):
        t = TensorRef(leaf, 0, (leaf.numel,), (1,), leaf.dtype)
        return tensor_var(name, t, records.get(leaf.key), blob.path, big_endian)
    if isinstance(leaf, ArrayRef):
        return array_var(name, leaf, blob.path)
    return value_var(name, leaf)


def read_locator(blob: Blob, var: VarInfo) -> np.ndarray:
    """Values of a variable without a Span (strided views, in-memory arrays, plain values)."""
    loc = var.locator
    kind = loc[0] if isinstance(loc, tuple) else None
    if kind == "value":
        value = loc[1]
        if var.dtype == "object":
            out = np.empty(var.shape, dtype=object)
            out[...] = value if var.shape == () else np.array(value, dtype=object)
            return out
        return np.asarray(value)
    if kind == "array":
        return loc[1].read(blob)
    if kind == "strided":
        _, where, offset, size, stride, big_endian = loc
        dt = np_dtype(var.dtype)
        if var.numel == 0:
            return np.empty(size, dtype=dt)
        span = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if isinstance(where, ZipRecord):  # a predicted offset, checked by this read
            raw = where.fetch(blob, offset * dt.itemsize, span * dt.itemsize)[1]
        else:
            raw = blob.read(where + offset * dt.itemsize, span * dt.itemsize)
        flat = _decode(raw, dt, big_endian)
        strides = [s * dt.itemsize for s in stride]
        return np.lib.stride_tricks.as_strided(flat, shape=size, strides=strides).copy()
    raise ValueError(f"{var.name}: no locator to read")


def _decode(raw: bytes, dt: np.dtype, big_endian: bool) -> np.ndarray:
    if not big_endian or dt.itemsize == 1:
        return np.frombuffer(raw, dtype=dt)
    if dt.kind in "biufc":
        return np.frombuffer(raw, dtype=dt.newbyteorder(">")).astype(dt)
    swapped = np.frombuffer(raw, dtype=f">u{dt.itemsize}").astype(f"<u{dt.itemsize}")
    return swapped.view(dt)


# -- opening a file: the object and its storage records -------------------------------------
@dataclass
class TorchFile:
    """What a torch file holds: the unpickled object (tensors as unread references) and each
    storage's bytes (key -> ZipRecord)."""

    obj: Any
    records: dict[str, ZipRecord]
    big_endian: bool = False
    problem: str | None = None  # the legacy storage table could not be read: no records


def open_torch(blob: Blob, *, views_ok: bool = False) -> TorchFile:
    """Unpickle a torch file's object and locate its storages, zip or legacy (see the module
    docstring for the requests a zip file costs). ``views_ok``: accept pre-0.4 legacy storage
    views (their storages are located; the views are not)."""
    if blob.head().startswith(LEGACY_MAGIC):
        return _open_legacy(blob, views_ok)
    return _open_zip(blob)


def _open_zip(blob: Blob) -> TorchFile:
    entries = zip_entries(blob)
    if not entries:
        raise ValueError("empty zip archive")
    prefix = next(iter(entries)).split("/", 1)[0]
    pkl = f"{prefix}/data.pkl"
    if pkl not in entries:
        raise ValueError(f"no {pkl} in the archive (not a torch.save file)")
    for name in entries:
        if name == pkl or name.startswith(f"{prefix}/data/"):
            e = entries[name]
            if e.compress_type != 0 or e.compress_size != e.file_size:
                raise ValueError(f"zip record {name} is compressed (torch writes stored records)")
    # data.pkl and the small records beside it: headers and payloads in one read
    small = [pkl] + [
        n for n in (f"{prefix}/byteorder", f"{prefix}/.storage_alignment") if n in entries
    ]
    got = dict(zip(small, read_members(blob, [entries[n] for n in small], PICKLE_PREFETCH),
                   strict=True))  # fmt: skip
    big_endian = False
    if f"{prefix}/byteorder" in got:
        big_endian = got[f"{prefix}/byteorder"][1][:16].strip() == b"big"
    alignment = DEFAULT_ALIGNMENT
    if f"{prefix}/.storage_alignment" in got:
        text = got[f"{prefix}/.storage_alignment"][1][:16].strip()
        alignment = int(text) if text.isdigit() and 0 < int(text) <= 1 << 20 else 0
    if alignment and any(aligned_offset(entries[n], alignment) != got[n][0] for n in small):
        alignment = 0  # not where PyTorchStreamWriter puts them: no predictions
    storages = [n for n in entries if n.startswith(f"{prefix}/data/")]
    found = _zip_records(blob, entries, storages, alignment or None)
    at, head = got[pkl]
    n = entries[pkl].file_size
    u = Unpickler(blob, offset=at, end=at + n, persistent_load=torch_persistent_load)
    u.src.hold(at, head)
    obj = u.load()
    skip = len(prefix) + 6
    records = {k[skip:]: v for k, v in found.items()}
    return TorchFile(obj, records, big_endian)


def _open_legacy(blob: Blob, views_ok: bool) -> TorchFile:
    views: list[Any] = []

    def persistent_load(pid: Any) -> StorageRef:
        if isinstance(pid, tuple) and len(pid) > 5 and pid[5] is not None:
            views.append(pid)
        return torch_persistent_load(pid)

    u = Unpickler(blob, persistent_load=persistent_load)
    u.load()  # magic number
    protocol = u.load()
    sys_info = u.load()
    if protocol != 1001:
        raise ValueError(f"legacy torch file with protocol version {protocol!r}")
    if isinstance(sys_info, dict) and sys_info.get("little_endian") is False:
        raise ValueError("big-endian legacy torch files are not supported")
    obj = u.load()
    if views and not views_ok:
        raise ValueError("pre-0.4 storage views in a legacy torch file are not supported")
    storages = {
        leaf.storage.key: leaf.storage
        for _, leaf in leaves(obj)
        if isinstance(leaf, TensorRef) and leaf.storage is not None
    }
    storages.update({s.key: s for _, s in leaves(obj) if isinstance(s, StorageRef)})
    records: dict[str, ZipRecord] = {}
    problem = None
    try:
        keys = u.load()
        if not isinstance(keys, list):
            raise ValueError("legacy storage key list missing")
        records = _legacy_records(u, blob, keys, storages)
    except (TruncatedError, ValueError, EOFError) as e:
        problem = f"legacy storage table: {e}"
    return TorchFile(obj, records, False, problem)


def _legacy_records(u: Unpickler, blob: Blob, keys: list, storages: dict) -> dict:
    """Each storage's data range from the table after the pickles: an 8-byte element count
    then the data, per listed key. Counts the unpickler holds already are not read again."""
    pos = u.pos
    records, where = {}, []
    for key in keys:
        st = storages.get(str(key))
        if st is None:
            raise ValueError(f"storage {key} listed but never referenced")
        where.append(pos)
        records[str(key)] = ZipRecord(pos + 8, st.nbytes)
        pos += 8 + st.nbytes
        if pos > blob.size:
            raise TruncatedError(f"storage {key} ends at {pos}, beyond {blob.size} bytes")
    counts = [u.src.cached(at, 8) for at in where]
    todo = [i for i, raw in enumerate(counts) if raw is None]
    got = blob.storage.read_ranges(blob.path, [(where[i], where[i] + 8) for i in todo])
    for i, raw in zip(todo, got, strict=True):
        counts[i] = raw
    for key, raw in zip(keys, counts, strict=True):
        (count,) = struct.unpack("<q", raw)
        if count != storages[str(key)].numel:
            raise ValueError(f"storage {key}: table says {count} elements, pickle says "
                             f"{storages[str(key)].numel}")  # fmt: skip
    return records


# -- the codec --------------------------------------------------------------------------------
class TorchCodec(Codec):
    """``torch.save`` files: zip (``<prefix>/data.pkl`` + ``data/<key>``) or legacy pickles."""

    name = "torch"
    priority = 30

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        if head.startswith(LEGACY_MAGIC):
            return True
        if not head.startswith(ZIP_MAGIC) or len(head) < 30:
            return False
        nlen = struct.unpack("<H", head[26:28])[0]
        first = head[30 : 30 + nlen]
        return first.endswith(b"/data.pkl") or filename.lower().endswith(SUFFIXES)

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        t = open_torch(blob)
        variables = self._variables(t.obj, blob, t.records, t.big_endian)
        if t.problem:
            raise PartialRead(variables, t.problem)
        return variables

    def _variables(self, obj: Any, blob: Blob, records: dict, big_endian: bool) -> list[VarInfo]:
        out = []
        for name, leaf in leaves(obj):
            var = leaf_var(name, leaf, blob, records, big_endian)
            if var is not None:
                out.append(var)
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        rec = _unchecked(var)
        if rec is not None:  # the Span's offset is a prediction: checked by this very read
            span = var.span
            dt = _span_dtype(var)
            want = var.numel * dt.itemsize
            if span.length < want:
                raise ValueError(f"{var.name}: span of {span.length} bytes, values need {want}")
            data = rec.fetch(blob, span.offset - rec.offset, want)[1]
            arr = np.frombuffer(data, dtype=dt, count=var.numel)
            arr = arr.reshape(var.shape, order=span.order)
            target = np_dtype(var.dtype)
            return arr.astype(target) if arr.dtype != target else arr
        if var.span is not None:
            return super().read(blob, var)
        return read_locator(blob, var)

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
        rec = _unchecked(var)
        if rec is None or var.span.order != "C" or var.numel == 0:
            yield from super().iter_chunks(blob, var, max_bytes)
            return
        # the first piece comes with the local header's check; the rest from the exact offset
        span, dt, target = var.span, _span_dtype(var), np_dtype(var.dtype)
        first = min(var.numel, max(1, max_bytes // max(1, dt.itemsize)))
        at = span.offset - rec.offset
        exact, data = rec.fetch(blob, at, first * dt.itemsize)
        arr = np.frombuffer(data, dtype=dt, count=first)
        yield arr.astype(target) if arr.dtype != target else arr
        if var.numel > first:
            rest = var.numel - first
            offset = exact + at + first * dt.itemsize
            tail = Span(span.path, offset, rest * dt.itemsize, disk_dtype=span.disk_dtype)
            more = VarInfo(var.name, var.dtype, (rest,), span=tail)
            yield from iter_span_chunks(blob.storage, more, max_bytes)


def _unchecked(var: VarInfo) -> ZipRecord | None:
    """The record of a Span whose offset is a prediction (to check when reading)."""
    loc = var.locator
    if var.span is not None and isinstance(loc, tuple) and len(loc) == 2 and loc[0] == "check":
        return loc[1]
    return None


def _span_dtype(var: VarInfo) -> np.dtype:
    return np_dtype(var.span.disk_dtype or var.dtype)
