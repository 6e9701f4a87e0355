"""Paddle distributed checkpoints: the ``{id}.metadata`` describing ``{rank}_{id}.distcp`` shards.

A ``.distcp`` file is a ``paddle.save`` flat pickle of the rank's local shards; the metadata
(a pickle of ``Metadata``/``LocalTensorMetadata``/``LocalTensorIndex`` dataclasses, read as
inert Records under both module paths) gives each tensor's dtype string (so bfloat16 is known,
not guessed), global shape and each shard's global offset. See specs/paddle.md §5.4.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..io import Blob
from ..model import PaddleDcpHints
from .pickle import Record, Unpickler

DISTCP = re.compile(r"^(\d+)_(\d+)\.distcp$")
METADATA = re.compile(r"^(\d+)\.metadata$")
MAX_METADATA = 256 << 20


@dataclass
class Shard:
    """One stored piece of a tensor: which file, where it sits in the global tensor."""

    key: str
    file: str
    global_offset: tuple[int, ...]
    local_shape: tuple[int, ...] | None = None


@dataclass
class DcpMetadata:
    """What a ``{id}.metadata`` file says: dtypes, global shapes and the shard -> file map."""

    dtypes: dict[str, str] = field(default_factory=dict)
    global_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    shards: list[Shard] = field(default_factory=list)

    @property
    def files(self) -> set[str]:
        return {s.file for s in self.shards}


def _get(rec: Any, name: str, default: Any = None) -> Any:
    if isinstance(rec, Record):
        return rec.fields().get(name, default)
    if isinstance(rec, dict):
        return rec.get(name, default)
    return default


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def parse_metadata(obj: Any) -> DcpMetadata:
    """A DcpMetadata from an unpickled Paddle ``Metadata`` Record (tolerates missing fields)."""
    if not isinstance(obj, Record) or not obj.cls.endswith(".Metadata"):
        raise ValueError(f"not a Paddle DCP Metadata pickle ({type(obj).__name__})")
    meta = DcpMetadata()
    for key, entries in (_get(obj, "state_dict_metadata") or {}).items():
        for entry in entries if isinstance(entries, (list, tuple)) else [entries]:
            dtype = _get(entry, "dtype")
            if isinstance(dtype, str):
                meta.dtypes[str(key)] = dtype.replace("paddle.", "")
            shape = _shape(_get(entry, "global_shape"))
            if shape is not None:
                meta.global_shapes[str(key)] = shape
    for index, file in (_get(obj, "storage_metadata") or {}).items():
        offset = _shape(_get(index, "global_offset")) or ()
        local = _shape(_get(index, "local_shape"))
        meta.shards.append(Shard(str(_get(index, "tensor_key", "")), str(file), offset, local))
    return meta


def read_metadata(blob: Blob) -> DcpMetadata:
    """Parse one ``{id}.metadata`` file (bounded size, restricted unpickler)."""
    if blob.size > MAX_METADATA:
        raise ValueError(f"metadata of {blob.size} bytes is too large")
    return parse_metadata(Unpickler(blob, encoding="latin1").load())


def metadata_hints(meta: DcpMetadata, file: str) -> PaddleDcpHints:
    """Codec hints for one ``.distcp`` file: dtypes, global shapes, this file's offsets."""
    offsets = {s.key: s.global_offset for s in meta.shards if s.file == file}
    return PaddleDcpHints(dtypes=meta.dtypes, global_shapes=meta.global_shapes, offsets=offsets)
