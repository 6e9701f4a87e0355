"""Object-dtype ``.npy`` payloads: ``np.save(path, [a, b, c])`` of arrays of different shapes
writes an object array whose values are a pickle of the element arrays.

The pickle runs through the restricted VM (:mod:`ckptview.formats.pickle`), never through
Python's: a file listed here is one ``np.load(allow_pickle=False)`` refuses. Its elements become
variables ``<name>/<index>`` (``<index>``: the element's C-order index, ``i`` or ``i/j``; a 0-d
array's one element takes the name itself) when every element is a numeric array, a number or a
list/tuple/dict of them; anything else (a class instance, a function, a string, None) makes the
whole array one error row naming it. Every row of an object array carries
``attrs["needs_pickle"] = True``.

Element arrays are byte ranges of the file (Spans) where the VM recorded their payloads as
:class:`~ckptview.formats.pickle.LazyBytes`. In a deflated ``.npz`` member they are ranges of
the inflated stream (:class:`InflatingBlob`), read back by inflating the member up to them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..dtypes import dtype_name, np_dtype
from ..io import Blob
from ..model import VarInfo
from .inflate import InflatingBlob, inflate
from .pickle import (
    MAX_DEPTH,
    MAX_LEAVES,
    ArrayRef,
    DtypeRef,
    LazyBytes,
    Record,
    RestrictedUnpicklingError,
    load_pickle,
)
from .pickle_vars import array_var, read_locator, value_var

#: the attrs key set on every row of an object array (np.load needs allow_pickle=True)
NEEDS_PICKLE = "needs_pickle"
NUMERIC = "biufc"


class Refused(ValueError):
    """An object array holds something ckptview does not read as values."""


# -- locators -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Deflated:
    """Where a deflated member's compressed bytes lie and its inflated size."""

    offset: int
    compressed: int
    size: int

    def stream(self, blob: Blob) -> InflatingBlob:
        return InflatingBlob(blob, self.offset, self.compressed, self.size)


@dataclass(frozen=True)
class ObjectArray:
    """An object array's pickle: ``[offset, end)`` of the file, or of the inflated member."""

    offset: int
    end: int
    deflated: Deflated | None = None


@dataclass(frozen=True)
class InflatedArray:
    """An element array whose bytes are ``[skip, skip + length)`` of a deflated member's
    inflated stream (``transform``/``text``: as :class:`LazyBytes` decodes them)."""

    where: Deflated
    skip: int
    length: int
    dtype: str  # the array's on-disk dtype string
    order: str
    transform: str | None = None
    text: bool = False


# -- listing ------------------------------------------------------------------------------------
def object_array_vars(name: str, source: Blob, offset: int, end: int, shape: tuple[int, ...],
                      deflated: Deflated | None = None) -> list[VarInfo]:  # fmt: skip
    """The rows of an object array whose pickle is ``[offset, end)`` of ``source`` (the file,
    or the :class:`InflatingBlob` of a ``deflated`` member): the array itself (dtype
    ``object``), then one row per numeric element; or the array alone with an error."""
    container = VarInfo(name, "object", shape, nbytes=0, attrs={NEEDS_PICKLE: True},
                        locator=ObjectArray(offset, end, deflated))  # fmt: skip
    try:
        arr = load_pickle(source, offset=offset, end=end, encoding="latin1")
        if not (isinstance(arr, ArrayRef) and arr.dtype is not None and arr.dtype.hasobject):
            raise Refused(f"object array: its pickle holds {_what(arr)}, not an object array")
        if arr.shape != tuple(shape):
            raise Refused(f"object array: its pickle says shape {arr.shape}, its header "
                          f"{tuple(shape)}")  # fmt: skip
        rows: list[VarInfo] = []
        for path, leaf in _leaves(arr, name):
            rows.append(_leaf_var(path, leaf, source, deflated))
            if len(rows) > MAX_LEAVES:
                raise Refused("object array: more than a million elements")
    except Refused as e:
        container.error = str(e)[:300]
        return [container]
    except RestrictedUnpicklingError as e:  # names the refused global
        container.error = f"object array: {e} (its pickle is never run)"[:300]
        return [container]
    except Exception as e:  # noqa: BLE001 - a cut or malformed pickle: an error row
        container.error = f"object array: its pickle is not read ({type(e).__name__}: {e})"[:300]
        return [container]
    for row in rows:
        row.attrs[NEEDS_PICKLE] = True
    return [container, *rows]


def _join(path: str, key: str) -> str:
    return f"{path}/{key}" if path and key else path or key


def _leaves(arr: ArrayRef, path: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    """``(name, leaf)`` for every element of an object array (nested containers walked);
    Refused at the first element that is neither a numeric array nor a number."""
    items = arr.data if isinstance(arr.data, list) else []
    if len(items) != arr.numel:
        raise Refused(f"object array: {len(items)} elements for shape {arr.shape}")
    for k, item in enumerate(items):
        if arr.shape:
            key = "/".join(str(int(i)) for i in np.unravel_index(k, arr.shape))
        else:  # a 0-d array (np.save of a dict): its item's own names, or "item"
            nested = isinstance(item, (dict, list, tuple)) or (
                isinstance(item, ArrayRef) and item.dtype is not None and item.dtype.hasobject
            )
            key = "" if nested else "item"
        yield from _walk(item, _join(path, key), depth + 1)


def _walk(node: Any, path: str, depth: int) -> Iterator[tuple[str, Any]]:
    if depth > MAX_DEPTH:
        raise Refused(f"object array: nests more than {MAX_DEPTH} deep at {path[:80]!r}")
    if isinstance(node, ArrayRef) and node.dtype is not None and node.dtype.hasobject:
        yield from _leaves(node, path, depth)
    elif isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise Refused(f"object array element {path!r} is a dict keyed by {_what(key)}")
            yield from _walk(value, _join(path, str(key)), depth + 1)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _walk(value, _join(path, str(i)), depth + 1)
    elif _numeric(node):
        yield path, node
    else:
        raise Refused(f"object array element {path!r} is {_what(node)}: ckptview reads object "
                      "arrays of numeric arrays and numbers only (their pickle is never run)")  # fmt: skip


def _numeric(node: Any) -> bool:
    if isinstance(node, ArrayRef):
        return node.dtype is not None and node.dtype.kind in NUMERIC and node.dtype.names is None
    if isinstance(node, np.generic):
        return node.dtype.kind in NUMERIC
    return isinstance(node, (bool, int, float, complex))


def _what(node: Any) -> str:
    """What a refused element is, naming the global it came from when there is one."""
    if isinstance(node, Record):
        return f"a pickled {node.cls} instance"
    qualname = getattr(node, "qualname", None)  # a class or marker global as a value
    if isinstance(qualname, str):
        return f"the global {qualname}"
    if isinstance(node, ArrayRef):
        return f"an array of dtype {node.dtype}"
    if isinstance(node, DtypeRef):
        return "a numpy.dtype"
    if callable(node):
        return f"the function {getattr(node, '__name__', type(node).__name__)}"
    if node is None:
        return "None"
    return f"a {type(node).__name__} ({repr(node)[:40]})"


def _leaf_var(path: str, leaf: Any, source: Blob, deflated: Deflated | None) -> VarInfo:
    if not isinstance(leaf, ArrayRef):
        var = value_var(path, leaf)
        if var is None:  # unreachable for the numbers _numeric admits
            raise Refused(f"object array element {path!r} is {_what(leaf)}")
        return var
    data = leaf.data
    if deflated is None or not isinstance(data, LazyBytes):
        return array_var(path, leaf, source.path)
    assert leaf.dtype is not None
    var = VarInfo(path, dtype_name(leaf.dtype), leaf.shape, nbytes=leaf.nbytes,
                  attrs={"numpy": True})  # fmt: skip
    if data.transform is None and not data.text and data.length < leaf.nbytes:
        var.error = f"array data holds {data.length} bytes, needs {leaf.nbytes}"
        return var
    var.locator = InflatedArray(deflated, data.offset, data.length, leaf.dtype.str,
                                "F" if leaf.fortran_order else "C", data.transform, data.text)  # fmt: skip
    return var


# -- reading ------------------------------------------------------------------------------------
def is_object_locator(locator: Any) -> bool:
    return isinstance(locator, (ObjectArray, InflatedArray))


def read_object(blob: Blob, var: VarInfo) -> np.ndarray:
    """Values of a row :func:`object_array_vars` made (the array, or one element)."""
    loc = var.locator
    if isinstance(loc, InflatedArray):
        return _read_inflated(blob, loc, var)
    if isinstance(loc, ObjectArray):
        source = loc.deflated.stream(blob) if loc.deflated is not None else blob
        arr = load_pickle(source, offset=loc.offset, end=loc.end, encoding="latin1")
        if not isinstance(arr, ArrayRef) or tuple(arr.shape) != tuple(var.shape):
            raise ValueError(f"{var.name}: the object array changed since it was listed")
        for _ in _leaves(arr, var.name):  # refuses what the listing refused
            pass
        return _materialize(arr, source)
    out = np.asarray(read_locator(blob, var))  # an in-memory element: native byte order
    target = np_dtype(var.dtype)
    return out.astype(target) if out.dtype != target else out


def _read_inflated(blob: Blob, loc: InflatedArray, var: VarInfo) -> np.ndarray:
    raw = b"".join(inflate(blob, loc.where.offset, loc.where.compressed, loc.skip, loc.length))
    if len(raw) < loc.length:
        raise ValueError(f"{var.name}: compressed member ends early")
    data: bytes = raw
    if loc.transform == "utf8-latin1":
        data = raw.decode("utf-8").encode("latin1")
    elif loc.text:
        data = raw.decode("utf-8", "surrogatepass").encode("latin1")
    dt = np.dtype(loc.dtype)
    want = var.numel * dt.itemsize
    if len(data) < want:
        raise ValueError(f"{var.name}: array data holds {len(data)} bytes, needs {want}")
    order: Literal["C", "F"] = "F" if loc.order == "F" else "C"
    arr = np.frombuffer(data, dtype=dt, count=var.numel).reshape(var.shape, order=order)
    target = np_dtype(var.dtype)
    return arr.astype(target) if arr.dtype != target else arr


def _materialize(node: Any, source: Blob) -> Any:
    """The values a listed object array holds: arrays read, containers rebuilt."""
    if isinstance(node, ArrayRef) and node.dtype is not None and node.dtype.hasobject:
        out = np.empty(node.numel, dtype=object)
        for k, item in enumerate(node.data):
            out[k] = _materialize(item, source)
        return out.reshape(node.shape)  # the pickle lists the items in C order
    if isinstance(node, ArrayRef):  # native byte order, as numpy unpickles it
        arr = node.read(source)
        return arr.astype(arr.dtype.newbyteorder("=")) if not arr.dtype.isnative else arr
    if isinstance(node, dict):
        return {k: _materialize(v, source) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return type(node)(_materialize(v, source) for v in node)
    return node
