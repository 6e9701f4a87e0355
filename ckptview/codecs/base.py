"""The codec contract: how one file format stores variables."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import ClassVar, Literal

import numpy as np

from ..dtypes import np_dtype
from ..io import Blob, Storage
from ..model import HintsLike, VarInfo
from ..registry import CodecTier


class PartialRead(Exception):
    """A file parsed only up to a point: the variables before it are kept, with a message."""

    def __init__(self, variables: list[VarInfo], message: str):
        super().__init__(message)
        self.variables = variables


class Codec:
    """Lists a file's variables from its header and reads one variable's values.

    Subclasses set ``name``, and for cheap detection ``suffixes`` (file name endings) and/or
    ``magic`` (leading bytes), or override :meth:`guess_can_open`. ``list_variables`` must not
    read tensor data; ``read`` must read only the asked variable's bytes. A class joins the
    registry by being defined in a ``ckptview.codecs`` module, through the ``ckptview.codecs``
    entry-point group, or with :func:`ckptview.registry.register`.
    """

    name: ClassVar[str] = ""
    suffixes: ClassVar[tuple[str, ...]] = ()
    magic: ClassVar[tuple[bytes, ...]] = ()
    #: name endings under which a script saves one checkpoint of this format per file
    #: (``torch.save(sd, f"step_{n}.pt")``); layouts that number files by name ask
    #: :func:`ckptview.registry.save_suffixes`. Empty: never a numbered save of its own
    save_suffixes: ClassVar[tuple[str, ...]] = ()
    #: ordering among codecs when several claim a file: lower goes first, equal by name
    priority: ClassVar[int] = CodecTier.DEFAULT

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        """Cheap check on the name and the first bytes of a file."""
        if self.magic and any(head.startswith(m) for m in self.magic):
            return True
        return bool(self.suffixes) and filename.lower().endswith(self.suffixes)

    def guess_can_open_blob(self, filename: str, head: bytes, blob: Blob) -> bool:
        """A second look at a file no codec claimed from its first block, for formats whose
        header can lie past it: may read a few small ranges more. Default: no."""
        return False

    def list_variables(self, blob: Blob, hints: HintsLike) -> list[VarInfo]:
        """Variables of the file from its header. ``hints``: what the layout knows about the
        file (``FileRef.hints``: a :class:`ckptview.model.Hints` subclass, or None); read
        your family's with e.g. ``TFHints.of(hints)``, which also takes a plain mapping."""
        raise NotImplementedError

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        """Values of one variable; the default reads ``var.span``."""
        if var.span is None:
            raise NotImplementedError(f"{self.name}: no reader for {var.name}")
        return read_span(blob.storage, var)

    def read_stored(self, blob: Blob, var: VarInfo) -> np.ndarray:
        """A quantized variable's values as stored (its blocks); default: :meth:`read`."""
        return self.read(blob, var)

    #: True when the framework loads a save into a model built at the run's shapes (Keras
    #: ``load_weights``): a serial whose shapes differ from the run's does not load
    loads_into_model: ClassVar[bool] = False

    #: True when the framework's loader checks the format's checksums on every load (TF's
    #: crc32c, ``np.load``'s zip CRC-32): small files' are checked as the tree is read
    checked_on_load: ClassVar[bool] = False
    #: True when the format's files are zip archives (their members' CRC-32 are checksums)
    zip_archive: ClassVar[bool] = False

    def checksums(self, blob: Blob, variables: Sequence[VarInfo]) -> Iterator[tuple[str, str]]:
        """``(variable name, problem)`` for each checksum the format stores that the bytes fail
        (deep verify reads them); a format without per-variable checksums yields nothing."""
        return iter(())

    def spans(self, blob: Blob, var: VarInfo) -> list[tuple[str, int, int]] | None:
        """Where a variable's stored bytes lie, as ``(path, offset, length)`` ranges (default:
        its span); ``[]`` when reading it reads nothing, None when not known. For planning
        only: work reading many variables at once fetches a small file most of whose bytes
        it wants whole, in one request."""
        span = var.span
        return None if span is None else [(span.path, span.offset, span.length)]

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
        """Flat (1-D, C-order) pieces of a variable's values, each about ``max_bytes``."""
        if var.span is not None and var.span.order == "C" and var.dtype != "object":
            yield from iter_span_chunks(blob.storage, var, max_bytes)
            return
        yield np.asarray(self.read(blob, var)).reshape(-1)


def _disk_dtype(var: VarInfo) -> np.dtype:
    span = var.span
    if span is not None and span.disk_dtype:
        return np_dtype(span.disk_dtype)
    return np_dtype(var.dtype)


def read_span(storage: Storage, var: VarInfo) -> np.ndarray:
    """A variable's values from its span: one ranged read."""
    span = var.span
    if span is None:
        raise ValueError(f"{var.name}: no span to read")
    dt = _disk_dtype(var)
    want = var.numel * dt.itemsize
    if span.length < want:
        raise ValueError(f"{var.name}: span of {span.length} bytes, values need {want}")
    data = storage.read_range(span.path, span.offset, span.offset + want)
    if len(data) < want:
        raise ValueError(f"{var.name}: file ends {want - len(data)} bytes early")
    order: Literal["C", "F"] = "F" if span.order == "F" else "C"
    arr = np.frombuffer(data, dtype=dt, count=var.numel).reshape(var.shape, order=order)
    target = np_dtype(var.dtype)
    if arr.dtype != target:
        arr = arr.astype(target)
    return arr


def iter_span_chunks(storage: Storage, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
    """A C-order span in flat pieces of about ``max_bytes``; one ranged read per piece (on
    remote storage the next ones in flight while one is used: ``Storage.read_many``)."""
    span = var.span
    if span is None:
        raise ValueError(f"{var.name}: no span to read")
    dt = _disk_dtype(var)
    target = np_dtype(var.dtype)
    per = max(1, max_bytes // max(1, dt.itemsize))
    total = var.numel
    counts = [min(per, total - start) for start in range(0, total, per)]
    requests = [(span.path, span.offset + start * dt.itemsize,
                 span.offset + (start + count) * dt.itemsize)
                for start, count in zip(range(0, total, per), counts)]  # fmt: skip
    for count, data in zip(counts, storage.read_many(requests, arrays=True)):
        if len(data) < count * dt.itemsize:
            raise ValueError(f"{var.name}: file ends early")
        arr = np.frombuffer(data, dtype=dt, count=count)
        yield arr.astype(target) if arr.dtype != target else arr
    if total == 0:
        yield np.empty(0, dtype=target)
