"""TensorFlow V1 checkpoints (TensorSlice tables, TF <= 1.x ``Saver`` V1, SessionBundle
exports): a LevelDB table (:mod:`.sstable`) whose ``""`` entry is a ``SavedTensorSlices`` with
the meta (name, shape, dtype, slices of every tensor) and whose other entries, keyed by
OrderedCode ``(name, slice)``, hold ``SavedSlice`` values inline as ``TensorProto``s
(tensorflow/core/util/saved_tensor_slice.proto, tensor.proto).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import protobuf as pb
from .tf_bundle import TF_DTYPES

#: TensorProto field -> numpy dtype of its repeated values (packed or not)
_FIXED = {5: "<f", 6: "<d"}  # float_val, double_val (struct codes)
_VARINT = (7, 10, 11, 13)  # int_val, int64_val, bool_val, half_val (as uint16 bits)


@dataclass
class SliceMeta:
    """One tensor of the table: name, full shape, DataType code, its slices' extents."""

    name: str
    shape: tuple[int, ...]
    dtype: int
    slices: list[tuple[tuple[int, int], ...]]


def _shape(buf: bytes | memoryview) -> tuple[int, ...]:
    dims = pb.decode(buf).get(2, [])
    return tuple(pb.signed(pb.decode(d).get(1, [0])[-1]) for d in dims)


def extents(buf: bytes | memoryview) -> tuple[tuple[int, int], ...]:
    """A TensorSliceProto: ((start, length or -1 for all), …) per dimension."""
    out = []
    for e in pb.decode(buf).get(1, []):
        f = pb.decode(e)
        out.append((pb.signed(f.get(1, [0])[-1]), pb.signed(f[2][-1]) if f.get(2) else -1))
    return tuple(out)


def read_meta(value: bytes | memoryview) -> list[SliceMeta]:
    """The tensors listed by the table's ``""`` entry (a SavedTensorSlices with its meta)."""
    meta = pb.decode(value).get(1)
    if not meta:
        raise pb.DecodeError("the table's first entry holds no SavedTensorSliceMeta")
    out = []
    for t in pb.decode(meta[-1]).get(1, []):
        f = pb.decode(t)
        shape = _shape(f[2][-1]) if f.get(2) else ()
        out.append(SliceMeta(pb.string(f.get(1, [])), shape, f.get(3, [0])[-1],
                             [extents(s) for s in f.get(4, [])]))  # fmt: skip
    return out


def slice_values(value: bytes | memoryview, dtype: str) -> tuple[str, tuple, np.ndarray]:
    """(name, extents, flat values) of one data entry (a SavedTensorSlices with ``data``)."""
    saved = pb.decode(value).get(2)
    if not saved:
        raise pb.DecodeError("a data entry without a SavedSlice")
    f = pb.decode(saved[-1])
    name, where = pb.string(f.get(1, [])), extents(f[2][-1]) if f.get(2) else ()
    t = pb.decode(f[3][-1]) if f.get(3) else {}
    dt = np.dtype(dtype)
    if t.get(4):  # tensor_content: raw little-endian bytes
        return name, where, np.frombuffer(bytes(t[4][-1]), dt.newbyteorder("<")).astype(dt)
    for field, code in _FIXED.items():
        if t.get(field):
            return name, where, np.asarray(pb.fixed(t[field], code), dt)
    for field in _VARINT:
        if t.get(field):
            ints = np.asarray(pb.varints(t[field]), np.int64)
            if field == 13:
                return name, where, ints.astype(np.uint16).view(np.float16).astype(dt)
            return name, where, ints.astype(dt)
    return name, where, np.empty(0, dt)


def np_name(code: int) -> str:
    """The ckptview dtype name of a DataType code (``object`` when not numeric)."""
    return TF_DTYPES.get(code, ("object", None))[0]
