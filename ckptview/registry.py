"""Layout and codec registries.

Built-ins are the classes defined in the modules of ``ckptview.layouts`` and
``ckptview.codecs`` (one module per format family); third parties add theirs through the
entry-point groups ``ckptview.layouts`` and ``ckptview.codecs``. A plugin that fails to import
is skipped with a warning (xarray's importable-module gate), never a crash.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings
from functools import lru_cache
from importlib.metadata import entry_points


def _builtin(package: str, base_name: str) -> dict:
    pkg = importlib.import_module(package)
    base = getattr(importlib.import_module(f"{package}.base"), base_name)
    found = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        try:
            module = importlib.import_module(f"{package}.{info.name}")
        except Exception as e:  # noqa: BLE001 - a broken module must not break the rest
            warnings.warn(f"ckptview: {package}.{info.name} unavailable: {e}", stacklevel=3)
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, base) and cls.__module__ == module.__name__ and cls.name:
                found[cls.name] = cls()
    return found


def _plugins(group: str) -> dict:
    found = {}
    for ep in entry_points(group=group):
        try:
            found[ep.name] = ep.load()()
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"ckptview: {group} entry point {ep.name!r} failed: {e}", stacklevel=3)
    return found


def _ordered(found: dict) -> dict:
    return dict(sorted(found.items(), key=lambda kv: (kv[1].priority, kv[0])))


@lru_cache(maxsize=1)
def codecs() -> dict:
    """name -> Codec instance, in detection order."""
    return _ordered({**_builtin("ckptview.codecs", "Codec"), **_plugins("ckptview.codecs")})


@lru_cache(maxsize=1)
def layouts() -> dict:
    """name -> Layout instance, in detection order."""
    return _ordered({**_builtin("ckptview.layouts", "Layout"), **_plugins("ckptview.layouts")})


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
