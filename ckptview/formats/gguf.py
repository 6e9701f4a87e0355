"""GGUF (ggml's model file): the header parsed with bounded reads, and numpy dequantization
of its block formats.

Layout (``gguf.md`` in ggml, versions 2 and 3; little-endian): ``GGUF`` magic, ``u32``
version, ``u64`` tensor count, ``u64`` metadata count; the metadata key/value pairs (a key is
a ``u64``-length string, a value a ``u32`` type then its payload, arrays as ``u32`` item type,
``u64`` count, items); the tensor infos (name, ``u32`` n_dims, ``u64`` dims in ggml order,
innermost first, ``u32`` ggml type, ``u64`` offset from the data section); the data section
starts at the next multiple of ``general.alignment`` (default 32).

Dequantization follows ggml's reference (``ggml-quants.c``) as gguf-py's ``quants.py``
restates it in numpy (MIT); each function maps ``(n_blocks, type_size)`` uint8 blocks to
``(n_blocks, block_size)`` float32 values.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
QK_K = 256
#: the most array items and string bytes a header may claim
MAX_COUNT = 1 << 24
MAX_STRING = 1 << 24
MAX_DIMS = 8
#: the most tensors and metadata entries a header may claim (docs/budgets.md): each costs a
#: few microseconds and a few hundred bytes to list; real models hold a few thousand tensors
#: and a few dozen metadata entries
MAX_TENSORS = 1 << 16
MAX_KV = 1 << 16
#: every ggml type stores at least one bit per value: a tensor of more values than 8 x the
#: file's bytes cannot be in it
VALUES_PER_BYTE = 8


class Truncated(Exception):
    """The header continues past the bytes fetched so far."""

    def __init__(self, need: int):
        super().__init__(need)
        self.need = need


@dataclass
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # numpy order (ggml dims reversed)
    offset: int  # from the start of the data section


@dataclass
class Header:
    version: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0

    @property
    def alignment(self) -> int:
        value = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        return value if isinstance(value, int) and value > 0 and value % 8 == 0 else 0


# -- ggml types: name, block size (values), type size (bytes), dequantizer -------------------
@dataclass(frozen=True)
class GGMLType:
    name: str
    block: int
    size: int
    numpy: str | None = None  # a plain type: its numpy dtype
    dequant: Callable[[np.ndarray], np.ndarray] | None = None

    def nbytes(self, numel: int) -> int | None:
        """Bytes of ``numel`` values, None when they do not fill whole blocks."""
        if numel % self.block:
            return None
        return numel // self.block * self.size


def _f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view(np.float16).astype(np.float32)


def _halves(qs: np.ndarray, n: int) -> np.ndarray:
    """Low nibbles then high nibbles of each row of packed bytes: ``(n, 2 * bytes)``."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).reshape(n, -1)


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, :2])
    return d * (_halves(b[:, 2:], len(b)).astype(np.float32) - 8)


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    return d * _halves(b[:, 4:], len(b)).astype(np.float32) + m


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """32 high bits (``u32`` little-endian) per block as ``(n, 32)`` values 0/1."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, :2])
    q = _halves(b[:, 6:], len(b)) | (_high_bits(b[:, 2:6]) << 4)
    return d * (q.astype(np.float32) - 16)


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, :2]), _f16(b[:, 2:4])
    q = _halves(b[:, 8:], len(b)) | (_high_bits(b[:, 4:8]) << 4)
    return d * q.astype(np.float32) + m


def _q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32)


def _shifted(q: np.ndarray, shifts: tuple[int, ...], mask: int, group: int) -> np.ndarray:
    """Each ``group`` bytes of ``q`` read at each shift in turn: ``(n, chunks, shifts, group)``."""
    n = len(q)
    s = np.array(shifts, dtype=np.uint8).reshape(1, 1, -1, 1)
    return (q.reshape(n, -1, 1, group) >> s) & mask


def _q2_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0xF).astype(np.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).astype(np.float32)).reshape(n, 16, 1)
    q = _shifted(qs, (0, 2, 4, 6), 3, 32).reshape(n, 16, 16).astype(np.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    hmask, qs, sc, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (sc[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    high = sc[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)
    scales = (low & 0x0F) | ((high.reshape(n, 16) & 0x03) << 4)
    dl = (d * (scales.astype(np.int8) - 32).astype(np.float32)).reshape(n, 16, 1)
    ql = _shifted(qs, (0, 2, 4, 6), 3, 32).reshape(n, 16, 16)
    qh = _shifted(hmask, tuple(range(8)), 1, 32).reshape(n, 16, 16) ^ 1
    q = (ql.astype(np.int8) - (qh << 2).astype(np.int8)).astype(np.float32)
    return (dl * q).reshape(n, QK_K)


def _scale_min_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins packed in 12 bytes (Q4_K, Q5_K)."""
    n = len(sc)
    s = sc.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    scale = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mins = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return scale.astype(np.float32), mins.astype(np.float32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, m = _scale_min_k4(b[:, 4:16])
    q = _shifted(b[:, 16:], (0, 4), 0x0F, 32).reshape(n, 8, 32).astype(np.float32)
    return ((d * sc).reshape(n, 8, 1) * q - (dmin * m).reshape(n, 8, 1)).reshape(n, QK_K)


def _q5_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, m = _scale_min_k4(b[:, 4:16])
    qh, qs = b[:, 16:48], b[:, 48:]
    ql = _shifted(qs, (0, 4), 0x0F, 32).reshape(n, 8, 32)
    hi = _shifted(qh, tuple(range(8)), 1, 32).reshape(n, 8, 32)
    q = (ql | (hi << 4)).astype(np.float32)
    return ((d * sc).reshape(n, 8, 1) * q - (dmin * m).reshape(n, 8, 1)).reshape(n, QK_K)


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = len(b)
    ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    dl = (d * sc.view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    low = _shifted(ql, (0, 4), 0x0F, 64).reshape(n, -1, 32)
    high = _shifted(qh, (0, 2, 4, 6), 0x03, 32).reshape(n, -1, 32)
    q = ((low | (high << 4)).astype(np.int8) - 32).reshape(n, 16, 16).astype(np.float32)
    return (dl * q).reshape(n, QK_K)


MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def _mxfp4(b: np.ndarray) -> np.ndarray:
    e = b[:, :1].astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23)).astype(np.uint32)
    d = bits.view(np.float32)  # 2**(e - 127) / 2: the table holds doubled values
    return d * MXFP4_VALUES[_halves(b[:, 1:], len(b))]


TYPES: dict[int, GGMLType] = {
    0: GGMLType("F32", 1, 4, "<f4"),
    1: GGMLType("F16", 1, 2, "<f2"),
    2: GGMLType("Q4_0", 32, 18, dequant=_q4_0),
    3: GGMLType("Q4_1", 32, 20, dequant=_q4_1),
    6: GGMLType("Q5_0", 32, 22, dequant=_q5_0),
    7: GGMLType("Q5_1", 32, 24, dequant=_q5_1),
    8: GGMLType("Q8_0", 32, 34, dequant=_q8_0),
    10: GGMLType("Q2_K", QK_K, 84, dequant=_q2_k),
    11: GGMLType("Q3_K", QK_K, 110, dequant=_q3_k),
    12: GGMLType("Q4_K", QK_K, 144, dequant=_q4_k),
    13: GGMLType("Q5_K", QK_K, 176, dequant=_q5_k),
    14: GGMLType("Q6_K", QK_K, 210, dequant=_q6_k),
    24: GGMLType("I8", 1, 1, "i1"),
    25: GGMLType("I16", 1, 2, "<i2"),
    26: GGMLType("I32", 1, 4, "<i4"),
    27: GGMLType("I64", 1, 8, "<i8"),
    28: GGMLType("F64", 1, 8, "<f8"),
    30: GGMLType("BF16", 1, 2, "bfloat16"),
    39: GGMLType("MXFP4", 32, 17, dequant=_mxfp4),
}
#: types gguf-py knows that ckptview lists but cannot dequantize (i-quants, ternary)
OTHER_TYPES = {9: "Q8_1", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL",
               21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0",
               40: "NVFP4", 41: "Q1_0"}  # fmt: skip


def dequantize(raw: bytes | np.ndarray, ggml: GGMLType, numel: int) -> np.ndarray:
    """``numel`` float32 values from the blocks of a quantized tensor."""
    blocks = np.frombuffer(raw, dtype=np.uint8, count=numel // ggml.block * ggml.size)
    blocks = blocks.reshape(-1, ggml.size)
    assert ggml.dequant is not None
    return ggml.dequant(blocks).reshape(-1).astype(np.float32, copy=False)


# -- header ------------------------------------------------------------------------------------
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q").unpack_from


class _Reader:
    """A cursor over the fetched head of a file; running off its end raises ``Truncated``."""

    def __init__(self, buf: bytes, size: int):
        self.buf, self.at, self.size = buf, 0, size

    def _short(self, end: int) -> None:
        """Reading up to ``end`` needs bytes not fetched, or not in the file."""
        if end > self.size:
            raise ValueError(f"header runs past the end of the file ({end} > {self.size})")
        raise Truncated(end)

    def take(self, n: int) -> bytes:
        end = self.at + n
        if end > len(self.buf):
            self._short(end)
        out = self.buf[self.at : end]
        self.at = end
        return out

    def skip_items(self, itype: int, n: int) -> None:
        """Move past ``n`` array items without decoding them."""
        if itype in _SCALARS:
            self.take(n * struct.calcsize(_SCALARS[itype]))
            return
        if itype != _STRING:
            raise ValueError(f"unknown metadata array item type {itype}")
        buf, at, u64 = self.buf, self.at, _U64
        limit = len(buf)
        for _ in range(n):
            if at + 8 > limit:
                self._short(at + 8)
            at += 8 + u64(buf, at)[0]
        if at > limit:
            self._short(at)
        self.at = at

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str) -> int:
        n = self.unpack("<Q")
        if n > MAX_COUNT:
            raise ValueError(f"{what} count {n} exceeds the {MAX_COUNT} limit")
        return n

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > MAX_STRING:
            raise ValueError(f"string of {n} bytes exceeds the {MAX_STRING} limit")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            itype = self.unpack("<I")
            n = self.count("array item")
            if itype in _SCALARS:
                fmt = _SCALARS[itype]
                data = self.take(n * struct.calcsize(fmt))
                return np.frombuffer(data, dtype=np.dtype(fmt)).copy()
            if itype == _ARRAY:
                raise ValueError("nested metadata arrays are not supported")
            return [self.value(itype) for _ in range(n)]
        raise ValueError(f"unknown metadata value type {vtype}")


def _budget(n_tensors: int, n_kv: int) -> None:
    """The entry counts a header claims against the budget, before any entry is parsed."""
    if n_tensors > MAX_TENSORS:
        raise ValueError(f"{n_tensors:,} tensors: over the {MAX_TENSORS:,}-tensor budget")
    if n_kv > MAX_KV:
        raise ValueError(f"{n_kv:,} metadata entries: over the {MAX_KV:,}-entry budget")


def _check_dims(name: str, dims: tuple[int, ...], size: int) -> None:
    """Each dim, then the running product, against the values the file's bytes can hold
    (never forming a product beyond it: 8 dims of 2**64 - 1 are refused at the first)."""
    limit = VALUES_PER_BYTE * max(size, 1)
    for d in dims:
        if d > limit:
            raise ValueError(f"{name!r}: dim {d} exceeds the {limit:,} values a file of "
                             f"{size:,} bytes can hold")  # fmt: skip
    numel = 1
    for d in dims:
        numel *= d
        if numel > limit:
            raise ValueError(f"{name!r}: dims {list(reversed(dims))} hold more values than a "
                             f"file of {size:,} bytes can")  # fmt: skip


LongArray = Callable[[str, int, int, int, int], None]


def read_strings(buf: bytes, count: int) -> list[str]:
    """``count`` GGUF strings (``u64`` length, UTF-8 bytes) back to back in ``buf``."""
    r = _Reader(buf, len(buf))
    return [r.string() for _ in range(count)]


def parse_header(buf: bytes, size: int, long_array: LongArray | None = None,
                 inline_items: int = 16) -> Header:  # fmt: skip
    """The header from the first bytes of a file of ``size`` bytes; raises ``Truncated(n)``
    when the header needs the first ``n`` bytes and ``buf`` holds fewer. With
    ``long_array``, metadata arrays of more than ``inline_items`` items are skipped, not
    decoded, and reported as ``long_array(key, item type, count, start, end)``."""
    r = _Reader(buf, size)
    if r.take(4) != MAGIC:
        raise ValueError("not a GGUF file (no GGUF magic)")
    version = r.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2, 3)")
    n_tensors, n_kv = r.count("tensor"), r.count("metadata")
    _budget(n_tensors, n_kv)
    header = Header(version)
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I")
        if vtype == _ARRAY and long_array is not None:
            mark = r.at
            itype, n = r.unpack("<I"), r.count("array item")
            if n > inline_items and itype != _ARRAY:
                start = r.at
                r.skip_items(itype, n)
                long_array(key, itype, n, start, r.at)
                continue
            r.at = mark
        header.metadata[key] = r.value(vtype)
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I")
        if n_dims > MAX_DIMS:
            raise ValueError(f"{name}: {n_dims} dims exceed the {MAX_DIMS} limit")
        dims = struct.unpack(f"<{n_dims}Q", r.take(8 * n_dims))
        _check_dims(name, dims, size)
        ggml_type, offset = r.unpack("<I"), r.unpack("<Q")
        if offset > size:
            raise ValueError(f"{name!r}: data offset {offset} is past the end of the file")
        header.tensors.append(TensorInfo(name, ggml_type, tuple(reversed(dims)), offset))
    align = header.alignment
    if not align:
        raise ValueError(
            f"general.alignment {header.metadata.get('general.alignment')!r} is invalid"
        )
    header.data_start = -(-r.at // align) * align
    return header
