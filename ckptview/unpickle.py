"""The one restricted unpickler for every pickle-based checkpoint format.

A small pickle VM of our own (protocols 0-5). Nothing in a pickle is ever executed: every
GLOBAL resolves through an allowlist to an inert stand-in; anything else raises
:class:`RestrictedUnpicklingError` naming the refused global. The VM reads from bytes or from a
:class:`ckptview.io.Blob` through a small buffered reader; payloads of BINBYTES/BINBYTES8/
BYTEARRAY8/BINSTRING (and long BINUNICODE strings) at or above ``lazy_min`` bytes are recorded as
:class:`LazyBytes` file ranges instead of being read, so a catalog scan of a pickle holding big
numpy arrays reads only its small structure. No length field is trusted: every length is
checked against the bytes left before anything is allocated or read.

Allowlist (module.qualname -> stand-in):

* numpy: ``numpy.core.multiarray._reconstruct`` / ``numpy._core.multiarray._reconstruct`` ->
  :class:`ArrayRef` (filled by BUILD), ``...multiarray.scalar`` -> a numpy scalar of a non-object
  dtype, ``numpy.ndarray`` (marker), ``numpy.dtype`` -> :class:`DtypeRef`.
* ``_codecs.encode`` (latin1/utf-8 only), ``collections.OrderedDict`` -> dict,
  ``builtins.{tuple,list,dict,set,frozenset,slice,complex,bytes,bytearray,object}`` (data
  only: ``bytes(n)``/``bytearray(n)`` with an int is refused), ``copyreg._reconstructor`` -> :class:`Record`.
* ``builtins.eval`` only in Paddle's tensor form ``eval('data', {'data': array})``: the dict
  entry is returned, nothing is evaluated.
* torch: ``torch._utils._rebuild_tensor``/``_v2``/``_v3``, ``_rebuild_parameter``,
  ``_rebuild_parameter_with_state``, ``_rebuild_meta_tensor_no_storage``,
  ``_rebuild_device_tensor_from_numpy`` -> :class:`TensorRef`; ``torch._tensor.
  _rebuild_from_type_v2`` (applies our own stand-in); ``torch.<X>Storage``,
  ``torch.cuda.<X>Storage``, ``torch.storage.{UntypedStorage,TypedStorage}`` ->
  :class:`StorageType`; ``torch.<dtype>`` -> :class:`TorchDtype`; ``torch.Size`` -> tuple;
  ``torch.device``, ``torch.serialization._get_layout``, ``torch.memory_format`` -> str.
* Inert :class:`Record` for data classes (never called, only their args/state kept):
  ``torch.distributed.checkpoint.*``, ``paddle.*`` (Paddle DCP metadata, both module paths),
  ``transformers.*``, ``accelerate.*``, ``lightning.*``, ``pytorch_lightning.*``,
  ``lightning_fabric.*``, ``omegaconf.*``, ``argparse.Namespace``, ``pathlib.*Path``,
  ``datetime.*``, ``enum.*``.

``allow`` adds entries: a mapping ``{qualname: callable}``, or names (``"pkg.mod.Cls"``) /
prefixes (``"pkg."``) that become Records.
"""

from __future__ import annotations

import codecs as _codecs
import re
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import np_dtype
from .io import HEAD_BLOCK, Blob, TruncatedError

LAZY_MIN = 4096  # payloads at least this long stay on disk as LazyBytes (Blob sources)
CHUNK = 1 << 16
MAX_LINE = 1 << 26  # protocol-0 text lines (a py2 STRING may hold an array)
MAX_LEAVES = 1_000_000
#: objects the VM may hold at once (stack + memo entries): a pickle of millions of DUP/PUT
#: opcodes must not build an enormous memo
MAX_OBJECTS = 10_000_000


class RestrictedUnpicklingError(__import__("pickle").UnpicklingError):
    """A pickle asked for something the restricted unpickler refuses (a global, an opcode)."""


# -- stand-ins --------------------------------------------------------------------------------
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
class StorageType:
    """A torch storage class (``torch.FloatStorage``): only its element dtype."""

    name: str
    dtype: str  # numpy name; UntypedStorage: uint8 (numel counts bytes)


@dataclass(eq=False)
class TorchDtype:
    """A ``torch.<dtype>`` global, as a numpy dtype name."""

    torch_name: str
    dtype: str


@dataclass(eq=False)
class StorageRef:
    """A torch storage named by a persistent id; nothing is read."""

    key: str
    dtype: str
    numel: int
    location: str = "cpu"
    storage_type: str = ""

    @property
    def nbytes(self) -> int:
        return self.numel * np_dtype(self.dtype).itemsize


@dataclass(eq=False)
class TensorRef:
    """A torch tensor: a view (offset, size, stride in elements) into a storage."""

    storage: StorageRef | None
    storage_offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    requires_grad: bool = False
    is_parameter: bool = False
    array: ArrayRef | None = None  # _rebuild_device_tensor_from_numpy
    metadata: Any = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.size

    @property
    def numel(self) -> int:
        return _prod(self.size)


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
                formats.append(_as_np_dtype(sub[0]))
                offsets.append(int(sub[1]))
            return np.dtype({"names": names, "formats": formats, "offsets": offsets})
        dt = np.dtype(self.spec)
        if self.byteorder in "<>" and dt.itemsize > 1:
            dt = dt.newbyteorder(self.byteorder)
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
        return _prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * (self.dtype.itemsize if self.dtype is not None else 0)

    def read(self, source: Blob | None = None) -> np.ndarray:
        """The array's values (a ranged read for lazy data)."""
        if self.dtype is None:
            raise ValueError("array without a dtype")
        order = "F" if self.fortran_order else "C"
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


class _RecordClass:
    """A class global resolved to Records."""

    def __init__(self, qualname: str):
        self.qualname = qualname

    def __call__(self, *args, **kwargs) -> Record:
        return Record(self.qualname, args, kwargs)

    def __repr__(self) -> str:
        return f"<record class {self.qualname}>"


class _Marker:
    """A global that may be referenced (e.g. as a subtype argument) but never called."""

    def __init__(self, qualname: str):
        self.qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RestrictedUnpicklingError(f"refused call of {self.qualname}")


# -- numpy / builtins stand-ins ----------------------------------------------------------------
def _as_np_dtype(d: Any) -> np.dtype:
    if isinstance(d, DtypeRef):
        return d.np()
    if isinstance(d, np.dtype):
        return d
    if isinstance(d, str):
        return np.dtype(d)
    raise RestrictedUnpicklingError(f"not a dtype: {type(d).__name__}")


def _np_reconstruct(subtype: Any, shape: Any = (0,), dtype: Any = b"b") -> ArrayRef:
    return ArrayRef()


def _np_frombuffer(buf: Any, dtype: Any, shape: Any, order: Any = "C") -> ArrayRef:
    """numpy >= 2's protocol-5 array form ``_frombuffer(buffer, dtype, shape, order)``."""
    if isinstance(buf, bytearray):
        buf = bytes(buf)
    if not isinstance(buf, (bytes, LazyBytes)):
        raise RestrictedUnpicklingError(f"_frombuffer of a {type(buf).__name__}")
    dt = _as_np_dtype(dtype)
    if dt.hasobject:
        raise RestrictedUnpicklingError("_frombuffer with an object dtype")
    return ArrayRef(_ints(shape, "shape"), dt, order == "F", buf)


def _np_dtype(spec: Any, align: Any = False, copy: Any = False) -> DtypeRef:
    if isinstance(spec, bytes):
        spec = spec.decode("latin1")
    if not isinstance(spec, str) or not re.fullmatch(r"[A-Za-z]\w{0,15}", spec):
        raise RestrictedUnpicklingError(f"numpy.dtype with an unsupported spec {spec!r}")
    if spec[0] == "O":
        return DtypeRef("O")
    np.dtype(spec)  # validates
    return DtypeRef(spec)


def _np_scalar(dtype: Any, data: Any = None) -> Any:
    dt = _as_np_dtype(dtype)
    if dt.hasobject:
        raise RestrictedUnpicklingError("numpy scalar of object dtype")
    if isinstance(data, str):
        data = data.encode("latin1")
    if not isinstance(data, (bytes, bytearray)) or len(data) < dt.itemsize:
        raise RestrictedUnpicklingError("numpy scalar without its bytes")
    return np.frombuffer(bytes(data[: dt.itemsize]), dtype=dt)[0]


def _codecs_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> Any:
    enc = _codecs.lookup(encoding).name
    if isinstance(obj, LazyBytes) and obj.text:
        if enc != "iso8859-1":
            raise RestrictedUnpicklingError(f"_codecs.encode of lazy text as {encoding}")
        return LazyBytes(obj.offset, obj.length, obj.blob, transform="utf8-latin1")
    if not isinstance(obj, str) or enc not in ("iso8859-1", "utf-8", "ascii"):
        raise RestrictedUnpicklingError(f"_codecs.encode({type(obj).__name__}, {encoding!r})")
    return obj.encode(enc, errors)


def _ordered_dict(items: Any = ()) -> dict:
    return dict(items)


def _bytes(data: Any = b"", *rest: Any) -> bytes:
    if not isinstance(data, (bytes, bytearray, str, list)):
        raise RestrictedUnpicklingError(f"bytes({type(data).__name__}) refused")
    return bytes(data, *rest) if isinstance(data, str) else bytes(data)


def _bytearray(data: Any = b"", *rest: Any) -> bytearray:
    if isinstance(data, int):
        raise RestrictedUnpicklingError("bytearray(int) refused (allocation)")
    if isinstance(data, LazyBytes):
        return data  # type: ignore[return-value]  # stays lazy
    if isinstance(data, str):
        return bytearray(data, *rest)
    return bytearray(data)


def _paddle_eval(source: Any, globs: Any = None, locs: Any = None) -> Any:
    """Paddle's DenseTensor form ``eval('data', {'data': array})``: the entry, never eval'ed."""
    ok = isinstance(source, str) and source.isidentifier() and isinstance(globs, dict)
    if ok and source in globs:
        return globs[source]
    raise RestrictedUnpicklingError(f"builtins.eval refused ({source!r:.60})")


def _copyreg_reconstructor(cls: Any, base: Any, state: Any = None) -> Any:
    if isinstance(cls, _RecordClass):
        return Record(cls.qualname, (state,) if state is not None else ())
    if cls is dict or cls is list:
        return cls()
    raise RestrictedUnpicklingError(f"copyreg._reconstructor of {cls!r}")


def _checked(fn: Callable, *types: type) -> Callable:
    def call(*args):
        for a in args:
            if not isinstance(a, types):
                raise RestrictedUnpicklingError(f"{fn.__name__}() of a {type(a).__name__}")
        return fn(*args)

    call.__name__ = fn.__name__
    return call


_DATA = (int, float, complex, str, bytes, bool, type(None), tuple, list, dict, set, frozenset)

# -- torch stand-ins ---------------------------------------------------------------------------
TORCH_DTYPES = {
    "float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
    "float16": "float16", "half": "float16", "bfloat16": "bfloat16", "int64": "int64",
    "long": "int64", "int32": "int32", "int": "int32", "int16": "int16", "short": "int16",
    "int8": "int8", "uint8": "uint8", "bool": "bool", "complex64": "complex64",
    "cfloat": "complex64", "complex128": "complex128", "cdouble": "complex128",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bits8": "uint8",
    "bits16": "uint16", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
    "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu", "qint8": "int8", "quint8": "uint8", "qint32": "int32",
    "complex32": "complex32", "chalf": "complex32",
}  # fmt: skip
STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "QInt8Storage": "int8", "QUInt8Storage": "uint8",
    "QInt32Storage": "int32", "QUInt4x2Storage": "uint8", "QUInt2x4Storage": "uint8",
    "UntypedStorage": "uint8", "TypedStorage": "uint8", "_UntypedStorage": "uint8",
}  # fmt: skip


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise RestrictedUnpicklingError(f"tensor {what} is not a tuple of ints")
    return tuple(int(v) for v in value)


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: str | None,
            requires_grad: Any = False, metadata: Any = None) -> TensorRef:  # fmt: skip
    if not isinstance(storage, StorageRef):
        raise RestrictedUnpicklingError(f"tensor rebuilt from a {type(storage).__name__}")
    if not isinstance(offset, int):
        raise RestrictedUnpicklingError("tensor storage_offset is not an int")
    return TensorRef(storage, int(offset), _ints(size, "size"), _ints(stride, "stride"),
                     dtype or storage.dtype, bool(requires_grad), metadata=metadata)  # fmt: skip


def _rebuild_tensor(storage, offset, size, stride, *rest):
    return _tensor(storage, offset, size, stride, None)


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None,
                       metadata=None):  # fmt: skip
    return _tensor(storage, offset, size, stride, None, requires_grad, metadata)


def _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks, dtype,
                       metadata=None):  # fmt: skip
    if not isinstance(dtype, TorchDtype):
        raise RestrictedUnpicklingError("_rebuild_tensor_v3 without a torch dtype")
    return _tensor(storage, offset, size, stride, dtype.dtype, requires_grad, metadata)


def _rebuild_parameter(data, requires_grad=True, hooks=None, state=None):
    if isinstance(data, TensorRef):
        data.is_parameter = True
        data.requires_grad = bool(requires_grad)
    return data


def _rebuild_meta(dtype, size, stride, requires_grad=False, *rest):
    d = dtype.dtype if isinstance(dtype, TorchDtype) else "float32"
    return TensorRef(None, 0, _ints(size, "size"), _ints(stride, "stride"), d, bool(requires_grad))


def _rebuild_from_numpy(data, dtype, device=None, requires_grad=False):
    if not isinstance(data, ArrayRef):
        raise RestrictedUnpicklingError("_rebuild_device_tensor_from_numpy without an array")
    d = dtype.dtype if isinstance(dtype, TorchDtype) else str(data.dtype)
    t = TensorRef(None, 0, data.shape, (), d, bool(requires_grad), array=data)
    return t


def _rebuild_from_type_v2(func, new_type, args, state):
    if not isinstance(func, Callable) or isinstance(func, (_Marker, _RecordClass)):
        raise RestrictedUnpicklingError("_rebuild_from_type_v2 of a non-rebuild function")
    if getattr(func, "__module__", None) != __name__:
        raise RestrictedUnpicklingError("_rebuild_from_type_v2 of a foreign function")
    return func(*args)


def _str_of(*args) -> str:
    return ":".join(str(a) for a in args)


def torch_persistent_load(pid: Any) -> StorageRef:
    """Torch's storage persistent id ``('storage', type, key, location, numel[, view])``."""
    if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
        raise RestrictedUnpicklingError(f"unsupported persistent id {str(pid)[:80]}")
    stype, key, location, numel = pid[1], pid[2], pid[3], pid[4]
    if not isinstance(stype, StorageType):
        raise RestrictedUnpicklingError("persistent id without a storage type")
    if not isinstance(numel, int) or numel < 0:
        raise RestrictedUnpicklingError("persistent id with a bad numel")
    return StorageRef(str(key), stype.dtype, int(numel), str(location), stype.name)


def _builtin_allowlist() -> dict[str, Any]:
    table: dict[str, Any] = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[f"{mod}._reconstruct"] = _np_reconstruct
        table[f"{mod}.scalar"] = _np_scalar
    for mod in ("numpy.core.numeric", "numpy._core.numeric"):
        table[f"{mod}._frombuffer"] = _np_frombuffer
    table["numpy.ndarray"] = _Marker("numpy.ndarray")
    table["numpy.dtype"] = _np_dtype
    table["_codecs.encode"] = _codecs_encode
    table["collections.OrderedDict"] = _ordered_dict
    table["collections.defaultdict"] = lambda *a: {}
    table["builtins.tuple"] = _checked(tuple, *_DATA)
    table["builtins.list"] = _checked(list, *_DATA)
    table["builtins.dict"] = _checked(dict, *_DATA)
    table["builtins.set"] = _checked(set, *_DATA)
    table["builtins.frozenset"] = _checked(frozenset, *_DATA)
    table["builtins.slice"] = _checked(slice, int, type(None))
    table["builtins.complex"] = _checked(complex, int, float)
    table["builtins.bytearray"] = _bytearray
    table["builtins.bytes"] = _bytes
    table["builtins.object"] = _Marker("builtins.object")
    table["builtins.eval"] = _paddle_eval
    table["copyreg._reconstructor"] = _copyreg_reconstructor
    for alias in ("__builtin__", "copy_reg"):  # python 2 module names
        for k in list(table):
            if k.startswith(("builtins.", "copyreg.")):
                table[alias + "." + k.split(".", 1)[1]] = table[k]
    table["torch._utils._rebuild_tensor"] = _rebuild_tensor
    table["torch._utils._rebuild_tensor_v2"] = _rebuild_tensor_v2
    table["torch._utils._rebuild_tensor_v3"] = _rebuild_tensor_v3
    table["torch._utils._rebuild_parameter"] = _rebuild_parameter
    table["torch._utils._rebuild_parameter_with_state"] = _rebuild_parameter
    table["torch._utils._rebuild_meta_tensor_no_storage"] = _rebuild_meta
    table["torch._utils._rebuild_device_tensor_from_numpy"] = _rebuild_from_numpy
    table["torch._tensor._rebuild_from_type_v2"] = _rebuild_from_type_v2
    for cls, dt in STORAGE_DTYPES.items():
        for mod in ("torch", "torch.cuda", "torch.storage"):
            table[f"{mod}.{cls}"] = StorageType(cls, dt)
    for name, dt in TORCH_DTYPES.items():
        table[f"torch.{name}"] = TorchDtype(name, dt)
    table["torch.Size"] = _checked(tuple, tuple, list)
    table["torch.device"] = _str_of
    table["torch.serialization._get_layout"] = _str_of
    table["torch.memory_format"] = _str_of
    return table


ALLOWED = _builtin_allowlist()
RECORD_PREFIXES = (
    "torch.distributed.checkpoint.", "paddle.", "transformers.", "accelerate.", "lightning.",
    "pytorch_lightning.", "lightning_fabric.", "omegaconf.", "datetime.", "enum.",
)  # fmt: skip
RECORD_NAMES = frozenset(
    {"argparse.Namespace", "pathlib.Path", "pathlib.PosixPath", "pathlib.WindowsPath",
     "pathlib.PurePosixPath", "pathlib.PureWindowsPath"}
)  # fmt: skip
_QUALNAME = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def resolve_global(
    module: str, name: str, allow: Mapping[str, Any] | Iterable[str] | None = None
) -> Any:
    """The stand-in for ``module.name``; RestrictedUnpicklingError when it is not allowed."""
    qual = f"{module}.{name}"
    if not _QUALNAME.fullmatch(qual):
        raise RestrictedUnpicklingError(f"refused global {qual[:120]!r} (malformed name)")
    if allow is not None:
        if isinstance(allow, Mapping):
            if qual in allow:
                return allow[qual]
            names: Iterable[str] = allow.keys()
        else:
            names = allow
        for entry in names:
            if entry == qual or (entry.endswith(".") and qual.startswith(entry)):
                return _RecordClass(qual)
    if qual in ALLOWED:
        return ALLOWED[qual]
    if qual in RECORD_NAMES or qual.startswith(RECORD_PREFIXES):
        return _RecordClass(qual)
    raise RestrictedUnpicklingError(f"refused global {qual} (not in ckptview's allowlist)")


# -- the VM ------------------------------------------------------------------------------------
class _Source:
    """A bounded, buffered reader over bytes or a Blob; ``pos`` is an absolute file offset."""

    def __init__(self, source: bytes | Blob, offset: int = 0, end: int | None = None):
        if isinstance(source, (bytes, bytearray, memoryview)):
            self.data: bytes | None = bytes(source)
            self.blob: Blob | None = None
            size = len(self.data)
        else:
            self.data, self.blob = None, source
            size = source.size
        self.end = size if end is None else min(int(end), size)
        if offset < 0 or offset > self.end:
            raise TruncatedError(f"pickle offset {offset} outside the file ({size} bytes)")
        self.pos = offset
        self._buf = b""
        self._buf_at = 0

    @property
    def left(self) -> int:
        return self.end - self.pos

    def _fill(self, n: int) -> None:
        if self.pos + n > self.end:
            raise TruncatedError(
                f"pickle needs {n} bytes at {self.pos} but only {self.left} are left"
            )

    def read(self, n: int) -> bytes:
        self._fill(n)
        if self.data is not None:
            out = self.data[self.pos : self.pos + n]
        else:
            rel = self.pos - self._buf_at
            if rel < 0 or rel + n > len(self._buf):
                self._load(n)
                rel = self.pos - self._buf_at
            out = self._buf[rel : rel + n]
        self.pos += n
        return out

    def _load(self, n: int) -> None:
        """Make the buffer hold ``[pos, pos + n)``, reading only bytes not held already.

        The Blob's cached first block serves what lies in it; bytes past it are read ahead
        (``CHUNK``, within ``end``), keeping the held bytes the new window overlaps."""
        pos, first = self.pos, min(HEAD_BLOCK, self.blob.size)
        if pos + n <= first:
            self._buf, self._buf_at = self.blob.head(), 0
            return
        held = b""
        for buf, at in ((self.blob.head() if pos < first else b"", 0), (self._buf, self._buf_at)):
            if at <= pos < at + len(buf):
                held = buf[pos - at :]
                break
        start = pos + len(held)
        stop = min(self.end, max(pos + n, start + CHUNK))
        self._buf = held + self.blob.read(start, stop - start) if stop > start else held
        self._buf_at = pos

    def cached(self, offset: int, n: int) -> bytes | None:
        """``n`` bytes at ``offset`` if the reader holds them already (buffer or head)."""
        if self.data is not None:
            return self.data[offset : offset + n] if offset + n <= len(self.data) else None
        rel = offset - self._buf_at
        if rel >= 0 and rel + n <= len(self._buf):
            return self._buf[rel : rel + n]
        if offset >= 0 and offset + n <= min(HEAD_BLOCK, self.blob.size):
            return self.blob.head()[offset : offset + n]  # the Blob's cached first block
        return None

    def skip(self, n: int) -> int:
        """Advance over ``n`` bytes without reading them; returns their offset."""
        self._fill(n)
        at = self.pos
        self.pos += n
        return at

    def readline(self) -> bytes:
        out = bytearray()
        while True:
            if self.left <= 0:
                raise TruncatedError("pickle ends inside a text line")
            n = min(self.left, 256)
            chunk = self.read(n)
            i = chunk.find(b"\n")
            if i >= 0:
                out += chunk[: i + 1]
                self.pos -= n - i - 1
                return bytes(out)
            out += chunk
            if len(out) > MAX_LINE:
                raise RestrictedUnpicklingError("protocol-0 text line too long")


class _Mark:
    pass


_MARK = _Mark()
_PyUnpicklingError = __import__("pickle").UnpicklingError


class Unpickler:
    """The restricted pickle VM. ``load()`` returns one object; ``pos`` is then after STOP."""

    def __init__(
        self,
        source: bytes | Blob,
        *,
        offset: int = 0,
        end: int | None = None,
        persistent_load: Callable[[Any], Any] | None = None,
        allow: Mapping[str, Any] | Iterable[str] | None = None,
        encoding: str = "ASCII",
        lazy_min: int | None = LAZY_MIN,
        max_objects: int | None = None,
    ):
        self.src = _Source(source, offset, end)
        self.max_objects = MAX_OBJECTS if max_objects is None else max_objects
        self.persistent_load = persistent_load
        self.allow = allow
        self.encoding = encoding
        self.lazy_min = lazy_min if isinstance(source, Blob) else None
        self.refused: list[str] = []

    @property
    def pos(self) -> int:
        return self.src.pos

    def _find_class(self, module: str, name: str) -> Any:
        return resolve_global(module, name, self.allow)

    def _persistent(self, pid: Any) -> Any:
        if self.persistent_load is None:
            raise RestrictedUnpicklingError("persistent id in a pickle without persistent_load")
        return self.persistent_load(pid)

    def _payload(self, n: int, text: bool = False) -> Any:
        if n < 0:
            raise _PyUnpicklingError("negative length")
        if self.lazy_min is not None and n >= self.lazy_min:
            at = self.src.skip(n)
            return LazyBytes(at, n, self.src.blob, text=text)
        data = self.src.read(n)
        return data.decode("utf-8", "surrogatepass") if text else data

    def _pop_mark(self) -> list:
        stack = self.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is _MARK:
                items = stack[i + 1 :]
                del stack[i:]
                return items
        raise _PyUnpicklingError("MARK not found")

    def _pop(self) -> Any:
        if not self.stack:
            raise _PyUnpicklingError("unpickling stack underflow")
        v = self.stack.pop()
        if v is _MARK:
            raise _PyUnpicklingError("unexpected MARK")
        return v

    def _top(self) -> Any:
        if not self.stack or self.stack[-1] is _MARK:
            raise _PyUnpicklingError("unpickling stack underflow")
        return self.stack[-1]

    def _decode_string(self, data: Any) -> Any:
        if isinstance(data, LazyBytes) or self.encoding == "bytes":
            return data
        return data.decode(self.encoding, "strict")

    def load(self) -> Any:
        self.stack: list = []
        self.memo: dict[int, Any] = {}
        src = self.src
        u = struct.unpack
        stack, memo, cap = self.stack, self.memo, self.max_objects
        ops = 0
        while True:
            op = src.read(1)
            handler = _DISPATCH.get(op)
            if handler is None:
                raise _PyUnpicklingError(f"unsupported pickle opcode {op!r} at {src.pos - 1}")
            if handler is _stop:
                return self._pop()
            handler(self, src, u)
            ops += 1
            if not ops & 1023 and len(stack) + len(memo) > cap:  # each op adds at most one
                raise _PyUnpicklingError(
                    f"pickle builds more than {cap} objects (stack + memo) at {src.pos}"
                )


def _stop(self, src, u):  # pragma: no cover - handled in load
    pass


def _apply(self, func: Any, args: Any, kwargs: dict | None = None) -> Any:
    if not callable(func):
        raise RestrictedUnpicklingError(f"REDUCE of a non-callable {type(func).__name__}")
    if not isinstance(args, tuple):
        raise _PyUnpicklingError("REDUCE arguments are not a tuple")
    try:
        return func(*args, **(kwargs or {}))
    except RestrictedUnpicklingError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise _PyUnpicklingError(f"bad arguments for {getattr(func, '__name__', func)}: {e}") from e


def _build(self, obj: Any, state: Any) -> None:
    if isinstance(obj, ArrayRef):
        _build_array(obj, state)
    elif isinstance(obj, DtypeRef):
        if isinstance(state, tuple) and len(state) >= 8:
            obj.byteorder = state[1] if isinstance(state[1], str) else "="
            obj.names, obj.fields = state[3], state[4]
    elif isinstance(obj, Record):
        obj.state = state
    elif isinstance(obj, TensorRef):
        obj.metadata = state
    elif isinstance(obj, (dict, list, set)):
        pass  # e.g. an OrderedDict's _metadata attribute: not data
    else:
        raise RestrictedUnpicklingError(f"BUILD on a {type(obj).__name__} refused")


def _build_array(arr: ArrayRef, state: Any) -> None:
    if not isinstance(state, tuple) or len(state) not in (4, 5):
        raise _PyUnpicklingError("numpy array state is not a tuple of 4 or 5")
    if len(state) == 5:
        state = state[1:]
    shape, dtype, fortran, data = state
    arr.shape = _ints(shape, "shape")
    arr.dtype = _as_np_dtype(dtype)
    arr.fortran_order = bool(fortran)
    if isinstance(data, bytearray):
        data = bytes(data)
    if arr.dtype.hasobject:
        if not isinstance(data, list):
            raise _PyUnpicklingError("object array without a list of items")
    elif not isinstance(data, (bytes, str, LazyBytes)):
        raise _PyUnpicklingError(f"numpy array data is a {type(data).__name__}")
    arr.data = data


def _op(code: bytes):
    def deco(fn):
        _DISPATCH[code] = fn
        return fn

    return deco


_DISPATCH: dict[bytes, Callable] = {b".": _stop}


@_op(b"\x80")
def _proto(self, src, u):
    v = src.read(1)[0]
    if v > 5:
        raise _PyUnpicklingError(f"unsupported pickle protocol {v}")


@_op(b"\x95")
def _frame(self, src, u):
    (n,) = u("<Q", src.read(8))
    if n > src.left:
        raise TruncatedError(f"pickle frame of {n} bytes but {src.left} left")


_DISPATCH[b"\x98"] = lambda self, src, u: None  # READONLY_BUFFER


@_op(b"\x97")
def _next_buffer(self, src, u):
    raise RestrictedUnpicklingError("out-of-band pickle buffers are not supported")


for _code in (b"\x82", b"\x83", b"\x84"):
    _DISPATCH[_code] = lambda self, src, u: (_ for _ in ()).throw(
        RestrictedUnpicklingError("pickle extension registry (EXT*) refused")
    )


@_op(b"(")
def _mark(self, src, u):
    self.stack.append(_MARK)


@_op(b"0")
def _popop(self, src, u):
    if self.stack:
        self.stack.pop()
    else:
        raise _PyUnpicklingError("POP on an empty stack")


@_op(b"1")
def _pop_mark(self, src, u):
    self._pop_mark()


@_op(b"2")
def _dup(self, src, u):
    self.stack.append(self._top())


@_op(b"N")
def _none(self, src, u):
    self.stack.append(None)


_DISPATCH[b"\x88"] = lambda self, src, u: self.stack.append(True)
_DISPATCH[b"\x89"] = lambda self, src, u: self.stack.append(False)


@_op(b"I")
def _int(self, src, u):
    line = src.readline()[:-1]
    if line == b"00":
        v: Any = False
    elif line == b"01":
        v = True
    else:
        v = int(line)
    self.stack.append(v)


_DISPATCH[b"J"] = lambda self, src, u: self.stack.append(u("<i", src.read(4))[0])
_DISPATCH[b"K"] = lambda self, src, u: self.stack.append(src.read(1)[0])
_DISPATCH[b"M"] = lambda self, src, u: self.stack.append(u("<H", src.read(2))[0])


@_op(b"L")
def _long(self, src, u):
    line = src.readline()[:-1]
    if line.endswith(b"L"):
        line = line[:-1]
    self.stack.append(int(line))


@_op(b"\x8a")
def _long1(self, src, u):
    n = src.read(1)[0]
    self.stack.append(int.from_bytes(src.read(n), "little", signed=True))


@_op(b"\x8b")
def _long4(self, src, u):
    (n,) = u("<i", src.read(4))
    if n < 0 or n > min(src.left, 1 << 16):
        raise _PyUnpicklingError(f"LONG4 of {n} bytes refused")
    self.stack.append(int.from_bytes(src.read(n), "little", signed=True))


_DISPATCH[b"F"] = lambda self, src, u: self.stack.append(float(src.readline()[:-1]))
_DISPATCH[b"G"] = lambda self, src, u: self.stack.append(u(">d", src.read(8))[0])


@_op(b"S")
def _string(self, src, u):
    data = src.readline()[:-1]
    if len(data) >= 2 and data[0] == data[-1] and data[:1] in (b'"', b"'"):
        data = data[1:-1]
    else:
        raise _PyUnpicklingError("the STRING opcode argument must be quoted")
    self.stack.append(self._decode_string(_codecs.escape_decode(data)[0]))


@_op(b"T")
def _binstring(self, src, u):
    (n,) = u("<i", src.read(4))
    self.stack.append(self._decode_string(self._payload(n)))


_DISPATCH[b"U"] = lambda self, src, u: self.stack.append(
    self._decode_string(src.read(src.read(1)[0]))
)
_DISPATCH[b"B"] = lambda self, src, u: self.stack.append(self._payload(u("<I", src.read(4))[0]))
_DISPATCH[b"C"] = lambda self, src, u: self.stack.append(src.read(src.read(1)[0]))
_DISPATCH[b"\x8e"] = lambda self, src, u: self.stack.append(self._payload(u("<Q", src.read(8))[0]))


@_op(b"\x96")
def _bytearray8(self, src, u):
    (n,) = u("<Q", src.read(8))
    data = self._payload(n)
    self.stack.append(data if isinstance(data, LazyBytes) else bytearray(data))


@_op(b"V")
def _unicode(self, src, u):
    self.stack.append(src.readline()[:-1].decode("raw-unicode-escape"))


_DISPATCH[b"X"] = lambda self, src, u: self.stack.append(
    self._payload(u("<I", src.read(4))[0], text=True)
)
_DISPATCH[b"\x8d"] = lambda self, src, u: self.stack.append(
    self._payload(u("<Q", src.read(8))[0], text=True)
)
_DISPATCH[b"\x8c"] = lambda self, src, u: self.stack.append(
    src.read(src.read(1)[0]).decode("utf-8", "surrogatepass")
)


@_op(b")")
def _empty_tuple(self, src, u):
    self.stack.append(())


@_op(b"t")
def _tuple(self, src, u):
    self.stack.append(tuple(self._pop_mark()))


def _tuple_n(n: int):
    def handler(self, src, u):
        if len(self.stack) < n or any(x is _MARK for x in self.stack[-n:]):
            raise _PyUnpicklingError("unpickling stack underflow")
        items = tuple(self.stack[-n:])
        del self.stack[-n:]
        self.stack.append(items)

    return handler


_DISPATCH[b"\x85"] = _tuple_n(1)
_DISPATCH[b"\x86"] = _tuple_n(2)
_DISPATCH[b"\x87"] = _tuple_n(3)
_DISPATCH[b"]"] = lambda self, src, u: self.stack.append([])
_DISPATCH[b"}"] = lambda self, src, u: self.stack.append({})
_DISPATCH[b"\x8f"] = lambda self, src, u: self.stack.append(set())
_DISPATCH[b"l"] = lambda self, src, u: self.stack.append(self._pop_mark())


@_op(b"\x91")
def _frozenset(self, src, u):
    self.stack.append(frozenset(self._pop_mark()))


@_op(b"d")
def _dict(self, src, u):
    items = self._pop_mark()
    if len(items) % 2:
        raise _PyUnpicklingError("odd number of items for DICT")
    self.stack.append({items[i]: items[i + 1] for i in range(0, len(items), 2)})


def _container(self, kind: type) -> Any:
    obj = self._top()
    if not isinstance(obj, kind):
        raise _PyUnpicklingError(f"expected a {kind.__name__}, got {type(obj).__name__}")
    return obj


@_op(b"a")
def _append(self, src, u):
    value = self._pop()
    _container(self, list).append(value)


@_op(b"e")
def _appends(self, src, u):
    items = self._pop_mark()
    _container(self, list).extend(items)


@_op(b"s")
def _setitem(self, src, u):
    value = self._pop()
    key = self._pop()
    _container(self, dict)[key] = value


@_op(b"u")
def _setitems(self, src, u):
    items = self._pop_mark()
    if len(items) % 2:
        raise _PyUnpicklingError("odd number of items for SETITEMS")
    d = _container(self, dict)
    for i in range(0, len(items), 2):
        d[items[i]] = items[i + 1]


@_op(b"\x90")
def _additems(self, src, u):
    items = self._pop_mark()
    _container(self, set).update(items)


@_op(b"c")
def _global(self, src, u):
    module = src.readline()[:-1].decode("utf-8")
    name = src.readline()[:-1].decode("utf-8")
    self.stack.append(self._find_class(module, name))


@_op(b"\x93")
def _stack_global(self, src, u):
    name = self._pop()
    module = self._pop()
    if not isinstance(name, str) or not isinstance(module, str):
        raise _PyUnpicklingError("STACK_GLOBAL requires str")
    self.stack.append(self._find_class(module, name))


@_op(b"R")
def _reduce(self, src, u):
    args = self._pop()
    func = self._pop()
    self.stack.append(_apply(self, func, args))


@_op(b"\x81")
def _newobj(self, src, u):
    args = self._pop()
    cls = self._pop()
    self.stack.append(_new(cls, args, {}))


@_op(b"\x92")
def _newobj_ex(self, src, u):
    kwargs = self._pop()
    args = self._pop()
    cls = self._pop()
    self.stack.append(_new(cls, args, kwargs))


def _new(cls: Any, args: Any, kwargs: Any) -> Any:
    if isinstance(cls, _RecordClass):
        return Record(cls.qualname, tuple(args), dict(kwargs or {}))
    if cls is _ordered_dict or cls is ALLOWED["collections.defaultdict"]:
        return {}
    empty = {"tuple": (), "list": [], "dict": {}, "set": set(), "frozenset": frozenset()}
    for builtin, value in empty.items():
        if cls is ALLOWED[f"builtins.{builtin}"]:
            return cls(*args) if args else value
    raise RestrictedUnpicklingError(f"NEWOBJ of {getattr(cls, 'qualname', cls)!r} refused")


@_op(b"i")
def _inst(self, src, u):
    module = src.readline()[:-1].decode("utf-8")
    name = src.readline()[:-1].decode("utf-8")
    args = tuple(self._pop_mark())
    cls = self._find_class(module, name)
    if isinstance(cls, _RecordClass):
        self.stack.append(Record(cls.qualname, args))
    else:
        self.stack.append(_apply(self, cls, args))


@_op(b"o")
def _obj(self, src, u):
    items = self._pop_mark()
    if not items:
        raise _PyUnpicklingError("OBJ without a class")
    cls, args = items[0], tuple(items[1:])
    if isinstance(cls, _RecordClass):
        self.stack.append(Record(cls.qualname, args))
    else:
        self.stack.append(_apply(self, cls, args))


@_op(b"b")
def _buildop(self, src, u):
    state = self._pop()
    _build(self, self._top(), state)


@_op(b"P")
def _persid(self, src, u):
    pid = src.readline()[:-1].decode("ascii")
    self.stack.append(self._persistent(pid))


@_op(b"Q")
def _binpersid(self, src, u):
    self.stack.append(self._persistent(self._pop()))


def _get(self, idx: int):
    if idx not in self.memo:
        raise _PyUnpicklingError(f"memo key {idx} missing")
    self.stack.append(self.memo[idx])


def _put(self, idx: int):
    if idx < 0:
        raise _PyUnpicklingError("negative memo key")
    self.memo[idx] = self._top()


_DISPATCH[b"g"] = lambda self, src, u: _get(self, int(src.readline()[:-1]))
_DISPATCH[b"h"] = lambda self, src, u: _get(self, src.read(1)[0])
_DISPATCH[b"j"] = lambda self, src, u: _get(self, u("<I", src.read(4))[0])
_DISPATCH[b"p"] = lambda self, src, u: _put(self, int(src.readline()[:-1]))
_DISPATCH[b"q"] = lambda self, src, u: _put(self, src.read(1)[0])
_DISPATCH[b"r"] = lambda self, src, u: _put(self, u("<I", src.read(4))[0])
_DISPATCH[b"\x94"] = lambda self, src, u: _put(self, len(self.memo))


# -- public helpers ----------------------------------------------------------------------------
def load_pickle(
    source: bytes | Blob,
    *,
    offset: int = 0,
    end: int | None = None,
    persistent_load: Callable[[Any], Any] | None = None,
    allow: Mapping[str, Any] | Iterable[str] | None = None,
    encoding: str = "ASCII",
    lazy_min: int | None = LAZY_MIN,
) -> Any:
    """One object from a pickle in ``source`` (bytes, or a Blob read by ranges) at ``offset``.

    Large payloads of a Blob source come back as :class:`LazyBytes`; refused globals raise
    :class:`RestrictedUnpicklingError`; a pickle running past ``end`` raises TruncatedError.
    """
    return Unpickler(
        source, offset=offset, end=end, persistent_load=persistent_load, allow=allow,
        encoding=encoding, lazy_min=lazy_min,
    ).load()  # fmt: skip


def is_leaf(obj: Any) -> bool:
    return not isinstance(obj, (dict, list, tuple, Record))


def flatten(
    obj: Any, sep: str = "/", prefix: str = "", keep: Callable[[Any], bool] | None = None
) -> list[tuple[str, Any]]:
    """``(path, leaf)`` pairs of nested dicts/lists/tuples/Records, keys joined with ``sep``.

    A Record with fields is walked through them; one without (an enum) is a leaf, as is any
    node for which ``keep(node)`` is true. Cycles and more than a million leaves raise
    ValueError.
    """
    out: list[tuple[str, Any]] = []
    active: set[int] = set()

    def walk(node: Any, path: str) -> None:
        if keep is not None and keep(node):
            out.append((path, node))
            return
        if isinstance(node, Record):
            fields = node.fields()
            if not fields:
                out.append((path, node))
                return
            node = fields
        if isinstance(node, dict):
            items: Iterable = ((_key(k), v) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            items = ((str(i), v) for i, v in enumerate(node))
        else:
            out.append((path, node))
            if len(out) > MAX_LEAVES:
                raise ValueError("pickle has more than a million leaves")
            return
        if id(node) in active:
            raise ValueError(f"pickle structure refers to itself at {path!r}")
        active.add(id(node))
        empty = True
        for k, v in items:
            empty = False
            walk(v, f"{path}{sep}{k}" if path else k)
        active.discard(id(node))
        if empty and path:
            out.append((path, node))

    walk(obj, prefix)
    return out


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    if isinstance(k, bytes):
        return k.decode("utf-8", "replace")
    return str(k)


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
