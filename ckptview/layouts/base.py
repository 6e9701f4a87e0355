"""The layout contract: how one family of checkpoint trees is arranged."""

from __future__ import annotations

import re
from typing import ClassVar

from ..model import TreeScan
from ..tree import Tree


class Layout:
    """Finds the serials of a tree, their files and nodes, completeness and the latest serial.

    ``guess_can_open`` looks at names in the (already listed) tree only. ``scan`` may read
    small marker/state files, never tensor data. Later capabilities (restore, retention) add
    methods here; a layout that lacks them says so with NotImplementedError.
    """

    name: ClassVar[str] = ""
    #: detection order: lower is tried first (specific layouts before generic ones)
    priority: ClassVar[int] = 50

    def guess_can_open(self, tree: Tree) -> bool:
        raise NotImplementedError

    def scan(self, tree: Tree) -> TreeScan:
        raise NotImplementedError


_NUM = re.compile(r"(\d+)")


def trailing_int(name: str) -> int | None:
    """The last run of digits in a name (``checkpoint-300`` -> 300), or None."""
    found = _NUM.findall(name)
    return int(found[-1]) if found else None
