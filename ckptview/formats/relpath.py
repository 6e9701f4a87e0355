"""Paths a file names (DCP ``relative_path``, t5x ``kvstore.path``): resolved inside the
directory of the file that names them, or refused (no ``..``, no absolute path, no URL)."""

from __future__ import annotations

import posixpath


def inside(rel: str) -> bool:
    """Whether ``rel`` names something inside the naming file's directory."""
    if not isinstance(rel, str) or not rel or rel.startswith("/"):
        return False
    if any(c in rel for c in ("\\", "\x00", ":")):
        return False
    return all(part not in ("..", "") for part in rel.rstrip("/").split("/")) or rel == "."


def join_inside(base: str, rel: str) -> str:
    """``base/rel``; ValueError when ``rel`` would leave ``base``."""
    if not inside(rel):
        raise ValueError(f"path {rel!r} leaves the checkpoint directory")
    return posixpath.join(base, rel)
