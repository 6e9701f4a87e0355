"""The bundled demo tree: bytes as Paddle wrote them (spec §1, §3, §4), and as ckptview reads them."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

import ckptview as cv
from ckptview.cli import main
from ckptview.demo import (
    TABLE,
    lod_tensor_bytes,
    lookup_shards,
    model_arrays,
    selected_rows_bytes,
    shapes,
    write_demo,
)

SERIALS = 6


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo(tmp_path_factory.mktemp("demo") / "tree", serials=SERIALS)


@pytest.fixture(scope="module")
def cat(demo):
    return cv.open(demo.root)


# -- the bytes -----------------------------------------------------------------------------
def test_lod_tensor_stream_bytes():
    lr = lod_tensor_bytes(np.array([0.01], dtype="float32"))
    assert lr == bytes(16) + bytes.fromhex("04000000 0805 1001") + struct.pack("<f", 0.01)
    w = lod_tensor_bytes(np.zeros((4, 8), dtype="float32"))
    assert w[:26] == bytes(16) + bytes.fromhex("06000000 0805 1004 1008") and len(w) == 154
    lod = lod_tensor_bytes(np.zeros((5, 2), "float32"), lod=[[0, 2, 5]])
    assert lod[:4] == bytes(4) and struct.unpack("<QQ", lod[4:20]) == (1, 24)
    assert struct.unpack("<3Q", lod[20:44]) == (0, 2, 5) and len(lod) == 98
    big = lod_tensor_bytes(np.zeros((300,), "int64"))  # varint dims: 300 = ac 02
    assert big[16:25] == bytes.fromhex("05000000 0803 10ac02")


def test_selected_rows_stream_bytes():
    data = selected_rows_bytes(np.array([3, 17]), 100, np.ones((2, 4), "float32"))
    assert struct.unpack("<IQ2qq", data[:36]) == (0, 2, 3, 17, 100)
    assert data[36:50] == bytes.fromhex("00000000 06000000 0805 1002 1004")
    assert len(data) == 50 + 32


def test_tree_layout_on_disk(demo):
    root = demo.root
    assert sorted(p.name for p in root.iterdir()) == [f"checkpoint_{n}" for n in range(SERIALS)]
    for s in demo.serials:
        d = root / f"checkpoint_{s.serial}"
        for trainer in ("trainer_0", "trainer_1"):
            assert (d / trainer / "epoch_id").read_bytes() == str(s.epoch).encode()
            assert (d / trainer / "step_id").read_bytes() == str(s.step).encode()
            assert (d / trainer / "_SUCCESS").exists()
        success = d / "__model__" / "_SUCCESS"
        assert success.exists() == s.complete
        assert (d / "__lookup_table__").exists() == s.complete
        if s.complete:
            stamp = success.read_text()  # time.ctime(): 24 characters, no newline
            assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", stamp)
            assert success.stat().st_mtime == pytest.approx(s.timestamp.timestamp())
            files = {p.name for p in (d / "__lookup_table__").iterdir()}
            assert files == {f"{TABLE}_0", f"{TABLE}_1"}
    last = demo.serials[-1]
    assert not last.complete and last.truncated
    assert all(s.complete for s in demo.serials[:-1])
    stamps = [s.timestamp for s in demo.serials]
    assert stamps == sorted(stamps) and stamps[0].year == 2018


def test_writer_is_deterministic(tmp_path):
    a = write_demo(tmp_path / "a", serials=3)
    b = write_demo(tmp_path / "b", serials=3)
    files_a = sorted(p.relative_to(a.root) for p in a.root.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b.root) for p in b.root.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (a.root / rel).read_bytes() == (b.root / rel).read_bytes()
        assert (a.root / rel).stat().st_mtime == (b.root / rel).stat().st_mtime


def test_training_dynamics():
    first, last = model_arrays(0), model_arrays(4)
    assert np.array_equal(first["pos_emb.w_0"], last["pos_emb.w_0"])  # frozen
    moved = np.linalg.norm(last["fc_1.w_0"] - first["fc_1.w_0"]) / np.linalg.norm(first["fc_1.w_0"])
    assert moved > 0.5  # the head moves a lot
    assert last["learning_rate_0"][0] < first["learning_rate_0"][0]
    assert (last["fc_0.w_0_moment2_0"] >= 0).all()
    assert len(lookup_shards(4)[0][0]) > len(lookup_shards(0)[0][0])  # the table grows
    assert model_arrays(2, scale=3)["fc_0.w_0"].shape == (768, 64)


# -- through ckptview.open -----------------------------------------------------------------
def test_opens_as_paddle_fluid(cat, demo):
    assert cat.layout == "paddle-fluid"
    df = cat.serials
    assert list(df.index) == list(range(SERIALS))
    assert df["complete"].tolist() == [s.complete for s in demo.serials]
    assert cat.latest == demo.latest == SERIALS - 2
    assert df["latest"].tolist() == [n == SERIALS - 2 for n in range(SERIALS)]
    assert df["epoch"].tolist() == [s.epoch for s in demo.serials]
    assert df["step"].tolist() == [s.step for s in demo.serials]
    for s in demo.serials:
        assert set(df.loc[s.serial, "nodes"]) >= {"trainer_0", "trainer_1"}
    assert df.loc[SERIALS - 1, "error"]  # the file cut short by the crash


def test_timestamps_are_the_markers(cat, demo):
    for s in demo.serials[:-1]:
        assert abs(cat.serials.loc[s.serial, "timestamp"] - s.timestamp).total_seconds() < 1.5


def test_variables_listed(cat, demo):
    df = cat.variables
    names = set(shapes())
    for s in demo.serials[:-1]:
        rows = df[(df["serial"] == s.serial) & (df["node"] == "")]
        assert names <= set(rows["name"])
        fc = rows[rows["name"] == "fc_0.w_0"].iloc[0]
        assert fc["dtype"] == "float32" and fc["shape"] == (256, 64) and fc["nbytes"] == 65536
    crashed = df[df["serial"] == SERIALS - 1]
    assert set(demo.serials[-1].variables) <= set(crashed["name"])
    assert not crashed["name"].isin([n for n in names if n not in demo.serials[-1].variables
                                     and n != demo.serials[-1].truncated]).any()  # fmt: skip


def test_read_equals_what_was_written(cat, demo):
    for s in demo.serials[:-1]:
        expected = model_arrays(s.serial)
        for name in ["fc_0.w_0", "fc_1.w_0_moment1_0", "learning_rate_0", "@LR_DECAY_COUNTER@",
                     "pos_emb.w_0"]:  # fmt: skip
            got = cat.read(name, serial=s.serial)
            assert got.dtype == expected[name].dtype
            np.testing.assert_array_equal(got, expected[name])
    latest = cat.load()
    for name, arr in model_arrays(demo.latest).items():
        np.testing.assert_array_equal(latest[name], arr)


def test_lookup_table_shards_listed(cat, demo):
    df = cat.variables
    rows = df[(df["serial"] == 0) & (df["kind"] == "lookup_table")]
    assert len(rows) == 2
    shards = lookup_shards(0)
    assert sorted(rows["numel"]) == sorted(len(r) * v.shape[1] for r, _, v in shards.values())


def test_cli_demo(tmp_path, capsys):
    assert main(["demo", str(tmp_path / "t"), "--serials", "3", "--scale", "2"]) == 0
    assert "3 serials (2 complete, latest 1)" in capsys.readouterr().out
    assert main(["demo", str(tmp_path / "t")]) == 2  # refuses a non-empty directory
    assert "not an empty directory" in capsys.readouterr().err
    assert main(["ls", str(tmp_path / "t"), "--json"]) == 0
