"""Checkpoints from public repositories' test data (../shared/wild, $CKPTVIEW_WILD), each with
the tensors its own framework finds: the wild acceptance run in full, and the formats this
set brought in (TF V1 TensorSlice tables, TF Serving SavedModels, pickled modules, Python 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, wild_path

import ckptview as cv

#: trees ckptview does not read yet
KNOWN_GAPS: set[str] = set()


def _truth() -> list[dict]:
    return json.loads(wild_path("ground_truth.json").read_text())


def test_wild_acceptance():
    """``check.py`` over all 48 roots: no crash, every root opens, and every tensor matches
    except those of the known gaps."""
    proc = subprocess.run([sys.executable, str(wild_path("check.py"))], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)  # fmt: skip
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"wild: (\d+)/(\d+) tensors matched, (\d+)/(\d+) trees opened, (\d+) crashes",
                     last)  # fmt: skip
    assert m, proc.stdout[-2000:] + proc.stderr[-2000:]
    matched, total, opened, roots, crashes = map(int, m.groups())
    gaps = sum(len(e.get("tensors", [])) for e in _truth() if e["root"] in KNOWN_GAPS)
    assert crashes == 0 and opened == roots
    assert matched == total - gaps, last
    mismatched = {
        line.split()[1] for line in proc.stdout.splitlines() if line.startswith("MISMATCH")
    }
    assert mismatched == KNOWN_GAPS


@pytest.mark.parametrize("root", ["files/tf-serving/session_bundle_half_plus_two/00000123",
                                  "files/tf-serving/bad_half_plus_two/00000123"])  # fmt: skip
def test_tf_v1_tensorslice_tables(root):
    entry = next(e for e in _truth() if e["root"] == root)
    cat = cv.open(wild_path(root), cache=False)
    v = cat.variables.set_index("name")
    for t in entry["tensors"]:
        name = f"{t['file'].rsplit('/', 1)[-1]}/{t['name']}"  # the files layout's file prefix
        row = v.loc[name]
        assert (
            row["dtype"] == t["dtype"]
            and row["shape"] == tuple(t["shape"])
            and row["error"] is None
        )
        assert float(np.sum(cat.read(name))) == pytest.approx(t["sum"])
    codec = cat.files.set_index("role").loc["data", "codec"]
    assert "tf-v1" in set(np.atleast_1d(codec))


def test_tf_v1_listing_reads_each_byte_at_most_once():
    """Listing a V1 table stops after its first entry (the meta); values are read on demand."""
    src = wild_path("files/tf-serving/bad_half_plus_two/00000123/export")
    cat = cv.open(src, cache=False)
    assert set(cat.variables["name"]) == {"Variable", "Variable_1"}
    assert cat.storage.counters.bytes_read <= src.stat().st_size
    assert float(cat.read("Variable_1")) == 2.0


def test_tf_serving_savedmodel_with_snappy_index():
    """TF Serving's SavedModel keeps its variables in a bundle whose ``.index`` blocks are
    snappy-compressed: recognized by the table footer, not the first bytes."""
    root = "files/tf-serving/saved_model_half_plus_two_cpu"
    entry = next(e for e in _truth() if e["root"] == root)
    cat = cv.open(wild_path(root), cache=False)
    names = set(cat.variables["name"])
    assert {t["name"] for t in entry["tensors"]} <= {n.split("/")[-1] for n in names} | names
    assert cat.serials["loadable"].all()


def test_tf_serving_base_path_serials_are_versions(tmp_path):
    """A model base path: its version directories are the serials, the highest that is
    complete is served; a version still being written (no saved_model.pb) is not."""
    import shutil

    base = tmp_path / "half_plus_two"
    src = wild_path("files/tf-serving/saved_model_half_plus_two_cpu/00000123")
    shutil.copytree(src, base / "00000123")
    shutil.copytree(src, base / "00000124")
    shutil.copytree(src / "variables", base / "00000125" / "variables")  # no graph yet
    cat = cv.open(base, cache=False)
    assert cat.layout == "tf-serving"
    s = cat.serials
    assert list(s.index) == [123, 124, 125] and s["complete"].tolist() == [True, True, False]
    assert cat.latest == 124
    entry = next(
        e for e in _truth() if e["root"] == "files/tf-serving/saved_model_half_plus_two_cpu"
    )
    for t in entry["tensors"]:
        assert float(np.sum(cat.read(t["name"], serial=124))) == pytest.approx(t["sum"])
    markers = cat.files[cat.files["role"] == "marker"]["path"]
    assert sorted(m.rsplit("/", 2)[-2] for m in markers) == ["00000123", "00000124"]


def test_t5x_checkpoint(tmp_path):
    """msgpack ``checkpoint`` + zarr arrays without ``.zarray`` (the tensorstore spec in the
    msgpack carries the metadata; gzip chunks); inline flax scalars."""
    import shutil

    root = "files/t5x/tiny_t5"
    entry = next(e for e in _truth() if e["root"] == root)
    tree = tmp_path / "t5x"
    shutil.copytree(wild_path(root), tree)
    shutil.copytree(tree / "checkpoint_1", tree / "checkpoint_2")
    shutil.copytree(tree / "checkpoint_1", tree / "checkpoint_3")
    (tree / "checkpoint_3" / "checkpoint").unlink()  # still being written: not a serial yet
    cat = cv.open(tree, cache=False)
    assert cat.layout == "t5x" and list(cat.serials.index) == [1, 2] and cat.latest == 2
    v = cat.variables[cat.variables["serial"] == 2].set_index("name")
    # listing read the two msgpack files (their head, then whole), never an array chunk
    msgpacks = 2 * (tree / "checkpoint_1" / "checkpoint").stat().st_size
    assert cat.storage.counters.bytes_read <= 2 * msgpacks
    for t in entry["tensors"]:
        assert v.loc[t["name"], "dtype"] == t["dtype"]
        assert v.loc[t["name"], "shape"] == tuple(t["shape"])
        assert float(np.sum(cat.read(t["name"]))) == pytest.approx(t["sum"])


def test_msgpack_refuses_claims_beyond_its_bytes():
    from ckptview.formats.msgpack import DecodeError, unpackb

    assert unpackb(b"\x82\xa1a\x01\xa1b\x92\xc3\xc0") == {"a": 1, "b": [True, None]}
    for bad in (b"\xdd\xff\xff\xff\xff", b"\xc6\x7f\xff\xff\xff", b"\xdb\x00\x00\x01\x00ab",
                b"\x91" * 300 + b"\xc0", b"\xc1", b"\x01\x02"):  # fmt: skip
        with pytest.raises(DecodeError):
            unpackb(bad)
