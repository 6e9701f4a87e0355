"""The inert stand-ins a restricted pickle builds instead of objects: raw byte ranges
(:class:`LazyBytes`), numpy arrays and dtypes (:class:`ArrayRef`, :class:`DtypeRef`) and
instances of allowlisted classes (:class:`Record`). Nothing here ever imports or calls what a
pickle names.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from ...io import Blob


class RestrictedUnpicklingError(pickle.UnpicklingError):
    """A pickle asked for something the restricted unpickler refuses (a global, an opcode)."""


@dataclass(eq=False)
class LazyBytes:
    """``length`` bytes at ``offset`` of a file, not read yet.

    ``transform``: None (raw bytes) or ``"utf8-latin1"`` (a protocol-2 ``_codecs.encode``
    payload: UTF-8 text whose code points are the bytes).
    """

    offset: int
    length: int
    blob: Blob | None = None
    transform: str | None = None
    text: bool = False  # a str payload (BINUNICODE) rather than bytes

    def read(self, source: Blob | None = None) -> bytes | str:
        blob = source or self.blob
        if blob is None:
            raise ValueError("LazyBytes has no source to read from")
        data = blob.read(self.offset, self.length)
        if self.transform == "utf8-latin1":
            return data.decode("utf-8").encode("latin1")
        return data.decode("utf-8", "surrogatepass") if self.text else data

    def __len__(self) -> int:
        return self.length


@dataclass(eq=False)
class DtypeRef:
    """A pickled ``numpy.dtype``; :meth:`np` builds the real (inert) numpy dtype."""

    spec: str
    byteorder: str = "="
    fields: Any = None
    names: Any = None

    def np(self) -> np.dtype:
        if self.names is not None and isinstance(self.fields, dict):
            names = list(self.names)
            formats, offsets = [], []
            for n in names:
                sub = self.fields[n]
                formats.append(as_np_dtype(sub[0]))
                offsets.append(int(sub[1]))
            return np.dtype({"names": names, "formats": formats, "offsets": offsets})
        dt = np.dtype(self.spec)
        if self.byteorder in "<>" and dt.itemsize > 1:
            dt = dt.newbyteorder(cast(Any, self.byteorder))  # a hostile value: numpy refuses
        return dt


@dataclass(eq=False)
class ArrayRef:
    """A pickled numpy array: shape, dtype, order and its data (bytes, LazyBytes or a list)."""

    shape: tuple[int, ...] = ()
    dtype: np.dtype | None = None
    fortran_order: bool = False
    data: Any = None

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * (self.dtype.itemsize if self.dtype is not None else 0)

    def read(self, source: Blob | None = None) -> np.ndarray:
        """The array's values (a ranged read for lazy data)."""
        if self.dtype is None:
            raise ValueError("array without a dtype")
        order: Literal["C", "F"] = "F" if self.fortran_order else "C"
        if self.dtype.hasobject:
            return np.array(list(self.data or []), dtype=object).reshape(self.shape, order=order)
        data = self.data.read(source) if isinstance(self.data, LazyBytes) else self.data
        if isinstance(data, str):
            data = data.encode("latin1")
        want = self.nbytes
        if data is None or len(data) < want:
            raise ValueError(f"array data holds {len(data or b'')} bytes, needs {want}")
        arr = np.frombuffer(data, dtype=self.dtype, count=self.numel)
        return arr.reshape(self.shape, order=order)


class Record:
    """An instance of an allowlisted class, kept inert: class name, args, kwargs and state."""

    __slots__ = ("cls", "args", "kwargs", "state")

    def __init__(self, cls: str, args: tuple = (), kwargs: dict | None = None):
        self.cls = cls
        self.args = args
        self.kwargs = kwargs or {}
        self.state: Any = None

    def fields(self) -> dict:
        """Readable fields: the state dict (slots merged), else kwargs."""
        st = self.state
        if isinstance(st, tuple) and len(st) == 2:
            merged = dict(st[0] or {}) if isinstance(st[0], dict) else {}
            if isinstance(st[1], dict):
                merged.update(st[1])
            return merged
        if isinstance(st, dict):
            return st
        return dict(self.kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        f = self.fields()
        if name in f:
            return f[name]
        raise AttributeError(f"{self.cls} record has no field {name!r}")

    @property
    def value(self) -> Any:
        """An enum's value (its single arg) or the state."""
        return self.args[0] if len(self.args) == 1 else self.state

    def __repr__(self) -> str:
        inner = repr(self.args[0]) if len(self.args) == 1 else ""
        return f"{self.cls.rsplit('.', 1)[-1]}({inner})"


class RecordClass:
    """A class global resolved to Records."""

    def __init__(self, qualname: str):
        self.qualname = qualname

    def __call__(self, *args, **kwargs) -> Record:
        return Record(self.qualname, args, kwargs)

    def __repr__(self) -> str:
        return f"<record class {self.qualname}>"


class Marker:
    """A global that may be referenced (e.g. as a subtype argument) but never called."""

    def __init__(self, qualname: str):
        self.qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RestrictedUnpicklingError(f"refused call of {self.qualname}")


def as_np_dtype(d: Any) -> np.dtype:
    """A numpy dtype from a pickled dtype (:class:`DtypeRef`), a dtype or its name."""
    if isinstance(d, DtypeRef):
        return d.np()
    if isinstance(d, np.dtype):
        return d
    if isinstance(d, str):
        return np.dtype(d)
    raise RestrictedUnpicklingError(f"not a dtype: {type(d).__name__}")


def ints(value: Any, what: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints (a shape, a stride); RestrictedUnpicklingError if not."""
    if isinstance(value, (tuple, list)):
        for v in value:
            if type(v) is not int:  # plain ints are the rule; other ints are converted
                break
        else:
            return tuple(value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(int(v) for v in value)
    raise RestrictedUnpicklingError(f"tensor {what} is not a tuple of ints")


def prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
