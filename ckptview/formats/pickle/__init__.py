"""The one restricted unpickler for every pickle-based checkpoint format.

A small pickle VM of our own (protocols 0-5). Nothing in a pickle is ever executed: every
GLOBAL resolves through an allowlist to an inert stand-in; anything else raises
:class:`RestrictedUnpicklingError` naming the refused global. The VM reads from bytes or from
a :class:`ckptview.io.Blob` through a growing window (:mod:`.source`); payloads of BINBYTES/
BINBYTES8/BYTEARRAY8/BINSTRING (and long BINUNICODE strings) at or above ``lazy_min`` bytes are
recorded as :class:`LazyBytes` file ranges instead of being read, so a catalog scan of a pickle
holding big numpy arrays reads only its small structure. No length field is trusted: every
length is checked against the bytes left before anything is allocated or read.

Allowlist (module.qualname -> stand-in):

* numpy: ``numpy.core.multiarray._reconstruct`` / ``numpy._core.multiarray._reconstruct`` ->
  :class:`ArrayRef` (filled by BUILD), ``...multiarray.scalar`` -> a numpy scalar of a non-object
  dtype, ``numpy.ndarray`` (marker), ``numpy.dtype`` -> :class:`DtypeRef`.
* ``_codecs.encode`` (latin1/utf-8 only), ``collections.OrderedDict`` -> dict,
  ``builtins.{tuple,list,dict,set,frozenset,slice,complex,bytes,bytearray,object}`` (data
  only: ``bytes(n)``/``bytearray(n)`` with an int is refused), ``copyreg._reconstructor`` ->
  :class:`Record`.
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

Modules: :mod:`.standins` (the inert objects), :mod:`.allowlist` and :mod:`.torch_globals`
(what each allowed global becomes), :mod:`.ops_data` and :mod:`.ops_objects` (the opcode
handlers), :mod:`.vm` (the one dispatch table and its loop), :mod:`.source` (the bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...io import Blob
from .allowlist import (
    ALLOWED,
    NUMPY_RNG_GLOBALS,
    RECORD_NAMES,
    RECORD_PREFIXES,
    TORCH_WEIGHTS_ONLY,
    InertClasses,
    resolve_global,
    runs_code,
)
from .machine import MAX_DEPTH, MAX_LINE, BudgetError, budget_for
from .source import CHUNK
from .standins import ArrayRef, DtypeRef, LazyBytes, Record, RestrictedUnpicklingError
from .torch_globals import (
    STORAGE_DTYPES,
    TORCH_DTYPES,
    DTensorRef,
    StorageRef,
    StorageType,
    TensorRef,
    TorchDtype,
)
from .vm import DISPATCH, LAZY_MIN, MAX_OBJECTS, Unpickler

MAX_LEAVES = 1_000_000

for _cls in (ArrayRef, DTensorRef, DtypeRef, LazyBytes, Record, RestrictedUnpicklingError, StorageRef,
             StorageType, TensorRef, TorchDtype, Unpickler):  # fmt: skip
    _cls.__module__ = __name__  # the public home: reprs, docs and pickles name it


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
    node for which ``keep(node)`` is true. Cycles, nesting past ``MAX_DEPTH`` and more than a
    million leaves raise ValueError.
    """
    out: list[tuple[str, Any]] = []
    active: set[int] = set()

    def walk(node: Any, path: str, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            raise ValueError(f"pickle structure nests more than {MAX_DEPTH} deep at {path[:80]!r}")
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
            walk(v, f"{path}{sep}{k}" if path else k, depth + 1)
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


__all__ = [
    "ALLOWED", "BudgetError", "CHUNK", "MAX_DEPTH", "budget_for", "DISPATCH", "InertClasses", "LAZY_MIN", "MAX_LEAVES", "MAX_LINE", "MAX_OBJECTS",
    "RECORD_NAMES", "RECORD_PREFIXES", "STORAGE_DTYPES", "TORCH_DTYPES", "ArrayRef", "DTensorRef",
    "DtypeRef",
    "LazyBytes", "Record", "RestrictedUnpicklingError", "StorageRef", "StorageType", "TensorRef",
    "TorchDtype", "Unpickler", "flatten", "is_leaf", "load_pickle", "resolve_global",
    "NUMPY_RNG_GLOBALS", "TORCH_WEIGHTS_ONLY", "runs_code",
]  # fmt: skip
