"""numpy dtype names for every framework dtype, including ml_dtypes' bfloat16 and float8."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

try:  # ml_dtypes registers bfloat16/float8 with numpy
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - ml_dtypes is a core dependency
    _ml = None

ML_DTYPE_NAMES = (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "int4",
    "uint4",
)
_ML_NAMES = ML_DTYPE_NAMES  # older name, kept for modules that import it

#: Aliases frameworks use for numpy dtype names (lower-case keys).
ALIASES = {
    "bool": "bool",
    "bool_": "bool",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "byte": "uint8",
    "char": "int8",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "complexfloat": "complex64",
    "complexdouble": "complex128",
    "str": "object",
    "string": "object",
    "bytes": "object",
}


def np_dtype(name: str | np.dtype) -> np.dtype:
    """The numpy dtype for a ckptview dtype name (``bfloat16`` and float8 via ml_dtypes)."""
    if isinstance(name, np.dtype):
        return name
    return _np_dtype(str(name))


_FIXED_WIDTH = re.compile(r"(str|bytes)(\d+)")


@lru_cache(maxsize=1024)  # called per variable by codecs: millions of times on big trees
def _np_dtype(name: str) -> np.dtype:
    key = ALIASES.get(name.lower(), name)
    if key in ML_DTYPE_NAMES:
        if _ml is None:
            raise TypeError(f"dtype {key} needs the ml_dtypes package")
        return np.dtype(getattr(_ml, key))
    fixed = _FIXED_WIDTH.fullmatch(key)
    if fixed:  # numpy names fixed-width strings by bits but does not parse the name back
        kind, bits = fixed.groups()
        return np.dtype(f"<U{int(bits) // 32}" if kind == "str" else f"S{int(bits) // 8}")
    return np.dtype(key)


def dtype_name(dtype: str | np.dtype) -> str:
    """The canonical ckptview name of a dtype (``float32``, ``bfloat16``, ``str192``,
    ``object``)."""
    if isinstance(dtype, np.dtype):
        if dtype.name in ML_DTYPE_NAMES:
            return dtype.name
        if dtype.kind in "SU" and dtype.itemsize:  # fixed-width strings keep their width
            return dtype.name  # "<U48" is "str192", "|S8" is "bytes64" (numpy's own names)
        if dtype.kind in "OSUV":
            return "object"
        return dtype.name if dtype.names is None else "object"
    return ALIASES.get(str(dtype).lower(), str(dtype))


def itemsize(name: str) -> int:
    """Bytes per element of a dtype name; 0 for ``object``."""
    if name == "object":
        return 0
    return np_dtype(name).itemsize


def packed_nbytes(numel: int, bits: int) -> int:
    """Bytes of ``numel`` values packed ``bits`` to a value (safetensors F4, F6)."""
    return (numel * bits + 7) // 8


def unpack_bits(data: bytes, numel: int, bits: int) -> np.ndarray:
    """``numel`` values of ``bits`` bits packed little-endian (value ``i`` in bits
    ``i*bits ..``, the first value in the low bits of the first byte), as uint8 codes."""
    raw = np.frombuffer(data, dtype=np.uint8, count=packed_nbytes(numel, bits))
    if bits == 4:
        out = np.empty(raw.size * 2, dtype=np.uint8)
        out[0::2], out[1::2] = raw & 0x0F, raw >> 4
        return out[:numel]
    stream = np.unpackbits(raw, bitorder="little")[: numel * bits].reshape(numel, bits)
    return np.packbits(stream, axis=1, bitorder="little").reshape(numel)


def is_numeric(name: str) -> bool:
    """Whether values of this dtype name have numbers (not ``object``, ``strN``, ``bytesN``)."""
    return name != "object" and not _FIXED_WIDTH.fullmatch(name)
