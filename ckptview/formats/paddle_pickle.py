"""``paddle.save`` / ``paddle.static.save`` / ``fluid.save`` pickle conventions (specs/paddle.md
§5.2-5.3): the variables of an unpickled object and reading them back.

Read through the restricted unpickler with array payloads left on disk, so listing reads the
pickle's structure only and each array is one ranged read. Handled forms: flat state dicts
with ``StructuredToParameterName@@`` (kept as ``attrs['param_name']``), nested objects whose
tensors are ``(name, ndarray)`` tuples or the ``builtins.eval('data', {'data': a})`` form,
protocols 0-5, and arrays split by ``UnpackBigParamInfor@@`` (reassembled).

bfloat16: Paddle pickles bf16 tensors as uint16 bit patterns with no marker. A dtype map from
``hints.dtypes`` or the program in ``hints.program`` decides; without one, uint16 is read
as bfloat16 (Paddle's own convention: ``Tensor.numpy()`` of bf16 gives uint16) and the row says
so in ``attrs['stored_as']``.
"""

from __future__ import annotations

import posixpath
from typing import Any

import numpy as np

from ..dtypes import np_dtype
from ..io import Blob
from ..model import HintsLike, PaddleHints, VarInfo
from .paddle_desc import program_dtypes
from .pickle import ArrayRef, flatten
from .pickle_vars import array_var, read_locator, value_var
from .torch_pickle import LEGACY_MAGIC

PADDLE_SUFFIXES = (".pdparams", ".pdopt", ".pdckpt", ".pdstates", ".pdtensor", ".pdema")
PICKLE_SUFFIXES = (".pkl", ".pickle")
NAME_TABLE = "StructuredToParameterName@@"
BIG_TABLE = "UnpackBigParamInfor@@"
_PROTO01_START = (b"(", b"}", b"]", b"c", b"(dp", b"}q")


def looks_like_pickle(head: bytes) -> bool:
    """Protocol 2-5 (PROTO opcode) or a plausible protocol 0/1 start."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return not head.startswith(LEGACY_MAGIC)
    return head[:1] in (b"(", b"}", b"]")


def _is_tensor_tuple(node: Any) -> bool:
    return (
        isinstance(node, tuple)
        and len(node) == 2
        and isinstance(node[0], str)
        and isinstance(node[1], ArrayRef)
    )


def _keep(node: Any) -> bool:
    if _is_tensor_tuple(node):
        return True
    if isinstance(node, (list, tuple)) and node and len(node) <= 4096:
        return all(isinstance(v, (bool, int, float)) for v in node)
    return False


class BigArray:
    """An array ``UnpackBigParamInfor@@`` split into flat slices: read back and reshaped."""

    def __init__(self, parts: list[ArrayRef], shape: tuple[int, ...]):
        self.parts = parts
        self.shape = shape

    def read(self, blob: Blob) -> np.ndarray:
        return np.concatenate([p.read(blob).reshape(-1) for p in self.parts]).reshape(self.shape)


def reassemble_big(obj: dict) -> None:
    """Undo ``_unpack_saved_dict``: ``name@@.0``, ``name@@.1`` … back into one entry."""
    info = obj.pop(BIG_TABLE, None)
    if not isinstance(info, dict):
        return
    for name, entry in info.items():
        if not isinstance(entry, dict):
            continue
        slices = entry.get("slices") or []
        parts = [obj.pop(k, None) for k in slices]
        shape = tuple(int(d) for d in entry.get("OriginShape") or ())
        if parts and all(isinstance(p, ArrayRef) for p in parts):
            obj[name] = BigArray(parts, shape)


def load_program_dtypes(blob: Blob, hints: HintsLike) -> dict[str, str]:
    """name -> dtype from ``hints.dtypes`` or the program in ``hints.program``."""
    hints = PaddleHints.of(hints)
    dtypes = dict(hints.dtypes or {})
    program = hints.program
    if program and not dtypes:
        try:
            dtypes = program_dtypes(blob.storage, program)
        except Exception:  # noqa: BLE001 - a broken program leaves the uint16 rule
            dtypes = {}
    return dtypes


def paddle_variables(obj: Any, blob: Blob, dtypes: dict[str, str]) -> list[VarInfo]:
    """The VarInfos of an unpickled paddle.save object."""
    param_names: dict = {}
    if isinstance(obj, dict):
        table = obj.pop(NAME_TABLE, None)
        param_names = table if isinstance(table, dict) else {}
        reassemble_big(obj)
    out = []
    for name, leaf in flatten(obj, keep=_keep):
        attrs = {}
        if _is_tensor_tuple(leaf):
            attrs["param_name"], leaf = leaf
        if name in param_names:
            attrs["param_name"] = param_names[name]
        if isinstance(leaf, BigArray):
            var = _big_var(name, leaf)
        elif isinstance(leaf, ArrayRef):
            var = array_var(name, leaf, blob.path)
            var.attrs.pop("numpy", None)
        else:
            found = value_var(name, leaf)
            if found is None:
                continue
            var = found
        var.attrs.update(attrs)
        _fix_bf16(var, dtypes)
        out.append(var)
    return out


def _big_var(name: str, big: BigArray) -> VarInfo:
    first = big.parts[0]
    if first.dtype is None:
        raise ValueError(f"{name}: big-array slice without a dtype")
    var = VarInfo(name, str(first.dtype), big.shape, locator=("big", big))
    if sum(p.numel for p in big.parts) != var.numel or any(
        p.dtype != first.dtype for p in big.parts
    ):
        var.error = "big-array slices do not add up to the original shape"
    var.nbytes = var.numel * first.dtype.itemsize
    return var


def _fix_bf16(var: VarInfo, dtypes: dict[str, str]) -> None:
    if var.dtype != "uint16":
        return
    keys = (var.name, var.attrs.get("param_name"), posixpath.basename(var.name))
    known = next((dtypes[k] for k in keys if k in dtypes), None)
    if known == "uint16" or (var.span is not None and var.span.disk_dtype):
        return
    var.dtype = "bfloat16"
    var.attrs["stored_as"] = "uint16"
    if known is None:
        var.attrs["dtype_guessed"] = True


def read_paddle(blob: Blob, var: VarInfo) -> np.ndarray:
    """Values of a variable listed by :func:`paddle_variables` without a Span."""
    loc = var.locator
    if isinstance(loc, tuple) and loc and loc[0] == "big":
        arr = loc[1].read(blob)
    else:
        arr = read_locator(blob, var)
    if var.dtype == "bfloat16" and arr.dtype == np.uint16:
        arr = arr.view(np_dtype("bfloat16"))
    return arr
