"""safetensors primitives shared by the codec (reading) and export (writing): the dtype codes
and the header a writer puts before the byte buffer."""

from __future__ import annotations

import json
import struct

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
#: sub-byte codes, packed little-endian: code -> (ckptview dtype, bits per value)
PACKED = {"F4": ("float4_e2m1fn", 4), "F6_E2M3": ("float6_e2m3fn", 6),
          "F6_E3M2": ("float6_e3m2fn", 6)}  # fmt: skip
#: ckptview dtype name -> safetensors code (the writer's direction)
CODES = {name: code for code, name in DTYPES.items()}


def header(entries: list[tuple[str, str, tuple[int, ...], int]],
           metadata: dict[str, str] | None = None) -> bytes:  # fmt: skip
    """The length-prefixed JSON header for tensors ``(name, dtype code, shape, nbytes)``
    stored back to back in that order, padded with spaces so the buffer starts 8-aligned."""
    head: dict = {}
    if metadata:
        head["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    at = 0
    for name, code, shape, nbytes in entries:
        head[name] = {
            "dtype": code,
            "shape": [int(d) for d in shape],
            "data_offsets": [at, at + nbytes],
        }
        at += nbytes
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw
