"""The layout contract: how one family of checkpoint trees is arranged."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import ClassVar

from ..model import STAGE_DIR, FileRef, Op, Piece, SerialInfo, TreeScan, VarInfo
from ..registry import LayoutTier
from ..tree import Tree


class Layout:
    """Finds the serials of a tree, their files and nodes, completeness and the latest serial.

    ``guess_can_open`` looks at names in the (already listed) tree only. ``scan`` may read
    small marker/state files, never tensor data. Later capabilities (restore, retention) add
    methods here; a layout that lacks them says so with NotImplementedError. A class joins
    the registry by being defined in a ``ckptview.layouts`` module, through the
    ``ckptview.layouts`` entry-point group, or with :func:`ckptview.registry.register`.
    """

    name: ClassVar[str] = ""
    #: detection order: lower is tried first (specific layouts before generic ones), equal
    #: priorities by name
    priority: ClassVar[int] = LayoutTier.DEFAULT
    #: the files the framework's resume path reads for a serial (DESIGN.md §3c): their errors
    #: block ``loadable``; errors of the serial's other files are its ``warning``
    resume_reads: ClassVar[str] = ""

    def guess_can_open(self, tree: Tree) -> bool:
        raise NotImplementedError

    def scan(self, tree: Tree) -> TreeScan:
        raise NotImplementedError

    def pieces(self, ref: FileRef, variables: list[VarInfo]) -> list[Piece | None] | None:
        """Which of a file's listed variables are pieces of larger logical tensors, and where
        they sit (DESIGN.md §3b), for layouts whose files do not say (Megatron tensor
        parallelism); None: none. Called after listing; codecs mark the pieces they know in
        ``var.attrs["piece"]``, and those marks win."""
        return None

    # -- management hooks (restore, retention): generic defaults; layouts override a few

    def optimizer_files(self, tree: Tree, info: SerialInfo) -> list[str]:
        """Files (relative paths) holding only the serial's optimizer state, which retention
        may slim away (HF ``optimizer.pt``, DeepSpeed ``*_optim_states.pt``, verl
        ``optim_*``, Megatron ``distrib_optim.pt``); default: its files of kind optimizer."""
        return [tree.rel(f.path) for f in info.files if f.kind == "optimizer"]

    #: a staging suffix: copies go to ``<dir><suffix>`` and are renamed into place (Orbax,
    #: Paddle incubate); None: files are copied directly, commit markers last
    staging_suffix: ClassVar[str | None] = None

    #: True: a copied serial is staged under ``.ckptview/tmp/`` (never listed by any layout)
    #: and renamed to its final name as the last step (layouts with no commit marker:
    #: numbered files and dirs), and a deleted directory serial is first renamed there
    stage_in_meta: ClassVar[bool] = False

    def staging_for(self, tree: Tree) -> str | None:
        """The staging suffix to use in ``tree`` (default ``staging_suffix``; a layout whose
        framework cannot rename atomically on some stores returns None there)."""
        return self.staging_suffix

    def serial_files(self, tree: Tree, info: SerialInfo) -> list[str]:
        """Relative paths of every file of a serial: data, markers, per-serial state."""
        rel = _serial_rel(tree, info)
        if rel and tree.is_dir(rel):
            return tree.files(under=rel)
        paths = [ref.path for ref in info.files] + list(info.other_files)
        return sorted({tree.rel(p) for p in paths if tree.exists(tree.rel(p))})

    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        """Files (among ``serial_files``) whose presence makes the serial complete: written
        last on copy, deleted first."""
        return []

    def marker_data(self, tree: Tree, info: SerialInfo, rel: str) -> bytes | None:
        """Fresh contents for a commit marker written by a promotion; None copies it."""
        return None

    def relocate(self, tree: Tree, info: SerialInfo, rel: str, new: int) -> str:
        """Where file ``rel`` of ``info`` lives when the serial is renumbered ``new``."""
        base = _serial_rel(tree, info)
        if base and tree.is_dir(base):
            head, _, tail = base.rpartition("/")
            moved = (head + "/" if head else "") + renumber(tail, info.serial, new)
            return moved + rel[len(base) :]
        head, _, tail = rel.rpartition("/")
        return (head + "/" if head else "") + renumber(tail, info.serial, new)

    def copy_ops(
        self,
        tree: Tree,
        info: SerialInfo,
        new: int | None = None,
        fresh_markers: bool = False,
        staging: str | None = None,
    ) -> list[Op]:
        """Copy a serial (renumbered ``new`` when given), commit markers last; a directory
        serial goes through ``<dir><staging>`` (default ``staging_for(tree)``; "" for none)."""
        staging = (self.staging_for(tree) if staging is None else staging) or ""
        files = self.serial_files(tree, info)
        markers = [m for m in self.commit_markers(tree, info) if m in files]
        dest = (lambda r: self.relocate(tree, info, r, new)) if new is not None else (lambda r: r)
        base = _serial_rel(tree, info)
        if self.stage_in_meta and not staging:
            return self._meta_copy_ops(tree, info, files, markers, dest, base)
        staged = bool(staging and base and tree.is_dir(base))
        final_dir = dest(base) if staged else ""

        def target(rel: str) -> str:
            out = dest(rel)
            return final_dir + staging + out[len(final_dir) :] if staged else out

        ops = []
        for rel in [f for f in files if f not in markers] + markers:
            data = self.marker_data(tree, info, rel) if fresh_markers and rel in markers else None
            if data is not None:
                ops.append(Op("write", target(rel), data=data, nbytes=len(data), note="marker"))
            else:
                note = "marker" if rel in markers else ""
                ops.append(Op("copy", target(rel), src=tree.abs(rel), nbytes=tree.size(rel),
                              atomic=not staged, note=note))  # fmt: skip
        if staged:
            ops.append(Op("rename", final_dir, src=final_dir + staging, note="commit"))
        return ops

    def _meta_copy_ops(self, tree: Tree, info: SerialInfo, files: list[str], markers: list[str],
                       dest, base: str) -> list[Op]:  # fmt: skip
        """``copy_ops`` for ``stage_in_meta``: every file is copied under ``.ckptview/tmp/``,
        then renamed into place: a directory serial in one rename, loose files one by one
        with the commit markers last."""
        token = f"{STAGE_DIR}/{uuid.uuid4().hex[:8]}-"
        if base and tree.is_dir(base):
            final_dir = dest(base)
            stage = token + final_dir.replace("/", "%")
            ops = [Op("copy", stage + dest(r)[len(final_dir) :], src=tree.abs(r),
                      nbytes=tree.size(r), atomic=False) for r in files]  # fmt: skip
            return [*ops, Op("rename", final_dir, src=stage, note="commit")]
        order = [f for f in files if f not in markers] + markers
        staged = {r: token + dest(r).replace("/", "%") for r in order}
        ops = [Op("copy", staged[r], src=tree.abs(r), nbytes=tree.size(r), atomic=False)
               for r in order]  # fmt: skip
        ops += [Op("rename", dest(r), src=staged[r], note="commit" if r == order[-1] else "")
                for r in order]  # fmt: skip
        return ops

    def export_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Copy a serial to another tree so the framework resumes from it there."""
        return self.copy_ops(tree, info)

    def next_serial(self, tree: Tree, scan: TreeScan) -> int:
        return max((s.serial for s in scan.serials), default=-1) + 1

    def promoted_serial(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> int:
        """The serial number ``info`` has once ``promote_ops`` ran (default: the next one;
        layouts that only move a pointer return ``info.serial``)."""
        return self.next_serial(tree, scan)

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Make the framework resume from ``info`` in place; default: copy it as the next
        serial with fresh commit markers written last."""
        return self.copy_ops(tree, info, self.next_serial(tree, scan), fresh_markers=True)

    def delete_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Delete a serial: commit markers first, in reverse of their write order (a
        half-deleted serial never looks complete), then its files, then its emptied
        directories, deepest first. With a ``staging_suffix`` a committed directory is first
        renamed to its staging name (the framework then ignores it: the rename is undone)."""
        files = self.serial_files(tree, info)
        markers = [m for m in self.commit_markers(tree, info) if m in files]
        ops = [Op("delete", r, nbytes=tree.size(r), note="marker") for r in reversed(markers)]
        ops += [Op("delete", r, nbytes=tree.size(r)) for r in files if r not in markers]
        base = _serial_rel(tree, info)
        if base and tree.is_dir(base):
            dirs = [base, *tree.dirs(under=base, depth=None)]
            ops += [Op("rmdir", d) for d in sorted(dirs, key=lambda d: -d.count("/"))]
            if self.stage_in_meta and not self.staging_for(tree):
                gone = f"{STAGE_DIR}/{uuid.uuid4().hex[:8]}-{base.replace('/', '%')}"
                return [Op("rename", gone, src=base, note="uncommit"),
                        *(_moved(o, base, gone) for o in ops)]  # fmt: skip
            suffix = self.staging_for(tree)
            if suffix and not base.endswith(suffix):
                gone = base + suffix
                if tree.exists(gone):  # a leftover staging dir of the same serial
                    gone += f"-{time.time_ns() // 1000}"
                ops = [Op("rename", gone, src=base, note="uncommit"),
                       *(_moved(o, base, gone) for o in ops)]  # fmt: skip
        return ops


_NUM = re.compile(r"(\d+)")


def trailing_int(name: str) -> int | None:
    """The last run of digits in a name (``checkpoint-300`` -> 300), or None."""
    found = _NUM.findall(name)
    return int(found[-1]) if found else None


# -- serial numbers in file and directory names (numbered files, DCP step dirs) -----------
STEP_WORDS = {"step", "steps", "iter", "iters", "iteration", "iterations", "it", "update",
              "updates", "batch", "gs"}  # fmt: skip
GENERIC_WORDS = {"ckpt", "checkpoint", "checkpoints", "snapshot", "save"}
SAVE_WORDS = GENERIC_WORDS | {"model", "weights", "state"}
DROP_WORDS = STEP_WORDS | GENERIC_WORDS | {"epoch", "epochs", "ep"}  # not kept in a label
EPOCH_WORDS = {"epoch", "epochs", "ep"}
GLUED = re.compile(r"^([a-z]+?)(\d+)$")
SHARD_RUN = re.compile(r"\d+-of-\d+", re.I)  # a shard number, not a serial
#: a version, not a serial: ``pt1.9.1``, ``tf2.15``, ``v1.2``, ``1.13.0``
VERSION = re.compile(
    r"(?<![\d.])\d+(?:\.\d+){2,}(?![\d.])|(?:(?<=v)|(?<=pt)|(?<=tf))\d+\.\d+(?![\d.])", re.I
)
SEP = re.compile(r"[_\-.=\s]+")


#: a GGUF quantization tag (``Q4_K_M``, ``Q8_0``, ``IQ2_XXS``): a type, not a serial
QUANT_TAG = re.compile(r"(?<![a-z0-9])i?q\d(?:_[a-z0-9]{1,3})+(?![a-z0-9])", re.I)
#: a decimal a name template carries (Keras ``{val_loss:.2f}``): a metric, not a serial;
#: ``key`` is the word just before it (``val_loss_0.41``, ``loss=0.41``), when there is one.
#: A ``-`` after a separator is a sign (a negative loss: ``weights.01--0.64``), and Python's
#: ``nan`` / ``inf`` after one are values too (a diverged run: ``weights.05-nan``)
METRIC = re.compile(
    r"(?:(?<![a-z0-9])(?P<key>[a-z][a-z_]*?)[_=\-]?)?"
    r"(?<![\d.])(?P<value>(?:(?<![^-_.=\s])-)?"
    r"(?:\d+\.\d+(?:e[-+]?\d+)?|(?<![^-_.=\s])(?:nan|inf)(?![a-z0-9])))(?![\d.])",
    re.I,
)
#: the metric name of a decimal whose name template does not say (``weights.07-0.41``)
FILENAME_METRIC = "filename_metric"


@dataclass
class Parsed:
    """What a file or dir name says: serial, step/epoch when named, and its template."""

    serial: int
    step: int | None
    epoch: int | None
    label: str  # the name without the serial's number (and its keyword)
    #: decimals the name carries, by their word (``val_loss``) or :data:`FILENAME_METRIC`
    metrics: dict[str, float] = field(default_factory=dict)


def name_metrics(stem: str) -> tuple[str, dict[str, float]]:
    """``stem`` without the decimals it carries, and those as metrics: Keras
    ``ModelCheckpoint`` templates such as ``weights.{epoch:02d}-{val_loss:.2f}`` give
    ``("weights.07", {"filename_metric": 0.41})``; ``loss_0.41`` names its metric ``loss``."""
    metrics: dict[str, float] = {}

    def take(m: re.Match) -> str:
        key = (m["key"] or "").strip("_").lower()
        if key in STEP_WORDS | SAVE_WORDS | EPOCH_WORDS:
            return m[0]  # ``step_1.5``: not a metric template
        metrics[key or FILENAME_METRIC] = float(m["value"])
        return "_"

    return METRIC.sub(take, stem), metrics


def parse_name(stem: str) -> Parsed | None:
    """The serial a file stem (name without extension) names, or None.

    Versions (``pt2.5.1``), GGUF quantization tags (``Q4_K_M``) and shard numbers are never
    serials. Decimals are metrics (:func:`name_metrics`); in a name with a metric and no
    step keyword, the serial is taken for the epoch (Keras ``{epoch:02d}-{val_loss:.2f}``)."""
    if SHARD_RUN.search(stem):
        return None
    text, metrics = name_metrics(QUANT_TAG.sub("_", VERSION.sub("", stem)))
    parts = [p for p in SEP.split(text.lower()) if p]
    cands: list[tuple[int, str, int, int]] = []  # (rank, keyword, value, part index)
    for i, part in enumerate(parts):
        if part.isdigit():
            word = parts[i - 1] if i and parts[i - 1].isalpha() else ""
            cands.append((_rank(word, bare=True), word, int(part), i))
        elif (m := GLUED.match(part)) and m[1] in STEP_WORDS | SAVE_WORDS | EPOCH_WORDS:
            cands.append((_rank(m[1]), m[1], int(m[2]), i))
    if not cands:
        return None
    step = next((v for r, w, v, _ in cands if w in STEP_WORDS), None)
    epoch = next((v for r, w, v, _ in cands if w in EPOCH_WORDS), None)
    best = min(cands, key=lambda c: (c[0], -c[3]))
    rank, word, value, index = best
    if metrics and step is None and epoch is None:
        epoch = value
    label_parts = [
        p
        for j, p in enumerate(parts)
        if j != index and not (j == index - 1 and p == word and word in DROP_WORDS)
    ]
    return Parsed(value, step, epoch, "_".join(label_parts), metrics)


def _rank(word: str, bare: bool = False) -> int:
    if word in STEP_WORDS:
        return 0
    if word in SAVE_WORDS:
        return 1
    if word in EPOCH_WORDS:
        return 3
    return 2 if bare else 4


# -- management ops: restore and retention ----------------------------------------------
# Layouts describe changes as a list of Ops; ckptview.changes runs them (journaled, locked,
# every write atomic). Paths in ops are relative to the root of the tree being changed.


def single_serial_refusal(layout: str) -> ValueError:
    """The error for an in-place promote in a one-serial layout (it is the latest already)."""
    return ValueError(f"a {layout} tree holds one serial, the one it resumes from; "
                      "use restore(serial, to=URL) to copy it elsewhere")  # fmt: skip


def _moved(op: Op, old: str, new: str) -> Op:
    """``op`` with its path under directory ``old`` moved under ``new``."""
    if op.path == old or op.path.startswith(old + "/"):
        op = replace(op, path=new + op.path[len(old) :])
    return op


def _serial_rel(tree: Tree, info: SerialInfo) -> str:
    return tree.rel(info.path)


def renumber(name: str, old: int, new: int) -> str:
    """``name`` with its last run of digits equal to ``old`` replaced by ``new`` (same width)."""
    runs = [m for m in _NUM.finditer(name) if int(m.group(1)) == old]
    if not runs:
        raise ValueError(f"cannot find serial {old} in {name!r}")
    m = runs[-1]
    width = len(m.group(1)) if m.group(1).startswith("0") else 0
    return name[: m.start()] + str(new).zfill(width) + name[m.end() :]


class TrackerLayout(Layout):
    """A layout whose trainer names the serial to resume from in a small text file (Megatron
    and verl's ``latest_checkpointed_iteration.txt``): it sets the scan's ``latest``, and a
    restore rewrites it rather than copying the serial."""

    tracker: ClassVar[str] = "latest_checkpointed_iteration.txt"
    #: tracker text -> serial for words that stand for one (Megatron's ``release``)
    tracker_words: ClassVar[dict[str, int]] = {}

    def read_tracker(self, tree: Tree, scan: TreeScan) -> TreeScan:
        """``scan`` with the serial the tracker names as its framework latest (if any)."""
        if not tree.exists(self.tracker):
            return scan
        try:
            text = tree.read_text(self.tracker, limit=64).strip()
            tracked = self.tracker_words[text] if text in self.tracker_words else int(text)
        except (ValueError, OSError):
            return scan
        scan.latest, scan.latest_rule = tracked, True
        scan.attrs["tracker"] = tracked
        return scan

    def tracker_text(self, tree: Tree, info: SerialInfo) -> str:
        """What the tracker says to name ``info`` (default: its number)."""
        return str(info.serial)

    def _tracker_op(self, tree: Tree, info: SerialInfo) -> Op:
        data = self.tracker_text(tree, info).encode()
        return Op("write", self.tracker, data=data, nbytes=len(data), replace=True, note="state")

    def promoted_serial(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> int:
        return info.serial

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Rewrite the tracker (tmp + rename) to name the serial."""
        return [self._tracker_op(tree, info)]

    def export_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """The serial's files, then the tracker naming it."""
        return [*self.copy_ops(tree, info), self._tracker_op(tree, info)]
