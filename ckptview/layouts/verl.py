"""verl FSDP checkpoints: ``global_step_N/<role>/{model,optim,extra_state}_world_size_W_rank_R.pt``.

``FSDPCheckpointManager`` has every rank ``torch.save`` its sharded ``model.state_dict()`` and
``optimizer.state_dict()`` (DTensors: a local tensor plus placements, read as pieces of logical
tensors) and its ``extra_state`` (lr scheduler, RNG); rank 0 adds ``<role>/huggingface/`` (config,
tokenizer) and the trainer ``global_step_N/data.pt`` (the dataloader). The trainer writes
``latest_checkpointed_iteration.txt`` (the step) after the save; ``find_latest_ckpt_path`` resumes
from the step it names. A step is complete when, for every role, each of the ``W`` ranks wrote
every kind of file rank 0 wrote.
"""

from __future__ import annotations

import posixpath
import re

from ..model import FileRef, SerialInfo, TreeScan
from ..tree import Tree
from .base import LayoutTier, TrackerLayout

STEP_DIR = re.compile(r"^global_step_(\d+)$")
RANK_FILE = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")
KINDS = {
    "model": ("", "model"),
    "optim": ("optim", "optimizer"),
    "extra_state": ("extra_state", "trainer"),
}


class VerlLayout(TrackerLayout):
    """``global_step_N`` dirs of per-rank FSDP files, with verl's step tracker."""

    name = "fsdp-verl"
    resume_reads = (
        "every rank's ``model_``, ``optim_`` and ``extra_state_world_size_W_rank_R.pt`` of each "
        "role, and ``data.pt`` when present (``FSDPCheckpointManager.load_checkpoint``)"
    )
    priority = LayoutTier.CONVENTION

    def guess_can_open(self, tree: Tree) -> bool:
        if tree.single:
            return False
        return any(self._rank_files(tree, d) for d in self._steps(tree).values())

    def _steps(self, tree: Tree) -> dict[int, str]:
        out = {}
        for d in tree.dirs():
            m = STEP_DIR.match(posixpath.basename(d))
            if m:
                out[int(m[1])] = d
        return out

    def _rank_files(self, tree: Tree, step_dir: str) -> dict[str, list[tuple[str, int, int, str]]]:
        """role -> [(kind, world size, rank, relative path)] of a step dir."""
        out: dict[str, list[tuple[str, int, int, str]]] = {}
        for rel in tree.files(under=step_dir, depth=2):
            parts = rel[len(step_dir) + 1 :].split("/")
            m = RANK_FILE.match(parts[-1]) if len(parts) == 2 else None
            if m:
                out.setdefault(parts[0], []).append((m[1], int(m[2]), int(m[3]), rel))
        return out

    def scan(self, tree: Tree) -> TreeScan:
        serials = []
        for step, d in sorted(self._steps(tree).items()):
            roles = self._rank_files(tree, d)
            if not roles:
                continue
            refs, problems = [], []
            for role, files in sorted(roles.items()):
                refs += [self._ref(tree, role, len(roles), f) for f in sorted(files, key=_order)]
                problems += _missing(role, files)
            data = posixpath.join(d, "data.pt")
            if tree.exists(data):
                refs.append(FileRef(tree.abs(data), prefix="data", kind="trainer", codec="torch",
                                    size=tree.size(data)))  # fmt: skip
            claimed = {tree.rel(r.path) for r in refs}
            others = [tree.abs(f) for f in tree.files(under=d) if f not in claimed]
            info = SerialInfo(step, tree.abs(d), files=refs, other_files=others, step=step)
            info.nodes = tuple(sorted({r.node for r in refs} - {""}, key=_rank_key))
            if problems:
                info.complete, info.error = False, "; ".join(problems)
            serials.append(info)
        return self.read_tracker(tree, TreeScan(serials))

    def _ref(self, tree: Tree, role: str, n_roles: int, f: tuple[str, int, int, str]) -> FileRef:
        kind, world, rank, rel = f
        prefix, var_kind = KINDS[kind]
        if n_roles > 1:  # actor and critic: the role keeps their tensors apart
            prefix = posixpath.join(role, prefix) if prefix else role
        return FileRef(tree.abs(rel), node=f"rank{rank}", prefix=prefix, kind=var_kind,
                       codec="torch", size=tree.size(rel))  # fmt: skip


def _order(f: tuple[str, int, int, str]) -> tuple[int, str]:
    return f[2], f[0]


def _rank_key(node: str) -> tuple[int, str]:
    digits = node[4:] if node.startswith("rank") else ""
    return (int(digits), node) if digits.isdigit() else (1 << 30, node)


def _missing(role: str, files: list[tuple[str, int, int, str]]) -> list[str]:
    """What a role's files lack: a rank of its world size, or a kind rank 0 wrote."""
    worlds = {w for _, w, _, _ in files}
    if len(worlds) != 1:
        return [f"{role}: files of several world sizes {sorted(worlds)}"]
    world = worlds.pop()
    kinds = {k for k, _, r, _ in files if r == 0} or {k for k, _, _, _ in files}
    have = {(k, r) for k, _, r, _ in files}
    gaps = [f"{k} of rank {r}" for r in range(world) for k in sorted(kinds) if (k, r) not in have]
    return [f"{role}: no {', '.join(gaps)} (world size {world})"] if gaps else []
