"""The allowlist of the restricted unpickler: every global a pickle may name, mapped to an
inert stand-in (the numpy / builtins ones are here, torch's in :mod:`.torch_globals`), and
:func:`resolve_global`, the one place a GLOBAL is looked up.
"""

from __future__ import annotations

import codecs as _codecs
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ..safe_globals import NUMPY_RNG_GLOBALS as NUMPY_RNG_GLOBALS
from .standins import (
    ArrayRef,
    DtypeRef,
    LazyBytes,
    Marker,
    Record,
    RecordClass,
    RestrictedUnpicklingError,
    as_np_dtype,
    ints,
)
from .torch_globals import torch_globals


# -- numpy / builtins stand-ins ---------------------------------------------------------------
def _np_reconstruct(subtype: Any, shape: Any = (0,), dtype: Any = b"b") -> ArrayRef:
    return ArrayRef()


def _np_frombuffer(buf: Any, dtype: Any, shape: Any, order: Any = "C") -> ArrayRef:
    """numpy >= 2's protocol-5 array form ``_frombuffer(buffer, dtype, shape, order)``."""
    if isinstance(buf, bytearray):
        buf = bytes(buf)
    if not isinstance(buf, (bytes, LazyBytes)):
        raise RestrictedUnpicklingError(f"_frombuffer of a {type(buf).__name__}")
    dt = as_np_dtype(dtype)
    if dt.hasobject:
        raise RestrictedUnpicklingError("_frombuffer with an object dtype")
    return ArrayRef(ints(shape, "shape"), dt, order == "F", buf)


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
    dt = as_np_dtype(dtype)
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
    if isinstance(cls, RecordClass):
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


def _builtin_allowlist() -> dict[str, Any]:
    table: dict[str, Any] = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        table[f"{mod}._reconstruct"] = _np_reconstruct
        table[f"{mod}.scalar"] = _np_scalar
    for mod in ("numpy.core.numeric", "numpy._core.numeric"):
        table[f"{mod}._frombuffer"] = _np_frombuffer
    table["numpy.ndarray"] = Marker("numpy.ndarray")
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
    table["builtins.object"] = Marker("builtins.object")
    table["builtins.eval"] = _paddle_eval
    table["copyreg._reconstructor"] = _copyreg_reconstructor
    for alias in ("__builtin__", "copy_reg"):  # python 2 module names
        for k in list(table):
            if k.startswith(("builtins.", "copyreg.")):
                table[alias + "." + k.split(".", 1)[1]] = table[k]
    table.update(torch_globals())
    return table


ALLOWED = _builtin_allowlist()
RECORD_PREFIXES = (
    "torch.distributed.checkpoint.", "torch.distributed.tensor.", "torch.distributed.device_mesh.",
    "torch.distributed._mesh_layout.", "paddle.", "transformers.", "accelerate.", "lightning.",
    "pytorch_lightning.", "lightning_fabric.", "omegaconf.", "datetime.", "enum.", "deepspeed.",
)  # fmt: skip
RECORD_NAMES = frozenset(
    {"argparse.Namespace", "pathlib.Path", "pathlib.PosixPath", "pathlib.WindowsPath",
     "pathlib.PurePosixPath", "pathlib.PureWindowsPath"}
)  # fmt: skip
_QUALNAME = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
_CLASS_NAME = re.compile(r"_*[A-Z]\w*")

#: modules whose globals run code, touch the system or build callables when a pickle is
#: loaded unsafely (``subprocess.Popen``, ``os.system``, ``builtins.exec``,
#: ``functools.partial`` …): refused whatever the name looks like, and named as code
CODE_MODULES = frozenset({
    "os", "posix", "nt", "subprocess", "commands", "popen2", "sys", "builtins", "__builtin__",
    "importlib", "imp", "runpy", "shutil", "socket", "pty", "ctypes", "code", "codeop", "pickle",
    "_pickle", "marshal", "types", "functools", "operator", "webbrowser", "multiprocessing",
    "asyncio", "signal", "platform", "tempfile", "io", "_io", "pdb", "timeit", "trace",
    "cProfile", "profile", "pip", "setuptools", "distutils", "urllib", "http", "requests",
    "ftplib", "smtplib", "telnetlib", "threading", "_thread", "inspect", "gc", "ast",
    "zipimport", "pkgutil", "site", "sysconfig", "select", "selectors", "resource", "fcntl",
    "posixpath", "ntpath", "glob", "fnmatch", "shelve", "dbm", "sqlite3", "xmlrpc",
    "paramiko", "dill", "cloudpickle", "joblib", "numpy.testing", "numpy.f2py", "numpy.distutils",
    "torch.hub", "torch.utils.cpp_extension", "torch._C", "torch.ops", "torch.jit",
})  # fmt: skip


def runs_code(qual: str) -> bool:
    """Whether global ``qual`` belongs to a module that can run code or touch the system."""
    parts = qual.split(".")
    return any(".".join(parts[:i]) in CODE_MODULES for i in range(1, len(parts)))


#: the globals ``torch.load(weights_only=True)`` accepts by default (torch >= 2.6,
#: ``torch._weights_only_unpickler._get_allowed_globals``): tensors, storages, dtypes, and a
#: few containers; numpy, argparse, dataclasses and every other class are refused
TORCH_WEIGHTS_ONLY = frozenset(
    {q for q in torch_globals() if q != "torch._utils._rebuild_device_tensor_from_numpy"}
    | {"collections.OrderedDict", "collections.Counter", "_codecs.encode", "builtins.bytearray",
       "builtins.set", "builtins.complex", "torch.nn.parameter.Parameter", "torch.Tensor",
       "torch._utils._rebuild_qtensor", "torch._utils._rebuild_sparse_tensor",
       "torch._utils._rebuild_nested_tensor"}
)  # fmt: skip


class InertClasses(Mapping[str, Any]):
    """An ``allow`` policy for files that pickle whole objects (``torch.save(model)``): any
    global named like a class (``alibi_testing.modules.CNN``, ``torch.nn.modules.conv.Conv2d``)
    stands in as an inert :class:`Record` of its name, arguments and state. Nothing is
    imported or called; functions (lower-case names such as ``os.system``) stay refused."""

    def __contains__(self, qual: object) -> bool:
        return (
            isinstance(qual, str)
            and qual not in ALLOWED
            and not runs_code(qual)
            and _CLASS_NAME.fullmatch(qual.rsplit(".", 1)[-1]) is not None
        )

    def __getitem__(self, qual: str) -> Any:
        if qual not in self:
            raise KeyError(qual)
        return RecordClass(qual)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0


def resolve_global(
    module: str, name: str, allow: Mapping[str, Any] | Iterable[str] | None = None
) -> Any:
    """The stand-in for ``module.name``; RestrictedUnpicklingError when it is not allowed."""
    qual = f"{module}.{name}"
    if not _QUALNAME.fullmatch(qual):
        raise RestrictedUnpicklingError(f"refused global {qual[:120]!r} (malformed name)")
    if runs_code(qual) and qual not in ALLOWED:
        raise RestrictedUnpicklingError(
            f"refused global {qual}: it runs code or touches the system when the file is "
            "loaded unsafely (torch.load(weights_only=False), pickle.load)"
        )
    if allow is not None:
        if isinstance(allow, Mapping):
            if qual in allow:
                return allow[qual]
            names: Iterable[str] = allow.keys()
        else:
            names = allow
        for entry in names:
            if entry == qual or (entry.endswith(".") and qual.startswith(entry)):
                return RecordClass(qual)
    if qual in ALLOWED:
        return ALLOWED[qual]
    if qual in RECORD_NAMES or qual.startswith(RECORD_PREFIXES):
        return RecordClass(qual)
    raise RestrictedUnpicklingError(f"refused global {qual} (not in ckptview's allowlist)")
