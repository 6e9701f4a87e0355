"""PyTorch ``torch.save`` files: the zip format and the legacy format, opened by
:func:`ckptview.formats.torch_pickle.open_torch` (its docstring counts the requests a file
costs). A tensor whose view is C- or F-contiguous gets a ``Span``; other views (shared storages
with their own offset/stride) are read from the storage range with ``as_strided``. Non-tensor
leaves become small variables: numbers as 0-d, lists of numbers as 1-d, strings as ``object``
(:mod:`ckptview.formats.pickle_vars`). See specs/modern.md §1.

A Span whose offset is a prediction from the zip directory carries
``locator=("check", ZipRecord)``: :meth:`TorchCodec.read` / :meth:`TorchCodec.iter_chunks`
fetch the local header in the same ranged read as the values and, if it disagrees, read again
at the exact offset.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..dtypes import np_dtype
from ..formats.pickle import TORCH_WEIGHTS_ONLY
from ..formats.pickle_vars import leaf_var, read_locator
from ..formats.torch_pickle import (
    LEGACY_MAGIC,
    ZIP_MAGIC,
    ZipRecord,
    leaves,
    module_classes,
    open_torch,
)
from ..io import Blob
from ..model import Span, TorchHints, VarInfo
from .base import Codec, CodecTier, PartialRead, iter_span_chunks

SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


# -- the codec --------------------------------------------------------------------------------
class TorchCodec(Codec):
    """``torch.save`` files: zip (``<prefix>/data.pkl`` + ``data/<key>``) or legacy pickles."""

    name = "torch"
    save_suffixes = (*SUFFIXES, ".tar")  # also model_best.pth.tar
    priority = CodecTier.SIGNATURE

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
        refused = weights_only_refuses(t.globals, TorchHints.of(hints))
        if refused:
            raise PartialRead(variables, refused)
        return variables

    def _variables(self, obj: Any, blob: Blob, records: dict, big_endian: bool) -> list[VarInfo]:
        out = []
        classes = module_classes(obj)  # a pickled nn.Module: which class each row stood in for
        for name, leaf in leaves(obj):
            var = leaf_var(name, leaf, blob, records, big_endian)
            if var is not None:
                owner = max((p for p in classes if name.startswith(p)), key=len, default=None)
                if owner is not None:
                    var.attrs["module_class"] = classes[owner]
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


def weights_only_refuses(named: frozenset[str], hints: TorchHints) -> str | None:
    """Why ``torch.load(weights_only=True)`` would refuse a file naming these globals (None:
    it loads, or the file is not read that way). Its values stay listed and readable."""
    if not hints.weights_only:
        return None
    outside = sorted(named - TORCH_WEIGHTS_ONLY - set(hints.extra_globals))
    if not outside:
        return None
    shown = ", ".join(outside[:4]) + (f" (+{len(outside) - 4} more)" if len(outside) > 4 else "")
    return f"torch.load(weights_only=True) refuses global {shown}: the resume cannot load it"


def _unchecked(var: VarInfo) -> ZipRecord | None:
    """The record of a Span whose offset is a prediction (to check when reading)."""
    loc = var.locator
    if var.span is not None and isinstance(loc, tuple) and len(loc) == 2 and loc[0] == "check":
        return loc[1]
    return None


def _span_dtype(var: VarInfo) -> np.dtype:
    return np_dtype(var.span.disk_dtype or var.dtype)
