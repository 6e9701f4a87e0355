"""Paddle distributed checkpoints (``paddle.distributed.save_state_dict``), specs/paddle.md §5.4.

A directory of ``{id}.metadata`` + ``{rank}_{id}.distcp`` (or ``.safetensors``) files. Serial =
unique id; nodes = ranks (``rank0`` …); complete = the metadata exists, parses, and every file
it references is present; latest = the largest complete id (``load_state_dict(unique_id=None)``
takes the largest id; an incomplete one could not be loaded).
"""

from __future__ import annotations

import posixpath
import re
import struct
from typing import TYPE_CHECKING

from ..model import FileRef, Op, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier

if TYPE_CHECKING:
    from ..formats.paddle_dcp_meta import DcpMetadata

SHARD = re.compile(r"^(\d+)_(\d+)\.(distcp|safetensors)$")
METADATA = re.compile(r"^(\d+)\.metadata$")


class PaddleDcpLayout(Layout):
    """``{id}.metadata`` + ``{rank}_{id}.distcp`` files directly in the root."""

    name = "paddle-dcp"
    resume_reads = "``{id}.metadata`` and every rank file it names (``load_state_dict``)"
    priority = LayoutTier.FRAMEWORK

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
        from ..formats.paddle_dcp_meta import metadata_hints, read_metadata  # (pickle reader)

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
            hints = metadata_hints(meta, base) if meta is not None else None
            codec = "paddle-dcp" if base.endswith(".distcp") else None
            files.append(FileRef(tree.abs(rel), node=f"rank{rank}", codec=codec, hints=hints,
                                 size=tree.size(rel)))  # fmt: skip
        others = [tree.abs(meta_rel)] if meta_rel else []
        lock = f"{uid}.metadata.lock"
        if tree.exists(lock):
            others.append(tree.abs(lock))
        return SerialInfo(uid, tree.root, files, others, complete=meta is not None and not error,
                          error=error, nodes=tuple(f.node for f in files))  # fmt: skip

    # -- management: promote = copy the shards as id max+1, then its metadata (renamed refs)
    def serial_files(self, tree: Tree, info: SerialInfo) -> list[str]:
        """Shards and ``{id}.metadata`` (not the ``.metadata.lock`` a save leaves behind)."""
        return [f for f in super().serial_files(tree, info) if not f.endswith(".lock")]

    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        return [f for f in self.serial_files(tree, info) if METADATA.match(posixpath.basename(f))]

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Shards copied as ``{rank}_{new}.distcp``, then ``{new}.metadata`` whose
        ``storage_metadata`` names the new files (the metadata written last commits)."""
        new = self.next_serial(tree, scan)
        ops = self.copy_ops(tree, info, new)
        names = {posixpath.basename(o.src): posixpath.basename(o.path) for o in ops if o.src}
        for i, op in enumerate(ops):
            if op.note == "marker":
                data = rename_strings(tree.storage.fs.cat_file(op.src), names)
                ops[i] = Op("write", op.path, data=data, nbytes=len(data), note="marker")
        return ops

    def delete_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        ops = super().delete_ops(tree, scan, info)
        lock = f"{info.serial}.metadata.lock"
        return ops + ([Op("delete", lock, nbytes=tree.size(lock))] if tree.exists(lock) else [])


_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}


def rename_strings(data: bytes, names: dict[str, str]) -> bytes:
    """A pickle with every string equal to a key of ``names`` replaced by its value.

    The opcodes are only parsed (pickletools), never run; string opcodes are re-encoded (BINUNICODE)
    with their new length and FRAME opcodes dropped (frames are optional in protocol 4).
    """
    import pickletools

    ops = list(pickletools.genops(data))
    out = bytearray()
    for i, (op, arg, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else len(data)
        if op.name == "FRAME":
            continue
        if op.name in _STRINGS and arg in names:
            raw = names[arg].encode("utf-8")
            out += b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE: any protocol >= 1
            continue
        out += data[pos:end]
    return bytes(out)
