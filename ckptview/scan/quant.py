"""Quantized groups (DESIGN.md §3b): tensors a quantized checkpoint stores for one weight,
listed as one logical row that reads back dequantized.

- FP8 (DeepSeek-V3, HF ``finegrained_fp8``, compressed-tensors): ``W.weight`` (float8) with
  ``W.weight_scale_inv`` or ``W.weight_scale``, per tensor (``fp8-tensor``), per output channel
  (``fp8-channel``) or per block (``fp8-block128``: 128×128 blocks, partial at the edges); the
  value is ``weight.float() * scale`` of its block, float32.
- MXFP4 (gpt-oss): ``W_blocks`` (uint8, ``[..., G, 16]``: 32 FP4 E2M1 values per group, low
  nibble first) with ``W_scales`` (uint8 E8M0 exponents, ``[..., G]``) is ``W``; dequantized as
  transformers' ``convert_moe_packed_tensors`` does (``lut[nibble] * 2**(scale - 127)``, then the
  last two logical axes swapped), float32.

A group is formed only when both members are listed without error in the same file result
set of one serial and node; anything else stays as stored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..dtypes import np_dtype
from ..model import Piece, VarInfo, as_columns
from .listing import FileResult
from .logical import ReadPiece
from .tables import stored_nbytes, var_name

#: the codec name of the synthetic results holding quantized groups
QUANTIZED = "(quantized)"

FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)  # fmt: skip
FP8_BLOCK = 128


@dataclass
class Member:
    """One stored tensor of a quantized group."""

    var: VarInfo
    res: FileResult
    role: str  # "data" (the fp8 weight), "blocks", "scale", "scales"


@dataclass
class Group:
    """How to dequantize: the scheme, its members and (FP8 blocks) the block shape."""

    scheme: str
    data: Member
    scale: Member
    block: tuple[int, int] | None = None


SCALE_SUFFIXES = ("_scale_inv", "_scale", "_scales")


def _no_scales(variables: Sequence[VarInfo]) -> bool:
    """True for columns (not yet made into records) without a scale tensor: a quick pass
    over the names alone."""
    if as_columns(variables) is None:
        return False
    text = "\n".join(variables.names) + "\n"  # one C pass; a false hit only costs time
    return not any(f"{suffix}\n" in text for suffix in SCALE_SUFFIXES)


def group(results: list[FileResult]) -> tuple[list[FileResult], dict[tuple[int, str], list]]:
    """Results with each quantized group's members replaced by one variable (in a synthetic
    result per file), and each group's members as ``(serial, name) -> [(var, res, Piece)]``."""
    index: dict[tuple[int, str, str], tuple[VarInfo, FileResult]] = {}
    for res in results:
        if _no_scales(res.variables):
            continue
        for var in res.variables:
            if not var.error and (var.name.endswith(SCALE_SUFFIXES)):
                index[(res.serial, res.ref.node, var_name(res.ref, var))] = (var, res)
    if not index:
        return results, {}
    taken: set[int] = set()
    found: list[tuple[FileResult, VarInfo, Group]] = []
    for res in results:
        for var in res.variables:
            made = _group_of(var, res, index)
            if made is not None:
                found.append((res, *made))
                taken.update((id(made[1].data.var), id(made[1].scale.var)))
    if not found:
        return results, {}
    out = [res if not any(id(v) in taken for v in res.variables)
           else replace(res, variables=[v for v in res.variables if id(v) not in taken])
           for res in results]  # fmt: skip
    synthetic: dict[tuple[int, str], FileResult] = {}
    pieces: dict[tuple[int, str], list] = {}
    for res, var, grp in found:
        key = (res.serial, res.ref.path)
        if key not in synthetic:
            ref = replace(res.ref)
            synthetic[key] = FileResult(res.serial, ref, QUANTIZED, [])
            out.append(synthetic[key])
        synthetic[key].variables.append(var)
        name = var_name(res.ref, var)
        pieces[(res.serial, name)] = [
            (m.var, m.res, Piece(placement=grp.scheme, role=m.role)) for m in (grp.data, grp.scale)
        ]
    return out, pieces


def _group_of(var: VarInfo, res: FileResult, index: dict) -> tuple[VarInfo, Group] | None:
    """The group ``var`` heads (an FP8 weight, MXFP4 blocks) with its partner, if listed."""
    if var.error:
        return None
    full = var_name(res.ref, var)
    if var.dtype.startswith("float8") and var.dtype != "float8_e8m0fnu":
        for suffix in ("_scale_inv", "_scale"):
            hit = index.get((res.serial, res.ref.node, full + suffix))
            if hit is not None:
                grp = _fp8(var, res, Member(hit[0], hit[1], "scale"))
                if grp is not None:
                    return _row(var, var.name, grp, var.shape), grp
        return None
    if var.name.endswith("_blocks") and var.dtype == "uint8" and len(var.shape) >= 2:
        hit = index.get((res.serial, res.ref.node, full[: -len("_blocks")] + "_scales"))
        if hit is None or tuple(hit[0].shape) != tuple(var.shape[:-1]):
            return None
        if hit[0].dtype not in ("uint8", "float8_e8m0fnu"):
            return None
        *prefix, g, b = (int(d) for d in var.shape)
        shape = (*prefix, g * b * 2)
        if len(shape) >= 3:
            shape = (shape[0], shape[2], shape[1], *shape[3:])
        grp = Group("mxfp4", Member(var, res, "blocks"), Member(hit[0], hit[1], "scales"))
        return _row(var, var.name[: -len("_blocks")], grp, shape), grp
    return None


def _fp8(var: VarInfo, res: FileResult, scale: Member) -> Group | None:
    """The FP8 scheme a weight and its scale make, None when their shapes do not fit."""
    shape, s = tuple(int(d) for d in var.shape), tuple(int(d) for d in scale.var.shape)
    data = Member(var, res, "data")
    if math.prod(s) == 1:
        return Group("fp8-tensor", data, scale)
    if len(shape) != 2 or len(s) != 2:
        return None
    if s == (shape[0], 1):
        return Group("fp8-channel", data, scale)
    block = _block(shape, s)
    if block is None:
        return None
    name = f"fp8-block{block[0]}" if block[0] == block[1] else f"fp8-block{block[0]}x{block[1]}"
    return Group(name, data, scale, block)


def _block(shape: tuple[int, int], scale: tuple[int, int]) -> tuple[int, int] | None:
    """The block shape: 128×128 when it fits, else the one the scale's shape implies."""
    if all(-(-d // FP8_BLOCK) == s for d, s in zip(shape, scale, strict=True)):
        return FP8_BLOCK, FP8_BLOCK
    block = tuple(-(-d // s) if s else 0 for d, s in zip(shape, scale, strict=True))
    if all(b and -(-d // b) == s for d, b, s in zip(shape, block, scale, strict=True)):
        return block[0], block[1]
    return None


def _row(head: VarInfo, name: str, grp: Group, shape: tuple[int, ...]) -> VarInfo:
    var = VarInfo(name, "float32", tuple(int(d) for d in shape), kind=head.kind)
    var.nbytes = stored_nbytes(grp.data.var) + stored_nbytes(grp.scale.var)
    var.locator = grp
    var.attrs = {"quant": grp.scheme, "n_shards": 1, "stored_dtype": grp.data.var.dtype}
    return var


# -- reading ----------------------------------------------------------------------------------
#: dequantized bytes per chunk when ``read_quantized`` fills its result
READ_CHUNK = 16 << 20


def read_quantized(var: VarInfo, read_piece: ReadPiece, dequantize: bool = True) -> np.ndarray:
    """A group's values: dequantized (float32), or its stored weight / blocks. Dequantized
    values are filled into the result chunk by chunk (peak: the result plus one chunk)."""
    grp: Group = var.locator
    if not dequantize:
        return read_piece(grp.data.res, grp.data.var)
    if _slices(grp) is None:
        return _dequantize(grp, read_piece(grp.data.res, grp.data.var),
                           read_piece(grp.scale.res, grp.scale.var))  # fmt: skip
    out = np.empty(tuple(int(d) for d in var.shape), dtype=np.float32)
    flat = out.reshape(-1)
    at = 0
    for chunk in iter_quantized(var, read_piece, READ_CHUNK):
        flat[at : at + chunk.size] = chunk
        at += chunk.size
    if at != flat.size:
        raise ValueError(f"{var.name}: dequantized {at} values, the tensor has {flat.size}")
    return out


def iter_quantized(var: VarInfo, read_piece: ReadPiece, max_bytes: int) -> Iterator[np.ndarray]:
    """Dequantized values in C order as flat chunks of about ``max_bytes`` (float32): the
    stored weight (blocks) and its scales are read a slab of rows at a time, so memory stays
    a few chunks whatever the tensor's size (a member without a plain byte span - not a
    safetensors-like file - is read whole, then cut)."""
    grp: Group = var.locator
    plan = _slices(grp)
    if plan is None:
        flat = _dequantize(grp, read_piece(grp.data.res, grp.data.var),
                           read_piece(grp.scale.res, grp.scale.var)).reshape(-1)  # fmt: skip
        step = max(1, max_bytes // 4)
        for at in range(0, flat.size, step):
            yield flat[at : at + step]
        return
    unit, n_units, out_per_unit, scale_rows = plan
    data, scale = grp.data.var, grp.scale.var
    whole_scale = read_piece(grp.scale.res, scale) if scale_rows is None else None
    per = max(1, max_bytes // max(1, out_per_unit * 4))  # units per chunk
    if n_units == 0:
        yield np.empty(0, dtype=np.float32)
        return
    for u in range(0, n_units, per):
        u_end = min(n_units, u + per)
        a, b = u * unit, min(int(data.shape[0]), u_end * unit)
        w = read_piece(grp.data.res, _rows(data, a, b))
        if scale_rows is None:
            s = whole_scale
        else:
            sa, sb = scale_rows(a, b)
            s = read_piece(grp.scale.res, _rows(scale, sa, sb))
        yield _dequantize(grp, w, s).reshape(-1)


def _dequantize(grp: Group, data: np.ndarray, scale: np.ndarray) -> np.ndarray:
    if grp.scheme == "mxfp4":
        return mxfp4(data, scale)
    return fp8(data, scale, grp.block)


def _sliceable(var: VarInfo) -> bool:
    """A stored member whose leading-axis slabs are byte ranges of its span."""
    span = var.span
    if span is None or span.order != "C" or var.locator is not None or not var.shape:
        return False
    if span.disk_dtype and span.disk_dtype.startswith(("packed", "ggml", "gguf")):
        return False
    try:
        size = np_dtype(span.disk_dtype or var.dtype).itemsize
    except (TypeError, ValueError):
        return False
    return bool(size) and span.length >= math.prod(int(d) for d in var.shape) * size


def _slices(grp: Group) -> tuple[int, int, int, Callable | None] | None:
    """How to stream a group along its leading axis: (stored rows per unit, units, output
    values per unit, the scale rows for data rows ``[a, b)`` or None for a scale read
    whole); None when a member cannot be read by slabs."""
    data, scale = grp.data.var, grp.scale.var
    if not _sliceable(data):
        return None
    shape = tuple(int(d) for d in data.shape)
    rows = shape[0]
    per_row = math.prod(shape[1:])
    if grp.scheme == "mxfp4":
        if not _sliceable(scale) or tuple(int(d) for d in scale.shape) != shape[:-1]:
            return None
        return 1, rows, per_row * 2, lambda a, b: (a, b)
    if grp.scheme == "fp8-tensor":
        return 1, rows, per_row, None
    if grp.scheme == "fp8-channel":
        if not _sliceable(scale):
            return None
        return 1, rows, per_row, lambda a, b: (a, b)
    if grp.block is not None and len(shape) == 2:
        if not _sliceable(scale):
            return None
        b0 = grp.block[0]
        return b0, -(-rows // b0), b0 * per_row, lambda a, b: (a // b0, -(-b // b0))
    return None


def _rows(var: VarInfo, start: int, stop: int) -> VarInfo:
    """The stored variable's rows ``[start, stop)`` as a variable of their own (a byte range
    of its span)."""
    span = var.span
    assert span is not None
    shape = tuple(int(d) for d in var.shape)
    size = np_dtype(span.disk_dtype or var.dtype).itemsize
    row_bytes = math.prod(shape[1:]) * size
    part = replace(span, offset=span.offset + start * row_bytes, length=(stop - start) * row_bytes)
    return replace(var, shape=(stop - start, *shape[1:]), nbytes=part.length, span=part)


def fp8(weight: np.ndarray, scale: np.ndarray, block: tuple[int, int] | None) -> np.ndarray:
    """``weight.float() * scale`` per tensor, channel or block (partial blocks at the edges)."""
    w = weight.astype(np.float32)
    s = scale.astype(np.float32)
    if block is None:
        w *= s.reshape(-1, *([1] * (w.ndim - 1))) if s.size > 1 else s.reshape(())
        return w
    rows = np.repeat(s, block[0], axis=0)[: w.shape[0]]
    w *= np.repeat(rows, block[1], axis=1)[:, : w.shape[1]]
    return w


def mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """transformers' ``convert_moe_packed_tensors`` in numpy (float32)."""
    *prefix, g, b = blocks.shape
    flat = blocks.reshape(-1, b)
    exp = scales.view(np.uint8).reshape(-1, 1).astype(np.int32) - 127
    out = np.empty((flat.shape[0], b * 2), dtype=np.float32)
    out[:, 0::2] = FP4_VALUES[flat & 0x0F]
    out[:, 1::2] = FP4_VALUES[flat >> 4]
    out = np.ldexp(out, exp)
    out = out.reshape(*prefix, g * b * 2)
    if out.ndim >= 3:
        out = np.ascontiguousarray(np.swapaxes(out, 1, 2))
    return out
