"""GGUF files (llama.cpp / ggml): tensors from the header, values dequantized with numpy.

Listing reads the head of the file once (a second, larger read only when the metadata runs
past it): tensors become variables (plain types keep their dtype; quantized ones read as
float32 with ``quant`` ``gguf-<TYPE>``); small metadata values are every variable's
``attrs["metadata"]``; metadata arrays longer than :data:`INLINE_ITEMS` (the vocabulary,
merges, scores) are variables of kind ``tokenizer``/``metadata``, read on demand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..formats.gguf import (
    MAGIC,
    OTHER_TYPES,
    TYPES,
    Header,
    Truncated,
    dequantize,
    parse_header,
    read_strings,
)
from ..io import Blob
from ..model import Span, VarInfo
from .base import Codec, CodecTier

#: a header longer than the cached head block comes in one more request: 1/64 of the file
#: within these bounds (a 70B model's ~8 MiB header, a 0.5B model's ~4 MiB), then doubling
FIRST_READ = (256 << 10, 16 << 20)
MAX_HEADER = 1 << 30
INLINE_ITEMS = 16  # metadata arrays up to this many items stay in attrs["metadata"]
_ITEM_FORMATS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
                 10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip


class GGUFCodec(Codec):
    """``*.gguf`` files (ggml's GGUF, versions 2 and 3)."""

    name = "gguf"
    suffixes = (".gguf",)
    save_suffixes = suffixes
    magic = (MAGIC,)
    priority = CodecTier.FORMAT

    def list_variables(self, blob: Blob, hints: Any) -> list[VarInfo]:
        header, arrays = _read_header(blob)
        meta = {k: v for k, v in header.metadata.items() if k not in arrays}
        out = [_metadata_var(blob.path, key, where) for key, where in arrays.items()]
        for t in header.tensors:
            out.append(_tensor_var(blob, header, t, meta))
        for var in out:
            var.attrs["metadata"] = meta
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        loc = var.locator
        if isinstance(loc, tuple) and loc[0] == "strings":
            return _read_strings(blob, var)
        if isinstance(loc, tuple) and loc[0] == "ggml":
            raw = blob.read(var.span.offset, var.span.length)
            return dequantize(raw, TYPES[loc[1]], var.numel).reshape(var.shape)
        return super().read(blob, var)

    def read_stored(self, blob: Blob, var: VarInfo) -> np.ndarray:
        """A quantized tensor's blocks as stored: uint8, one row per tensor row."""
        loc = var.locator
        if isinstance(loc, tuple) and loc[0] == "ggml":
            raw = blob.read(var.span.offset, var.span.length)
            rows = var.numel // var.shape[-1] if var.shape else 1
            return np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1)
        return self.read(blob, var)

    def iter_chunks(self, blob: Blob, var: VarInfo, max_bytes: int) -> Iterator[np.ndarray]:
        loc = var.locator
        if not (isinstance(loc, tuple) and loc[0] == "ggml"):
            yield from super().iter_chunks(blob, var, max_bytes)
            return
        ggml = TYPES[loc[1]]
        row = int(var.shape[-1]) if var.shape else var.numel
        rows = var.numel // row if row else 0
        row_bytes = row // ggml.block * ggml.size
        step = max(1, max_bytes // max(1, row * 4))
        for at in range(0, rows, step):
            n = min(step, rows - at)
            raw = blob.read(var.span.offset + at * row_bytes, n * row_bytes)
            yield dequantize(raw, ggml, n * row)


def _read_header(blob: Blob) -> tuple[Header, dict[str, tuple]]:
    """The parsed header, fetching more of the file only when it runs past what was read."""
    size = blob.size
    buf = blob.head()
    lo, hi = FIRST_READ
    want = max(lo, min(hi, size >> 6))
    while True:
        try:
            return _parse(buf, size)
        except Truncated as t:
            if t.need > MAX_HEADER:
                raise ValueError(f"header longer than {MAX_HEADER} bytes") from None
            end = min(size, max(t.need, len(buf) + want))
            buf += blob.read(len(buf), end - len(buf))
            want = 2 * len(buf)


def _parse(buf: bytes, size: int) -> tuple[Header, dict[str, tuple]]:
    """The header, with long metadata arrays skipped and located instead of decoded."""
    arrays: dict[str, tuple] = {}
    header = parse_header(buf, size, lambda key, *where: arrays.__setitem__(key, where),
                          INLINE_ITEMS)  # fmt: skip
    return header, arrays


def _metadata_var(path: str, key: str, where: tuple) -> VarInfo:
    itype, count, start, end = where
    kind = "tokenizer" if key.startswith("tokenizer.") else "metadata"
    if itype in _ITEM_FORMATS:
        fmt = _ITEM_FORMATS[itype]
        dtype = np.dtype(fmt)
        disk = fmt if dtype.itemsize > 1 else None
        span = Span(path, start, end - start, "C", disk)
        return VarInfo(key, dtype.newbyteorder("=").name if dtype.kind != "b" else "bool",
                       (count,), nbytes=end - start, kind=kind, span=span)  # fmt: skip
    span = Span(path, start, end - start, "C", "gguf-strings")
    return VarInfo(key, "object", (count,), nbytes=end - start, kind=kind, span=span,
                   locator=("strings", itype))  # fmt: skip


def _read_strings(blob: Blob, var: VarInfo) -> np.ndarray:
    out = np.empty(var.shape[0], dtype=object)
    out[:] = read_strings(blob.read(var.span.offset, var.span.length), var.shape[0])
    return out


def _tensor_var(blob: Blob, header: Header, t: Any, meta: dict) -> VarInfo:
    numel = 1
    for d in t.shape:
        numel *= d
    ggml = TYPES.get(t.ggml_type)
    offset = header.data_start + t.offset
    if ggml is None:
        name = OTHER_TYPES.get(t.ggml_type, f"type {t.ggml_type}")
        return VarInfo(t.name, "object", t.shape, nbytes=0, attrs={"quant": f"gguf-{name}"},
                       error=f"ggml type {name} is not supported")  # fmt: skip
    nbytes = ggml.nbytes(numel)
    if nbytes is None or (t.shape and t.shape[-1] % ggml.block):
        return VarInfo(t.name, "object", t.shape, nbytes=0, error=f"{ggml.name}{list(t.shape)}: "
                       f"rows are not whole blocks of {ggml.block}")  # fmt: skip
    if ggml.numpy is not None:
        dt = np.dtype(ggml.numpy) if ggml.numpy != "bfloat16" else None
        dtype = "bfloat16" if dt is None else dt.newbyteorder("=").name
        disk = ggml.numpy if dt is not None and dt.itemsize > 1 else None
        span = Span(blob.path, offset, nbytes, "C", disk)
        return VarInfo(t.name, dtype, t.shape, nbytes=nbytes, span=span,
                       attrs={"ggml_type": ggml.name})  # fmt: skip
    span = Span(blob.path, offset, nbytes, "C", f"ggml-{ggml.name}")
    return VarInfo(t.name, "float32", t.shape, nbytes=nbytes, span=span,
                   locator=("ggml", t.ggml_type),
                   attrs={"ggml_type": ggml.name, "quant": f"gguf-{ggml.name}"})  # fmt: skip
