"""t5x native checkpoints: ``checkpoint_<step>/`` directories, each a msgpack ``checkpoint``
file and one directory per array stored apart (tensorstore zarr). t5x writes a checkpoint to a
temporary directory and renames it into place, so a directory with its ``checkpoint`` file is
complete; the newest one is the resume point."""

from __future__ import annotations

import posixpath
import re

from ..model import FileRef, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier

STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
MSGPACK_MAP = tuple(range(0x80, 0x90)) + (0xDE, 0xDF)


class T5xLayout(Layout):
    """``checkpoint_N/checkpoint`` (msgpack) plus array directories."""

    name = "t5x"
    resume_reads = (
        "``checkpoint`` (msgpack) and every array directory it points to (``restore_checkpoint``)"
    )
    priority = LayoutTier.CONVENTION

    def guess_can_open(self, tree: Tree) -> bool:
        return bool(self._steps(tree))

    def _steps(self, tree: Tree) -> dict[int, str]:
        out = {}
        for d in tree.dirs():
            m = STEP_DIR.match(posixpath.basename(d))
            f = f"{d}/checkpoint"
            if m and tree.exists(f) and tree.size(f) and self._msgpack(tree, f):
                out[int(m[1])] = d
        return out

    @staticmethod
    def _msgpack(tree: Tree, rel: str) -> bool:
        """Does the file start with a msgpack map (one small read, remembered)?"""
        return tree.memo(rel, "t5x-map", lambda: tree.read_bytes(rel, 1)[:1]) in {
            bytes([b]) for b in MSGPACK_MAP
        }

    def scan(self, tree: Tree) -> TreeScan:
        serials = []
        for step, d in sorted(self._steps(tree).items()):
            state = f"{d}/checkpoint"
            ref = FileRef(tree.abs(state), codec="t5x", size=tree.size(state))
            others = [tree.abs(f) for f in tree.files(under=d) if f != state]
            serials.append(SerialInfo(step, tree.abs(d), [ref], others, complete=True, step=step))
        return TreeScan(serials)

    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        return [f"{tree.rel(info.path)}/checkpoint"]
