"""Layout and codec registries: which formats ckptview knows, and in which order it tries them.

Three sources, later ones winning a name clash:

1. built-ins: the classes defined in the modules of ``ckptview.layouts`` and ``ckptview.codecs``
   (one module per format family);
2. installed plugins: the entry-point groups ``ckptview.layouts`` and ``ckptview.codecs``;
3. classes registered at run time with :func:`register` (a test's toy format, a notebook).

A module or plugin that fails to import is skipped with a warning (xarray's importable-module
gate), never a crash. Detection tries layouts and codecs by ``priority`` (lower first, equal
priorities by name): a class states it with a :class:`LayoutTier` / :class:`CodecTier` member
(plain ints keep working: the tiers carry the historical numbers).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from enum import IntEnum
from functools import lru_cache
from typing import Any, NamedTuple


class LayoutTier(IntEnum):
    """When a layout is tried: the more specific its evidence, the earlier."""

    #: directory structures only one framework writes (Paddle fluid/incubate serial dirs)
    SPECIFIC = 20
    #: a framework's own state or commit files (Orbax, TF ``checkpoint``, HF
    #: ``trainer_state.json``, Paddle DCP metadata)
    FRAMEWORK = 30
    #: a framework's file-naming convention (torch DCP, DeepSpeed, Lightning, Paddle static)
    CONVENTION = 40
    #: a plugin that states no priority
    DEFAULT = 50
    #: decided by peeking at file heads, not by names alone (Caffe2 minidb)
    CONTENT = 60
    #: a bare model directory of one file family (sharded safetensors + index)
    FAMILY = 450
    #: serials from the numbers in file or directory names, any file family
    GENERIC = 500
    #: anything: every file is part of one serial
    FALLBACK = 1000


class CodecTier(IntEnum):
    """When a codec's cheap check runs: unmistakable signatures before looser claims."""

    #: a signature that settles it, checked before any plausibility check (torch's zip
    #: with ``data.pkl``, its legacy magic number)
    SIGNATURE = 30
    #: a format's own magic number, suffix or header plausibility check
    FORMAT = 40
    #: a generic container (a pickle) claimed by its file name: after the formats above
    CONTAINER = 45
    #: a plugin that states no priority
    DEFAULT = 50
    #: claims on loose evidence (content sniffing, a common suffix such as ``.h5``)
    LOOSE = 60
    #: never guessed: layouts assign it to files by name
    ASSIGNED = 900


_BASES = {"ckptview.codecs": "Codec", "ckptview.layouts": "Layout"}
#: classes added with :func:`register`, per package, by name
_REGISTERED: dict[str, dict[str, Any]] = {package: {} for package in _BASES}


class Claim(NamedTuple):
    """What a built-in codec's cheap check may accept, checked before its module is imported:
    a superset of ``guess_can_open`` (a file none of these match is never the codec's)."""

    #: name endings (lower case)
    suffixes: tuple[str, ...] = ()
    #: exact file names
    names: tuple[str, ...] = ()
    #: leading bytes
    magic: tuple[bytes, ...] = ()
    #: any file may be the codec's (content sniffing): its module is imported to ask
    sniff: bool = False
    #: the codec has a ``guess_can_open_blob`` second look (imported for unclaimed files)
    blob: bool = False

    def may(self, filename: str, lower: str, head: bytes) -> bool:
        return (
            self.sniff
            or filename in self.names
            or (bool(self.suffixes) and lower.endswith(self.suffixes))
            or (bool(self.magic) and head.startswith(self.magic))
        )


class Builtin(NamedTuple):
    """One built-in codec or layout as the registry knows it before importing its module:
    enough to order detection, answer :func:`known_suffixes` and skip codecs that cannot
    claim a file. ``tests/test_registry_lazy.py`` checks each row against its class."""

    name: str
    module: str
    cls: str
    priority: int
    #: codecs: ``Codec.suffixes`` and ``Codec.save_suffixes``, as the class states them
    suffixes: tuple[str, ...] = ()
    save_suffixes: tuple[str, ...] = ()
    claim: Claim = Claim()


_NEVER = Claim()  # forced by layouts only: guess_can_open is always False
_ZIP, _LEGACY_TORCH = b"PK\x03\x04", b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19."
_PADDLE_PICKLE = (".pdparams", ".pdopt", ".pdckpt", ".pdstates", ".pdtensor", ".pdema", ".pkl",
                  ".pickle")  # fmt: skip

#: the modules of ``ckptview.codecs`` and ``ckptview.layouts``, one row per class
BUILTIN: dict[str, tuple[Builtin, ...]] = {
    "ckptview.codecs": (
        # before torch, whose signature (a .pt zip) a TorchScript archive also has
        Builtin("torchscript", "torchscript", "TorchScriptCodec", CodecTier.SIGNATURE - 1,
                claim=Claim(magic=(_ZIP,), blob=True)),
        Builtin("torch", "torch", "TorchCodec", CodecTier.SIGNATURE,
                save_suffixes=(".pt", ".pth", ".bin", ".ckpt", ".tar"),
                claim=Claim(magic=(_LEGACY_TORCH, _ZIP))),
        Builtin("gguf", "gguf", "GGUFCodec", CodecTier.FORMAT, (".gguf",), (".gguf",),
                claim=Claim(suffixes=(".gguf",), magic=(b"GGUF",))),
        Builtin("npy", "numpy", "NpyCodec", CodecTier.FORMAT, (".npy",), (".npy",),
                claim=Claim(suffixes=(".npy",), magic=(b"\x93NUMPY",))),
        Builtin("npz", "numpy", "NpzCodec", CodecTier.FORMAT, (".npz",), (".npz",),
                claim=Claim(suffixes=(".npz",), magic=(_ZIP,))),
        Builtin("orbax", "orbax", "OrbaxCodec", CodecTier.FORMAT, claim=_NEVER),
        Builtin("orbax-json", "orbax", "OrbaxJsonCodec", CodecTier.FORMAT, claim=_NEVER),
        Builtin("paddle", "paddle", "PaddleStreamCodec", CodecTier.FORMAT, (".pdiparams",),
                claim=Claim(suffixes=(".pdiparams",), names=("__params__",),
                            magic=(b"\0\0\0\0",), blob=True)),
        Builtin("safetensors", "safetensors", "SafetensorsCodec", CodecTier.FORMAT,
                (".safetensors",), (".safetensors",), claim=Claim(sniff=True)),
        Builtin("tf", "tf", "TFBundleCodec", CodecTier.FORMAT, (".index",),
                claim=Claim(suffixes=(".index",), blob=True)),
        Builtin("paddle-dcp", "paddle_dcp", "PaddleDcpCodec", CodecTier.CONTAINER,
                claim=Claim(suffixes=(".distcp",))),
        Builtin("paddle-pickle", "paddle_pickle", "PaddlePickleCodec", CodecTier.CONTAINER,
                save_suffixes=(".pdparams", ".pdopt", ".pkl"),
                claim=Claim(suffixes=_PADDLE_PICKLE)),
        Builtin("torch_dcp", "torch_dcp", "TorchDCPCodec", CodecTier.CONTAINER,
                claim=Claim(suffixes=(".metadata",))),
        Builtin("caffe2", "caffe2", "Caffe2Codec", CodecTier.LOOSE, (".minidb",),
                claim=Claim(sniff=True)),
        Builtin("keras", "keras", "KerasCodec", CodecTier.LOOSE,
                (".keras", ".weights.h5", ".h5", ".hdf5"), (".keras", ".weights.h5", ".h5", ".hdf5"),
                claim=Claim(suffixes=(".keras", ".h5", ".hdf5"),
                            magic=(b"\x89HDF\r\n\x1a\n",))),
        Builtin("tf-v1", "tf_v1", "TFSliceCodec", CodecTier.LOOSE, claim=Claim(blob=True)),
        Builtin("paddle-text-int", "paddle", "PaddleTextIntCodec", CodecTier.ASSIGNED,
                claim=_NEVER),
        Builtin("t5x", "t5x", "T5xCodec", CodecTier.ASSIGNED, claim=_NEVER),
    ),
    "ckptview.layouts": (
        Builtin("paddle-fluid", "paddle", "PaddleFluidLayout", LayoutTier.SPECIFIC),
        Builtin("paddle-incubate", "paddle", "PaddleIncubateLayout", LayoutTier.SPECIFIC),
        Builtin("paddlenlp-trainer", "paddle_nlp", "PaddleNLPTrainerLayout", LayoutTier.SPECIFIC),
        Builtin("hf-trainer", "hf", "HFTrainerLayout", LayoutTier.FRAMEWORK),
        Builtin("orbax", "orbax", "OrbaxLayout", LayoutTier.FRAMEWORK),
        Builtin("paddle-dcp", "paddle_dcp", "PaddleDcpLayout", LayoutTier.FRAMEWORK),
        Builtin("tf", "tf", "TFLayout", LayoutTier.FRAMEWORK),
        Builtin("tf-serving", "tf_serving", "TFServingLayout", LayoutTier.FRAMEWORK),
        Builtin("dcp", "dcp", "DCPLayout", LayoutTier.CONVENTION),
        Builtin("deepspeed", "deepspeed", "DeepSpeedLayout", LayoutTier.CONVENTION),
        Builtin("fsdp-verl", "verl", "VerlLayout", LayoutTier.CONVENTION),
        Builtin("lightning", "lightning", "LightningLayout", LayoutTier.CONVENTION),
        Builtin("megatron-legacy", "megatron", "MegatronLayout", LayoutTier.CONVENTION),
        Builtin("paddle-static", "paddle", "PaddleStaticLayout", LayoutTier.CONVENTION),
        Builtin("t5x", "t5x", "T5xLayout", LayoutTier.CONVENTION),
        Builtin("caffe2", "caffe2", "Caffe2Layout", LayoutTier.CONTENT),
        Builtin("safetensors-sharded", "hf", "SafetensorsShardedLayout", LayoutTier.FAMILY),
        Builtin("numbered", "numbered", "NumberedLayout", LayoutTier.GENERIC),
        Builtin("files", "files", "FilesLayout", LayoutTier.FALLBACK),
    ),
}  # fmt: skip

#: built-in instances made so far, per package, by name (None: its module failed to import)
_INSTANCES: dict[str, dict[str, Any]] = {package: {} for package in _BASES}


def _base(package: str) -> Any:
    return getattr(importlib.import_module(f"{package}.base"), _BASES[package])


def _load(package: str, row: Builtin) -> Any | None:
    """The instance of a built-in row, importing its module on first use (None, with a
    warning, when the module cannot be imported: a broken module must not break the rest)."""
    made = _INSTANCES[package]
    if row.name in made:
        return made[row.name]
    try:
        module = importlib.import_module(f"{package}.{row.module}")
        made[row.name] = getattr(module, row.cls)()
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"ckptview: {package}.{row.module} unavailable: {e}", stacklevel=4)
        made[row.name] = None
    return made[row.name]


def entry_points(**select: Any) -> Any:
    """:func:`importlib.metadata.entry_points`, imported when plugins are first looked for."""
    from importlib.metadata import entry_points as installed

    return installed(**select)


#: entry points of both groups, from one scan of the installed distributions, by the
#: ``entry_points`` function that found them (a test may swap it)
_EP_SCAN: list = [None, None]
_PLUGINS: dict[str, dict[str, Any]] = {}


def _entry_points(group: str) -> list:
    if _EP_SCAN[0] is not entry_points:
        found = entry_points()  # one scan of the installed distributions for both groups
        if hasattr(found, "select"):
            eps = [ep for g in _BASES for ep in found.select(group=g)]
        else:  # a stand-in (tests) that lists by group
            eps = [ep for g in _BASES for ep in entry_points(group=g)]
        _EP_SCAN[:] = [entry_points, eps]
        _PLUGINS.clear()
        _ORDER.clear()
    return [ep for ep in _EP_SCAN[1] if getattr(ep, "group", group) == group]


def _plugins(group: str) -> dict:
    """name -> instance of the group's installed plugins, loaded once (until cleared)."""
    eps = _entry_points(group)
    if group not in _PLUGINS:
        found = {}
        for ep in eps:
            try:
                found[ep.name] = ep.load()()
            except Exception as e:  # noqa: BLE001
                warnings.warn(f"ckptview: {group} entry point {ep.name!r} failed: {e}",
                              stacklevel=4)  # fmt: skip
        _PLUGINS[group] = found
    return _PLUGINS[group]


_ORDER: dict[str, list] = {}


def _order(package: str) -> list:
    """Detection order of a package: built-in rows (not imported yet) and plugin and
    registered instances, by (priority, name); a later source replaces an earlier name."""
    plugins = _plugins(package)  # (re)scans when the entry points changed
    if package not in _ORDER:
        found: dict[str, Any] = {row.name: row for row in BUILTIN[package]}
        found.update(plugins)
        found.update(_REGISTERED[package])
        _ORDER[package] = sorted(found.values(), key=lambda x: (x.priority, x.name))
    return _ORDER[package]


def _resolve(package: str, item: Any) -> Any | None:
    return _load(package, item) if isinstance(item, Builtin) else item


def iter_ordered(package: str) -> Iterator[Any]:
    """Instances of a package in detection order, each built-in module imported only when
    reached (layout detection stops at the first layout that recognizes the tree)."""
    for item in _order(package):
        obj = _resolve(package, item)
        if obj is not None:
            yield obj


def names(package: str) -> list[str]:
    """Names of a package's layouts or codecs in detection order, importing none."""
    return [item.name for item in _order(package)]


def _all(package: str) -> dict:
    """name -> instance from the three sources, in detection order (every module imported)."""
    return {obj.name: obj for obj in iter_ordered(package)}


@lru_cache(maxsize=1)
def codecs() -> dict:
    """name -> Codec instance, in detection order (imports every codec module; detection
    itself imports only those whose cheap checks could apply)."""
    return _all("ckptview.codecs")


@lru_cache(maxsize=1)
def layouts() -> dict:
    """name -> Layout instance, in detection order (imports every layout module)."""
    return _all("ckptview.layouts")


def register(cls):
    """Add a Codec or Layout subclass (or an instance of one) to the registry; returns it.

    The format is then detected, listed and openable by name like a built-in one, in the
    order its ``priority`` gives; a registered name replaces a built-in or plugin of that
    name. Usable as a class decorator::

        @registry.register
        class ToyCodec(Codec):
            name = "toy"
            magic = (b"TOY1",)

    :func:`unregister` takes it out again (e.g. at the end of a test).
    """
    package = _package_of(cls)
    obj = cls() if isinstance(cls, type) else cls
    if not getattr(obj, "name", ""):
        raise ValueError(f"{type(obj).__name__} has no name")
    _REGISTERED[package][obj.name] = obj
    _clear()
    return cls


def unregister(cls_or_name) -> None:
    """Remove what :func:`register` added, by class, instance or name (no error when absent).

    Only run-time registrations are removed: a built-in or plugin of that name comes back.
    """
    name = cls_or_name if isinstance(cls_or_name, str) else getattr(cls_or_name, "name", "")
    for found in _REGISTERED.values():
        found.pop(name, None)
    _clear()


def _package_of(cls_or_obj) -> str:
    """``ckptview.codecs`` or ``ckptview.layouts``: where a class or instance belongs."""
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    for package in _BASES:
        if issubclass(cls, _base(package)):
            return package
    raise TypeError(f"{cls_or_obj!r} is neither a ckptview Codec nor a Layout")


def _clear() -> None:
    codecs.cache_clear()
    layouts.cache_clear()
    _ORDER.clear()


def _get(package: str, name: str, what: str):
    order = _order(package)
    by_name = _BY_NAME.get(package)
    if by_name is None or by_name[0] is not order:  # rebuilt with the order
        by_name = _BY_NAME[package] = (order, {x.name: x for x in order})
    item = by_name[1].get(name)
    obj = None if item is None else _resolve(package, item)
    if obj is None:
        known = ", ".join(names(package))
        raise ValueError(f"unknown {what} {name!r}; known: {known}") from None
    return obj


_BY_NAME: dict[str, tuple[list, dict[str, Any]]] = {}


def get_codec(name: str):
    """The codec named ``name`` (importing its module alone); ValueError naming the known."""
    return _get("ckptview.codecs", name, "codec")


def get_layout(name: str):
    """The layout named ``name`` (importing its module alone); ValueError naming the known."""
    return _get("ckptview.layouts", name, "layout")


def _suffix_sets() -> tuple[tuple[str, ...], tuple[str, ...]]:
    key = _order("ckptview.codecs")
    if _SUFFIXES[0] is not key:  # the order list is rebuilt whenever the codecs change
        save, known = set(), set()
        for item in _order("ckptview.codecs"):
            saves = tuple(getattr(item, "save_suffixes", ()))
            save.update(s.lower() for s in saves)
            known.update(s.lower() for s in (*item.suffixes, *saves))
        _SUFFIXES[:] = [key, tuple(sorted(save, key=lambda s: (-len(s), s))),
                        tuple(sorted(known))]  # fmt: skip
    return _SUFFIXES[1], _SUFFIXES[2]


_SUFFIXES: list = [None, (), ()]


def save_suffixes() -> tuple[str, ...]:
    """File-name endings under which scripts save one checkpoint per file, as the codecs
    declare them (``Codec.save_suffixes``), longest first: layouts that find checkpoint files
    by name alone (numbered) ask here instead of keeping their own list."""
    return _suffix_sets()[0]


def known_suffixes() -> tuple[str, ...]:
    """Every name ending a codec claims or saves under (``.pt``, ``.safetensors``, …): a file
    with one of them is taken for a checkpoint file."""
    return _suffix_sets()[1]


def detect_codec(filename: str, head: bytes, blob=None):
    """The first codec whose cheap check accepts the file, or None.

    With ``blob``, a file no codec claims from its first block gets a second look from the
    codecs that implement ``guess_can_open_blob`` (a few small reads more). A built-in codec
    whose :class:`Claim` rules the file out is skipped without importing its module.
    """
    package = "ckptview.codecs"
    order = _order(package)
    lower = filename.lower()
    for item in order:
        if isinstance(item, Builtin):
            if not item.claim.may(filename, lower, head):
                continue
            codec = _load(package, item)
            if codec is None:
                continue
        else:
            codec = item
        try:
            if codec.guess_can_open(filename, head):
                return codec
        except Exception as e:  # noqa: BLE001 - warn rather than crash while guessing
            warnings.warn(f"ckptview: codec {codec.name} failed while guessing: {e}", stacklevel=2)
    if blob is None:
        return None
    for item in order:
        if isinstance(item, Builtin):
            codec = _load(package, item) if item.claim.blob else None
        else:
            codec = item
        look = getattr(codec, "guess_can_open_blob", None)
        try:
            if look is not None and look(filename, head, blob):
                return codec
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"ckptview: codec {codec.name} failed while guessing: {e}", stacklevel=2)
    return None
