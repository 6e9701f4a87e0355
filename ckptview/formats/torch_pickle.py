"""torch's pickle conventions: a ``torch.save`` file opened to its unpickled object (tensors
as unread :class:`~ckptview.formats.pickle.TensorRef`) and each storage's bytes, zip (any
archive prefix, zip64) or legacy; storages named by persistent ids
(:func:`torch_persistent_load`). The torch global stand-ins (``_rebuild_tensor_v2`` & co.) are
in the pickle allowlist (:mod:`ckptview.formats.pickle.torch_globals`). See specs/modern.md §1.

**Requests per zip file: a constant, whatever the number of tensors.** Listing reads the tail
(end of central directory), the central directory, and ``data.pkl`` with the small records
written next to it (``byteorder``, ``.storage_alignment``), headers and payloads in one ranged
read -- 3 or 4 requests, the first 4 KiB being the Blob's cached head. The storages' local
headers are not read: PyTorchStreamWriter aligns every payload (zip ``aligned_offset``), so
each offset is predicted from the directory. A prediction is trusted for listing only when

* the records read with ``data.pkl`` sit exactly where the prediction puts them (the archive was
  written with that alignment: 64, or the ``.storage_alignment`` record's), and
* the directory agrees with it for this record (zip ``packed``: the next record starts right
  after the predicted payload and its data descriptor);

any other record (archives of other zip writers, hand-made ones) has its local header read, all
of them in one batch, as before. A predicted offset is still *verified when the values are
read*: a var holds ``Span(offset=predicted)`` and ``locator=("check", ZipRecord)``, and the
torch codec's ``read`` / ``iter_chunks`` fetch the local header in the same ranged read as the
values (:meth:`ZipRecord.fetch`: the read starts at the header, ≤ ~128 bytes earlier), compare
it with the prediction and, if it disagrees, read again at the exact offset. Records whose header
lay in bytes read anyway (the cached head) are verified at listing and carry no check.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import np_dtype
from ..io import HEAD_BLOCK, Blob, TruncatedError
from .pickle import (
    InertClasses,
    Record,
    RestrictedUnpicklingError,
    StorageRef,
    StorageType,
    TensorRef,
    Unpickler,
    flatten,
)
from .zipdir import (
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
from .zipdir import read as zip_read

ZIP_MAGIC = b"PK\x03\x04"
LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
PICKLE_PREFETCH = 1 << 20  # data.pkl bytes read with its header; the rest streams (lazily)
FAR = 64 << 10  # values this far into a record: its header is fetched as a range of its own
MAX_LIST = 4096  # lists of numbers longer than this are not shown as variables
#: ``torch.save(model)`` pickles the module objects: their classes stand in as inert Records
INERT = InertClasses()
MODULE_FIELDS = ("_parameters", "_buffers", "_modules")


def torch_persistent_load(pid: Any) -> StorageRef:
    """Torch's storage persistent id ``('storage', type, key, location, numel[, view])``."""
    if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
        raise RestrictedUnpicklingError(f"unsupported persistent id {str(pid)[:80]}")
    stype, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if not isinstance(stype, StorageType):
        raise RestrictedUnpicklingError("persistent id without a storage type")
    if not isinstance(numel, int) or numel < 0:
        raise RestrictedUnpicklingError("persistent id with a bad numel")
    return StorageRef(str(key), stype.dtype, int(numel), str(location), stype.name)


def _scalar_list(node: Any) -> bool:
    if not isinstance(node, (list, tuple)) or not node or len(node) > MAX_LIST:
        return False
    return all(isinstance(v, (bool, int, float)) for v in node) or all(
        isinstance(v, str) for v in node
    )


def leaves(obj: Any) -> list[tuple[str, Any]]:
    """Flattened leaves, lists of plain scalars kept whole; a pickled ``nn.Module`` as its
    ``state_dict`` would name it (``conv1.weight``)."""
    return flatten(_as_state_dicts(obj), keep=_scalar_list)


def is_module(node: Any) -> bool:
    """A pickled ``nn.Module``: a Record whose state holds parameters, buffers and children,
    or a TorchScript module (``__torch__.*``: its attributes are its tensors and children)."""
    if not isinstance(node, Record):
        return False
    return is_script(node) or all(f in node.fields() for f in MODULE_FIELDS)


def is_script(node: Any) -> bool:
    return isinstance(node, Record) and node.cls.startswith("__torch__.")


def module_classes(obj: Any) -> dict[str, str]:
    """``state_dict`` name prefix -> the class each pickled module stood in for."""
    out: dict[str, str] = {}
    if is_module(obj):
        _walk_module(obj, "", {}, out)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if is_module(value):
                _walk_module(value, f"{key}/", {}, out)
    return out


def _as_state_dicts(obj: Any) -> Any:
    """A module (or a dict of modules, ``{"model": model, ...}``) as its state dict."""
    if is_module(obj):
        return _walk_module(obj, "", {}, {})
    if isinstance(obj, dict) and any(is_module(v) for v in obj.values()):
        return {k: _walk_module(v, "", {}, {}) if is_module(v) else v for k, v in obj.items()}
    return obj


def _walk_module(module: Record, prefix: str, into: dict, classes: dict[str, str],
                 depth: int = 0) -> dict:  # fmt: skip
    """``Module.state_dict``: parameters, persistent buffers, then each child's, dot-joined."""
    if depth > 256:
        raise ValueError("modules nested more than 256 deep")
    fields = module.fields()
    classes[prefix] = module.cls
    if is_script(module):  # TorchScript: tensors and submodules are plain attributes
        for name, value in fields.items():
            if is_module(value):
                _walk_module(value, f"{prefix}{name}.", into, classes, depth + 1)
            elif isinstance(value, TensorRef):
                into[f"{prefix}{name}"] = value
        return into
    transient = fields.get("_non_persistent_buffers_set") or ()
    for group in ("_parameters", "_buffers"):
        for name, value in _items(fields.get(group)):
            if value is not None and not (group == "_buffers" and name in transient):
                into[f"{prefix}{name}"] = value
    for name, child in _items(fields.get("_modules")):
        if is_module(child):
            _walk_module(child, f"{prefix}{name}.", into, classes, depth + 1)
    return into


def _items(group: Any) -> list[tuple[str, Any]]:
    if isinstance(group, Record):  # an OrderedDict subclass kept as a Record
        group = group.fields()
    return [(str(k), v) for k, v in group.items()] if isinstance(group, dict) else []


# -- zip directory ----------------------------------------------------------------------------
def zip_entries(blob: Blob) -> Directory:
    """The archive's members from its central directory (see :mod:`.zipdir`)."""
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
                 alignment: int) -> dict[str, ZipRecord]:  # fmt: skip
    """name -> ZipRecord: predicted (to check on read) where ``alignment`` is known (not 0)
    and the directory agrees with it, else from the local headers (one batch)."""
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


# -- opening a file: the object and its storage records -------------------------------------
@dataclass
class TorchFile:
    """What a torch file holds: the unpickled object (tensors as unread references) and each
    storage's bytes (key -> ZipRecord)."""

    obj: Any
    records: dict[str, ZipRecord]
    big_endian: bool = False
    problem: str | None = None  # the legacy storage table could not be read: no records
    #: every global the pickle names (``module.name``): what a safe loader is asked to accept
    globals: frozenset[str] = frozenset()


def open_torch(blob: Blob, *, views_ok: bool = False) -> TorchFile:
    """Unpickle a torch file's object and locate its storages, zip or legacy (see the module
    docstring for the requests a zip file costs). ``views_ok``: accept pre-0.4 legacy storage
    views (their storages are located; the views are not)."""
    if blob.head().startswith(LEGACY_MAGIC):
        return _open_legacy(blob, views_ok)
    return _open_zip(blob)


def open_torch_zip(blob: Blob) -> TorchFile:
    """:func:`open_torch` of a zip without the first block's read (records inside a container
    whose magic is known: the directory, ``data.pkl`` and nothing of the storages)."""
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
    found = _zip_records(blob, entries, storages, alignment)
    at, head = got[pkl]
    n = entries[pkl].file_size
    u = Unpickler(blob, offset=at, end=at + n, persistent_load=torch_persistent_load,
                  allow=INERT)  # fmt: skip
    u.src.hold(at, head)
    obj = u.load()
    skip = len(prefix) + 6
    records = {k[skip:]: v for k, v in found.items()}
    return TorchFile(obj, records, big_endian, globals=u.globals_named)


def _open_legacy(blob: Blob, views_ok: bool) -> TorchFile:
    views: list[Any] = []

    def persistent_load(pid: Any) -> StorageRef:
        if isinstance(pid, tuple) and len(pid) > 5 and pid[5] is not None:
            views.append(pid)
        return torch_persistent_load(pid)

    u = Unpickler(blob, persistent_load=persistent_load, allow=INERT)
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
    return TorchFile(obj, records, False, problem, u.globals_named)


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
    held = [u.src.cached(at, 8) for at in where]
    todo = [i for i, raw in enumerate(held) if raw is None]
    got = blob.read_ranges([(where[i], where[i] + 8) for i in todo])
    fetched = dict(zip(todo, got, strict=True))
    counts = [raw if raw is not None else fetched[i] for i, raw in enumerate(held)]
    for key, raw in zip(keys, counts, strict=True):
        (count,) = struct.unpack("<q", raw)
        if count != storages[str(key)].numel:
            raise ValueError(f"storage {key}: table says {count} elements, pickle says "
                             f"{storages[str(key)].numel}")  # fmt: skip
    return records


# -- reading values ---------------------------------------------------------------------------
def read_view(blob: Blob, where: ZipRecord | int, offset: int, size: tuple[int, ...],
              stride: tuple[int, ...], dt: np.dtype, big_endian: bool = False) -> np.ndarray:  # fmt: skip
    """A strided view's values (``offset``/``stride`` in elements) of the storage at ``where``
    (a record, checked by this read if its offset is a prediction, or a file offset): one
    ranged read of the bytes the view spans."""
    if math.prod(size) == 0:
        return np.empty(size, dtype=dt)
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if isinstance(where, ZipRecord):
        raw = where.fetch(blob, offset * dt.itemsize, span * dt.itemsize)[1]
    else:
        raw = blob.read(where + offset * dt.itemsize, span * dt.itemsize)
    flat = _decode(raw, dt, big_endian)
    strides = [s * dt.itemsize for s in stride]
    return np.lib.stride_tricks.as_strided(flat, shape=size, strides=strides).copy()


def read_tensor(blob: Blob, t: TensorRef, records: dict[str, ZipRecord],
                big_endian: bool = False) -> np.ndarray:  # fmt: skip
    """The values of a tensor of a file opened by :func:`open_torch` (``records``: its
    storages' bytes)."""
    if t.storage is None:
        raise ValueError("tensor without storage (meta tensor)")
    record = records.get(t.storage.key)
    if record is None:
        raise ValueError(f"storage record {t.storage.key} missing")
    if len(t.stride) != len(t.size) or min(t.stride, default=0) < 0 or t.storage_offset < 0:
        raise ValueError("tensor with an invalid stride or offset")
    dt = np_dtype(t.dtype)
    return read_view(blob, record, t.storage_offset, t.size, t.stride, dt, big_endian)


def _decode(raw: bytes, dt: np.dtype, big_endian: bool) -> np.ndarray:
    if not big_endian or dt.itemsize == 1:
        return np.frombuffer(raw, dtype=dt)
    if dt.kind in "biufc":
        return np.frombuffer(raw, dtype=dt.newbyteorder(">")).astype(dt)
    swapped = np.frombuffer(raw, dtype=f">u{dt.itemsize}").astype(f"<u{dt.itemsize}")
    return swapped.view(dt)
