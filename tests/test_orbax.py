"""Orbax (JAX) trees: layout, OCDBT/zarr metadata listing and value reads, against the corpus."""

from __future__ import annotations

import builtins
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv
from ckptview.formats.ocdbt import OcdbtIndex
from ckptview.io import Storage
from ckptview.layouts.orbax import STEP_RE, OrbaxLayout
from ckptview.tree import Tree

TF_RUNS = ["run1", "run2_policy", "run3_noocdbt", "run4_inprogress"]
MODERN_RUNS = ["run_best", "run_tmp"]
TREES = [f"tf_orbax/orbax/{r}" for r in TF_RUNS] + [f"modern/orbax/{r}" for r in MODERN_RUNS]


@pytest.fixture(scope="module")
def tf_gt() -> dict:
    return ground_truth("tf_orbax/orbax/ground_truth.json")


@pytest.fixture(scope="module")
def index() -> dict:
    trees = ground_truth("INDEX.json")["trees"]
    return {t["root"]: t for t in trees if t["family"] == "orbax"}


def _row(cat, serial: int, name: str):
    df = cat.variables
    hit = df[(df["serial"] == serial) & (df["name"] == name)]
    assert len(hit) == 1, f"{name}@{serial}: {len(hit)} rows"
    return hit.iloc[0]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 * max(1.0, abs(a), abs(b))


@pytest.mark.parametrize("run", TF_RUNS)
def test_tf_orbax_arrays_match_ground_truth(run, tf_gt):
    cat = cv.open(str(corpus_path("tf_orbax/orbax", run)))
    assert cat.layout == "orbax"
    steps = tf_gt["runs"][run]["steps"]
    for step, s in steps.items():
        for leaf in s["state"]:
            name = "state/" + leaf["path"].replace(".", "/")
            row = _row(cat, int(step), name)
            assert row["error"] is None or row["error"] != row["error"]  # None or NaN
            assert row["dtype"] == leaf["dtype"], name
            assert row["shape"] == tuple(leaf["shape"]), name
            assert row["nbytes"] == leaf["nbytes"], name
            arr = cat.read(name, serial=int(step))
            assert arr.shape == tuple(leaf["shape"])
            assert _close(float(np.asarray(arr, dtype=np.float64).sum()), leaf["sum"]), name
        if "extra" in s:  # the JsonSave item: one object variable holding the document
            assert cat.read("extra", serial=int(step))[()] == s["extra"]


@pytest.mark.parametrize("run", ["run_best"])
def test_modern_orbax_arrays_match_ground_truth(run):
    gt = ground_truth("modern/ground_truth.json")["files"]
    cat = cv.open(str(corpus_path("modern/orbax", run)))
    items = {k: v for k, v in gt.items() if k.startswith(f"orbax/{run}/") and "tensors" in v}
    assert items
    for key, entry in items.items():
        step, item = key.split("/")[-2:]
        for t in entry["tensors"]:
            row = _row(cat, int(step), f"{item}/{t['key']}")
            assert (row["dtype"], row["shape"]) == (t["dtype"], tuple(t["shape"]))
            assert str(row["file"]).endswith(f"{step}/{item}")
            arr = cat.read(f"{item}/{t['key']}", serial=int(step))
            assert _close(float(np.asarray(arr, dtype=np.float64).sum()), t["sum"])


@pytest.mark.parametrize("root", TREES)
def test_serials_match_index(root, index):
    want = index[root]
    cat = cv.open(str(corpus_path(root)))
    df = cat.serials
    assert list(df.index) == sorted(want["serials"])
    assert sorted(df.index[df["complete"]]) == sorted(want["complete_serials"])
    assert cat.latest == want["latest_resumable_serial"]
    assert int(df["latest"].sum()) == 1
    metrics = cat.metrics
    for key, per in want["per_serial"].items():
        for name, value in per.get("metrics", {}).items():
            got = metrics[(metrics["serial"] == per["serial"]) & (metrics["name"] == name)]
            assert len(got) == 1 and _close(got["value"].iloc[0], value)
        if per["complete"]:  # the commit time recorded in _CHECKPOINT_METADATA
            meta = json.loads((corpus_path(root) / key / "_CHECKPOINT_METADATA").read_text())
            nsecs = meta["commit_timestamp_nsecs"]
            got = df.loc[per["serial"], "timestamp"]
            assert got.value == nsecs and str(got.tz) == "UTC"


def test_tf_orbax_timestamps_and_steps_from_ground_truth(tf_gt):
    for run in ("run1", "run2_policy"):
        df = cv.open(str(corpus_path("tf_orbax/orbax", run))).serials
        for step, s in tf_gt["runs"][run]["steps"].items():
            nsecs = s["_CHECKPOINT_METADATA"]["commit_timestamp_nsecs"]
            assert df.loc[int(step), "timestamp"].value == nsecs
            assert df.loc[int(step), "step"] == int(step)


def test_root_metadata_dir_is_not_a_step():
    cat = cv.open(str(corpus_path("tf_orbax/orbax/run2_policy")))
    assert 0 in cat.serials.index  # ckpt_000000
    assert "custom_metadata" in cat.attrs["root_metadata"]
    assert not cat.variables["file"].str.contains("/metadata/_ROOT").any()


def test_in_progress_step():
    cat = cv.open(str(corpus_path("tf_orbax/orbax/run4_inprogress")))
    row = cat.serials.loc[30]
    assert not row["complete"] and not row["latest"]
    assert "_METADATA" in row["error"]
    df = cat.variables[cat.variables["serial"] == 30]
    assert df["error"].notna().sum() == 1  # the unfinished state item: one error row
    assert cat.read("extra", serial=30)[()]["step"] == 30
    # run_tmp: a fully written step only the tmp name marks as uncommitted
    tmp = cv.open(str(corpus_path("modern/orbax/run_tmp")))
    assert not tmp.serials.loc[200, "complete"]
    assert (tmp.variables["serial"] == 200).sum() == (tmp.variables["serial"] == 100).sum()
    assert "default/" not in " ".join(tmp.variables["name"])  # single-item manager


def test_step_name_formats():
    def parse(name):
        m = STEP_RE.match(name)
        return (int(m["step"]), bool(m["tmp"])) if m else None

    assert parse("10") == (10, False)
    assert parse("ckpt_000010") == (10, False)
    assert parse("my_run_0042") == (42, False)
    assert parse("30.orbax-checkpoint-tmp") == (30, True)
    assert parse("0.orbax-checkpoint-tmp-1703334121930256") == (0, True)
    assert parse("metadata") is None


def test_root_may_be_one_step_dir():
    cat = cv.open(str(corpus_path("tf_orbax/orbax/run1/10")))
    assert cat.layout == "orbax" and list(cat.serials.index) == [10]
    assert cat.read("state/step")[()] == 10


def test_root_may_be_one_item_dir(tf_gt):
    cat = cv.open(str(corpus_path("tf_orbax/orbax/run1/10/state")))
    assert cat.layout == "orbax" and list(cat.serials.index) == [10]
    want = {
        leaf["path"].replace(".", "/"): leaf
        for leaf in tf_gt["runs"]["run1"]["steps"]["10"]["state"]
    }
    assert set(cat.variables["name"]) == set(want)
    assert cat.read("params/counts").sum() == want["params/counts"]["sum"]


def test_ocdbt_keys_match_tensorstore():
    import tensorstore as ts

    state = corpus_path("tf_orbax/orbax/run1/10/state")
    storage, _ = Storage.from_url(str(state))
    ours = set(OcdbtIndex(storage, str(state)).items())
    kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{state}/"}).result()
    theirs = {k.decode() for k in kv.list().result()}
    assert ours == theirs and len(ours) == 14  # spec: ts.ocdbt.dump on run1 lists 14 keys


def test_ocdbt_decoder_on_a_deep_tree(tmp_path):
    """Interior nodes, out-of-line values and several versions, written by tensorstore itself."""
    import tensorstore as ts

    config = {"max_decoded_node_bytes": 300, "max_inline_value_bytes": 8}
    spec = {"driver": "ocdbt", "base": f"file://{tmp_path}/", "config": config}
    kv = ts.KvStore.open(spec).result()
    want = {
        f"p.{i:03d}/{j}": (f"v{i}-{j}" * (i % 4 + 1)).encode() for i in range(60) for j in range(3)
    }
    with ts.Transaction() as txn:
        for key, value in want.items():
            kv.with_transaction(txn)[key] = value
    kv["p.007/1"] = want["p.007/1"] = b"second version"  # a newer generation
    storage, _ = Storage.from_url(str(tmp_path))
    index = OcdbtIndex(storage, str(tmp_path))
    assert index.root_ref()[1] > 1  # the B+tree has interior levels
    entries = index.items()
    assert any(not isinstance(e, bytes) for e in entries.values())  # out-of-line values
    assert {k: index.value(e) for k, e in entries.items()} == want


def test_without_tensorstore(monkeypatch):
    real_import = builtins.__import__

    def no_tensorstore(name, *args, **kwargs):
        if name.split(".")[0] == "tensorstore":
            raise ImportError("No module named 'tensorstore'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorstore)
    cat = cv.open(str(corpus_path("tf_orbax/orbax/run1")))
    assert _row(cat, 10, "state/params/embed/table")["dtype"] == "bfloat16"  # listing needs no ts
    with pytest.raises(ImportError, match=r"ckptview\[orbax\]"):
        cat.read("state/params/dense/kernel")
    plain = cv.open(str(corpus_path("tf_orbax/orbax/run3_noocdbt")))
    assert plain.read("state/params/embed/table").dtype.name == "bfloat16"  # numpy + zstandard


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def test_scan_reads_metadata_only():
    root = corpus_path("tf_orbax/orbax/run3_noocdbt")
    cat = cv.open(str(root))
    # counted from open: detection already scans the layout (its reads count once)
    assert len(cat.variables) and len(cat.serials)
    json_files = [
        p for p in root.rglob("*") if p.name in ("_CHECKPOINT_METADATA", "_METADATA", ".zarray")
    ]
    assert cat.storage.counters.bytes_read == sum(p.stat().st_size for p in json_files)
    # OCDBT: JSON files, the root manifest and the root B+tree node; no process db, no data
    root = corpus_path("tf_orbax/orbax/run1")
    cat = cv.open(str(root))
    cat.storage.counters.reset()
    assert len(cat.variables)
    allowed = [
        p
        for p in root.rglob("*")
        if p.is_file()
        and "ocdbt.process_" not in str(p)
        and p.name not in ("_sharding", "process_0", "commit_success.txt")
    ]
    assert 0 < cat.storage.counters.bytes_read <= sum(p.stat().st_size for p in allowed)
    assert cat.storage.counters.bytes_read < _tree_bytes(root) / 2


def _copy(src: str, tmp_path: Path) -> Path:
    dst = tmp_path / Path(src).name
    shutil.copytree(corpus_path(src), dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def test_garbage_metadata_is_an_error_row(tmp_path):
    root = _copy("tf_orbax/orbax/run1", tmp_path)
    (root / "8/state/_METADATA").write_text("{not json")
    (root / "6/_CHECKPOINT_METADATA").write_text("[1, 2")
    cat = cv.open(str(root))
    bad = cat.variables[(cat.variables["serial"] == 8) & cat.variables["error"].notna()]
    assert len(bad) == 1 and "JSONDecodeError" in bad["error"].iloc[0]
    assert cat.serials.loc[6, "error"].startswith("_CHECKPOINT_METADATA")
    assert (cat.variables["serial"] == 10).sum() == 8 and cat.latest == 10
    assert cat.read("state/step", serial=10)[()] == 10


def test_missing_array_dir_is_an_error_row(tmp_path):
    root = _copy("tf_orbax/orbax/run3_noocdbt", tmp_path)
    shutil.rmtree(root / "3/state/params.counts")
    cat = cv.open(str(root))
    df = cat.variables[cat.variables["serial"] == 3]
    bad = df[df["error"].notna()]
    assert list(bad["name"]) == ["state/params/counts"]
    assert cat.read("state/params/dense/bias").shape == (8,)


def test_corrupt_ocdbt_is_an_error_row(tmp_path):
    root = _copy("tf_orbax/orbax/run1", tmp_path)
    manifest = root / "10/state/manifest.ocdbt"
    manifest.write_bytes(manifest.read_bytes()[:50])  # truncated
    node = next((root / "8/state/d").iterdir())
    data = bytearray(node.read_bytes())
    data[4:12] = struct.pack("<Q", 1 << 40)  # a length far beyond the file
    node.write_bytes(bytes(data))
    cat = cv.open(str(root))
    for serial in (8, 10):
        err = cat.variables[(cat.variables["serial"] == serial) & cat.variables["error"].notna()]
        assert len(err) == 1 and "OCDBT" in err["error"].iloc[0]
    assert cat.read("state/opt/host_f64", serial=6).sum() == pytest.approx(
        ground_truth("tf_orbax/orbax/ground_truth.json")["runs"]["run1"]["steps"]["6"]["state"][0][
            "sum"
        ]
    )


def test_other_trees_are_not_orbax(corpus_index):
    for tree in corpus_index["trees"]:
        if tree["family"] in ("caffe2", "paddle-fluid", "tf", "hf-trainer") and not tree.get(
            "hostile"
        ):
            storage, path = Storage.from_url(str(corpus_path(tree["root"])))
            assert not OrbaxLayout().guess_can_open(Tree.at(storage, path)), tree["root"]
