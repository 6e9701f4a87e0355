"""Paddle programs: the ``ProgramDesc`` protobuf (``__model__``, ``*.pdmodel``) and the PIR
JSON program, read for what checkpoints need -- the persistable variables a ``save_combine``
file holds, in its order, and each variable's dtype.
"""

from __future__ import annotations

import threading
import weakref

from ..io import Blob
from . import protobuf as pb
from .paddle_stream import DTYPES, FormatError
from .small import loads_json

MAX_PROGRAM_BYTES = 256 << 20
#: VarType codes never saved as tensors (FEED_MINIBATCH, FETCH_LIST, READER, RAW)
NOT_SAVED = {9, 10, 15, 17}
DENSE_TYPES = {7}  # LOD_TENSOR / DENSE_TENSOR


def program_param_names(blob: Blob, path: str, count: int, cut: bool = False) -> list[str]:
    """Sorted names of the persistable variables a ``save_combine`` of ``program`` holds.

    Tries persistable vars minus FEED/FETCH/RAW/READER first; if that count does not match the
    file, only DENSE_TENSOR ones (save_combine never writes SelectedRows).
    """
    store = blob.storage.blob(path)
    if store.size > MAX_PROGRAM_BYTES:
        raise FormatError(f"program of {store.size} bytes is too large")
    data = store.read(0, store.size)
    if path.lower().endswith(".json") or data[:1] == b"{":
        return sorted(pir_persistable_names(data))
    candidates = program_desc_vars(data)
    names = sorted({n for n, t in candidates if t not in NOT_SAVED})
    if len(names) != count and not cut:
        dense = sorted({n for n, t in candidates if t in DENSE_TYPES})
        if len(dense) == count:
            return dense
    return names


def program_dtypes(storage, path: str) -> dict[str, str]:
    """name -> dtype of the persistable dense variables a program declares (legacy desc or PIR
    JSON); lets pickle readers tell bfloat16 from the uint16 bit patterns pickles hold.

    Remembered per storage and file identity: the ``.pdparams`` and ``.pdopt`` beside one
    program (listed concurrently) read it once.
    """
    info = storage.info(path)
    key = (path, info["size"], info.get("mtime"), info.get("etag"))
    with _PROGRAMS_LOCK:
        memo = _PROGRAMS.setdefault(storage, {})
        if key not in memo:
            memo.clear()  # one program at a time is plenty; keeps the memo bounded
            memo[key] = _program_dtypes(storage.blob(path, info["size"]), path)
        return dict(memo[key])


_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_PROGRAMS_LOCK = threading.Lock()


def _program_dtypes(blob: Blob, path: str) -> dict[str, str]:
    if blob.size > MAX_PROGRAM_BYTES:
        raise FormatError(f"program of {blob.size} bytes is too large")
    data = blob.read(0, blob.size)
    if path.lower().endswith(".json") or data[:1] == b"{":
        return _pir_dtypes(loads_json(data))
    out = {}
    for raw in pb.decode(pb.decode(data).get(1, [b""])[0]).get(3, []):
        var = pb.decode(raw)
        if not (var.get(3) and var[3][-1]):
            continue
        vtype = pb.decode(var[2][-1]) if var.get(2) else {}
        tensor = vtype.get(3) or vtype.get(2)  # dense_tensor.tensor, or selected_rows
        if not tensor:
            continue
        desc = pb.decode(tensor[-1])
        desc = pb.decode(desc[1][-1]) if vtype.get(3) and desc.get(1) else desc
        code = desc.get(1, [None])[-1]
        if code in DTYPES:
            out[pb.string(var.get(1, []))] = DTYPES[code][0]
    return out


def _pir_dtypes(doc: dict) -> dict[str, str]:
    out = {}
    for region in doc.get("program", {}).get("regions", []):
        for block in region.get("blocks", [])[:1]:
            for op in block.get("ops", []):
                name = _pir_persistable(op)
                outs = op.get("O")
                first = outs[0] if isinstance(outs, list) and outs else outs
                try:
                    code = first["TT"]["D"][0]["#"]
                except (KeyError, IndexError, TypeError):
                    continue
                dtype = _PIR_DTYPES.get(str(code).rsplit(".", 1)[-1])
                if name and dtype:
                    out[name] = dtype
    return out


_PIR_DTYPES = {
    "t_bool": "bool", "t_i8": "int8", "t_ui8": "uint8", "t_i16": "int16", "t_i32": "int32",
    "t_i64": "int64", "t_f16": "float16", "t_bf16": "bfloat16", "t_f32": "float32",
    "t_f64": "float64", "t_c64": "complex64", "t_c128": "complex128",
    "t_f8e4m3fn": "float8_e4m3fn", "t_f8e5m2": "float8_e5m2", "t_ui16": "uint16",
    "t_ui32": "uint32", "t_ui64": "uint64",
}  # fmt: skip


def program_desc_vars(data: bytes) -> list[tuple[str, int]]:
    """(name, VarType code) of the persistable variables of block 0 of a ProgramDesc."""
    blocks = pb.decode(data).get(1, [])
    if not blocks:
        raise FormatError("ProgramDesc has no blocks")
    out = []
    for raw in pb.decode(blocks[0]).get(3, []):
        var = pb.decode(raw)
        if not (var.get(3) and var[3][-1]):
            continue
        vtype = pb.decode(var[2][-1]).get(1, [-1])[-1] if var.get(2) else -1
        out.append((pb.string(var.get(1, [])), vtype))
    return out


def pir_persistable_names(data: bytes) -> list[str]:
    """Names of the persistable values of a PIR program JSON (parameters, persistable data)."""
    doc = loads_json(data)
    names: set[str] = set()
    for region in doc.get("program", {}).get("regions", []):
        for block in region.get("blocks", [])[:1]:
            for op in block.get("ops", []):
                name = _pir_persistable(op)
                if name:
                    names.add(name)
    return sorted(names)


def _pir_persistable(op: dict) -> str | None:
    kind = str(op.get("#", ""))
    attrs = op.get("A")
    if any(word in kind for word in ("feed", "fetch", "shadow_output")):
        return None
    if kind in ("p", "0.p", "builtin.parameter", "0.parameter") and isinstance(attrs, list):
        strings = [a for a in attrs if isinstance(a, str)]
        if strings:
            return strings[-1]
    if isinstance(attrs, list):
        named = {a.get("N"): a.get("AT", {}).get("D") for a in attrs if isinstance(a, dict)}
        out = {a.get("N"): a.get("AT", {}) for a in op.get("OA", []) if isinstance(a, dict)}
        flag = out.get("persistable", {}).get("D")
        persistable = isinstance(flag, list) and any(
            isinstance(f, dict) and f.get("D") is True for f in flag
        )
        if persistable and isinstance(named.get("name"), str):
            return named["name"]
    return None
