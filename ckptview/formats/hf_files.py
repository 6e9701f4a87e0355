"""Hugging Face model directories: which files hold the weights, and small JSON files.

A model dir holds ``model.safetensors`` / ``pytorch_model.bin`` / ``adapter_model.*``, or
shards ``<stem>-00001-of-00003.<ext>`` listed by ``<stem>.<ext>.index.json`` (its
``weight_map`` names the shards, its ``metadata`` describes the model). Used by the HF Trainer
and safetensors-sharded layouts and by numbered checkpoint dirs holding a saved model.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from ..model import FileRef
from ..tree import Tree
from .small import loads_json

SHARD = re.compile(r"^(?P<stem>.+)-\d{5}-of-\d{5}\.(?P<ext>safetensors|bin)$")
#: weight file stem -> the logical prefix of its variables
WEIGHT_STEMS = {"model": "model", "pytorch_model": "model", "adapter_model": "adapter"}
WEIGHT_EXTS = (".safetensors", ".bin", ".pt", ".pth")
#: a rank's pieces written by DCP's ``HuggingFaceStorageWriter(save_distributed=True)``
RANK_SHARD = re.compile(r"^shard-(?P<rank>\d{5})-(?P<stem>.+)-\d{5}-of-\d{5}\.safetensors$")
RANK_DIR = "sharded"
#: ``transformers.TrainerState`` fields: ``TrainerState(**json)`` fails on any other key, so
#: a ``trainer_state.json`` holding one stops a resume
TRAINER_STATE_FIELDS = frozenset({
    "epoch", "global_step", "max_steps", "logging_steps", "eval_steps", "save_steps",
    "train_batch_size", "num_train_epochs", "num_input_tokens_seen", "total_flos",
    "log_history", "best_metric", "best_global_step", "best_model_checkpoint",
    "is_local_process_zero", "is_world_process_zero", "is_hyper_param_search", "trial_name",
    "trial_params", "stateful_callbacks",
})  # fmt: skip


def state_problem(state: dict, fields: frozenset[str], name: str = "trainer_state.json") -> str | None:
    """Why ``TrainerState(**state)`` would fail (keys it does not know), else None."""
    extra = sorted(str(k) for k in state if k not in fields)
    if not extra:
        return None
    return f"{name}: TrainerState(**json) rejects keys {extra}"


def read_json(tree: Tree, rel: str, problems: list[str] | None = None) -> Any:
    """A small JSON file, or None when missing or unparsable (why: in ``problems``)."""
    if not tree.exists(rel):
        return None
    try:
        return loads_json(tree.read_text(rel, limit=256 << 20))
    except (ValueError, OSError) as e:
        if problems is not None:
            problems.append(f"{posixpath.basename(rel)} unreadable: {e}")
        return None


def weight_refs(
    tree: Tree, rel_dir: str, meta: dict | None = None, problems: list[str] | None = None
) -> tuple[list[FileRef], list[str]]:
    """Model weight files of a directory (single or sharded) and the index files consumed.

    The indexes' ``metadata`` is merged into ``meta`` when given; an index that cannot be read
    (``from_pretrained`` would fail on it) is described in ``problems``.
    Shards listed by a ``*.index.json`` get the logical prefix of their stem (``model``), so
    names carry no shard prefix; other weight files get the prefix of their stem.
    """
    prefix = rel_dir.rstrip("/") + "/" if rel_dir else ""
    names = [posixpath.basename(f) for f in tree.files(under=rel_dir, depth=1)]
    refs: list[FileRef] = []
    used: list[str] = []
    for name in names:
        if not name.endswith(".index.json"):
            continue
        weights = name[: -len(".index.json")]
        stem = weights.rsplit(".", 1)[0]
        try:
            index = loads_json(tree.read_text(prefix + name, limit=256 << 20))
        except (ValueError, OSError) as e:
            index = None
            if problems is not None:
                problems.append(f"{name} unreadable: {e}")
        shards = _index_shards(index)
        if shards is None:
            if index is not None and problems is not None:
                problems.append(f"{name} has no weight_map")
            continue
        if meta is not None and isinstance(index.get("metadata"), dict):
            meta.update(index["metadata"])
        used.append(prefix + name)
        held: dict[str, list[str]] = {}
        for tensor, shard in index["weight_map"].items():
            if isinstance(shard, str):
                held.setdefault(shard, []).append(str(tensor))
        for shard in shards:
            if tree.exists(prefix + shard):
                ref = _weight_ref(tree, prefix + shard, WEIGHT_STEMS.get(stem, stem))
                ref.expects = tuple(sorted(held.get(shard, ())))
                refs.append(ref)
            elif problems is not None:
                problems.append(f"{name} names {shard}, which is missing")
    claimed = {posixpath.basename(r.path) for r in refs}
    for name in names:
        if name in claimed or not name.endswith(WEIGHT_EXTS):
            continue
        stem = name.rsplit(".", 1)[0]
        m = SHARD.match(name)
        if m:  # a shard without (or missing from) its index: still logical names
            stem = m["stem"]
            index_name = f"{stem}.{m['ext']}.index.json"
            if problems is not None and index_name not in names:
                problems.append(f"{name}: a shard without its {index_name} (sharded weights "
                                "do not load without their index)")
        if stem in WEIGHT_STEMS or m:
            refs.append(_weight_ref(tree, prefix + name, WEIGHT_STEMS.get(stem, stem)))
    for rel in tree.files(under=prefix + RANK_DIR, depth=1):
        m = RANK_SHARD.match(posixpath.basename(rel))
        if m:  # pieces named like the consolidated tensors (their DCP_SHARDING_INFO places them)
            ref = _weight_ref(tree, rel, WEIGHT_STEMS.get(m["stem"], m["stem"]))
            ref.node = f"rank{int(m['rank'])}"
            refs.append(ref)
    return refs, used


def _weight_ref(tree: Tree, rel: str, prefix: str) -> FileRef:
    codec = "safetensors" if rel.endswith(".safetensors") else "torch"
    return FileRef(tree.abs(rel), prefix=prefix, kind="model", codec=codec, size=tree.size(rel))


def _index_shards(index: Any) -> list[str] | None:
    """Shard file names of a parsed ``*.index.json`` (weight_map values), or None."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return None
    return sorted({v for v in weight_map.values() if isinstance(v, str) and "/" not in v})
