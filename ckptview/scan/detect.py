"""Opening a tree at a URL and detecting its layout (``ckptview.open`` and crash recovery)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .. import registry
from ..io import Storage
from ..layouts.base import Layout
from ..model import META_DIR
from ..registry import LayoutTier
from ..tree import Tree
from .cache import resolve
from .listing import paused_gc


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
    """The layout named ``layout``, else the one that explains ``tree`` best.

    Layouts are asked in detection order; the first that recognizes the tree is taken when
    it accounts for at least half of the tree's files. Otherwise every layout that
    recognizes the tree scans it and the one whose serials claim the most files wins (the
    earliest on a tie); the ``files`` fallback only when no other claims any.
    :class:`UnknownTreeError` (naming the tree as ``label``) when no layout recognizes it."""
    if layout is not None:
        return registry.get_layout(layout)
    with paused_gc:  # the walk and the layouts' scans allocate an object or more per file
        return _detect(tree, label)


def _detect(tree: Tree, label: str | os.PathLike | None) -> Layout:
    package = "ckptview.layouts"
    first = next((c for c in registry.iter_ordered(package) if c.guess_can_open(tree)), None)
    if first is None:
        raise UnknownTreeError(
            f"no layout recognizes {label if label is not None else tree.url()} "
            f"({len(tree.entries)} entries); tried: {', '.join(registry.names(package))}"
        )
    if first.priority >= LayoutTier.FALLBACK or _explained(first, tree) * 2 >= _n_files(tree):
        return first  # the common case: no other layout is asked (nor imported)
    layouts = list(registry.iter_ordered(package))
    i = next(i for i, c in enumerate(layouts) if c is first)
    rest = [c for c in layouts[i + 1 :] if c.priority < LayoutTier.FALLBACK]
    yes = [first, *(c for c in rest if c.guess_can_open(tree))]
    scores = [(_explained(c, tree), -j, c) for j, c in enumerate(yes)]
    best = max(scores, key=lambda t: (t[0], t[1]))
    if best[0] > 0:
        return best[2]
    return next(c for c in layouts if c.priority >= LayoutTier.FALLBACK and c.guess_can_open(tree))


def _n_files(tree: Tree) -> int:
    return sum(1 for rel in tree.files() if rel.split("/", 1)[0] != META_DIR)


def _explained(layout: Layout, tree: Tree) -> int:
    """How many of the tree's files the layout's serials claim (data and other files)."""
    try:
        found = layout.scan(tree)
    except Exception:  # noqa: BLE001 - a layout that cannot scan the tree explains nothing
        return -1
    tree.scans[layout.name] = found  # the Scan takes it instead of scanning again
    rel = _rel_of(tree)
    claimed = {rel(ref.path) for s in found.serials for ref in s.files}
    claimed.update(rel(p) for s in found.serials for p in s.other_files)
    dirs = tuple(f"{rel}/" for rel in claimed if rel == "" or tree.is_dir(rel))  # item dirs
    if "/" in dirs:
        return sum(1 for _ in tree.files())
    return sum(1 for rel in tree.files() if rel in claimed or rel.startswith(dirs))


def _rel_of(tree: Tree) -> Callable[[str], str]:
    """``tree.rel`` for the paths layouts make (``tree.abs(rel)``): the root's prefix cut
    off, anything else through ``tree.rel``."""
    root = tree.root.rstrip("/")
    if not root:
        return tree.rel
    head, cut, rel = root + "/", len(root) + 1, tree.rel

    def fast(path: str) -> str:
        if path.startswith(head) and not path.endswith("/"):
            return path[cut:]
        return rel(path)

    return fast
