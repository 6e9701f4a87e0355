"""DeepSpeed engine checkpoints: the per-rank state files of one tag dir (``global_stepN/``).

``mp_rank_XX_model_states.pt`` (node ``mpX`` when model-parallel), ``[bf16_|fp16_]zero_pp_rank_D_
mp_rank_XX_{optim,model}_states.pt`` (node ``rankD``), MoE ``expp_rank_E…`` (node ``epE``) and
``layer_L_expert_E…`` (prefix ``layer_L_expert_E``). Used by the DeepSpeed layout and by HF
Trainer dirs holding DeepSpeed state.
"""

from __future__ import annotations

import posixpath
import re

from ..model import FileRef
from ..tree import Tree

MODEL = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
ZERO = re.compile(r"^(?:bf16_|fp16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(optim|model)_states\.pt$")
EXPP = re.compile(r"^expp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
EXPERT = re.compile(r"^layer_(\d+)_expert_(\d+)_mp_rank_(\d+)_model_states\.pt$")


def classify(name: str, multi_mp: bool) -> tuple[str, str, str] | None:
    """(node, prefix, kind) of a DeepSpeed file name, or None when it holds no states."""
    mp = ""
    if m := MODEL.match(name):
        return (f"mp{int(m[1])}" if multi_mp else "", "", "model")
    if m := ZERO.match(name):
        mp = f"_mp{int(m[2])}" if multi_mp else ""
        kind = "optimizer" if m[3] == "optim" else "model"
        return (f"rank{int(m[1])}{mp}", "", kind)
    if m := EXPP.match(name):
        mp = f"_mp{int(m[2])}" if multi_mp else ""
        return (f"ep{int(m[1])}{mp}", "", "optimizer")
    if m := EXPERT.match(name):
        node = f"mp{int(m[3])}" if multi_mp else ""
        return (node, f"layer_{int(m[1])}_expert_{int(m[2])}", "model")
    return None


def tag_refs(tree: Tree, rel: str) -> list[FileRef]:
    """FileRefs of the per-rank state files of one tag dir."""
    names = [posixpath.basename(f) for f in tree.files(under=rel, depth=1)]
    mps = {int(m[1]) for n in names if (m := MODEL.match(n))}
    mps |= {int(m[2]) for n in names if (m := ZERO.match(n))}
    refs = []
    for name in sorted(names):
        found = classify(name, multi_mp=len(mps) > 1)
        if found:
            node, prefix, kind = found
            f = f"{rel}/{name}" if rel else name
            refs.append(FileRef(tree.abs(f), node=node, prefix=prefix, kind=kind, codec="torch",
                                size=tree.size(f)))  # fmt: skip
    return refs
