"""Conformance kits for codec and layout authors (like fsspec's ``tests/abstract``).

Subclass :class:`CodecSuite` or :class:`LayoutSuite` in a test module, name your codec or
layout and give sample files or trees: the shared checks (the table contract of DESIGN.md §3,
header-only reads, truncation at every header offset, bad input, a crash at every step of a
retention run) run on them. Needs pytest; never imported by ckptview itself.
"""

from __future__ import annotations

from .codec_suite import CodecSuite
from .contract import check_files, check_serials, check_variables
from .faults import FaultyFS, InjectedFault
from .layout_suite import LayoutSuite, snapshot
from .mutations import flipped, truncation_points

__all__ = [
    "CodecSuite", "FaultyFS", "InjectedFault", "LayoutSuite", "check_files", "check_serials",
    "check_variables", "flipped", "snapshot", "truncation_points",
]  # fmt: skip
