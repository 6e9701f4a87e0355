"""Fallback layout: a directory (or one file) of checkpoint files without serial numbers."""

from __future__ import annotations

import posixpath
import re

from ..formats.safe_globals import NUMPY_RNG_GLOBALS
from ..model import FileRef, SerialInfo, TorchHints, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier, single_serial_refusal

#: files that never hold variables
SKIP_SUFFIXES = (".md", ".txt", ".yaml", ".yml", ".lock", ".log", ".csv", ".py", ".sh", ".json")


#: a torch file is loaded with ``torch.load(weights_only=True)`` (torch >= 2.6's default);
#: an RNG state file as transformers loads it, numpy's RNG globals allowed
SAFE_LOAD = TorchHints(weights_only=True)
SAFE_RNG = TorchHints(weights_only=True, extra_globals=tuple(sorted(NUMPY_RNG_GLOBALS)))
RNG = re.compile(r"^rng_state(?:_\d+)?\.pth$")


class FilesLayout(Layout):
    """Every file below the root is one part of a single checkpoint, serial 0.

    Files a codec does not recognize are skipped. With several files, each variable name is
    prefixed by the file's path relative to the root, so names from different files never
    collide.
    """

    name = "files"
    resume_reads = "every file that holds variables (no framework rule: all of them)"
    priority = LayoutTier.FALLBACK

    def guess_can_open(self, tree: Tree) -> bool:
        return bool(self._candidates(tree))

    def _candidates(self, tree: Tree) -> list[str]:
        return [f for f in tree.files() if not f.lower().endswith(SKIP_SUFFIXES)]

    def scan(self, tree: Tree) -> TreeScan:
        files = self._candidates(tree)
        many = len(files) > 1
        refs = [
            FileRef(tree.abs(f), prefix=f if many else "", size=tree.size(f), optional=many,
                    hints=SAFE_RNG if RNG.match(posixpath.basename(f)) else SAFE_LOAD)
            for f in files
        ]
        others = [tree.abs(f) for f in tree.files() if f not in files]
        serial = SerialInfo(0, tree.abs(tree.single or ""), files=refs, other_files=others)
        return TreeScan([serial])

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list:
        raise single_serial_refusal(self.name)
