"""Whole small files (JSON metadata, markers), refused above a size bound."""

from __future__ import annotations

import json
from typing import Any

from ..io import Blob, Storage

MAX_JSON_BYTES = 256 << 20


MAX_JSON_BYTES = 256 << 20


def read_small(storage: Storage, path: str, size: int | None = None) -> bytes:
    """A whole small file (JSON, marker); refuses files above ``MAX_JSON_BYTES``."""
    blob = Blob(storage, path, size)
    if blob.size > MAX_JSON_BYTES:
        raise ValueError(f"{blob.name}: {blob.size} bytes is too large for a metadata file")
    return blob.read(0, blob.size)


def read_json(storage: Storage, path: str, size: int | None = None) -> Any:
    return json.loads(read_small(storage, path, size).decode("utf-8"))
