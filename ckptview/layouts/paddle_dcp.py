"""Paddle distributed checkpoints (``paddle.distributed.save_state_dict``), specs/paddle.md §5.4.

A directory of ``{id}.metadata`` + ``{rank}_{id}.distcp`` (or ``.safetensors``) files. Serial =
unique id; nodes = ranks (``rank0`` …); complete = the metadata exists, parses, and every file
it references is present; latest = the largest complete id (``load_state_dict(unique_id=None)``
takes the largest id; an incomplete one could not be loaded).
"""

from __future__ import annotations

import posixpath
import re

from ..codecs.paddle_dcp import DcpMetadata, metadata_hints, read_metadata
from ..model import FileRef, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout

SHARD = re.compile(r"^(\d+)_(\d+)\.(distcp|safetensors)$")
METADATA = re.compile(r"^(\d+)\.metadata$")


class PaddleDcpLayout(Layout):
    """``{id}.metadata`` + ``{rank}_{id}.distcp`` files directly in the root."""

    name = "paddle-dcp"
    priority = 30

    def guess_can_open(self, tree: Tree) -> bool:
        names = [posixpath.basename(f) for f in tree.files(depth=1)]
        has_meta = any(METADATA.match(n) for n in names)
        has_shard = any(SHARD.match(n) for n in names)
        return has_shard and (has_meta or any(n.endswith(".distcp") for n in names))

    def scan(self, tree: Tree) -> TreeScan:
        shards: dict[int, list[tuple[int, str]]] = {}
        metas: dict[int, str] = {}
        for rel in tree.files(depth=1):
            name = posixpath.basename(rel)
            if m := SHARD.match(name):
                shards.setdefault(int(m.group(2)), []).append((int(m.group(1)), rel))
            elif m := METADATA.match(name):
                metas[int(m.group(1))] = rel
        serials = [self._serial(tree, uid, shards.get(uid, []), metas.get(uid))
                   for uid in sorted(set(shards) | set(metas))]  # fmt: skip
        complete = [s.serial for s in serials if s.complete]
        return TreeScan(serials, max(complete) if complete else None, latest_rule=True)

    def _serial(self, tree: Tree, uid: int, shards: list, meta_rel: str | None) -> SerialInfo:
        meta: DcpMetadata | None = None
        error = None
        if meta_rel is None:
            error = f"{uid}.metadata missing"
        else:
            try:
                meta = read_metadata(tree.blob(meta_rel))
            except Exception as e:  # noqa: BLE001 - a broken metadata makes the serial incomplete
                error = f"{meta_rel}: {type(e).__name__}: {e}"[:300]
        present = {posixpath.basename(rel) for _, rel in shards}
        if meta is not None:
            missing = sorted(meta.files - present)
            if missing:
                error = f"missing shard files: {', '.join(missing[:5])}"
        files = []
        for rank, rel in sorted(shards):
            base = posixpath.basename(rel)
            hints = metadata_hints(meta, base) if meta is not None else {}
            codec = "paddle-dcp" if base.endswith(".distcp") else None
            files.append(FileRef(tree.abs(rel), node=f"rank{rank}", codec=codec, hints=hints,
                                 size=tree.size(rel)))  # fmt: skip
        others = [tree.abs(meta_rel)] if meta_rel else []
        lock = f"{uid}.metadata.lock"
        if tree.exists(lock):
            others.append(tree.abs(lock))
        return SerialInfo(uid, tree.root, files, others, complete=meta is not None and not error,
                          error=error, nodes=tuple(f.node for f in files))  # fmt: skip
