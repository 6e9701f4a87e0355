"""Megatron-LM legacy checkpoints: ``iter_NNNNNNN/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``.

Each model-parallel rank ``torch.save``\\ s one dict (``args``, ``iteration``, ``model``,
``optimizer``, ``opt_param_scheduler``, ``rng_state`` …), with ``distrib_optim.pt`` beside it
under the distributed optimizer; rank 0 then writes ``latest_checkpointed_iteration.txt`` (the
iteration, or ``release`` for ``release/``). Tensor-parallel shards carry no split metadata:
they are reassembled by Megatron's own partition rules, as ``tools/checkpoint/loader_megatron``
does (column-parallel and vocab-parallel weights on dim 0, row-parallel on dim 1, norms and
row-parallel biases replicated, SwiGLU ``linear_fc1`` as ``[gate; up]`` halves), pipeline
stages by offsetting their local layer numbers, and optimizer state (``state/<param id>``, ids
in model order) by the rule of its parameter.
"""

from __future__ import annotations

import posixpath
import re

from ..model import FileRef, Piece, SerialInfo, TreeScan, VarInfo, inline_value
from ..tree import Tree
from .base import LayoutTier, TrackerLayout

ITER_DIR = re.compile(r"^(?:iter_(\d{7,})|release)$")
RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")
MODEL_FILE = "model_optim_rng.pt"
DISTRIB_OPTIM = "distrib_optim.pt"
RELEASE = 0  # the serial number of ``release/``

#: weight names split on dim 0 (column-parallel, vocab-parallel) and dim 1 (row-parallel)
DIM0 = re.compile(
    r"(word_embeddings\.weight|output_layer\.weight|lm_head\.weight"
    r"|linear_qkv\.(weight|bias)|linear_q\.(weight|bias)|linear_kv\.(weight|bias)"
    r"|linear_fc1\.(weight|bias)|query_key_value\.(weight|bias)|dense_h_to_4h\.(weight|bias))$"
)
DIM1 = re.compile(r"(linear_proj\.weight|linear_fc2\.weight|attention\.dense\.weight"
                  r"|dense_4h_to_h\.weight)$")  # fmt: skip
SWIGLU_FC1 = re.compile(r"(linear_fc1|dense_h_to_4h)\.weight$")
LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
MODEL_PREFIX = re.compile(r"^model\d*/")


class MegatronLayout(TrackerLayout):
    """``iter_N`` (or ``release``) dirs of per-rank ``model_optim_rng.pt``, with the tracker."""

    name = "megatron-legacy"
    resume_reads = (
        "every model-parallel rank's ``mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`` (and "
        "``distrib_optim.pt`` when written) of the iteration the tracker names "
        "(``load_checkpoint``)"
    )
    priority = LayoutTier.CONVENTION
    tracker_words = {"release": RELEASE}

    def guess_can_open(self, tree: Tree) -> bool:
        if tree.single:
            return False
        return any(self._rank_files(tree, d) for d in self._iters(tree).values())

    def _iters(self, tree: Tree) -> dict[int, str]:
        out = {}
        for d in tree.dirs():
            m = ITER_DIR.match(posixpath.basename(d))
            if m and posixpath.dirname(d) in ("", "."):
                out[int(m[1]) if m[1] else RELEASE] = d
        return out

    def _rank_files(self, tree: Tree, it_dir: str) -> list[tuple[tuple[int, int, int], str]]:
        """((tp, pp, ep), relative path) of each rank's files in an iteration dir."""
        out = []
        for rel in tree.files(under=it_dir, depth=2):
            parts = rel[len(it_dir) + 1 :].split("/")
            m = RANK_DIR.match(parts[0]) if len(parts) == 2 else None
            if m and parts[1] in (MODEL_FILE, DISTRIB_OPTIM):
                out.append(((int(m[1]), int(m[2] or 0), int(m[3] or 0)), rel))
        return out

    def scan(self, tree: Tree) -> TreeScan:
        serials = []
        for it, d in sorted(self._iters(tree).items()):
            files = sorted(self._rank_files(tree, d))
            if not files:
                continue
            pipelined = any(RANK_DIR.match(rel.split("/")[-2])[2] for _, rel in files)
            refs = [self._ref(tree, rank, rel, pipelined) for rank, rel in files]
            claimed = {tree.rel(r.path) for r in refs}
            others = [tree.abs(f) for f in tree.files(under=d) if f not in claimed]
            info = SerialInfo(it, tree.abs(d), files=refs, other_files=others, step=it)
            info.nodes = tuple(dict.fromkeys(r.node for r in refs))
            problems = _missing(files)
            if problems:
                info.complete, info.error = False, problems
            serials.append(info)
        return self.read_tracker(tree, TreeScan(serials))

    def _ref(self, tree: Tree, rank: tuple[int, int, int], rel: str, pipelined: bool) -> FileRef:
        tp, pp, ep = rank
        node = f"tp{tp}" + (f"-pp{pp}" if pipelined else "") + (f"-ep{ep}" if ep else "")
        distrib = rel.endswith(DISTRIB_OPTIM)
        return FileRef(tree.abs(rel), node=node, prefix="distrib_optim" if distrib else "",
                       kind="optimizer" if distrib else None, codec="torch",
                       size=tree.size(rel))  # fmt: skip

    def pieces(self, ref: FileRef, variables: list[VarInfo]) -> list[Piece | None] | None:
        """Tensor-parallel pieces of the model and its optimizer state, by Megatron's rules."""
        if ref.prefix:
            return None
        rank = _node_rank(ref.node)
        if rank is None:
            return None
        tp, pp = rank
        by_name = {v.name: v for v in variables}
        n_tp = _int(by_name.get("args/tensor_model_parallel_size"))
        swiglu = inline_value(by_name["args/swiglu"]) if "args/swiglu" in by_name else None
        params = [v for v in variables if MODEL_PREFIX.match(v.name) and v.dtype != "object"
                  and not v.name.endswith("_extra_state")]  # fmt: skip
        offset = pp * _layers_per_stage(params) if pp else 0
        rules = {v.name: _rule(v, tp, n_tp, swiglu, params, offset) for v in params}
        state = _optimizer_params(variables, params)
        out: list[Piece | None] = []
        for var in variables:
            piece = rules.get(var.name)
            if piece is None and var.name in state:
                param, key = state[var.name]
                base = rules[param.name]
                if tuple(var.shape) == tuple(param.shape):
                    stem = param.name[param.name.index("/") + 1 :]
                    logical = f"optimizer/{_logical(stem, offset)}/{key}"
                    piece = Piece(base.shape, shard=base.shard, replica=base.replica,
                                  placement=base.placement, role="data", name=logical,
                                  blocks=base.blocks)  # fmt: skip
            out.append(piece)
        return out

    def tracker_text(self, tree: Tree, info: SerialInfo) -> str:
        """``release`` for the release dir, else the iteration."""
        return (
            "release" if posixpath.basename(tree.rel(info.path)) == "release" else str(info.serial)
        )


def _rule(var: VarInfo, tp: int, n_tp: int | None, swiglu: bool | None,
          params: list[VarInfo], offset: int) -> Piece:  # fmt: skip
    """Where one rank's model tensor sits in the full tensor."""
    name = var.name[var.name.index("/") + 1 :]
    logical = f"model/{_logical(name, offset)}" if offset else None
    shape = tuple(int(d) for d in var.shape)
    dim = 0 if DIM0.search(name) else 1 if DIM1.search(name) and len(shape) == 2 else None
    if dim is None or not shape:
        return Piece(shape, replica=("tp",), placement="Replicate() over tp", name=logical)
    full = None
    if n_tp:
        full = tuple(d * n_tp if i == dim else d for i, d in enumerate(shape))
    blocks = 2 if SWIGLU_FC1.search(name) and _is_swiglu(var, swiglu, params) else 1
    placement = f"Shard({dim}) over tp" + (" as [gate; up]" if blocks == 2 else "")
    return Piece(full, shard=((dim, tp, n_tp),), placement=placement, name=logical,
                 blocks=blocks)  # fmt: skip


def _is_swiglu(fc1: VarInfo, swiglu: bool | None, params: list[VarInfo]) -> bool:
    """Whether ``linear_fc1`` stacks gate and up: as ``args.swiglu`` says, else when it has
    twice the rows ``linear_fc2`` of the same layer has columns."""
    if swiglu is not None:
        return bool(swiglu)
    fc2 = fc1.name.replace("linear_fc1", "linear_fc2").replace("dense_h_to_4h", "dense_4h_to_h")
    other = next((v for v in params if v.name == fc2), None)
    return bool(other is not None and len(other.shape) == 2
                and int(fc1.shape[0]) == 2 * int(other.shape[1]))  # fmt: skip


def _optimizer_params(variables: list[VarInfo], params: list[VarInfo]
                      ) -> dict[str, tuple[VarInfo, str]]:  # fmt: skip
    """``optimizer/state/<id>/<key>`` -> (its parameter, key): ids count the parameters in
    model order (torch's optimizer ``state_dict``), when there are as many as parameters."""
    weights = [p for p in params if p.name.startswith("model/")]
    out = {}
    ids = set()
    for var in variables:
        parts = var.name.split("/")
        if len(parts) == 4 and parts[:2] == ["optimizer", "state"] and parts[2].isdigit():
            ids.add(int(parts[2]))
            out[var.name] = (int(parts[2]), parts[3])
    if not ids or ids != set(range(len(weights))):
        return {}
    return {name: (weights[i], key) for name, (i, key) in out.items()}


def _logical(name: str, offset: int) -> str:
    """A model tensor's name with its pipeline stage's layer offset applied."""
    if not offset:
        return name
    return LAYER.sub(lambda m: f"{m[1]}layers.{int(m[2]) + offset}.", name, count=1)


def _layers_per_stage(params: list[VarInfo]) -> int:
    return len({int(m[2]) for v in params if (m := LAYER.search(v.name))})


def _node_rank(node: str) -> tuple[int, int] | None:
    m = re.match(r"^tp(\d+)(?:-pp(\d+))?", node)
    return (int(m[1]), int(m[2] or 0)) if m else None


def _int(var: VarInfo | None) -> int | None:
    value = inline_value(var) if var is not None else None
    return (
        int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    )


def _missing(files: list[tuple[tuple[int, int, int], str]]) -> str | None:
    """Which model-parallel ranks of the grid lack their ``model_optim_rng.pt``."""
    have = {rank for rank, rel in files if rel.endswith(MODEL_FILE)}
    if not have:
        return f"no {MODEL_FILE}"
    grid = [(t, p, e) for t in range(1 + max(r[0] for r in have))
            for p in range(1 + max(r[1] for r in have))
            for e in range(1 + max(r[2] for r in have))]  # fmt: skip
    gaps = [r for r in grid if r not in have]
    if not gaps:
        return None
    names = ", ".join(f"mp_rank_{t:02d}" + (f"_{p:03d}" if p else "") for t, p, _ in gaps[:4])
    return f"no {MODEL_FILE} of {names}"
