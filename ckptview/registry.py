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
import inspect
import pkgutil
import warnings
from enum import IntEnum
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any


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


def _base(package: str) -> Any:
    return getattr(importlib.import_module(f"{package}.base"), _BASES[package])


def _builtin(package: str) -> dict:
    pkg = importlib.import_module(package)
    base = _base(package)
    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        try:
            module = importlib.import_module(f"{package}.{info.name}")
        except Exception as e:  # noqa: BLE001 - a broken module must not break the rest
            warnings.warn(f"ckptview: {package}.{info.name} unavailable: {e}", stacklevel=4)
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            name = getattr(cls, "name", "")
            if issubclass(cls, base) and cls.__module__ == module.__name__ and name:
                found[name] = cls()
    return found


def _plugins(group: str) -> dict:
    found = {}
    for ep in entry_points(group=group):
        try:
            found[ep.name] = ep.load()()
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"ckptview: {group} entry point {ep.name!r} failed: {e}", stacklevel=4)
    return found


def _all(package: str) -> dict:
    """name -> instance from the three sources, in detection order."""
    found = {**_builtin(package), **_plugins(package), **_REGISTERED[package]}
    return dict(sorted(found.items(), key=lambda kv: (kv[1].priority, kv[0])))


@lru_cache(maxsize=1)
def codecs() -> dict:
    """name -> Codec instance, in detection order."""
    return _all("ckptview.codecs")


@lru_cache(maxsize=1)
def layouts() -> dict:
    """name -> Layout instance, in detection order."""
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


def get_codec(name: str):
    try:
        return codecs()[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(codecs())}") from None


def get_layout(name: str):
    try:
        return layouts()[name]
    except KeyError:
        raise ValueError(f"unknown layout {name!r}; known: {', '.join(layouts())}") from None


def save_suffixes() -> tuple[str, ...]:
    """File-name endings under which scripts save one checkpoint per file, as the codecs
    declare them (``Codec.save_suffixes``), longest first: layouts that find checkpoint files
    by name alone (numbered) ask here instead of keeping their own list."""
    found = {s.lower() for codec in codecs().values() for s in getattr(codec, "save_suffixes", ())}
    return tuple(sorted(found, key=lambda s: (-len(s), s)))


def known_suffixes() -> tuple[str, ...]:
    """Every name ending a codec claims or saves under (``.pt``, ``.safetensors``, …): a file
    with one of them is taken for a checkpoint file."""
    found = {x.lower() for c in codecs().values() for x in (*c.suffixes, *c.save_suffixes)}
    return tuple(sorted(found))


def detect_codec(filename: str, head: bytes, blob=None):
    """The first codec whose cheap check accepts the file, or None.

    With ``blob``, a file no codec claims from its first block gets a second look from the
    codecs that implement ``guess_can_open_blob`` (a few small reads more).
    """
    for codec in codecs().values():
        try:
            if codec.guess_can_open(filename, head):
                return codec
        except Exception as e:  # noqa: BLE001 - warn rather than crash while guessing
            warnings.warn(f"ckptview: codec {codec.name} failed while guessing: {e}", stacklevel=2)
    if blob is None:
        return None
    for codec in codecs().values():
        look = getattr(codec, "guess_can_open_blob", None)
        try:
            if look is not None and look(filename, head, blob):
                return codec
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"ckptview: codec {codec.name} failed while guessing: {e}", stacklevel=2)
    return None
