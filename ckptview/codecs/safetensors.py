"""safetensors: an 8-byte header length, a JSON header, then one flat little-endian buffer.

Listing costs two reads (the length, then the header); values are Spans into the buffer.
The header's ``__metadata__`` (string -> string) is kept in every variable's
``attrs["metadata"]``.
"""

from __future__ import annotations

import json
import struct

import numpy as np

from ..dtypes import np_dtype
from ..io import Blob
from ..model import Span, VarInfo
from .base import Codec, PartialRead

#: the reference parser refuses larger headers
MAX_HEADER = 100 * 1024 * 1024

#: safetensors dtype code -> ckptview dtype name
DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
    "C128": "complex128",
}


class SafetensorsCodec(Codec):
    """``*.safetensors`` files (huggingface/safetensors format)."""

    name = "safetensors"
    suffixes = (".safetensors",)
    priority = 40

    def guess_can_open(self, filename: str, head: bytes) -> bool:
        if filename.lower().endswith(self.suffixes):
            return True
        if len(head) < 10 or head[8:10] not in (b'{"', b"{ ", b"{}"):
            return False
        (n,) = struct.unpack("<Q", head[:8])
        return 2 <= n <= MAX_HEADER

    def list_variables(self, blob: Blob, hints: dict) -> list[VarInfo]:
        header, data_start = read_header(blob)
        meta = header.pop("__metadata__", None)
        if meta is not None and not isinstance(meta, dict):
            raise ValueError("__metadata__ is not a JSON object")
        buffer_len = blob.size - data_start
        out: list[VarInfo] = []
        beyond: list[str] = []
        for name, entry in header.items():
            var = _entry_var(blob.path, name, entry, data_start)
            if meta:
                var.attrs["metadata"] = dict(meta)
            if var.span is not None and var.span.offset + var.span.length > blob.size:
                beyond.append(name)
                continue
            out.append(var)
        if beyond:
            raise PartialRead(
                out,
                f"truncated: {len(beyond)} tensor(s) end beyond the file "
                f"(buffer holds {buffer_len} bytes), e.g. {beyond[0]!r}",
            )
        return out

    def read(self, blob: Blob, var: VarInfo) -> np.ndarray:
        if var.dtype == "object":  # unknown dtype code: the raw bytes
            data = blob.read(var.span.offset, var.span.length)
            return np.frombuffer(data, dtype=np.uint8)
        return super().read(blob, var)


def read_header(blob: Blob) -> tuple[dict, int]:
    """The parsed JSON header and the absolute offset of the byte buffer (two reads)."""
    if blob.size < 8:
        raise ValueError(f"{blob.name}: {blob.size} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", blob.read(0, 8))
    if n > MAX_HEADER:
        raise ValueError(f"{blob.name}: header length {n} exceeds the {MAX_HEADER}-byte limit")
    if 8 + n > blob.size:
        raise ValueError(f"{blob.name}: header length {n} runs past the end of the file")
    raw = blob.read(8, n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{blob.name}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{blob.name}: header is not a JSON object")
    return header, 8 + n


def _entry_var(path: str, name: str, entry: object, data_start: int) -> VarInfo:
    """One header entry as a VarInfo; a malformed entry becomes a variable with an error."""
    if not isinstance(entry, dict):
        return VarInfo(name, "object", (), error="header entry is not an object")
    code = entry.get("dtype")
    shape = entry.get("shape")
    offsets = entry.get("data_offsets")
    if not (isinstance(shape, list) and all(_is_uint(d) for d in shape)):
        return VarInfo(name, "object", (), error=f"bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
        return VarInfo(name, "object", tuple(shape), error=f"bad data_offsets {offsets!r}")
    begin, end = offsets
    if end < begin:
        return VarInfo(name, "object", tuple(shape), error=f"data_offsets {offsets} decrease")
    span = Span(path, data_start + begin, end - begin)
    attrs = {"safetensors_dtype": code}
    dtype = DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:  # newer (sub-byte …) codes: listed as opaque bytes
        return VarInfo(name, "object", tuple(shape), nbytes=end - begin, span=span, attrs=attrs)
    var = VarInfo(name, dtype, tuple(shape), nbytes=end - begin, span=span, attrs=attrs)
    want = var.numel * np_dtype(dtype).itemsize
    if want != end - begin:
        var.error = f"{code}{list(shape)} needs {want} bytes, data_offsets give {end - begin}"
    elif np_dtype(dtype).kind in "iufc" and np_dtype(dtype).itemsize > 1:
        var.span.disk_dtype = np_dtype(dtype).newbyteorder("<").str
    return var


def _is_uint(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
