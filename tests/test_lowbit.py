"""Low-bit safetensors (DESIGN.md §3b): sub-byte and FP8 dtypes, FP8 weight + scale groups and
MXFP4 blocks + scales as one dequantized row. Expected values come from the corpus ground
truth (HF's finegrained-FP8 and transformers' MXFP4 code paths) or are computed by hand."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv

FP8 = "llm/lowbit/fp8_block"
MXFP4 = "llm/lowbit/mxfp4"


def safetensors(path, tensors: dict[str, tuple[str, tuple, bytes]]) -> None:
    """Write ``name -> (dtype code, shape, raw bytes)`` as a safetensors file by hand."""
    head, at, data = {}, 0, b""
    for name, (code, shape, raw) in tensors.items():
        head[name] = {"dtype": code, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
        data += raw
    h = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= max(1e-4, 1e-4 * abs(b))


def test_sub_byte_and_fp8_dtypes_read_as_ml_dtypes(tmp_path):
    f4 = np.array([0.5, -1.0, 6.0, 0.0, -0.5], dtype=ml_dtypes.float4_e2m1fn)
    codes = f4.view(np.uint8)
    packed4 = bytes([codes[0] | codes[1] << 4, codes[2] | codes[3] << 4, codes[4]])
    f6 = np.array([1.0, -0.5, 3.0, 0.25], dtype=ml_dtypes.float6_e2m3fn)
    bits = "".join(format(int(c), "06b")[::-1] for c in f6.view(np.uint8))  # LSB first
    packed6 = bytes(int(bits[i : i + 8][::-1], 2) for i in range(0, 24, 8))
    e3m2 = np.array([2.0, -4.0, 0.5, 1.5], dtype=ml_dtypes.float6_e3m2fn)
    bits = "".join(format(int(c), "06b")[::-1] for c in e3m2.view(np.uint8))
    packed_e3m2 = bytes(int(bits[i : i + 8][::-1], 2) for i in range(0, 24, 8))
    e8m0 = np.array([1.0, 2.0, 0.25], dtype=ml_dtypes.float8_e8m0fnu)
    fnuz = np.array([1.5, -2.0], dtype=ml_dtypes.float8_e4m3fnuz)
    e5fnuz = np.array([0.5, 4.0], dtype=ml_dtypes.float8_e5m2fnuz)
    safetensors(tmp_path / "w.safetensors", {
        "f4": ("F4", (5,), packed4), "f6": ("F6_E2M3", (2, 2), packed6),
        "e3m2": ("F6_E3M2", (4,), packed_e3m2), "e8m0": ("F8_E8M0", (3,), e8m0.tobytes()),
        "fnuz": ("F8_E4M3FNUZ", (2,), fnuz.tobytes()), "e5": ("F8_E5M2FNUZ", (2,), e5fnuz.tobytes()),
    })  # fmt: skip
    cat = cv.open(tmp_path / "w.safetensors")
    v = cat.variables.set_index("name")
    assert v.loc["f4", "dtype"] == "float4_e2m1fn" and v.loc["f4", "nbytes"] == 3
    assert v.loc["f6", "dtype"] == "float6_e2m3fn" and v.loc["f6", "nbytes"] == 3
    assert v["error"].isna().all()
    assert cat.read("f4").astype(np.float32).tolist() == [0.5, -1.0, 6.0, 0.0, -0.5]
    assert cat.read("f6").astype(np.float32).tolist() == [[1.0, -0.5], [3.0, 0.25]]
    assert cat.read("e3m2").astype(np.float32).tolist() == [2.0, -4.0, 0.5, 1.5]
    assert cat.read("e8m0").astype(np.float32).tolist() == [1.0, 2.0, 0.25]
    assert cat.read("fnuz").astype(np.float32).tolist() == [1.5, -2.0]
    assert cat.read("e5").astype(np.float32).tolist() == [0.5, 4.0]
    assert cat.verify().query("severity == 'error'").empty


def test_packed_dtype_with_wrong_byte_count_is_an_error_row(tmp_path):
    safetensors(tmp_path / "w.safetensors", {"f4": ("F4", (5,), b"\x00\x00")})
    row = cv.open(tmp_path / "w.safetensors").variables.iloc[0]
    assert "needs 3 bytes" in row["error"]


def test_fp8_block_groups_dequantize_as_the_ground_truth():
    gt = ground_truth(f"{FP8}/ground_truth.json")
    cat = cv.open(corpus_path(FP8))
    v = cat.variables.set_index("name")
    assert not v.index.str.endswith("_scale_inv").any()  # the scales are pieces, not rows
    stored = {t["key"]: t for t in gt["files"]["model.safetensors"]["tensors"]}
    for e in gt["logical"]["none"]:
        row = v.loc[e["name"]]
        assert row["shape"] == tuple(e["shape"]) and row["dtype"] == e["dtype"]
        got = cat.read(e["name"])
        assert close(float(got.astype(np.float64).sum()), e["sum"]), e["name"]
        if e.get("from"):
            assert row["quant"] == "fp8-block128"
            raw = cat.read(e["name"], dequantize=False)
            assert raw.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
            assert close(float(raw.astype(np.float64).sum()), stored[e["name"]]["sum"])
        else:
            assert row["quant"] is None
    sh = cat.shards.set_index("stored_name")
    scale = sh.loc["model.layers.1.mlp.up_proj.weight_scale_inv"]
    assert scale["role"] == "scale" and scale["name"] == "model.layers.1.mlp.up_proj.weight"


def test_fp8_partial_edge_blocks_by_hand(tmp_path):
    """A 130 x 129 weight: 2 x 2 blocks of 128, the last row and column blocks partial."""
    w = (np.arange(130 * 129) % 7 - 3).astype(np.float32).reshape(130, 129)
    s = np.array([[1.0, 2.0], [4.0, 0.5]], dtype=np.float32)
    fp8 = w.astype(ml_dtypes.float8_e4m3fn)
    safetensors(tmp_path / "m.safetensors", {
        "l.weight": ("F8_E4M3", w.shape, fp8.tobytes()),
        "l.weight_scale_inv": ("F32", s.shape, s.tobytes()),
        "t.weight": ("F8_E4M3", (2, 2), fp8[:2, :2].tobytes()),
        "t.weight_scale_inv": ("F32", (), np.float32(0.25).tobytes()),
        "c.weight": ("F8_E4M3", (2, 3), fp8[:2, :3].tobytes()),
        "c.weight_scale": ("F32", (2, 1), np.array([[2.0], [3.0]], np.float32).tobytes()),
    })  # fmt: skip
    cat = cv.open(tmp_path / "m.safetensors")
    want = w.copy()
    want[:128, :128] *= 1.0
    want[:128, 128:] *= 2.0
    want[128:, :128] *= 4.0
    want[128:, 128:] *= 0.5
    np.testing.assert_array_equal(cat.read("l.weight"), want)
    np.testing.assert_array_equal(cat.read("t.weight"), w[:2, :2] * 0.25)
    np.testing.assert_array_equal(cat.read("c.weight"), w[:2, :3] * np.array([[2.0], [3.0]]))
    q = cat.variables.set_index("name")["quant"]
    assert (q["l.weight"], q["t.weight"], q["c.weight"]) == ("fp8-block128", "fp8-tensor",
                                                             "fp8-channel")  # fmt: skip


def test_mxfp4_groups_dequantize_as_the_ground_truth():
    gt = ground_truth(f"{MXFP4}/ground_truth.json")
    cat = cv.open(corpus_path(MXFP4))
    v = cat.variables.set_index("name")
    assert not v.index.str.endswith(("_blocks", "_scales")).any()
    for e in gt["logical"]["none"]:
        row = v.loc[e["name"]]
        assert row["shape"] == tuple(e["shape"]) and row["dtype"] == e["dtype"]
        got = float(cat.read(e["name"]).astype(np.float64).sum())
        assert close(got, e["sum"]), e["name"]
    assert v.loc["model.layers.1.mlp.experts.down_proj", "quant"] == "mxfp4"
    blocks = cat.read("model.layers.1.mlp.experts.down_proj", dequantize=False)
    assert blocks.dtype == np.uint8 and blocks.shape == (3, 96, 2, 16)


def test_mxfp4_by_hand(tmp_path):
    """One expert, one row, one group of 32 values: byte 0x21 holds 0.5 (low nibble 1) then
    1.0 (high nibble 2); scale 128 multiplies by 2; then the last two axes swap."""
    blocks = np.zeros((1, 1, 1, 16), np.uint8)
    blocks[0, 0, 0, 0] = 0x21
    blocks[0, 0, 0, 1] = 0xF9  # -0.5 (low 9), -6.0 (high 15)
    scales = np.full((1, 1, 1), 128, np.uint8)
    safetensors(tmp_path / "m.safetensors", {
        "e.w_blocks": ("U8", blocks.shape, blocks.tobytes()),
        "e.w_scales": ("U8", scales.shape, scales.tobytes()),
    })  # fmt: skip
    cat = cv.open(tmp_path / "m.safetensors")
    out = cat.read("e.w")
    assert out.shape == (1, 32, 1)
    assert out[0, :4, 0].tolist() == [1.0, 2.0, -1.0, -12.0]
    assert not out[0, 4:, 0].any()


@pytest.mark.parametrize("tree", [FP8, MXFP4])
def test_quantized_trees_export_as_stored_and_dequantized(tmp_path, tree):
    gt = ground_truth(f"{tree}/ground_truth.json")
    cat = cv.open(corpus_path(tree))
    cat.export(to=tmp_path / "stored")
    again = cv.open(tmp_path / "stored")
    cat.export(to=tmp_path / "f32", dequantize=True)
    f32 = cv.open(tmp_path / "f32")
    for e in gt["logical"]["none"]:
        for c in (again, f32):
            got = float(c.read(e["name"]).astype(np.float64).sum())
            assert close(got, e["sum"]), e["name"]
        if e.get("from"):
            assert again.variables.set_index("name").loc[e["name"], "quant"] is not None
            assert f32.variables.set_index("name").loc[e["name"], "quant"] is None
