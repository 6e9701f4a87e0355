"""torch.distributed.checkpoint (DCP): a ``.metadata`` pickle + ``__<rank>_<n>.distcp`` files.

Listing reads only ``.metadata`` (restricted unpickler; specs/modern.md §2): every logical
tensor's dtype, global shape and chunks. Names follow ``planner_data`` (the original key path
joined with "/", e.g. ``model/fc1.weight``). Values are assembled from the chunks: each chunk is
a ``[offset, offset + length)`` range of a ``.distcp`` file holding a complete ``torch.save``
zip (the default TORCH_SAVE format), or raw bytes. Non-tensor items (BytesStorageMetadata) are
listed as dtype ``object``; reading one unpickles its small ``torch.save`` record.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import np_dtype
from ..formats.dcp_budget import check_entries, check_metadata_bytes
from ..formats.pickle import TORCH_WEIGHTS_ONLY, Record, TensorRef, TorchDtype, load_pickle
from ..formats.relpath import inside
from ..formats.torch_pickle import leaves, open_torch, open_torch_zip, read_tensor
from ..io import Blob, Storage, TruncatedError
from ..model import VarInfo
from .base import Codec, CodecTier

MAX_METADATA = 1 << 30
DCP = "torch.distributed.checkpoint.metadata."


@dataclass
class Chunk:
    """One stored piece of a logical tensor."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str  # relative to the checkpoint dir
    offset: int
    length: int


class TorchDCPCodec(Codec):
    """A DCP checkpoint, opened through its ``.metadata`` (or ``__<rank>.metadata``) file."""

    name = "torch_dcp"
    priority = CodecTier.CONTAINER

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        named = filename == ".metadata" or (
            filename.startswith("__") and filename.endswith(".metadata")
        )
        return named and head[:1] == b"\x80" and b"torch.distributed.checkpoint" in head

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        if blob.size > MAX_METADATA:
            raise ValueError(f"{blob.name}: {blob.size} bytes is too large for DCP metadata")
        check_metadata_bytes(blob.name, blob.read, blob.size)  # entry budget, before unpickling
        meta = load_pickle(blob, lazy_min=None)
        if not (isinstance(meta, Record) and meta.cls == DCP + "Metadata"):
            raise ValueError(f"{blob.name}: not a DCP Metadata pickle")
        fields = meta.fields()
        check_entries(blob.name, fields)
        entries = fields.get("state_dict_metadata")
        if not isinstance(entries, dict):
            raise ValueError(f"{blob.name}: Metadata without state_dict_metadata")
        storage = _storage_index(fields.get("storage_data"))
        planner = fields.get("planner_data") if isinstance(fields.get("planner_data"), dict) else {}
        out = []
        for fqn, entry in entries.items():
            name = _name(fqn, planner.get(fqn))
            try:
                out.append(_var(name, str(fqn), entry, storage))
            except (ValueError, TypeError, AttributeError) as e:
                out.append(VarInfo(name, "object", (), error=f"{type(e).__name__}: {e}"[:300]))
        check_items(blob, out)
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        chunks: list[Chunk] = var.locator
        root = posixpath.dirname(blob.path)
        if var.dtype == "object":
            if not chunks:
                raise ValueError(f"{var.name}: no stored item")
            return _object_value(_slice(blob.storage, root, chunks[0]))
        dt = np_dtype(var.dtype)
        out = np.zeros(var.shape, dtype=dt)
        storage = blob.storage

        def values(chunk: Chunk) -> np.ndarray:
            return _chunk_values(storage, root, chunk, dt)

        # on remote storage the chunks (in several rank files) are read concurrently
        pieces = storage.map_window(values, chunks, cost=lambda c: max(0, c.length))
        for chunk, piece in zip(chunks, pieces):
            index = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))
            out[index] = piece
        return out


    def spans(self, blob: Blob, var: VarInfo) -> list[tuple[str, int, int]]:
        """Each chunk's item in its rank file."""
        root = posixpath.dirname(blob.path)
        return [(posixpath.join(root, c.file), c.offset, c.length)
                for c in var.locator or () if isinstance(c, Chunk) and inside(c.file)]  # fmt: skip


def check_items(blob: Blob, variables: list[VarInfo]) -> None:
    """What ``dcp.load`` needs of the data files, checked without reading tensor bytes: each
    item's file exists and holds its byte range; a tensor item is a ``torch.save`` record
    that ``torch.load(weights_only=True)`` accepts holding a tensor of the chunk's shape, or
    raw bytes of the chunk's size; a bytes item's record parses (the default planner loads it
    with ``weights_only=False``). The first problem of a variable becomes its ``error``."""
    root = posixpath.dirname(blob.path)
    sizes: dict[str, int | None] = {}
    seen: dict[tuple, str | None] = {}  # an item several chunks name is checked once
    storage = blob.storage
    if storage.remote:  # every item's record read at once (a few small GETs each)
        todo: dict[tuple, tuple[Chunk, str]] = {}
        for var in variables:
            for chunk in () if var.error else var.locator or ():
                key = (chunk.file, chunk.offset, chunk.length, chunk.sizes, var.dtype)
                todo.setdefault(key, (chunk, var.dtype))
        for chunk, _dtype in todo.values():  # sizes first (the listing's): no races below
            if inside(chunk.file) and chunk.file not in sizes:
                sizes[chunk.file] = _file_size(storage, posixpath.join(root, chunk.file))

        def check(item: tuple[Chunk, str]) -> str | None:
            return _item_problem(storage, root, item[0], item[1], sizes)

        seen.update(zip(todo, storage.map_window(check, list(todo.values()))))
    for var in variables:
        if var.error:
            continue
        for chunk in var.locator or ():
            key = (chunk.file, chunk.offset, chunk.length, chunk.sizes, var.dtype)
            if key not in seen:
                seen[key] = _item_problem(blob.storage, root, chunk, var.dtype, sizes)
            if seen[key]:
                var.error = seen[key]
                break


def _file_size(storage: Storage, path: str) -> int | None:
    """A rank file's size (the listing's on async filesystems), None when it is missing."""
    try:
        return int(storage.blob(path).size)
    except (FileNotFoundError, KeyError):
        return None


def _item_problem(storage: Storage, root: str, chunk: Chunk, dtype: str,
                  sizes: dict[str, int | None]) -> str | None:  # fmt: skip
    if not inside(chunk.file):
        return f"relative_path {chunk.file!r} leaves the checkpoint directory"
    if chunk.file not in sizes:
        sizes[chunk.file] = _file_size(storage, posixpath.join(root, chunk.file))
    size = sizes[chunk.file]
    if size is None:
        return f"{chunk.file}: missing"
    if chunk.offset < 0 or chunk.length < 0 or chunk.offset + chunk.length > size:
        return f"{chunk.file}: item at {chunk.offset}+{chunk.length} beyond its {size} bytes"
    item = _slice(storage, root, chunk)
    try:
        try:
            saved = open_torch_zip(item)  # a torch.save record (the default)
        except ValueError as e:  # else raw bytes (no record): only their size can tell
            if "not a zip archive" not in str(e) or dtype == "object":
                raise
            want = _prod(chunk.sizes) * np_dtype(dtype).itemsize
            if chunk.length != want:
                return f"{chunk.file}@{chunk.offset}: {e}; as raw bytes {chunk.length}, the tensor needs {want}"
            return None
        if dtype == "object":  # the planner's load_bytes: torch.load(weights_only=False)
            return None  # parsed (a code-running global is refused)
        dt = np_dtype(dtype)
        want = _prod(chunk.sizes) * dt.itemsize
        refused = sorted(saved.globals - TORCH_WEIGHTS_ONLY)
        if refused:
            return f"{chunk.file}@{chunk.offset}: weights_only refuses {refused[:3]}"
        found = [t for _, t in leaves(saved.obj) if isinstance(t, TensorRef)]
        if len(found) != 1:
            return f"{chunk.file}@{chunk.offset}: {len(found)} tensors in one item"
        t = found[0]
        if tuple(t.shape) != tuple(chunk.sizes):
            return f"{chunk.file}@{chunk.offset}: a tensor of shape {list(t.shape)}, the chunk is {list(chunk.sizes)}"
        rec = saved.records.get(t.storage.key) if t.storage is not None else None
        if rec is None:
            return f"{chunk.file}@{chunk.offset}: the tensor's storage record is missing"
        if rec.size < want:
            return f"{chunk.file}@{chunk.offset}: storage of {rec.size} bytes, the chunk needs {want}"
    except (ValueError, TypeError, KeyError, AttributeError, EOFError, UnicodeDecodeError,
            TruncatedError) as e:  # fmt: skip
        return f"{chunk.file}@{chunk.offset}: {type(e).__name__}: {e}"[:300]
    return None


def _storage_index(storage_data: Any) -> dict[tuple[str, tuple | None], tuple[str, int, int]]:
    """(fqn, chunk offsets) -> (relative file, offset, length)."""
    out = {}
    if not isinstance(storage_data, dict):
        return out
    for key, info in storage_data.items():
        k = key.fields() if isinstance(key, Record) else {}
        v = info.fields() if isinstance(info, Record) else {}
        fqn, offset = k.get("fqn"), k.get("offset")
        path, at, length = v.get("relative_path"), v.get("offset"), v.get("length")
        if (
            isinstance(fqn, str)
            and isinstance(path, str)
            and isinstance(at, int)
            and isinstance(length, int)
        ):
            out[(fqn, tuple(offset) if offset is not None else None)] = (path, at, length)
    return out


def _name(fqn: Any, path: Any) -> str:
    if isinstance(path, (tuple, list)) and path:
        return "/".join(str(p) for p in path)
    return str(fqn)


def _var(name: str, fqn: str, entry: Any, storage: dict) -> VarInfo:
    if not isinstance(entry, Record):
        raise ValueError(f"unexpected metadata entry {type(entry).__name__}")
    fields = entry.fields()
    if entry.cls == DCP + "BytesStorageMetadata":
        where = storage.get((fqn, None))
        var = VarInfo(name, "object", (), nbytes=where[2] if where else 0, kind=None)
        var.locator = [Chunk((), (), *where)] if where else []
        if not where:
            var.error = "no storage entry for this item"
        return var
    if entry.cls != DCP + "TensorStorageMetadata":
        raise ValueError(f"unknown metadata entry {entry.cls}")
    props = fields.get("properties")
    dtype = _dtype(props)
    shape = tuple(int(d) for d in fields.get("size") or ())
    var = VarInfo(name, dtype, shape)
    var.nbytes = var.numel * np_dtype(dtype).itemsize
    chunks, missing = [], 0
    for c in fields.get("chunks") or []:
        cf = c.fields() if isinstance(c, Record) else {}
        offsets, sizes = tuple(cf.get("offsets") or ()), tuple(cf.get("sizes") or ())
        where = storage.get((fqn, offsets))
        if where is None or len(offsets) != len(shape) or len(sizes) != len(shape):
            missing += 1
            continue
        if any(o + s > d for o, s, d in zip(offsets, sizes, shape, strict=True)):
            raise ValueError(f"chunk {offsets}+{sizes} outside the tensor {shape}")
        chunks.append(Chunk(offsets, sizes, *where))
    var.locator = chunks
    var.attrs["chunks"] = len(chunks)
    files = sorted({c.file for c in chunks})
    var.attrs["files"] = files
    if missing:
        var.error = f"{missing} chunk(s) without a storage entry"
    elif sum(_prod(c.sizes) for c in chunks) < var.numel:
        var.error = "chunks do not cover the tensor"
    return var


def _dtype(props: Any) -> str:
    state = props.state if isinstance(props, Record) else None
    if isinstance(state, tuple) and state and isinstance(state[0], TorchDtype):
        return state[0].dtype
    fields = props.fields() if isinstance(props, Record) else {}
    if isinstance(fields.get("dtype"), TorchDtype):
        return fields["dtype"].dtype
    raise ValueError("tensor properties without a dtype")


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- chunk reading ----------------------------------------------------------------------------
def _slice(storage: Storage, root: str, chunk: Chunk) -> Blob:
    """The chunk's byte range as a Blob of its own (offset 0 = the chunk's first byte)."""
    if not inside(chunk.file):
        raise ValueError(f"relative_path {chunk.file!r} leaves the checkpoint directory")
    path = posixpath.join(root, chunk.file)
    return storage.blob(path).slice(chunk.offset, chunk.length)


def _chunk_values(storage: Storage, root: str, chunk: Chunk, dt: np.dtype) -> np.ndarray:
    blob = _slice(storage, root, chunk)
    want = _prod(chunk.sizes) * dt.itemsize
    if blob.head(4) != b"PK\x03\x04":  # raw bytes (no torch.save wrapper)
        if chunk.length != want:
            raise ValueError(f"{chunk.file}: item of {chunk.length} bytes, tensor needs {want}")
        return np.frombuffer(blob.read(0, want), dtype=dt).reshape(chunk.sizes)
    saved = open_torch(blob)  # a torch.save'd tensor, read as a file of its own
    found = [(name, t) for name, t in leaves(saved.obj) if isinstance(t, TensorRef)]
    tensors = [t for name, t in found if name == ""] or [t for _, t in found]
    if len(tensors) != 1:
        raise ValueError(f"{chunk.file}@{chunk.offset}: expected one tensor, found {len(found)}")
    arr = read_tensor(blob, tensors[0], saved.records, saved.big_endian)
    if tuple(arr.shape) != tuple(chunk.sizes):
        raise ValueError(f"chunk shape {arr.shape} != {chunk.sizes}")
    return arr.astype(dt, copy=False)


def _object_value(blob: Blob) -> np.ndarray:
    """A torch.save'd non-tensor value (int, float, str, list …) as a numpy array."""
    # a zip: data.pkl with its local header in one ranged read; else a bare pickle
    value = open_torch(blob).obj if blob.head(4) == b"PK\x03\x04" else load_pickle(blob)
    if isinstance(value, (bool, int, float, complex)) or (
        isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in value)
    ):
        return np.asarray(value)
    out = np.empty((), dtype=object)
    out[()] = value
    return out
