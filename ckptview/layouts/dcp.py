"""torch.distributed.checkpoint step dirs: ``step_1/{.metadata, __0_0.distcp, …}``.

A DCP dir is committed when ``.metadata`` exists: it is written as ``.metadata.tmp`` after
all data and renamed (specs/modern.md §2); with ``use_collectives=False`` every rank writes its
own ``__<rank>.metadata``. The serial is the number in the dir name, the nodes are the ranks
of the ``__<rank>_<n>.distcp`` files, and there is no latest pointer (largest complete serial).
File naming: :mod:`ckptview.formats.torch_dcp_files`.
"""

from __future__ import annotations

import posixpath

from ..formats.torch_dcp_files import dcp_refs, is_dcp_dir, ranks
from ..model import SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier, parse_name


class DCPLayout(Layout):
    """Numbered DCP checkpoint dirs below the root (or the root itself being one)."""

    name = "dcp"
    resume_reads = "``.metadata`` and every ``__<rank>_<n>.distcp`` it names (``dcp.load``)"
    priority = LayoutTier.CONVENTION

    def guess_can_open(self, tree: Tree) -> bool:
        if tree.single:
            return False
        return is_dcp_dir(tree, "") or any(is_dcp_dir(tree, d) for d in tree.dirs())

    def scan(self, tree: Tree) -> TreeScan:
        if is_dcp_dir(tree, ""):
            parsed = parse_name(posixpath.basename(tree.root))
            return TreeScan([self._serial(tree, "", parsed.serial if parsed else 0)])
        serials = {}
        for d in tree.dirs():
            parsed = parse_name(posixpath.basename(d))
            if parsed is None or not is_dcp_dir(tree, d) or parsed.serial in serials:
                continue
            info = self._serial(tree, d, parsed.serial)
            info.step, info.epoch = parsed.step, parsed.epoch
            serials[parsed.serial] = info
        return TreeScan([serials[k] for k in sorted(serials)])

    def _serial(self, tree: Tree, rel: str, serial: int) -> SerialInfo:
        refs = dcp_refs(tree, rel)
        paths = {tree.rel(r.path) for r in refs}
        others = [tree.abs(f) for f in tree.files(under=rel) if f not in paths]
        info = SerialInfo(serial, tree.abs(rel), files=refs, other_files=others)
        info.nodes = ranks(tree, rel)
        data_ranks = {n for n in info.nodes}
        if not refs:
            info.complete = False
            info.error = "no .metadata: the save was not committed"
        elif refs[0].node:  # per-rank metadata: every rank with data must have committed
            committed = {r.node for r in refs}
            info.complete = data_ranks <= committed
            if not info.complete:
                info.error = f"ranks without metadata: {sorted(data_ranks - committed)}"
        else:
            info.complete = True
        return info

    # -- management: defaults (copy as max+1), with the metadata written last
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        """``.metadata`` (or every rank's ``__<rank>.metadata``): DCP writes it after the data."""
        files = self.serial_files(tree, info)
        return [f for f in files if posixpath.basename(f).endswith(".metadata")]
