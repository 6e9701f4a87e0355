"""Zarr arrays as Orbax writes them: dtype and shape from v2 (``.zarray``) or v3
(``zarr.json``) metadata, and plain v2 arrays read with numpy (zstd chunks with zstandard, gzip/zlib with zlib).
"""

from __future__ import annotations

import io
import zlib
from typing import Any

import numpy as np

from ..dtypes import _ML_NAMES, dtype_name, np_dtype
from ..io import Blob, Storage


def zarr_dtype(meta: dict) -> str:
    """The ckptview dtype name of a zarr v2 (``dtype``) or v3 (``data_type``) array."""
    dt = _np_zarr_dtype(meta.get("data_type", meta.get("dtype")))
    if dt.kind == "V" and dt.names is None and dt.name in _ML_NAMES:
        return dt.name  # bfloat16, float8_* (ml_dtypes)
    name = dtype_name(dt)
    if name == "object":
        raise ValueError(f"unsupported zarr dtype {dt}")
    return name


def _np_zarr_dtype(raw: Any) -> np.dtype:
    if not isinstance(raw, str):
        raise ValueError(f"unsupported zarr dtype {raw!r}")
    try:
        return np.dtype(raw)
    except TypeError:
        return np_dtype(raw)


def zarr_shape(meta: dict) -> tuple[int, ...]:
    shape = meta.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ValueError(f"bad zarr shape {shape!r}")
    return tuple(shape)


def read_zarr2(storage: Storage, root: str, meta: dict) -> np.ndarray:
    """A plain zarr v2 array directory, read with numpy (+ zstandard for zstd chunks)."""
    if meta.get("filters"):
        raise ValueError("zarr filters are not supported without tensorstore")
    comp = meta.get("compressor")
    if comp is not None and comp.get("id") not in ("zstd", "gzip", "zlib"):
        raise ImportError(
            f"zarr compressor {comp.get('id')!r} needs tensorstore: install ckptview[orbax]"
        )
    dt = _np_zarr_dtype(meta.get("dtype"))
    shape = zarr_shape(meta)
    chunks = tuple(meta.get("chunks") or ())
    if len(chunks) != len(shape) or any(c <= 0 for c in chunks):
        raise ValueError(f"bad zarr chunks {chunks!r} for shape {shape!r}")
    order = meta.get("order", "C")
    sep = meta.get("dimension_separator", ".")
    fill = meta.get("fill_value")
    out = np.zeros(shape, dtype=dt) if fill in (None, 0) else np.full(shape, fill, dtype=dt)
    grid = [range(-(-s // c)) for s, c in zip(shape, chunks)]
    chunk_bytes = int(np.prod(chunks, dtype=np.int64)) * dt.itemsize
    for idx in np.ndindex(*[len(g) for g in grid]) if shape else [()]:
        key = sep.join(str(i) for i in idx) if idx else "0"
        path = f"{root}/{key}"
        if not storage.fs.exists(path):
            continue
        blob = Blob(storage, path)
        data = blob.read(0, blob.size)
        if comp is not None:
            data = _decompress(comp["id"], data, chunk_bytes + 1)
        if len(data) != chunk_bytes:
            raise ValueError(f"{key}: chunk has {len(data)} bytes, expected {chunk_bytes}")
        block = np.frombuffer(data, dtype=dt).reshape(chunks, order=order)
        sel = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunks, shape))
        out[sel] = block[tuple(slice(0, x.stop - x.start) for x in sel)]
    return out


def _decompress(codec: str, data: bytes, limit: int) -> bytes:
    """A chunk's bytes, never more than ``limit`` of them (a bomb stops there)."""
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read(limit)
    wbits = 31 if codec == "gzip" else 15
    return zlib.decompressobj(wbits).decompress(data, limit)
