"""torch.distributed.checkpoint directories: which files a DCP dir holds, and whose they are.

Data goes to ``__<rank>_<n>.distcp``; the global ``.metadata`` (written as ``.metadata.tmp``
and renamed: the commit) or, with ``use_collectives=False``, one ``__<rank>.metadata`` per rank.
Used by the DCP layout and by HF Trainer dirs holding FSDP state (``pytorch_model_fsdp_0/``).
"""

from __future__ import annotations

import posixpath
import re

from ..model import FileRef
from ..tree import Tree

DATA = re.compile(r"^__(\d+)_(\d+)\.distcp$")
RANK_META = re.compile(r"^__(\d+)\.metadata$")


def is_dcp_dir(tree: Tree, rel: str) -> bool:
    """True when directory ``rel`` holds DCP data or metadata files."""
    names = [posixpath.basename(f) for f in tree.files(under=rel, depth=1)]
    return any(n in (".metadata", ".metadata.tmp") or DATA.match(n) or RANK_META.match(n)
               for n in names)  # fmt: skip


def dcp_refs(tree: Tree, rel: str, prefix: str = "", kind: str | None = None) -> list[FileRef]:
    """The metadata file(s) of one DCP dir as FileRefs read by the ``torch_dcp`` codec."""
    base = rel.rstrip("/") + "/" if rel else ""
    if tree.exists(base + ".metadata"):
        metas = [(base + ".metadata", "")]
    else:
        metas = []
        for f in tree.files(under=rel, depth=1):
            m = RANK_META.match(posixpath.basename(f))
            if m:
                metas.append((f, f"rank{m[1]}"))
    return [FileRef(tree.abs(f), node=node, prefix=prefix, kind=kind, codec="torch_dcp",
                    size=tree.size(f)) for f, node in metas]  # fmt: skip


def ranks(tree: Tree, rel: str) -> tuple[str, ...]:
    """The nodes (``rank<N>``) that wrote data or metadata files in directory ``rel``."""
    found = set()
    for f in tree.files(under=rel, depth=1):
        m = DATA.match(posixpath.basename(f)) or RANK_META.match(posixpath.basename(f))
        if m:
            found.add(int(m[1]))
    return tuple(f"rank{r}" for r in sorted(found))
