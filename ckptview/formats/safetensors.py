"""safetensors primitives shared by the codec (reading) and export (writing): the dtype codes
and the header a writer puts before the byte buffer."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import numpy as np

from ..dtypes import np_dtype

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


# -- the reference loader's rules (huggingface/safetensors ``Metadata::validate``) -------------
METADATA = "__metadata__"


def metadata_problem(meta: object) -> str | None:
    """Why the loader refuses a header's ``__metadata__`` (it must be absent, null or a map of
    strings to strings), else None. A tensor entry named ``__metadata__`` is refused too."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        return f"{METADATA} is not a JSON object"
    if "data_offsets" in meta or "dtype" in meta:
        return (f"a tensor named {METADATA!r} (the safetensors loader reads that key as "
                "metadata and refuses the file)")  # fmt: skip
    bad = next((k for k, v in meta.items() if type(v) is not str), None)
    if bad is not None:
        return f"{METADATA}[{bad!r}] is not a string (the safetensors loader refuses the file)"
    return None


def gap_problem(begins: Sequence[int] | np.ndarray, ends: Sequence[int] | np.ndarray,
                buffer_len: int) -> str | None:  # fmt: skip
    """Why the loader refuses these data offsets (relative to the buffer), else None: sorted,
    they must run back to back from 0 to the end of the buffer (a gap, an overlap or bytes
    after the last tensor leave bytes no tensor owns, or owned twice)."""
    b = np.asarray(begins, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if not len(b):
        return None if buffer_len == 0 else f"{buffer_len} bytes of buffer and no tensor"
    order = np.lexsort((e, b))
    b, e = b[order], e[order]
    if b[0] != 0:
        return f"bytes 0..{int(b[0])} of the buffer belong to no tensor (the loader refuses gaps)"
    bad = np.nonzero(b[1:] != e[:-1])[0]
    if len(bad):
        i = int(bad[0])
        lo, hi = int(e[i]), int(b[i + 1])
        what = "belong to no tensor" if hi > lo else "are owned twice"
        return (f"bytes {min(lo, hi)}..{max(lo, hi)} of the buffer {what} (the safetensors "
                "loader needs data_offsets back to back)")  # fmt: skip
    if int(e[-1]) != buffer_len:
        return (f"bytes {int(e[-1])}..{buffer_len} after the last tensor belong to no tensor "
                "(the safetensors loader refuses them)")  # fmt: skip
    return None


def reference_problems(raw: bytes, buffer_len: int) -> list[str]:
    """Every rule of the reference loader a header (its JSON ``raw``) breaks for a buffer of
    ``buffer_len`` bytes: valid JSON object, names unique, ``__metadata__`` a string map, every
    entry's dtype known, shape non-negative ints, ``data_offsets`` two ints whose span is
    dtype x shape bytes, and all spans dense, ordered and non-overlapping up to the end."""
    problems: list[str] = []
    dupes: list[str] = []

    def pairs(items: list) -> dict:
        out: dict = {}
        for k, v in items:
            if k in out and k not in dupes:
                dupes.append(k)
            out[k] = v
        return out

    if raw[:1] != b"{":
        problems.append("header does not start with '{'")
    try:
        top = json.loads(raw.decode("utf-8"), object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError) as e:
        return [f"header is not valid JSON ({e})"]
    if not isinstance(top, dict):
        return ["header is not a JSON object"]
    problems += [f"header names {d!r} twice (the loader refuses duplicate keys)" for d in dupes]
    meta = metadata_problem(top.get(METADATA))
    if meta:
        problems.append(meta)
    begins, ends = [], []
    for name, entry in top.items():
        if name == METADATA:
            continue
        if not isinstance(entry, dict):
            problems.append(f"{name!r}: entry is not an object")
            continue
        code, shape, span = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        bits = _BITS.get(code) if isinstance(code, str) else None
        if bits is None:
            problems.append(f"{name!r}: unknown dtype {code!r}")
            continue
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            problems.append(f"{name!r}: bad shape {shape!r}")
            continue
        if not (isinstance(span, list) and len(span) == 2
                and all(type(o) is int and o >= 0 for o in span) and span[0] <= span[1]):  # fmt: skip
            problems.append(f"{name!r}: bad data_offsets {span!r}")
            continue
        numel = 1
        for d in shape:
            numel *= d
        if (numel * bits + 7) // 8 != span[1] - span[0]:
            problems.append(f"{name!r}: {code}{shape} needs {(numel * bits + 7) // 8} bytes, "
                            f"data_offsets give {span[1] - span[0]}")  # fmt: skip
        begins.append(span[0])
        ends.append(span[1])
    gap = gap_problem(begins, ends, buffer_len)
    if gap:
        problems.append(gap)
    return problems


#: bits per value of every dtype code the loader knows
_BITS = {**{code: np_dtype(name).itemsize * 8 for code, name in DTYPES.items()},
         **{code: bits for code, (_, bits) in PACKED.items()}}  # fmt: skip
