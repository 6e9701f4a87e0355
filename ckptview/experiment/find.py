"""Finding run roots below a directory (the layouts' cheap detection, names only)."""

from __future__ import annotations

import posixpath
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from .. import registry
from ..layouts.base import Layout
from ..model import META_DIR
from ..registry import LayoutTier
from ..scan.detect import UnknownTreeError, _explained, _n_files, detect
from ..tree import Tree

#: how deep below an experiment's root run roots are looked for
MAX_DEPTH = 3


# -- finding runs ------------------------------------------------------------------------
@dataclass
class FoundRun:
    """A run root found below an experiment's root: its relative path, tree and layout."""

    name: str
    tree: Tree
    layout: Layout


class _Walk:
    """Sub-trees of one listed tree, made from its listing (no storage request)."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self.keys = sorted(tree.entries)

    def subtree(self, rel: str) -> Tree:
        if not rel:
            return self.tree
        tree = self.tree
        prefix = rel + "/"
        lo = bisect_left(self.keys, prefix)
        hi = bisect_left(self.keys, prefix + "\U0010ffff", lo)
        entries, meta = {}, set()
        for key in self.keys[lo:hi]:
            sub = key[len(prefix) :]
            if sub.startswith(META_DIR + "/"):
                meta.add(sub)
            elif not sub.startswith(META_DIR):
                entries[sub] = tree.entries[key]
        out = Tree(tree.storage, tree.abs(rel))
        out.__dict__["entries"] = entries  # listed already; ``forget`` lists it again
        out.meta_files = meta
        out.cache = tree.cache
        return out


def _checkpoint_files(tree: Tree) -> list[str]:
    """Files directly in the tree's root with a checkpoint ending."""
    suffixes = registry.known_suffixes()
    return [f for f in tree.files(depth=1) if f.lower().endswith(suffixes)]


class _Scanned:
    """A layout whose scan of one tree is made already (detection's): ``_explained`` counts
    its claims without scanning the tree again."""

    def __init__(self, layout: Layout, found: Any):
        self.name, self.found = layout.name, found

    def scan(self, tree: Tree) -> Any:
        return self.found


def _run_layout(tree: Tree) -> Layout | None:
    """The layout that makes ``tree`` one run, or None (``files`` is returned as is: the
    caller decides whether loose files make a run). Detection's own scan is counted (and
    left in ``tree.scans`` for the run's Catalog), never a second one."""
    try:
        layout = detect(tree)
    except UnknownTreeError:
        return None
    if layout.priority >= LayoutTier.FALLBACK:
        return layout
    found = tree.scans.get(layout.name)
    counted: Any = layout if found is None else _Scanned(layout, found)
    return layout if _explained(counted, tree) * 2 >= _n_files(tree) else None


def find_runs(tree: Tree, depth: int = MAX_DEPTH) -> tuple[list[FoundRun], list[str]]:
    """The run roots at or below ``tree``'s root (to ``depth`` levels; see the module
    docstring), and the stray checkpoint files that belong to no run."""
    walk = _Walk(tree)
    stray: list[str] = []

    def visit(rel: str, level: int) -> list[FoundRun]:
        sub = walk.subtree(rel)
        name = rel or "."
        layout = _run_layout(sub)
        if layout is not None and layout.priority < LayoutTier.FAMILY:
            return [FoundRun(name, sub, layout)]
        below: list[FoundRun] = []
        if level < depth:
            for child in sub.dirs():
                if not child.startswith((".", "__pycache__")):
                    below += visit(posixpath.join(rel, child) if rel else child, level + 1)
        if layout is not None and layout.priority < LayoutTier.FALLBACK:
            own = [r for r in below if r.layout.priority < LayoutTier.FALLBACK]
            return below if len(own) >= 2 else [FoundRun(name, sub, layout)]
        loose = _checkpoint_files(sub) if layout is not None else []
        if below:
            stray.extend(posixpath.join(rel, f) if rel else f for f in loose)
            return below
        return [FoundRun(name, sub, layout)] if layout is not None and loose else []

    return visit("", 0), stray
