"""VarInfo rows for the leaves of an unpickled object -- torch tensors (a Span when the view is
contiguous, else a strided locator), numpy arrays, plain values -- and reading back the rows
without a Span (:func:`read_locator`). Shared by the torch and Paddle pickle codecs.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..dtypes import dtype_name, np_dtype
from ..io import Blob
from ..model import Piece, Span, VarInfo
from .pickle import ArrayRef, DTensorRef, LazyBytes, Record, StorageRef, TensorRef
from .torch_pickle import ZipRecord, read_view


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
    size, stride, offset = t.size, t.stride, t.storage_offset
    numel = 1
    for n in size:
        numel *= int(n)
    var.nbytes = numel * dt.itemsize
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
    if len(stride) != len(size) or min(stride, default=0) < 0 or offset < 0:
        var.error = "tensor with an invalid stride or offset"
        return var
    if numel:
        if len(size) == 1:
            last = offset + (size[0] - 1) * stride[0]
        else:
            last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if (last + 1) * dt.itemsize > storage_bytes:
            var.error = f"view reaches element {last} beyond storage {st.key}"
            return var
    start = rec_offset + offset * dt.itemsize
    disk = _disk_dtype(t.dtype, big_endian) if big_endian else None
    if disk is not None or not big_endian:  # values in native order, or read as disk_dtype
        order: str | None = "C"  # the common case: 1-D, C order
        if not (len(size) == 1 and (size[0] == 1 or stride[0] == 1)):
            order = next((o for o in ("C", "F") if _contiguous(size, stride, o)), None)
        if order is not None:
            var.span = Span(path, start, var.nbytes, order, disk)
            if record.entry is not None:
                var.locator = ("check", record)
            return var
    where = record if record.entry is not None else rec_offset
    var.locator = ("strided", where, offset, size, stride, big_endian)
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


def leaf_var(name: str, leaf: Any, blob: Blob, records: dict, big_endian: bool) -> VarInfo | None:
    if isinstance(leaf, TensorRef):
        rec = records.get(leaf.storage.key) if leaf.storage is not None else None
        return tensor_var(name, leaf, rec, blob.path, big_endian)
    if isinstance(leaf, DTensorRef):
        return dtensor_var(name, leaf, blob, records, big_endian)
    if isinstance(leaf, StorageRef):
        t = TensorRef(leaf, 0, (leaf.numel,), (1,), leaf.dtype)
        return tensor_var(name, t, records.get(leaf.key), blob.path, big_endian)
    if isinstance(leaf, ArrayRef):
        return array_var(name, leaf, blob.path)
    return value_var(name, leaf)


def dtensor_var(name: str, d: DTensorRef, blob: Blob, records: dict,
                big_endian: bool) -> VarInfo | None:  # fmt: skip
    """A DTensor's local tensor, marked as a piece of its global tensor (DESIGN.md §3b)."""
    var = leaf_var(name, d.local, blob, records, big_endian)
    if var is None:
        return None
    shard, replica = [], []
    for i, placement in enumerate(d.placements):
        coord = d.coordinate[i] if d.coordinate and i < len(d.coordinate) else None
        size = d.mesh_shape[i] if d.mesh_shape and i < len(d.mesh_shape) else None
        if placement.startswith("Shard(") and coord is not None:
            shard.append((int(placement[6:-1]), coord, size))
        elif placement.startswith("Shard("):
            var.error = var.error or "DTensor shard without its mesh coordinate"
        elif not placement.startswith("Replicate"):
            var.error = var.error or f"DTensor placement {placement} is not read"
        else:
            replica.append(coord)
    var.attrs["piece"] = Piece(d.global_shape, None, tuple(shard), tuple(replica),
                               ", ".join(d.placements) or "DTensor")  # fmt: skip
    return var


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
        return read_view(blob, where, offset, size, stride, np_dtype(var.dtype), big_endian)
    raise ValueError(f"{var.name}: no locator to read")
