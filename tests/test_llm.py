"""Large-model trees (DESIGN.md §3b): Megatron legacy tensor/pipeline parallelism, verl FSDP
DTensor shards, DCP-written safetensors; resume rules, missing pieces, mixed-parallelism diffs.
Expected values come from the corpus ground truth (the frameworks' own gathers) or are built
by hand below."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_copy, corpus_path, ground_truth
from test_deepspeed import torch_zip

import ckptview as cv

LEGACY = "llm/megatron_legacy"
VERL = "llm/fsdp_verl"


def tree_copy(tmp_path: Path, rel: str) -> Path:
    return corpus_copy(rel, tmp_path / Path(rel).name)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-4, 1e-4 * abs(b))


# -- Megatron legacy ---------------------------------------------------------------------------
def test_megatron_legacy_reads_every_logical_tensor_as_megatron_gathers_it():
    gt = ground_truth(f"{LEGACY}/ground_truth.json")
    cat = cv.open(corpus_path(LEGACY))
    assert cat.layout == "megatron-legacy"
    v = cat.variables.set_index(["serial", "node", "name"])
    checked = 0
    for serial, groups in gt["logical"].items():
        for group, entries in groups.items():
            for e in entries:
                name = ("model/" if group == "model" else "optimizer/") + e["name"]
                row = v.loc[(int(serial), "", name)]
                assert row["shape"] == tuple(e["shape"]), name
                assert row["n_shards"] == 2, name
                got = float(cat.read(name, serial=int(serial)).astype(np.float64).sum())
                assert close(got, e["sum"]), (name, got, e["sum"])
                checked += 1
    assert checked == 2 * (21 + 42)


def test_megatron_swiglu_fc1_is_gate_halves_then_up_halves():
    cat = cv.open(corpus_path(LEGACY))
    name = "model/decoder.layers.0.mlp.linear_fc1.weight"
    sh = cat.shards
    rows = sh[(sh["serial"] == 15) & (sh["name"] == name)].sort_values("offsets")
    assert [(r.node, r.offsets, r.shape) for r in rows.itertuples()] == [
        ("tp0", (0, 0), (64, 48)),  # gate of rank 0
        ("tp1", (64, 0), (64, 48)),  # gate of rank 1
        ("tp0", (128, 0), (64, 48)),  # up of rank 0
        ("tp1", (192, 0), (64, 48)),  # up of rank 1
    ]
    assert not ((cat.variables["name"] == name) & (cat.variables["node"] != "")).any()
    full = cat.read(name, serial=15).astype(np.float64)
    gt = ground_truth(f"{LEGACY}/ground_truth.json")["files"]
    for tp in (0, 1):  # rank tp's stored [gate_tp; up_tp] lands at rows tp*64 and 128 + tp*64
        rel = f"megatron_legacy/iter_0000015/mp_rank_{tp:02d}/model_optim_rng.pt"
        local = {t["key"]: t["sum"] for t in gt[rel]["tensors"]}
        mine = full[64 * tp : 64 * tp + 64].sum() + full[128 + 64 * tp : 192 + 64 * tp].sum()
        assert close(mine, local[name]), tp


def test_megatron_row_parallel_and_replicated_rules():
    cat = cv.open(corpus_path(LEGACY))
    sh = cat.shards[cat.shards["serial"] == 15].set_index(["name", "node"])
    proj = "model/decoder.layers.0.self_attention.linear_proj.weight"
    assert sh.loc[(proj, "tp1"), "offsets"] == (0, 24)  # row-parallel: dim 1
    norm = "model/decoder.final_layernorm.weight"
    assert "(replica)" in sh.loc[(norm, "tp1"), "placement"]
    assert sh.loc[(norm, "tp0"), "offsets"] == sh.loc[(norm, "tp1"), "offsets"] == (0,)


def test_megatron_tracker_names_the_resume_point(tmp_path):
    root = tree_copy(tmp_path, LEGACY)
    assert cv.open(root).latest == 15
    (root / "latest_checkpointed_iteration.txt").write_text("5")
    cat = cv.open(root)
    assert cat.latest == 5
    assert "framework_latest" not in cat.attrs


def test_megatron_missing_rank_makes_the_iteration_unloadable(tmp_path):
    root = tree_copy(tmp_path, LEGACY)
    shutil.rmtree(root / "iter_0000015" / "mp_rank_01")
    cat = cv.open(root)
    s = cat.serials
    assert not s.loc[15, "loadable"]
    assert "a piece is missing" in s.loc[15, "error"]
    assert cat.latest == 5
    assert cat.attrs["framework_latest"] == 15
    name = "model/decoder.layers.0.self_attention.linear_qkv.weight"
    row = cat.variables.set_index(["serial", "name"]).loc[(15, name)]
    assert row["shape"] == (80, 48)  # the full shape from args.tensor_model_parallel_size
    assert "a piece is missing" in row["error"]
    with pytest.raises(ValueError, match="a piece is missing"):
        cat.read(name, serial=15)


def test_megatron_a_hole_in_the_rank_grid_is_incomplete(tmp_path):
    root = tree_copy(tmp_path, LEGACY)
    shutil.copytree(root / "iter_0000015" / "mp_rank_01", root / "iter_0000015" / "mp_rank_02")
    shutil.rmtree(root / "iter_0000015" / "mp_rank_01")
    s = cv.open(root).serials
    assert not s.loc[15, "complete"] and "mp_rank_01" in s.loc[15, "error"]


def test_megatron_truncated_rank_file_is_a_clear_error(tmp_path):
    root = tree_copy(tmp_path, LEGACY)
    f = root / "iter_0000015" / "mp_rank_01" / "model_optim_rng.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    cat = cv.open(root)
    assert not cat.serials.loc[15, "loadable"]
    assert cat.latest == 5
    with pytest.raises(ValueError, match="a piece is missing"):
        cat.read("model/output_layer.weight", serial=15)


def _megatron_rank(model: dict, tp: int, pp: int, n_tp: int) -> bytes:
    args = {"tensor_model_parallel_size": n_tp, "pipeline_model_parallel_size": 2,
            "swiglu": False}  # fmt: skip
    state = {"args": args, "iteration": 7, "checkpoint_version": 3.0, "model": model,
             "rng_state": [{"torch_rng_state": np.full(4, tp + 10 * pp, np.uint8)}]}  # fmt: skip
    return torch_zip(state)


def test_megatron_pipeline_stages_offset_their_layer_numbers(tmp_path):
    """TP=2 x PP=2, two layers per stage, built by hand: stage 1's local ``layers.0`` is
    layer 2 of the model; column-parallel on dim 0, row-parallel on dim 1."""
    rng = np.random.default_rng(0)
    full = {}
    for layer in range(4):
        full[f"decoder.layers.{layer}.mlp.linear_fc1.weight"] = rng.standard_normal((8, 6), "f4")
        full[f"decoder.layers.{layer}.mlp.linear_fc2.weight"] = rng.standard_normal((6, 8), "f4")
        full[f"decoder.layers.{layer}.input_layernorm.weight"] = rng.standard_normal(6, "f4")
    d = tmp_path / "iter_0000007"
    for pp in range(2):
        for tp in range(2):
            model = {}
            for local in range(2):
                layer = 2 * pp + local
                fc1 = full[f"decoder.layers.{layer}.mlp.linear_fc1.weight"]
                fc2 = full[f"decoder.layers.{layer}.mlp.linear_fc2.weight"]
                norm = full[f"decoder.layers.{layer}.input_layernorm.weight"]
                model[f"decoder.layers.{local}.mlp.linear_fc1.weight"] = fc1[4 * tp : 4 * tp + 4]
                model[f"decoder.layers.{local}.mlp.linear_fc2.weight"] = np.ascontiguousarray(
                    fc2[:, 4 * tp : 4 * tp + 4]
                )
                model[f"decoder.layers.{local}.input_layernorm.weight"] = norm
            out = d / f"mp_rank_{tp:02d}_{pp:03d}" / "model_optim_rng.pt"
            out.parent.mkdir(parents=True)
            out.write_bytes(_megatron_rank(model, tp, pp, 2))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    cat = cv.open(tmp_path)
    assert cat.layout == "megatron-legacy"
    assert cat.latest == 7
    assert set(cat.serials.loc[7, "nodes"]) == {"tp0-pp0", "tp1-pp0", "tp0-pp1", "tp1-pp1"}
    for name, want in full.items():
        np.testing.assert_array_equal(cat.read(f"model/{name}", serial=7), want)
    rng_rows = cat.variables[cat.variables["name"] == "rng_state/0/torch_rng_state"]
    assert sorted(rng_rows["node"]) == ["tp0-pp0", "tp0-pp1", "tp1-pp0", "tp1-pp1"]


def test_megatron_tp2_diffs_equal_to_megatron_core_dist_checkpoint():
    """The same weights saved by the legacy writer (TP=2 shards) and by megatron-core's
    dist_checkpointing (DCP) diff as identical, piece by piece."""
    legacy = cv.open(corpus_path(LEGACY))
    dist = cv.open(corpus_path("llm/megatron_dist"))
    names = [n for n in legacy.variables["name"].unique() if n.startswith("model/")]
    d = legacy.diff(15, 15, other=dist, names=names, rename=lambda n: f"model/{n}")
    assert len(d) == 21
    assert set(d["status"]) == {"identical"}


# -- verl FSDP -----------------------------------------------------------------------------------
def test_verl_dtensor_shards_read_as_logical_tensors():
    gt = ground_truth(f"{VERL}/ground_truth.json")
    cat = cv.open(corpus_path(VERL))
    assert cat.layout == "fsdp-verl"
    v = cat.variables.set_index(["serial", "node", "name"])
    for e in gt["logical"]["15"]["model"]:
        row = v.loc[(15, "", e["name"])]
        assert row["shape"] == tuple(e["shape"]) and row["n_shards"] == 2
        got = float(cat.read(e["name"], serial=15).astype(np.float64).sum())
        assert close(got, e["sum"]), e["name"]
    sh = cat.shards
    emb = sh[(sh["serial"] == 15) & (sh["name"] == "model.embed_tokens.weight")]
    assert sorted(emb["offsets"]) == [(0, 0), (151, 0)]  # torch chunking: ceil(301 / 2)
    assert set(emb["placement"]) == {"Shard(0)"}


def test_verl_resume_rule_and_a_rank_that_never_wrote(tmp_path):
    cat = cv.open(corpus_path(VERL))
    s = cat.serials
    assert list(s.index) == [5, 15, 25]
    assert not s.loc[25, "complete"] and "rank 1" in s.loc[25, "error"]
    assert cat.latest == 15
    root = tree_copy(tmp_path, VERL)
    (root / "latest_checkpointed_iteration.txt").write_text("5")
    assert cv.open(root).latest == 5
    (root / "latest_checkpointed_iteration.txt").write_text("15")
    (root / "global_step_15" / "actor" / "model_world_size_2_rank_1.pt").unlink()
    cat = cv.open(root)
    assert not cat.serials.loc[15, "loadable"]
    assert cat.latest == 5 and cat.attrs["framework_latest"] == 15
    with pytest.raises(ValueError, match="a piece is missing"):
        cat.read("model.embed_tokens.weight", serial=15)


def test_two_fsdp_ranks_diff_equal_to_the_dcp_written_safetensors():
    """verl's 2-rank DTensor shards and DCP's HuggingFaceStorageWriter output of the same
    weights: every model tensor identical (2 pieces vs a consolidated file)."""
    verl = cv.open(corpus_path(VERL))
    hf = cv.open(corpus_path("llm/dcp_hf"))
    gt = ground_truth(f"{VERL}/ground_truth.json")
    names = [e["name"] for e in gt["logical"]["15"]["model"]]
    d = verl.diff(15, 15, other=hf, names=names, rename=lambda n: n.removeprefix("model/"))
    assert len(d) == len(names)
    assert set(d["status"]) == {"identical"}, d[d["status"] != "identical"][["name", "status"]]


def test_dcp_written_safetensors_pieces_carry_their_offsets():
    gt = ground_truth("llm/dcp_hf/ground_truth.json")
    cat = cv.open(corpus_path("llm/dcp_hf"))
    sh = cat.shards
    sharded = [f for f in gt["files"] if "/sharded/" in f or f.startswith("sharded/")]
    assert sharded, "the corpus holds DCP-sharded safetensors"
    pieces = sh[sh["file"].str.contains("/sharded/")]
    assert len(pieces) and (pieces["placement"] != "").all()
    # pieces of one logical tensor tile it: their element counts add up to the full tensor
    v = cat.variables.set_index(["serial", "node", "name"])
    for (serial, name), grp in pieces.groupby(["serial", "name"]):
        full = v.loc[(serial, "", name), "numel"]
        assert sum(int(np.prod(s)) for s in grp["shape"]) == full, name
