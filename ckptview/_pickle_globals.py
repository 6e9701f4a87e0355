"""Stand-ins and the allowlist of the restricted unpickler (see :mod:`ckptview.unpickle`).

Every global a pickle may name resolves here to an inert stand-in: a dataclass recording what
the pickle described (:class:`TensorRef`, :class:`ArrayRef`, :class:`Record` …) or a small
function building one. Nothing a pickle names is ever imported or called.
"""

from __future__ import annotations

import codecs as _codecs
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import np_dtype
from .io import Blob


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
    if isinstance(value, (tuple, list)):
        for v in value:
            if type(v) is not int:  # plain ints are the rule; other ints are converted
                break
        else:
            return tuple(value)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(int(v) for v in value)
    raise RestrictedUnpicklingError(f"tensor {what} is not a tuple of ints")


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: str | None,
            requires_grad: Any = False, metadata: Any = None) -> TensorRef:  # fmt: skip
    if type(storage) is not StorageRef and not isinstance(storage, StorageRef):
        raise RestrictedUnpicklingError(f"tensor rebuilt from a {type(storage).__name__}")
    if type(offset) is not int:
        if not isinstance(offset, int):
            raise RestrictedUnpicklingError("tensor storage_offset is not an int")
        offset = int(offset)
    return TensorRef(storage, offset, _ints(size, "size"), _ints(stride, "stride"),
                     dtype or storage.dtype, requires_grad is True or bool(requires_grad),
                     False, None, metadata)  # fmt: skip


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


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
