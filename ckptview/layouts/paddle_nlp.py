"""PaddleNLP Trainer output dirs: ``checkpoint-N/`` of ``paddle.save`` pickles.

A serial is ``checkpoint-N`` holding ``model_state.pdparams`` (or shards
``model_state-0000x-of-0000y.pdparams`` listed by ``model_state.pdparams.index.json``;
tensor-parallel ``model_state.tp00_pp00.pdparams``), ``optimizer.pdopt`` (and
``master_weights.pdparams``), ``scheduler.pdparams``, ``scaler.pdparams``, ``rng_state*.pth``,
``trainer_state.json``, ``config.json`` and a pickled ``training_args.bin``. The Trainer
resumes from ``get_last_checkpoint`` = the largest N (``TreeScan.latest``); ckptview's
``latest`` is the newest complete and loadable serial, the pointer kept in
``attrs["framework_latest"]`` when it differs.

Completeness and loadability (what ``Trainer.train(resume_from_checkpoint=...)`` reads):
``trainer_state.json`` is the commit marker (written after the weights and the optimizer): a
dir without a readable one is incomplete; it must parse into PaddleNLP's
``TrainerState(**json)`` (:data:`STATE_FIELDS`: another key is an error naming it); every
``.pdparams``/``.pdopt`` file must parse, every shard its index names must exist, and a serial
lacking a file every other serial has (a deleted ``optimizer.pdopt``) is incomplete.
``rng_state*.pth`` (Paddle ``GeneratorState`` objects the restricted reader does not model)
and ``training_args.bin`` (never read on resume) do not block: their problems are warnings.
``log_history`` gives the metrics (serial = step); ``best_metric`` and
``best_model_checkpoint`` go to ``TreeScan.attrs`` (``best_serial``).
"""

from __future__ import annotations

import math
import posixpath
import re
from typing import Any

from ..formats.hf_files import TRAINER_STATE_FIELDS, state_problem
from ..formats.small import loads_json
from ..model import FileRef, SerialInfo, TreeScan
from ..tree import Tree
from .base import Layout, LayoutTier

CKPT_DIR = re.compile(r"^checkpoint-(\d+)$")
STATE = "trainer_state.json"
PADDLE_EXTS = (".pdparams", ".pdopt")
#: ``model_state-00001-of-00002.pdparams``, ``optimizer.tp00_pp01.pdopt``: stem, rank tags
PADDLE_FILE = re.compile(
    r"^(?P<stem>[a-z_]+?)(?:-\d{5}-of-\d{5})?(?:\.(?P<tags>(?:tp|pp|shard|moe)\d+(?:_(?:tp|pp|"
    r"shard|moe)\d+)*))?\.(?P<ext>pdparams|pdopt)$"
)
RNG = re.compile(r"^rng_state(?:_(\d+))?\.pth$")
#: file stem -> (variable prefix, kind)
STEMS = {
    "model_state": ("model", "model"),
    "optimizer": ("optimizer", "optimizer"),
    "master_weights": ("master_weights", "optimizer"),
    "scheduler": ("scheduler", "scheduler"),
    "scaler": ("scaler", "trainer"),
}
#: ``paddlenlp.trainer.TrainerState`` fields: transformers' and two of its own
STATE_FIELDS = TRAINER_STATE_FIELDS | {"trained_samples", "consumed_samples"}


def _is_paddle_dir(tree: Tree, rel: str) -> bool:
    return any(
        f.endswith(PADDLE_EXTS) or f.endswith(PADDLE_EXTS[0] + ".index.json")
        for f in tree.files(under=rel, depth=1)
    )


def read_state(tree: Tree, rel: str) -> tuple[dict | None, str | None, bool]:
    """``(state, error, parsed)`` of a ``trainer_state.json``: the object when it parses as
    JSON (strict UTF-8, as ``json.load`` of the file), the reason ``TrainerState(**json)``
    would fail, and whether it parsed at all."""
    if not tree.exists(rel):
        return None, f"no {STATE} (save interrupted?)", False
    try:
        state = loads_json(tree.read_bytes(rel, 256 << 20).decode("utf-8"))
    except (ValueError, OSError) as e:  # UnicodeDecodeError is a ValueError
        return None, f"{STATE} unreadable: {e}", False
    if not isinstance(state, dict):
        return None, f"{STATE} is not a JSON object", True
    problem = state_problem(state, STATE_FIELDS, STATE)
    if problem:
        return state, problem, True
    return state, None, True


def checkpoint_refs(tree: Tree, rel: str, problems: list[str]) -> tuple[list[FileRef], list[str]]:
    """The variable files of one ``checkpoint-N`` dir and its other files (relative)."""
    prefix = rel + "/" if rel else ""
    names = [posixpath.basename(f) for f in tree.files(under=rel, depth=1)]
    refs: list[FileRef] = []
    used: set[str] = set()
    for name in names:
        if not name.endswith(tuple(e + ".index.json" for e in PADDLE_EXTS)):
            continue
        used.add(name)
        try:
            index = loads_json(tree.read_bytes(prefix + name, 256 << 20).decode("utf-8"))
            shards = sorted(set(index["weight_map"].values()))
            if not all(isinstance(s, str) and "/" not in s for s in shards):
                raise ValueError("weight_map names a file outside the dir")
        except (ValueError, OSError, KeyError, TypeError, AttributeError) as e:
            problems.append(f"{name} unreadable: {e}")
            continue
        for shard in shards:
            if shard not in names:
                problems.append(f"{shard} (named by {name}) is missing")
    for name in names:
        m = PADDLE_FILE.match(name)
        r = RNG.match(name)
        if m:
            pre, kind = STEMS.get(m["stem"], (m["stem"], "model" if m["ext"] == "pdparams"
                                              else "optimizer"))  # fmt: skip
            node = m["tags"] or ""
            refs.append(FileRef(tree.abs(prefix + name), node=node, prefix=pre, kind=kind,
                                codec="paddle-pickle", size=tree.size(prefix + name)))  # fmt: skip
        elif r:
            node = f"rank{r[1]}" if r[1] is not None else ""
            refs.append(FileRef(tree.abs(prefix + name), node=node, prefix="rng_state",
                                kind="rng", codec="paddle-pickle", size=tree.size(prefix + name),
                                required=False))  # fmt: skip
        else:
            continue
        used.add(name)
    others = [prefix + n for n in names if n not in used]
    others += [f for f in tree.files(under=rel) if posixpath.dirname(f) != rel]
    return refs, others


def _roles(tree: Tree, info: SerialInfo) -> set[str]:
    """The files of a serial its resume reads, by role (name without shard numbers): the
    every-other-serial rule compares these."""
    names = [posixpath.basename(r.path) for r in info.files if r.required]
    names += [posixpath.basename(p) for p in info.other_files if p.endswith("/" + STATE)]
    return {re.sub(r"-\d{5}-of-\d{5}", "", n) for n in names}


class PaddleNLPTrainerLayout(Layout):
    """``output_dir/checkpoint-N/`` trees written by ``paddlenlp.trainer.Trainer``."""

    name = "paddlenlp-trainer"
    resume_reads = (
        "``model_state*.pdparams`` (and the shards its index names), ``optimizer*.pdopt``, "
        "``master_weights*.pdparams``, ``scheduler.pdparams``, ``scaler.pdparams``, "
        "``trainer_state.json`` (``Trainer.train(resume_from_checkpoint=...)``); "
        "``rng_state*.pth`` as a warning; not ``training_args.bin``"
    )
    priority = LayoutTier.SPECIFIC  # before hf-trainer, which would claim checkpoint-N/ too

    def guess_can_open(self, tree: Tree) -> bool:
        if tree.single:
            return False
        dirs = [d for d in tree.dirs() if CKPT_DIR.match(posixpath.basename(d))]
        if dirs:
            return any(_is_paddle_dir(tree, d) for d in dirs)
        return tree.exists(STATE) and _is_paddle_dir(tree, "")  # the root is one checkpoint

    def scan(self, tree: Tree) -> TreeScan:
        dirs = {int(m[1]): d for d in tree.dirs() if (m := CKPT_DIR.match(posixpath.basename(d)))}
        if not dirs:  # the root is one checkpoint dir
            m = CKPT_DIR.match(posixpath.basename(tree.root.rstrip("/")))
            state, _, _ = read_state(tree, STATE)
            step = state.get("global_step") if state else None
            dirs = {int(m[1]) if m else step if isinstance(step, int) else 0: ""}
        serials, states, roles = [], {}, []
        for n, rel in sorted(dirs.items()):
            info, state = self._serial(tree, n, rel)
            serials.append(info)
            roles.append(_roles(tree, info))
            if state is not None:
                states[n] = state
        for i, info in enumerate(serials):
            others = roles[:i] + roles[i + 1 :]
            missing = sorted(set.intersection(*others) - roles[i]) if others else []
            missing = [m for m in missing if f"no {m}" not in (info.error or "")]  # said so
            if missing:
                info.complete = False
                note = f"no {', '.join(missing)}, which every other serial has: cut short"
                info.error = "; ".join(filter(None, [info.error, note]))
        latest = max(dirs) if any(s.complete for s in serials) else None
        scan = TreeScan(serials, latest=latest, latest_rule=True)
        scan.metrics = log_metrics(states)
        scan.attrs = best_attrs(states)
        return scan

    def _serial(self, tree: Tree, n: int, rel: str) -> tuple[SerialInfo, dict | None]:
        problems: list[str] = []
        refs, others = checkpoint_refs(tree, rel, problems)
        state, error, parsed = read_state(tree, f"{rel}/{STATE}" if rel else STATE)
        info = SerialInfo(n, tree.abs(rel), files=refs, other_files=[tree.abs(o) for o in others])
        if error:
            problems.append(error)
        if not any(r.kind == "model" for r in refs):
            problems.append("no model_state.pdparams")
        info.error = "; ".join(problems) or None
        info.complete = parsed and isinstance(state, dict)
        if isinstance(state, dict):
            step = state.get("global_step")
            info.step = step if isinstance(step, int) and not isinstance(step, bool) else None
            epoch = state.get("epoch")
            if isinstance(epoch, (int, float)) and math.isfinite(epoch):
                info.epoch = int(math.floor(epoch))
                info.attrs["epoch"] = float(epoch)
            if step != n:
                info.attrs["global_step_mismatch"] = f"global_step {step} != {n}"
        return info, state if isinstance(state, dict) else None

    # -- management: copy as checkpoint-(max+1), trainer_state.json (the commit) last
    def commit_markers(self, tree: Tree, info: SerialInfo) -> list[str]:
        return [f for f in self.serial_files(tree, info) if posixpath.basename(f) == STATE]


def log_metrics(states: dict[int, dict]) -> list[tuple[int, str, float]]:
    """``log_history`` rows of every trainer_state.json as (step, name, value), newest wins."""
    found: dict[tuple[int, str], float] = {}
    for _n, state in sorted(states.items()):
        history = state.get("log_history")
        for row in history if isinstance(history, list) else ():
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                continue
            for key, value in row.items():
                if key not in ("step", "epoch") and _number(value):
                    found[(step, key)] = float(value)
    return [(step, key, value) for (step, key), value in sorted(found.items())]


def best_attrs(states: dict[int, dict]) -> dict[str, Any]:
    """``best_metric``, ``best_model_checkpoint`` (and its serial) of the newest state."""
    attrs: dict[str, Any] = {}
    if not states:
        return attrs
    newest = states[max(states)]
    for key in ("best_metric", "best_model_checkpoint", "best_global_step"):
        if newest.get(key) is not None:
            attrs[key] = newest[key]
    best = newest.get("best_model_checkpoint")
    if isinstance(best, str) and (m := CKPT_DIR.match(posixpath.basename(best.rstrip("/")))):
        attrs["best_serial"] = int(m[1])
    return attrs


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
