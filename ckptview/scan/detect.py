"""Opening a tree at a URL and detecting its layout (``ckptview.open`` and crash recovery)."""

from __future__ import annotations

import os
from typing import Any

from .. import registry
from ..io import Storage
from ..layouts.base import Layout
from ..tree import Tree
from .cache import resolve


class UnknownTreeError(ValueError):
    """No layout recognizes the tree."""


def list_tree(url: str | os.PathLike, storage_options: dict | None = None,
              cache: Any = None) -> Tree:  # fmt: skip
    """The tree at ``url`` (a directory, a file, or a file prefix), with its header cache set
    (``cache``: see :func:`ckptview.scan.cache.resolve`)."""
    storage, path = Storage.from_url(os.fspath(url), storage_options)
    try:
        tree = Tree.at(storage, path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such checkpoint tree: {url}") from None
    tree.cache = resolve(cache)
    return tree


def detect(tree: Tree, layout: str | None = None, label: str | os.PathLike | None = None) -> Layout:
    """The layout named ``layout``, else the first (in detection order) that recognizes
    ``tree``; :class:`UnknownTreeError` (naming the tree as ``label``) when none does."""
    if layout is not None:
        return registry.get_layout(layout)
    tried = []
    for name, candidate in registry.layouts().items():
        tried.append(name)
        if candidate.guess_can_open(tree):
            return candidate
    raise UnknownTreeError(
        f"no layout recognizes {label if label is not None else tree.url()} "
        f"({len(tree.entries)} entries); tried: {', '.join(tried)}"
    )
