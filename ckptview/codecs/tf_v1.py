"""TensorFlow V1 checkpoints (TensorSlice tables: ``model.ckpt-N`` of TF <= 1.x ``Saver`` V1,
SessionBundle ``export-00000-of-00001``). Listing reads the table's first entry (the meta);
values are inline in the table and read on demand (:mod:`ckptview.formats.tf_slices`)."""

from __future__ import annotations

import struct

import numpy as np

from ..formats.sstable import TABLE_MAGIC, TableFile
from ..formats.tf_slices import np_name, read_meta, slice_values
from ..io import Blob
from ..kinds import guess_kind
from ..model import HintsLike, VarInfo
from .base import Codec, CodecTier


class TFSliceCodec(Codec):
    """A V1 TensorSlice table: a LevelDB table whose first entry (key ``""``) is the meta."""

    name = "tf-v1"
    priority = CodecTier.LOOSE

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        return False  # needs the footer: see guess_can_open_blob

    def guess_can_open_blob(self, filename: str, head: bytes, blob: Blob) -> bool:
        """Key ``""`` first (shared 0, non-shared 0), a SavedTensorSlices value (field 1), and
        the table magic in the last 8 bytes."""
        if filename.lower().endswith(".index") or len(head) < 5 or head[:2] != b"\x00\x00":
            return False
        n = 1 if head[2] < 0x80 else 2
        if head[2 + n : 3 + n] != b"\x0a" or blob.size < 48:
            return False
        return blob.read(blob.size - 8, 8) == struct.pack("<Q", TABLE_MAGIC)

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        key, value = next(iter(TableFile(blob).entries()))  # the meta: the first entry only
        if key != b"":
            raise ValueError("not a TensorSlice table (its first key is not the meta)")
        out = []
        for t in read_meta(value):
            var = VarInfo(t.name, np_name(t.dtype), t.shape, kind=guess_kind(t.name))
            var.locator = t.name
            if var.dtype == "object":
                var.error = f"TF DataType {t.dtype} is not read"
            out.append(var)
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        out = np.zeros(var.shape, dtype=np.dtype(var.dtype))
        found = False
        for key, value in TableFile(blob).entries():
            if key == b"" or var.locator.encode() not in bytes(key):
                continue
            name, where, flat = slice_values(value, var.dtype)
            if name != var.locator:
                continue
            index = tuple(slice(None) if n < 0 else slice(s, s + n) for s, n in where)
            target = out[index] if where else out
            if flat.size != target.size:
                raise ValueError(
                    f"{var.name}: a slice holds {flat.size} values, {target.size} expected"
                )
            if where:
                out[index] = flat.reshape(target.shape)
            else:
                out = flat.reshape(var.shape)
            found = True
        if not found:
            raise ValueError(f"{var.name}: no data entry in the table")
        return out
