"""paddle.save / paddle.static.save pickles: the corpus, the tensor forms, bad input, laziness."""

from __future__ import annotations

import builtins
import os
import pickle

import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.codecs.paddle_pickle import PaddlePickleCodec
from ckptview.io import Storage

GT = ground_truth("paddle/ground_truth.json")["files"]
PICKLES = sorted(
    k for k, v in GT.items()
    if v.get("format", "").startswith("pickle_") and v["format"] != "pickle_dcp_metadata"
    and not k.startswith("dist_ckpt/")
)  # fmt: skip


class _Reduce:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _rows(cat) -> dict:
    return {r.name: r for r in cat.variables.itertuples()}


@pytest.mark.parametrize("rel", PICKLES)
def test_corpus_pickles_match_ground_truth(rel):
    cat = cv.open(str(corpus_path("paddle", rel)))
    assert cat.files["error"].isna().all()
    rows = _rows(cat)
    for e in GT[rel]["entries"]:
        row = rows[e["name"]]
        assert (row.dtype, row.shape) == (e["dtype"], tuple(e["shape"])), e["name"]
        arr = cat.read(e["name"])
        assert str(arr.dtype) == e["dtype"]
        total = np.asarray(arr).astype(np.complex128).sum()
        assert total.real == pytest.approx(e["sum"], rel=1e-6)
        assert total.imag == pytest.approx(e.get("sum_imag", 0.0), rel=1e-6, abs=1e-9)
        if "param_name" in e:
            assert cat.variable(e["name"]).attrs["param_name"] == e["param_name"]
    for key, value in GT[rel].get("non_tensor_items", {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert cat.read(key).item() == value
    assert not any("StructuredToParameterName@@" in n for n in rows)


def _write(tmp_path, name, obj, protocol=4):
    path = tmp_path / name
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


@pytest.mark.parametrize("protocol", [2, 4])
def test_scan_of_a_large_array_reads_a_small_fraction(tmp_path, protocol):
    big = np.random.default_rng(0).standard_normal((1024, 1024)).astype("f4")  # 4 MiB
    small = np.arange(7, dtype="i8")
    path = _write(tmp_path, "big.pdparams", {"w": big, "b": small,
                                              "StructuredToParameterName@@": {"w": "fc.w_0"}},
                  protocol)  # fmt: skip
    cat = cv.open(str(path))
    rows = _rows(cat)
    assert rows["w"].shape == (1024, 1024) and rows["w"].dtype == "float32"
    assert cat.storage.counters.bytes_read < os.path.getsize(path) // 20
    np.testing.assert_array_equal(cat.read("w"), big)
    np.testing.assert_array_equal(cat.read("b"), small)
    assert cat.variable("w").attrs["param_name"] == "fc.w_0"


def test_tensor_forms_and_old_protocols(tmp_path):
    a = np.arange(6, dtype="f4").reshape(2, 3)
    nested = {
        "model": {"w": ("linear_0.w_0", a)},  # eager Tensor form
        "static": _Reduce(builtins.eval, "data", {"data": a * 2}),  # DenseTensor form
        "epoch": 3,
    }
    for protocol in (0, 1, 2, 4):
        cat = cv.open(str(_write(tmp_path, f"n{protocol}.pdckpt", nested, protocol)))
        np.testing.assert_array_equal(cat.read("model/w"), a)
        assert cat.variable("model/w").attrs["param_name"] == "linear_0.w_0"
        np.testing.assert_array_equal(cat.read("static"), a * 2)
        assert cat.read("epoch").item() == 3


def test_big_param_split_is_reassembled(tmp_path):
    w = np.arange(20, dtype="f4").reshape(4, 5)
    flat = w.reshape(-1)
    obj = {
        "w@@.0": flat[:12], "w@@.1": flat[12:],
        "UnpackBigParamInfor@@": {"w": {"OriginShape": [4, 5], "slices": ["w@@.0", "w@@.1"]}},
    }  # fmt: skip
    cat = cv.open(str(_write(tmp_path, "split.pdparams", obj, 2)))
    assert list(cat.variables["name"]) == ["w"]
    np.testing.assert_array_equal(cat.read("w"), w)


def test_uint16_is_bfloat16_unless_a_dtype_map_says_otherwise(tmp_path):
    bits = np.array([0x3F80, 0x4000], dtype=np.uint16)  # bfloat16 1.0, 2.0
    path = _write(tmp_path, "lowp.pdparams", {"bf": bits, "u": bits})
    storage, p = Storage.from_url(str(path))
    codec = PaddlePickleCodec()
    blob = storage.blob(p)
    guessed = {v.name: v for v in codec.list_variables(blob, {})}
    assert guessed["bf"].dtype == "bfloat16" and guessed["bf"].attrs["dtype_guessed"]
    assert codec.read(blob, guessed["bf"]).astype(np.float32).tolist() == [1.0, 2.0]
    known = {v.name: v for v in codec.list_variables(blob, {"dtypes": {"u": "uint16"}})}
    assert known["u"].dtype == "uint16" and known["bf"].dtype == "bfloat16"


def test_hostile_pickle_is_refused(tmp_path):
    marker = tmp_path / "PWNED"
    path = _write(tmp_path, "evil.pdparams", {"w": _Reduce(os.system, f"touch {marker}")}, 2)
    cat = cv.open(str(path))
    assert "refused global posix.system" in cat.variables["error"].iloc[0]
    assert not marker.exists()


def test_bad_files_become_error_rows(tmp_path):
    good = corpus_path("paddle", "dygraph/model.pdparams").read_bytes()
    cases = {
        "cut.pdparams": good[: len(good) // 2],
        "zero.pdparams": b"",
        "junk.pdparams": b"\x80\x04" + os.urandom(3000),
        "huge.pdparams": b"\x80\x04\x8e" + (1 << 42).to_bytes(8, "little") + b"\x00" * 64,
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        cat = cv.open(str(tmp_path / name))
        assert cat.variables["error"].notna().any(), name
        assert cat.storage.counters.bytes_read <= max(len(data), 4096) * 2
