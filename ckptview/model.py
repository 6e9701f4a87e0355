"""Plain records passed between layouts, codecs and the catalog."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: where ckptview keeps its own bookkeeping under a tree root (journal, lock, policy, staging)
META_DIR = ".ckptview"
#: where copies are staged before the rename that commits them
STAGE_DIR = f"{META_DIR}/tmp"

KINDS = ("model", "optimizer", "trainer", "lookup_table", "rng", "scheduler", "other")


@dataclass
class Span:
    """Where a variable's raw values lie: ``length`` bytes at ``offset`` of file ``path``.

    ``dtype`` is the on-disk numpy dtype string (byte order included, e.g. ``>f4``) when it
    differs from the variable's dtype; ``order`` is 'C' or 'F'.
    """

    path: str
    offset: int
    length: int
    order: str = "C"
    disk_dtype: str | None = None


@dataclass
class VarInfo:
    """One variable as a codec lists it from a header (no values read)."""

    name: str  # "" for a file holding one unnamed tensor: the catalog names it after the file
    dtype: str
    shape: tuple[int, ...]
    nbytes: int | None = None
    kind: str | None = None
    error: str | None = None
    span: Span | None = None  # contiguous raw values, read generically when set
    locator: Any = None  # codec-private: how to read values when there is no span
    attrs: dict = field(default_factory=dict)  # extras (lod, rows, height, metadata …)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n


@dataclass
class FileRef:
    """A file a layout assigns to a serial: which node wrote it and how to name its variables."""

    path: str
    node: str = ""
    prefix: str = ""  # joined before every variable name with "/"
    kind: str | None = None  # default kind for its variables
    codec: str | None = None  # force a codec by name
    hints: dict = field(default_factory=dict)  # codec options (e.g. a program desc path)
    size: int | None = None
    optional: bool = False  # True: a file no codec recognizes is skipped, not an error


@dataclass
class SerialInfo:
    """One serial as a layout found it."""

    serial: int
    path: str
    files: list[FileRef] = field(default_factory=list)  # files holding variables
    other_files: list[str] = field(default_factory=list)  # markers, configs: counted, not parsed
    complete: bool | None = None  # None: complete when every file parses without error
    timestamp: datetime | None = None
    epoch: int | None = None
    step: int | None = None
    nodes: tuple[str, ...] | None = None  # None: derived from the files' nodes
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    aliases: tuple[str, ...] = ()  # other paths naming this serial (Lightning last.ckpt)
    attrs: dict = field(default_factory=dict)


@dataclass
class TreeScan:
    """What a layout returns for a tree."""

    serials: list[SerialInfo]
    latest: int | None = None  # the serial the framework resumes from
    latest_rule: bool = False  # True: ``latest`` is set by the layout (even when None)
    metrics: list[tuple[int, str, float]] = field(default_factory=list)
    attrs: dict = field(default_factory=dict)  # tree facts (best_model_checkpoint, …)


@dataclass
class Op:
    """One step of a change: ``copy`` (src: absolute path on the source storage), ``write``
    (data), ``rename`` (src: relative path), ``delete`` (a file) or ``rmdir`` (an empty dir)."""

    kind: str
    path: str
    src: str | None = None
    data: bytes | None = None
    nbytes: int = 0
    atomic: bool = True  # copy/write: via a temp file under .ckptview/tmp, then a rename
    replace: bool = False  # write: may replace an existing file (state files: atomic rename)
    note: str = ""
