"""Whole small files (JSON metadata, markers), refused above a size bound."""

from __future__ import annotations

import json
from typing import Any

from ..io import Blob, Storage

MAX_JSON_BYTES = 256 << 20
#: JSON documents nesting deeper are refused (state files nest a few levels; ``json.loads``
#: raises RecursionError near 1,000 and callers walking a document recurse too)
MAX_JSON_DEPTH = 200


def loads_json(data: str | bytes, walk: bool = True) -> Any:
    """``json.loads`` that refuses documents nesting deeper than ``MAX_JSON_DEPTH`` with a
    ValueError (never a RecursionError). ``walk=False``: only what ``json.loads`` itself
    refuses; the caller checks the parts it keeps with :func:`check_depth`."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise ValueError(f"JSON nests more than {MAX_JSON_DEPTH} levels deep") from None
    if walk:
        check_depth(doc)
    return doc


def check_depth(doc: Any, depth: int = 1) -> None:
    """ValueError when ``doc`` (found ``depth`` levels down) nests deeper than
    ``MAX_JSON_DEPTH``."""
    if isinstance(doc, (dict, list)):
        todo = [(doc, depth)]
        while todo:
            node, depth = todo.pop()
            if depth > MAX_JSON_DEPTH:
                raise ValueError(f"JSON nests more than {MAX_JSON_DEPTH} levels deep")
            for v in node.values() if isinstance(node, dict) else node:
                if isinstance(v, (dict, list)):
                    todo.append((v, depth + 1))


def read_small(storage: Storage, path: str, size: int | None = None) -> bytes:
    """A whole small file (JSON, marker); refuses files above ``MAX_JSON_BYTES``."""
    blob = Blob(storage, path, size)
    if blob.size > MAX_JSON_BYTES:
        raise ValueError(f"{blob.name}: {blob.size} bytes is too large for a metadata file")
    return blob.read(0, blob.size)


def read_json(storage: Storage, path: str, size: int | None = None) -> Any:
    return loads_json(read_small(storage, path, size).decode("utf-8"))
