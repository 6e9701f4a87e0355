"""t5x native checkpoints: a msgpack ``checkpoint`` file holding the state tree, each array
either inline (flax's msgpack extension for ndarrays and numpy scalars) or a tensorstore spec
of a zarr array in a directory beside it (``state.param_states.kernel/0.0``, no ``.zarray``:
the spec carries the metadata). Listing reads the ``checkpoint`` file only."""

from __future__ import annotations

import posixpath
from typing import Any

import numpy as np

from ..dtypes import dtype_name
from ..formats.msgpack import Ext, unpackb
from ..formats.relpath import join_inside
from ..formats.small import read_small
from ..formats.zarr import read_zarr2
from ..io import Blob
from ..kinds import guess_kind
from ..model import HintsLike, VarInfo
from .base import Codec, CodecTier

#: flax.serialization's msgpack extension codes
EXT_NDARRAY, EXT_COMPLEX, EXT_SCALAR = 1, 2, 3
SKIP = {"version"}  # the checkpoint format's own version, not a tensor


def _inline(ext: Ext) -> np.ndarray:
    """A flax ndarray / numpy scalar extension: msgpack ``(shape, dtype name, bytes)``."""
    if ext.code not in (EXT_NDARRAY, EXT_SCALAR):
        raise ValueError(f"msgpack extension {ext.code} is not an array")
    shape, dtype, data = unpackb(ext.data)
    dt = np.dtype(dtype)
    if dt.hasobject or not isinstance(data, bytes):
        raise ValueError(f"inline array of dtype {dtype!r}")
    shape = tuple(int(d) for d in shape)
    if len(data) != int(np.prod(shape, dtype=np.int64)) * dt.itemsize:
        raise ValueError(f"inline array of {len(data)} bytes for {dtype}{list(shape)}")
    return np.frombuffer(data, dt).reshape(shape)


def _leaves(node: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict) and not ("driver" in node and "kvstore" in node):
        out = []
        for k, v in node.items():
            if not (path == "" and k in SKIP):
                out += _leaves(v, f"{path}/{k}" if path else str(k))
        return out
    return [(path, node)]


class T5xCodec(Codec):
    """The ``checkpoint`` file of a t5x checkpoint directory (assigned by the t5x layout)."""

    name = "t5x"
    priority = CodecTier.ASSIGNED

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return False

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        doc = unpackb(read_small(blob.storage, blob.path, blob.size))
        if not isinstance(doc, dict):
            raise ValueError("a t5x checkpoint holds a msgpack map")
        base = posixpath.dirname(blob.path)
        out = []
        for name, leaf in _leaves(doc):
            var = VarInfo(name, "object", (), kind=guess_kind(name))
            try:
                if isinstance(leaf, Ext):
                    arr = _inline(leaf)
                    var.dtype, var.shape, var.locator = dtype_name(arr.dtype), arr.shape, arr
                elif isinstance(leaf, dict):
                    meta = dict(leaf["metadata"])
                    meta["dtype"] = np.dtype(leaf["dtype"]).str
                    var.dtype, var.shape = dtype_name(np.dtype(leaf["dtype"])), tuple(meta["shape"])
                    where = join_inside(base, str(leaf["kvstore"]["path"]).rstrip("/"))
                    var.locator = (where, meta)
                elif isinstance(leaf, (int, float, bool)):
                    arr = np.asarray(leaf)
                    var.dtype, var.locator = dtype_name(arr.dtype), arr
                else:
                    var.locator = leaf
            except (KeyError, TypeError, ValueError) as e:
                var.error = f"{type(e).__name__}: {e}"
            var.nbytes = var.numel * np.dtype(var.dtype).itemsize if var.dtype != "object" else 0
            out.append(var)
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        loc = var.locator
        if isinstance(loc, np.ndarray):
            return loc
        if isinstance(loc, tuple):
            return read_zarr2(blob.storage, loc[0], loc[1])
        out = np.empty((), dtype=object)
        out[()] = loc
        return out
