"""DeepSpeed engine checkpoints: ``latest`` + ``global_stepN/`` tag dirs of per-rank files.

specs/modern.md §8: rank 0 writes ``latest`` (the tag, no newline) after every rank saved, so
a tag is complete when it is the one ``latest`` names or an older one holding model states.
A tag newer than ``latest`` (or any tag when there is no ``latest``, ``save_latest=False``)
is complete when its files are: model states for every model-parallel rank and, with ZeRO,
a state file for every data-parallel rank (ranks ``0..D-1``, D being the resume tag's world
size when there is one) - and every file reads. Such a tag may be a save in flight or a
complete save that is simply not the resume point (``latest`` was moved back by a restore):
``complete`` says which, ``latest`` still follows the ``latest`` file. Retention applies
DESIGN.md's invariants unchanged: the newest complete tag and the resume tag are never
deleted, nor an incomplete tag newer than the newest complete one; complete tags newer than
the resume point are otherwise ordinary serials a policy may keep or delete. ``latest`` naming a missing tag resumes nothing: the scan
reports that tag's number as the framework's pick and ``attrs["latest_tag_missing"]``, and the
catalog falls back to the newest loadable older tag. Files map to nodes by rank:
``mp_rank_XX_model_states.pt`` (node ``mpX`` when model-parallel), ``[bf16_]zero_pp_rank_D_
mp_rank_XX_{optim,model}_states.pt`` (node ``rankD``), MoE ``expp_rank_E…`` / ``layer_L_expert_E…``
(:mod:`ckptview.formats.deepspeed_files`).
"""

from __future__ import annotations

import posixpath

from ..formats.deepspeed_files import EXPERT, MODEL, ZERO, tag_refs
from ..model import FileRef, Op, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier, trailing_int

POINTERS = ("latest", "latest_universal")


def _dp_ranks(refs: list[FileRef]) -> dict[int, set[int]]:
    """ZeRO data-parallel ranks per model-parallel rank (optimizer or model partitions)."""
    out: dict[int, set[int]] = {}
    for r in refs:
        if m := ZERO.match(posixpath.basename(r.path)):
            out.setdefault(int(m[2]), set()).add(int(m[1]))
    return out


def files_complete(refs: list[FileRef], world: int | None = None) -> bool:
    """Model states for every model-parallel rank and a ZeRO file for every data-parallel
    rank ``0..world-1`` (``world`` unknown: ranks ``0..max`` without a hole)."""
    names = [posixpath.basename(r.path) for r in refs]
    mps = {int(m[1]) for n in names if (m := MODEL.match(n))}
    zero_models = [n for n in names if (m := ZERO.match(n)) and m[3] == "model"]
    if not mps and not zero_models and not any(EXPERT.match(n) for n in names):
        return False
    dp = _dp_ranks(refs)
    if mps and (mps != set(range(max(mps) + 1)) or not set(dp) <= mps):
        return False
    for ranks in dp.values():
        want = world if world is not None else max(ranks) + 1
        if ranks != set(range(want)):
            return False
    return True


def _world(refs: list[FileRef]) -> int | None:
    dp = _dp_ranks(refs)
    return max((len(r) for r in dp.values()), default=None) if dp else None


def _has_states(tree: Tree, rel: str) -> bool:
    return any(
        MODEL.match(posixpath.basename(f)) or ZERO.match(posixpath.basename(f))
        for f in tree.files(under=rel, depth=1)
    )


class DeepSpeedLayout(Layout):
    """``save_dir/{latest, global_stepN/…}`` trees from ``engine.save_checkpoint``."""

    name = "deepspeed"
    resume_reads = (
        "the ``latest`` tag's ``mp_rank_*_model_states.pt`` and, with ZeRO, every data-"
        "parallel rank's ``*_optim_states.pt`` (``engine.load_checkpoint``)"
    )
    priority = LayoutTier.CONVENTION

    def guess_can_open(self, tree: Tree) -> bool:
        if tree.single:
            return False
        return any(_has_states(tree, d) for d in tree.dirs())

    def scan(self, tree: Tree) -> TreeScan:
        tags = {}
        for d in tree.dirs():
            n = trailing_int(posixpath.basename(d))
            if n is not None and _has_states(tree, d) and n not in tags:
                tags[n] = d
        pointer = next((p for p in POINTERS if tree.exists(p)), None)
        tag = tree.read_text(pointer, limit=4096).strip() if pointer else None
        pointed = next((n for n, d in tags.items() if posixpath.basename(d) == tag), None)
        serials = []
        limit = None if tag is None else pointed if pointed is not None else trailing_int(tag)
        world = _world(tag_refs(tree, tags[pointed])) if pointed is not None else None
        for n, d in sorted(tags.items()):
            refs = tag_refs(tree, d)
            paths = {tree.rel(r.path) for r in refs}
            others = [tree.abs(f) for f in tree.files(under=d) if f not in paths]
            info = SerialInfo(n, tree.abs(d), files=refs, other_files=others, step=n)
            info.nodes = tuple(sorted({r.node for r in refs} - {""}))
            has_model = any(MODEL.match(posixpath.basename(r.path)) for r in refs) or any(
                r.kind == "model" for r in refs
            )
            if limit is not None and n <= limit:  # committed: ``latest`` came after it
                info.complete = has_model
            elif files_complete(refs, world):  # every rank's files: complete if they read
                info.complete = None
            else:
                info.complete = False
                if limit is not None:
                    info.error = f"newer than {pointer!r} ({tag}): an interrupted save"
            serials.append(info)
        scan = TreeScan(serials)
        if tag is not None:
            scan.latest_rule = True
            scan.latest = pointed
            scan.attrs["latest_tag"] = tag
            if pointed is None:  # the catalog falls back to the newest loadable older tag
                scan.latest = trailing_int(tag)
                scan.attrs["latest_tag_missing"] = True
        return scan

    # -- management: ``latest`` is the pointer (rank 0 writes it after every rank saved)
    def _pointer(self, tree: Tree, info: SerialInfo, pointer: str | None = None) -> Op:
        name = pointer or next((p for p in POINTERS if tree.exists(p)), POINTERS[0])
        tag = posixpath.basename(tree.rel(info.path))
        return Op("write", name, data=tag.encode(), nbytes=len(tag), replace=True, note="state")

    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        """The model states files: a tag without them is incomplete (copied last, deleted
        first)."""

        def model(name: str) -> bool:
            return bool(MODEL.match(name) or ((m := ZERO.match(name)) and m[3] == "model"))

        return [f for f in self.serial_files(tree, info) if model(posixpath.basename(f))]

    def promoted_serial(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> int:
        return info.serial

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """Rewrite ``latest`` (tmp + rename) to name the tag."""
        return [self._pointer(tree, info)]

    def export_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list[Op]:
        """The tag dir's files, then ``latest`` naming it."""
        return [*self.copy_ops(tree, info), self._pointer(tree, info, POINTERS[0])]
