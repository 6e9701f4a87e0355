"""``ckptview.open``: detect a tree's layout and return its Catalog."""

from __future__ import annotations

import os
from concurrent.futures import Executor

from . import registry
from .catalog import Catalog
from .io import Storage
from .tree import Tree


class UnknownTreeError(ValueError):
    """No layout recognizes the tree."""


def open(  # noqa: A001 - the public name is ckptview.open
    url: str | os.PathLike,
    *,
    layout: str | None = None,
    storage_options: dict | None = None,
    executor: Executor | None = None,
    cache=None,
    progress=None,
) -> Catalog:
    """Open a checkpoint tree (a directory, a file, or a file prefix) at any fsspec URL.

    ``cache`` (an extra to the DESIGN.md signature): None uses the process-wide header cache,
    a directory path adds an on-disk cache there, False keeps the catalog's cache private
    (see :mod:`ckptview.cache`). A rescan of unchanged files reads no header again.
    ``progress`` (also an extra): ``progress(done, total)`` is called once per file while
    the catalog lists headers (the CLI passes a tqdm bar); the core itself shows nothing.
    """
    from .cache import resolve

    storage, path = Storage.from_url(os.fspath(url), storage_options)
    try:
        tree = Tree.at(storage, path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such checkpoint tree: {url}") from None
    tree.cache = cache = resolve(cache)
    if layout is not None:
        return Catalog(tree, registry.get_layout(layout), executor, cache, progress)
    tried = []
    for name, candidate in registry.layouts().items():
        tried.append(name)
        if candidate.guess_can_open(tree):
            return Catalog(tree, candidate, executor, cache, progress)
    raise UnknownTreeError(
        f"no layout recognizes {url} ({len(tree.entries)} entries); tried: {', '.join(tried)}"
    )
