"""Permission problems a local tree walk skips silently: directories it could not enter."""

from __future__ import annotations

import os

from ..tree import Tree


def denied_root(tree: Tree) -> str | None:
    """The root (or the one file) of a local tree when this process may not read it."""
    if not tree.storage.plain_local:
        return None
    path = tree.abs(tree.single) if tree.single else tree.root
    mode = os.R_OK if tree.single else os.R_OK | os.X_OK
    if os.path.exists(path) and not os.access(path, mode):
        return path
    return None


def unreadable_dirs(tree: Tree) -> list[str]:
    """Directories below a local tree's root that the walk listed but could not enter (no
    read or execute permission): what they hold is missing from every table. [] for a
    remote store (its listing raises instead) and for a one-file tree."""
    if not tree.storage.plain_local or tree.single:
        return []
    return sorted(
        tree.abs(rel)
        for rel, info in tree.entries.items()
        if info["type"] == "directory" and not os.access(tree.abs(rel), os.R_OK | os.X_OK)
    )


def denied_message(path: str) -> str:
    """The one line that names a permission problem and its path."""
    return f"permission denied: {path} cannot be read (its contents are not listed)"


def touches(denied: str, path: str) -> bool:
    """Whether an unreadable directory is ``path``, lies inside it or holds it."""
    path = str(path)
    return denied == path or denied.startswith(f"{path}/") or path.startswith(f"{denied}/")
