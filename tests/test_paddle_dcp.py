"""Paddle distributed checkpoints: the corpus tree and hand-built multi-rank trees."""

from __future__ import annotations

import pickle
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv

GT = ground_truth("paddle/ground_truth.json")["files"]
MODULE = "paddle.distributed.flex_checkpoint.dcp.metadata"
FAKE = "_ckptview_test_dcp_metadata"


def test_corpus_tree(corpus_index):
    tree = next(t for t in corpus_index["trees"] if t["root"] == "paddle/dist_ckpt")
    cat = cv.open(str(corpus_path("paddle", "dist_ckpt")))
    assert cat.layout == "paddle-dcp"
    s = cat.serials
    assert list(s.index) == tree["serials"]
    assert sorted(s.index[s["complete"]]) == tree["complete_serials"]
    assert cat.latest == tree["latest_resumable_serial"]
    for uid in tree["serials"]:
        shapes = GT[f"dist_ckpt/{uid}.metadata"]["shapes"]
        rows = cat.variables[cat.variables["serial"] == uid]
        for e in GT[f"dist_ckpt/0_{uid}.distcp"]["entries"]:
            row = rows[rows["name"] == e["name"]].iloc[0]
            assert (row["node"], row["dtype"], row["shape"]) == (
                "rank0", e["dtype"], tuple(e["shape"])
            )  # fmt: skip
            assert row["file"].endswith(f"0_{uid}.distcp")
            arr = cat.read(e["name"], serial=uid)
            assert float(arr.astype(np.float64).sum()) == pytest.approx(e["sum"], rel=1e-6)
            info = cat.variable(e["name"], serial=uid, node="rank0")
            assert info.attrs["global_shape"] == tuple(shapes[e["name"]])
            assert info.attrs["param_name"] == e["param_name"]


@dataclass
class LocalTensorMetadata:
    global_offset: tuple
    local_shape: tuple
    dtype: str
    global_shape: tuple


@dataclass(frozen=True)
class LocalTensorIndex:
    tensor_key: str
    global_offset: tuple


@dataclass
class Metadata:
    state_dict_metadata: dict
    storage_metadata: dict
    flat_mapping: dict


def _metadata_bytes(shards: dict[str, list[tuple[int, tuple, tuple, str]]], gshape: dict) -> bytes:
    """A Metadata pickle naming Paddle's real class path (no paddle needed: the classes are
    pickled from a stand-in module whose name is then rewritten in the GLOBAL opcodes)."""
    module = types.ModuleType(FAKE)
    for cls in (LocalTensorMetadata, LocalTensorIndex, Metadata):
        cls.__module__ = FAKE
        setattr(module, cls.__name__, cls)
    sys.modules[FAKE] = module
    try:
        sdm, storage = {}, {}
        for key, pieces in shards.items():
            for rank, offset, local, dtype in pieces:
                sdm.setdefault(key, []).append(
                    LocalTensorMetadata(offset, local, dtype, gshape[key])
                )
                storage[LocalTensorIndex(key, offset)] = f"{rank}_{UID}.distcp"
        data = pickle.dumps(Metadata(sdm, storage, {}), protocol=2)
        return data.replace(f"c{FAKE}\n".encode(), f"c{MODULE}\n".encode())
    finally:
        del sys.modules[FAKE]


UID = 3


def _make_tree(tmp_path, drop_rank1: bool = False):
    w = np.arange(32, dtype="f4").reshape(8, 4)
    bf = np.array([0x3F80, 0x4000, 0xC000, 0x0000], dtype=np.uint16)  # 1, 2, -2, 0 in bf16
    shards = {
        "w": [(0, (0, 0), (4, 4), "float32"), (1, (4, 0), (4, 4), "float32")],
        "bf": [(0, (0,), (4,), "bfloat16")],
    }
    (tmp_path / f"{UID}.metadata").write_bytes(_metadata_bytes(shards, {"w": (8, 4), "bf": (4,)}))
    rank0 = {"w": w[:4], "bf": bf, "StructuredToParameterName@@": {"w": "linear_0.w_0"}}
    (tmp_path / f"0_{UID}.distcp").write_bytes(pickle.dumps(rank0, protocol=4))
    if not drop_rank1:
        (tmp_path / f"1_{UID}.distcp").write_bytes(pickle.dumps({"w": w[4:]}, protocol=4))
    (tmp_path / "1.metadata").write_bytes(b"\x80\x04garbage")  # a broken older serial
    (tmp_path / "0_1.distcp").write_bytes(pickle.dumps({"w": w}, protocol=4))
    return w


def test_multi_rank_tree(tmp_path):
    w = _make_tree(tmp_path)
    cat = cv.open(str(tmp_path))
    s = cat.serials
    assert list(s.index) == [1, UID]
    assert s.loc[UID, "complete"] and not s.loc[1, "complete"]
    assert s.loc[1, "error"]
    assert cat.latest == UID
    assert s.loc[UID, "nodes"] == ("rank0", "rank1")
    # the two ranks' shards of w are one logical tensor (DESIGN 3b), its pieces in cat.shards
    row = cat.variables.set_index(["serial", "name"]).loc[(UID, "w")]
    assert row["node"] == "" and row["shape"] == (8, 4) and row["n_shards"] == 2
    np.testing.assert_array_equal(cat.read("w"), w)
    sh = cat.shards
    pieces = sh[(sh["serial"] == UID) & (sh["name"] == "w")].set_index("node")
    assert pieces.loc["rank1", "offsets"] == (4, 0) and pieces.loc["rank1", "shape"] == (4, 4)
    bf = cat.variable("bf", node="rank0")
    assert bf.dtype == "bfloat16" and "dtype_guessed" not in bf.attrs
    assert cat.read("bf").astype(np.float32).tolist() == [1.0, 2.0, -2.0, 0.0]


def test_missing_rank_file_makes_the_serial_incomplete(tmp_path):
    _make_tree(tmp_path, drop_rank1=True)
    cat = cv.open(str(tmp_path))
    assert not cat.serials.loc[UID, "complete"]
    assert "1_3.distcp" in cat.serials.loc[UID, "error"]
    assert cat.latest is None
    with pytest.raises(ValueError, match="a piece is missing"):
        cat.read("w", serial=UID)


def test_hostile_metadata_is_refused(tmp_path):
    import os

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'PWNED'}",)

    (tmp_path / "0.metadata").write_bytes(pickle.dumps(Evil(), protocol=4))
    (tmp_path / "0_0.distcp").write_bytes(pickle.dumps({"w": Evil()}, protocol=4))
    cat = cv.open(str(tmp_path))
    assert not cat.serials.loc[0, "complete"]
    assert "refused global" in cat.serials.loc[0, "error"]
    assert cat.variables["error"].str.contains("refused global").all()
    assert not (tmp_path / "PWNED").exists()
