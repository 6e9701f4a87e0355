"""Hugging Face: Trainer output dirs (``checkpoint-N/``) and bare sharded model dirs.

Trainer rules (specs/modern.md §6): ``checkpoint-N`` is complete when its
``trainer_state.json`` (written last, no tmp/rename) exists and parses; a ``global_step`` other
than N (a copy promoted to a new number, a hand-renamed dir) is recorded in the serial's
``attrs["global_step_mismatch"]`` but does not stop the Trainer, which resumes from
``get_last_checkpoint`` = the largest N among ``checkpoint-N`` dirs, whatever they hold. ``log_history`` gives the metrics (serial = step), ``best_model_checkpoint``
and ``best_metric`` go to ``TreeScan.attrs``; ``training_args.bin`` fields (read through the
restricted unpickler, transformers not needed) go to ``TreeScan.attrs["training_args"]``.
"""

from __future__ import annotations

import math
import posixpath
import re
from enum import Enum
from typing import Any

from ..formats.deepspeed_files import tag_refs
from ..formats.hf_files import (
    TRAINER_STATE_FIELDS,
    WEIGHT_EXTS,
    read_json,
    state_problem,
    weight_refs,
)
from ..formats.safe_globals import NUMPY_RNG_GLOBALS
from ..formats.torch_dcp_files import dcp_refs
from ..io import Blob
from ..model import FileRef, SerialInfo, TorchHints, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier, single_serial_refusal

CKPT_DIR = re.compile(r"^checkpoint-(\d+)$")
TMP_DIR = re.compile(r"^tmp-checkpoint-(\d+)$")
RNG = re.compile(r"^rng_state(?:_(\d+))?\.pth$")
FSDP_DIR = re.compile(r"^(pytorch_model_fsdp|optimizer)_(\d+)$")
TORCH_FILES = {
    "optimizer.pt": ("optimizer", "optimizer"),
    "optimizer.bin": ("optimizer", "optimizer"),
    "scheduler.pt": ("scheduler", "scheduler"),
    "scheduler.bin": ("scheduler", "scheduler"),
    "scaler.pt": ("scaler", "trainer"),
    "training_args.bin": ("training_args", "trainer"),
}
#: files Trainer writes that ``resume_from_checkpoint`` never reads (a pickled TrainingArguments)
NOT_RESUMED = frozenset({"training_args.bin"})
#: how the resume loads torch files: ``torch.load(weights_only=True)``; RNG states with
#: transformers' numpy allowlist
SAFE_LOAD = TorchHints(weights_only=True)
SAFE_RNG = TorchHints(weights_only=True, extra_globals=tuple(sorted(NUMPY_RNG_GLOBALS)))
SIMPLE = (str, int, float, bool, type(None))


def checkpoint_refs(
    tree: Tree, rel_dir: str, problems: list[str] | None = None
) -> tuple[list[FileRef], list[str]]:
    """Every variable-holding file of one Trainer checkpoint dir, and the other files."""
    prefix = rel_dir.rstrip("/") + "/" if rel_dir else ""
    refs, used = weight_refs(tree, rel_dir, problems=problems)
    taken = {tree.rel(r.path) for r in refs} | set(used)
    for rel in tree.files(under=rel_dir, depth=1):
        name = posixpath.basename(rel)
        if rel in taken:
            continue
        m = RNG.match(name)
        if name in TORCH_FILES:
            pre, kind = TORCH_FILES[name]
            resumed = name not in NOT_RESUMED
            refs.append(FileRef(tree.abs(rel), prefix=pre, kind=kind, codec="torch",
                                hints=SAFE_LOAD if resumed else None, size=tree.size(rel),
                                required=resumed))  # fmt: skip
        elif m:
            node = f"rank{m[1]}" if m[1] is not None else ""
            refs.append(FileRef(tree.abs(rel), node=node, prefix="rng_state", kind="rng",
                                codec="torch", hints=SAFE_RNG, size=tree.size(rel)))  # fmt: skip
        elif name.endswith(WEIGHT_EXTS):
            refs.append(FileRef(tree.abs(rel), prefix=name.rsplit(".", 1)[0], size=tree.size(rel),
                                optional=True))  # fmt: skip
        else:
            continue
        taken.add(rel)
    for sub in tree.dirs(under=rel_dir):
        name = posixpath.basename(sub)
        m = FSDP_DIR.match(name)
        if m:
            pre = "model" if m[1] == "pytorch_model_fsdp" else "optimizer"
            refs += dcp_refs(tree, sub, prefix=pre, kind="model" if pre == "model" else "optimizer")
        elif tree.exists(prefix + "latest") or name.startswith("global_step"):
            refs += tag_refs(tree, sub)
    paths = {tree.rel(r.path) for r in refs}
    others = [f for f in tree.files(under=rel_dir) if f not in paths]
    return refs, others


class HFTrainerLayout(Layout):
    """``output_dir/checkpoint-N/`` trees written by ``transformers.Trainer``."""

    name = "hf-trainer"
    resume_reads = (
        "the weights (``model.safetensors``/``pytorch_model.bin`` and shards), "
        "``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state*.pth``, "
        "``trainer_state.json`` (``Trainer.train(resume_from_checkpoint=...)``); not "
        "``training_args.bin``"
    )
    priority = LayoutTier.FRAMEWORK

    def guess_can_open(self, tree: Tree) -> bool:
        if tree.single:
            return False
        if any(CKPT_DIR.match(posixpath.basename(d)) for d in tree.dirs()):
            return True
        return tree.exists("trainer_state.json")  # the root is one checkpoint dir

    def scan(self, tree: Tree) -> TreeScan:
        dirs = {int(m[1]): d for d in tree.dirs() if (m := CKPT_DIR.match(posixpath.basename(d)))}
        tmp = {int(m[1]): d for d in tree.dirs() if (m := TMP_DIR.match(posixpath.basename(d)))}
        if not dirs and tree.exists("trainer_state.json"):
            return self._scan_one(tree)
        serials, states = [], {}
        for n in sorted(dirs.keys() | tmp.keys()):
            info, state = self._serial(tree, n, dirs.get(n) or tmp[n], staged=n not in dirs)
            serials.append(info)
            if state is not None:
                states[n] = state
        mark_missing_files(tree, serials)
        latest = max(dirs) if dirs else None
        if not any(s.complete for s in serials):
            latest = None
        scan = TreeScan(serials, latest=latest, latest_rule=True)
        scan.metrics = log_metrics(states)
        scan.attrs = tree_attrs(tree, states, dirs, serials)
        if tmp.keys() & dirs.keys():
            scan.attrs["stale_tmp_dirs"] = [tmp[n] for n in sorted(tmp.keys() & dirs.keys())]
        return scan

    def _serial(self, tree: Tree, n: int, rel: str, staged: bool = False):
        problems: list[str] = []
        refs, others = checkpoint_refs(tree, rel, problems)
        state_rel = f"{rel}/trainer_state.json" if rel else "trainer_state.json"
        state = read_json(tree, state_rel, problems)
        info = SerialInfo(n, tree.abs(rel), files=refs, other_files=[tree.abs(o) for o in others])
        if problems:
            info.error = "; ".join(problems)
        if not isinstance(state, dict):
            info.complete = False
            info.error = info.error or "no readable trainer_state.json (save interrupted?)"
            state = None
        else:
            step = state.get("global_step")
            info.step = step if isinstance(step, int) else None
            epoch = state.get("epoch")
            if isinstance(epoch, (int, float)) and math.isfinite(epoch):
                info.epoch = int(math.floor(epoch))
                info.attrs["epoch"] = float(epoch)
            info.complete = not staged
            problem = state_problem(state, TRAINER_STATE_FIELDS)
            if problem:
                info.error = "; ".join(filter(None, [info.error, problem]))
            if step != n:
                info.attrs["global_step_mismatch"] = f"global_step {step} != {n}"
        if staged:
            info.complete = False
            info.error = "tmp-checkpoint dir: a staged save that was never renamed"
        missing = [m for m in ("optimizer", "scheduler", "rng_state") if not _has(refs, m)]
        if not any(r.kind == "model" for r in refs):
            missing.insert(0, "model weights")
        if missing:
            info.attrs["missing"] = missing
        return info, state

    def _scan_one(self, tree: Tree) -> TreeScan:
        state = read_json(tree, "trainer_state.json")
        name = posixpath.basename(tree.root)
        m = CKPT_DIR.match(name)
        step = state.get("global_step") if isinstance(state, dict) else None
        n = int(m[1]) if m else step if isinstance(step, int) else 0
        info, state = self._serial(tree, n, "")
        states = {n: state} if state is not None else {}
        scan = TreeScan([info], latest=n if info.complete else None, latest_rule=True)
        scan.metrics = log_metrics(states)
        scan.attrs = tree_attrs(tree, states, {n: ""}, [info])
        return scan

    # -- management: copy as checkpoint-(max+1), trainer_state.json (the commit) last
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        files = self.serial_files(tree, info)
        return [f for f in files if posixpath.basename(f) == "trainer_state.json"]


def mark_missing_files(tree: Tree, serials: list[SerialInfo]) -> None:
    """A complete serial lacking a file that every other complete serial has (its
    ``optimizer.pt``, a weight shard, ``rng_state.pth``) does not resume as they do: an
    error naming the files. Slimmed serials are judged by their own marker."""
    names = {}
    for info in serials:
        if info.complete:
            base = tree.rel(info.path)
            paths = [r.path for r in info.files if r.required]
            paths += [p for p in info.other_files if p.endswith(".index.json")]
            names[info.serial] = {tree.rel(p)[len(base) :].lstrip("/") for p in paths}
    for serial, have in names.items():
        others = [v for k, v in names.items() if k != serial]
        if len(others) < 2:
            continue
        lacking = sorted(set.intersection(*others) - have)
        if lacking:
            info = next(s for s in serials if s.serial == serial)
            shown = ", ".join(lacking[:4]) + (" …" if len(lacking) > 4 else "")
            info.error = "; ".join(filter(None, [
                info.error, f"no {shown}, which every other checkpoint has"]))  # fmt: skip


def _has(refs: list[FileRef], prefix: str) -> bool:
    return any(r.prefix == prefix for r in refs)


def log_metrics(states: dict[int, dict]) -> list[tuple[int, str, float]]:
    """``log_history`` rows of every trainer_state.json as (step, name, value), newest wins."""
    found: dict[tuple[int, str], float] = {}
    for _n, state in sorted(states.items()):
        history = state.get("log_history")
        if not isinstance(history, list):
            continue
        for row in history:
            if not isinstance(row, dict) or not isinstance(row.get("step"), int):
                continue
            for key, value in row.items():
                if key in ("step", "epoch") or isinstance(value, bool):
                    continue
                if isinstance(value, (int, float)):
                    found[(row["step"], key)] = float(value)
    return [(step, key, value) for (step, key), value in sorted(found.items())]


def tree_attrs(tree: Tree, states: dict[int, dict], dirs: dict[int, str],
               serials: list[SerialInfo]) -> dict:  # fmt: skip
    """Best checkpoint and metric (from the newest trainer_state.json) and training args."""
    attrs: dict = {}
    if states:
        newest = states[max(states)]
        for key in ("best_model_checkpoint", "best_metric", "best_global_step"):
            if newest.get(key) is not None:
                attrs[key] = newest[key]
        best = newest.get("best_model_checkpoint")
        if isinstance(best, str):
            m = CKPT_DIR.match(posixpath.basename(best.rstrip("/")))
            if m:
                attrs["best_serial"] = int(m[1])
    complete = [s for s in serials if s.complete]
    if complete:
        rel = tree.rel(complete[-1].path)
        args = training_args(tree, f"{rel}/training_args.bin" if rel else "training_args.bin")
        if args:
            attrs["training_args"] = args
            for key in ("save_total_limit", "metric_for_best_model", "greater_is_better"):
                if key in args:
                    attrs[key] = args[key]
    return attrs


def training_args(tree: Tree, rel: str) -> dict | None:
    """Simple fields of a pickled TrainingArguments (through the restricted unpickler)."""
    if not tree.exists(rel):
        return None
    try:
        obj = tree.memo(rel, "torch-pickle", lambda: load_torch_pickle(tree.blob(rel)))
        fields = obj.fields() if hasattr(obj, "fields") else obj
    except Exception:  # noqa: BLE001 - optional extra: a bad file only loses the attrs
        return None
    if not isinstance(fields, dict):
        return None
    return {str(k): plain(v) for k, v in fields.items() if plain(v) is not _SKIP}


_SKIP = object()


def plain(value: Any) -> Any:
    """A JSON-able version of a pickled field (enums to their value), else _SKIP."""
    if isinstance(value, SIMPLE):
        return value
    if isinstance(value, Enum):
        return value.value
    inner = getattr(value, "args", None)
    if hasattr(value, "cls") and isinstance(inner, tuple) and len(inner) == 1:
        return inner[0] if isinstance(inner[0], SIMPLE) else _SKIP
    if isinstance(value, (list, tuple)) and all(isinstance(v, SIMPLE) for v in value):
        return list(value)
    return _SKIP


def load_torch_pickle(blob: Blob) -> Any:
    """The object of a torch file's pickle (storages stay unread references)."""
    from ..formats.torch_pickle import open_torch  # the pickle machine: when a file is read

    return open_torch(blob, views_ok=True).obj


class SafetensorsShardedLayout(Layout):
    """A bare sharded model dir: ``*.safetensors.index.json`` + its shards, one serial 0."""

    name = "safetensors-sharded"
    resume_reads = "the index and every shard it names (``from_pretrained``)"
    priority = LayoutTier.FAMILY

    def guess_can_open(self, tree: Tree) -> bool:
        return not tree.single and any(
            f.endswith((".safetensors.index.json", ".bin.index.json")) for f in tree.files(depth=1)
        )

    def scan(self, tree: Tree) -> TreeScan:
        meta: dict = {}
        problems: list[str] = []
        refs, _used = weight_refs(tree, "", meta, problems)
        for ref in refs:
            ref.prefix = ""  # a bare model: the logical names themselves
        paths = {tree.rel(r.path) for r in refs}
        others = [tree.abs(f) for f in tree.files(depth=1) if f not in paths]
        info = SerialInfo(0, tree.abs(""), files=refs, other_files=others)
        info.error = "; ".join(problems) or None
        return TreeScan([info], attrs={"metadata": meta} if meta else {})

    def promote_ops(self, tree: Tree, scan: TreeScan, info: SerialInfo) -> list:
        raise single_serial_refusal(self.name)
