"""Caffe2 CheckpointManager trees: ``<db_prefix>/<node>.<epoch>`` minidb files (specs/caffe2.md).

The node name may hold dots and colons; the epoch is the digits after the last dot. Open-source
Caffe2 has no metadata file (the metadata handler was Facebook-internal), so an epoch is complete
when every node of the tree has a file for it and each parses completely; the latest is the
largest complete epoch (the catalog derives both from file errors).

A directory of loose ``.minidb`` files (predictor exports, ad-hoc ``Save`` ops) is left to the
fallback ``files`` layout, which catalogues every file the codec recognizes.
"""

from __future__ import annotations

import posixpath
import re
import weakref

from ..io import HEAD_BLOCK
from ..model import FileRef, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier

_NAME = re.compile(r"^(?P<node>.+)\.(?P<epoch>\d+)$")
MAX_SNIFFS = 8  # files sniffed per node before giving up on it, spread over its epochs


def parse_name(filename: str) -> tuple[str, int] | None:
    """``trainer:0.12`` -> ("trainer:0", 12); None when the name is not ``<node>.<epoch>``."""
    m = _NAME.match(filename)
    return (m["node"], int(m["epoch"])) if m else None


class Caffe2Layout(Layout):
    """MultiNodeCheckpointManager / CheckpointManager output with db_type minidb."""

    name = "caffe2"
    resume_reads = "every node's ``<node>.<epoch>`` minidb (``load_model`` of each node's db)"
    priority = LayoutTier.CONTENT

    def guess_can_open(self, tree: Tree) -> bool:
        return bool(self._nodes(tree, first_only=True))

    def _candidates(self, tree: Tree) -> dict[str, dict[int, str]]:
        """node -> epoch -> relative path, for every ``<node>.<epoch>`` file in the root."""
        found: dict[str, dict[int, str]] = {}
        for rel in tree.files(depth=1):
            parsed = parse_name(posixpath.basename(rel))
            if parsed:
                found.setdefault(parsed[0], {})[parsed[1]] = rel
        return found

    def _nodes(self, tree: Tree, first_only: bool = False) -> dict[str, dict[int, str]]:
        """The candidate nodes whose files are minidb (one sniffed file is enough)."""
        candidates = self._candidates(tree)
        accepted: dict[str, dict[int, str]] = {}
        empty_only = {}
        for node, files in candidates.items():
            sized = [rel for _e, rel in sorted(files.items(), reverse=True) if tree.size(rel)]
            if not sized:
                empty_only[node] = files
                continue
            if any(_sniff(tree, rel) for rel in _spread(sized, MAX_SNIFFS)):
                accepted[node] = files
                if first_only:
                    return accepted
        if accepted:  # nodes whose files are all empty: crashed saves of this job
            accepted.update(empty_only)
        return accepted

    def scan(self, tree: Tree) -> TreeScan:
        nodes = self._nodes(tree)
        epochs = sorted({e for files in nodes.values() for e in files})
        serials = []
        for epoch in epochs:
            present = sorted(n for n, files in nodes.items() if epoch in files)
            missing = sorted(set(nodes) - set(present))
            refs = [
                FileRef(
                    tree.abs(nodes[n][epoch]),
                    node=n,
                    codec="caffe2",
                    size=tree.size(nodes[n][epoch]),
                )  # fmt: skip
                for n in present
            ]
            serials.append(
                SerialInfo(
                    serial=epoch,
                    path=refs[0].path,  # the first node's file: the serial's main file
                    files=refs,
                    complete=False if missing else None,
                    epoch=epoch,
                    nodes=tuple(present),
                    error=f"no file for node(s) {', '.join(missing)}" if missing else None,
                    attrs={"db_type": "minidb"},
                )
            )
        return TreeScan(serials, attrs={"nodes": tuple(sorted(nodes)), "db_type": "minidb"})


def _spread(items: list[str], n: int) -> list[str]:
    """At most ``n`` of ``items``, first and last included and evenly spaced between: a run
    whose newest (or oldest) epochs are damaged is still recognized by the others."""
    if len(items) <= n:
        return items
    step = (len(items) - 1) / (n - 1)
    return [items[round(i * step)] for i in range(n)]


def _minidb_sniff(head: bytes, size: int) -> bool:
    from ..formats.minidb import sniff  # imported when a tree has candidate files

    return sniff(head, size)


def _sniff(tree: Tree, rel: str) -> bool:
    """Is ``rel`` a minidb file? Reads at most ``SNIFF_BYTES`` once per tree and file (the
    codec reads the file again: a small file must not be read whole twice)."""
    memo = _SNIFFS.setdefault(tree, {})
    if rel not in memo:
        size = tree.size(rel)
        try:
            if tree.storage.async_fs:  # the codec's first block, kept for its listing
                tree.storage.prefetch([(tree.abs(rel), size)], HEAD_BLOCK)
            head = tree.storage.read_range(tree.abs(rel), 0, min(SNIFF_BYTES, size))
            memo[rel] = _minidb_sniff(head, size)
        except (OSError, ValueError):
            memo[rel] = False
    return memo[rel]


SNIFF_BYTES = 1024  # the first record: its lengths, key and BlobProto name
_SNIFFS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
