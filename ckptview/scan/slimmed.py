"""Slimmed serials: those whose optimizer state retention deleted (``.ckptview/slimmed.json``).

A slimmed serial keeps its weights and stays readable, but no framework can resume from it:
it is never ``loadable`` and says so in its ``warning``."""

from __future__ import annotations

import json

from ..formats.small import loads_json
from ..model import META_DIR
from ..tree import Tree

SLIMMED_FILE = f"{META_DIR}/slimmed.json"


def read_slimmed(tree: Tree) -> dict[int, dict]:
    """serial -> what was slimmed (``files``, ``nbytes``, ``time``); {} when none (or the
    record is unreadable: then nothing is claimed slimmed)."""
    tree.entries  # noqa: B018 - the listing notes .ckptview/ files
    if SLIMMED_FILE not in tree.meta_files:
        return {}
    try:
        raw = tree.storage.fs.cat_file(tree.abs(SLIMMED_FILE))
        doc = loads_json(raw[: 16 << 20])
        return {int(k): dict(v) for k, v in doc.get("serials", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def slimmed_json(current: dict[int, dict], added: dict[int, dict]) -> bytes:
    merged = {**current, **added}
    doc = {"serials": {str(k): v for k, v in sorted(merged.items())}}
    return json.dumps(doc, indent=1).encode()
