"""torch.distributed.checkpoint: the corpus step dirs and a hand-built 2-rank sharded save."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from conftest import corpus_path, ground_truth
from test_deepspeed import Glob, Obj, _Emitter, torch_zip

import ckptview as cv

DCP = "torch.distributed.checkpoint.metadata"


def index_tree(corpus_index: dict, root: str) -> dict:
    return next(t for t in corpus_index["trees"] if t["root"] == root)


def test_corpus_serials(corpus_index):
    want = index_tree(corpus_index, "modern/dcp")
    cat = cv.open(corpus_path("modern/dcp"))
    assert cat.layout == "dcp"
    s = cat.serials
    assert list(s.index) == want["serials"]
    assert sorted(s.index[s["complete"]]) == want["complete_serials"]
    assert cat.latest == want["latest_resumable_serial"]
    for per in want["per_serial"].values():
        assert s.loc[per["serial"], "step"] == per["step"]
    assert set(s["nodes"]) == {("rank0",)}
    assert (s["n_files"] == 2).all()


@pytest.mark.parametrize("step", [1, 2])
def test_corpus_every_entry(step):
    gt = ground_truth("modern/ground_truth.json")["files"][f"dcp/step_{step}/.metadata"]
    cat = cv.open(corpus_path("modern/dcp"))
    v = cat.variables.query(f"serial == {step}").set_index("name")
    assert len(v) == len(gt["entries"])
    for e in gt["entries"]:
        name = "/".join(str(p) for p in gt["planner_data"][e["key"]])
        row = v.loc[name]
        if e["kind"] == "bytes":
            assert row["dtype"] == "object"
            continue
        assert (row["dtype"], row["shape"]) == (e["dtype"], tuple(e["shape"])), name
        arr = cat.read(name, serial=step)
        assert float(np.asarray(arr, np.float64).sum()) == pytest.approx(e["sum"], rel=1e-6)
    assert cat.read("note", serial=step).item() == f"dcp step {step}"


def test_listing_reads_the_metadata_and_each_items_record_headers_only():
    """``dcp.load`` needs every item's ``torch.save`` record to parse: the listing reads the
    metadata and, per item, its magic, zip directory and ``data.pkl`` (at most 2 KiB of a
    record's tail and the pickle), never a whole storage of a large item."""
    cat = cv.open(corpus_path("modern/dcp"), cache=False)
    cat.storage.counters.reset()
    cat.variables  # noqa: B018
    meta = sum((corpus_path(f"modern/dcp/step_{n}/.metadata")).stat().st_size for n in (1, 2))
    items = sum(len(v.locator or ()) for r in cat._scan.file_results() for v in r.variables)
    assert items > 0
    assert cat.storage.counters.bytes_read <= meta + items * 2048


# -- a sharded save by hand --------------------------------------------------------------------
W = np.arange(12, dtype=np.float32).reshape(4, 3)


def metadata(lengths: dict[str, int]) -> bytes:
    props = Obj(
        DCP, "TensorProperties", (Glob("torch", "float32"), "torch.strided", False, 0, False)
    )
    chunks = [Obj(DCP, "ChunkStorageMetadata", {"offsets": (r * 2, 0), "sizes": (2, 3)})
              for r in (0, 1)]  # fmt: skip
    entries = {
        "model.w": Obj(DCP, "TensorStorageMetadata", {"properties": props, "size": (4, 3),
                                                      "chunks": chunks}),
        "step": Obj(DCP, "BytesStorageMetadata", {}),
    }  # fmt: skip
    storage = {}
    for r in (0, 1):
        key = Obj(DCP, "MetadataIndex", {"fqn": "model.w", "offset": (r * 2, 0), "index": r})
        where = {"relative_path": f"__{r}_0.distcp", "offset": 0, "length": lengths[f"w{r}"]}
        storage[key] = Obj("torch.distributed.checkpoint.filesystem", "_StorageInfo", where)
    key = Obj(DCP, "MetadataIndex", {"fqn": "step", "index": None})
    where = {"relative_path": "__0_0.distcp", "offset": lengths["w0"], "length": lengths["step"]}
    storage[key] = Obj("torch.distributed.checkpoint.filesystem", "_StorageInfo", where)
    state = {
        "state_dict_metadata": entries,
        "planner_data": {"model.w": ("model", "w"), "step": ("step",)},
        "storage_data": storage,
        "storage_meta": None,
        "version": "1.0.0",
    }
    return _Emitter().dump(Obj(DCP, "Metadata", state))


@pytest.fixture
def sharded(tmp_path):
    d = tmp_path / "run" / "step_7"
    d.mkdir(parents=True)
    w0, w1, step = torch_zip(W[:2].copy()), torch_zip(W[2:].copy()), torch_zip(7)
    (d / "__0_0.distcp").write_bytes(w0 + step)
    (d / "__1_0.distcp").write_bytes(w1)
    (d / ".metadata").write_bytes(metadata({"w0": len(w0), "w1": len(w1), "step": len(step)}))
    return tmp_path / "run"


def test_chunks_are_assembled(sharded):
    cat = cv.open(sharded)
    assert cat.serials.loc[7, "nodes"] == ("rank0", "rank1")
    var = cat.variable("model/w")
    assert var.shape == (4, 3) and var.attrs["files"] == ["__0_0.distcp", "__1_0.distcp"]
    np.testing.assert_array_equal(cat.read("model/w"), W)
    assert cat.read("step") == 7


def test_uncommitted_dir_and_missing_chunk_file(sharded):
    tmp = sharded / "step_9"
    shutil.copytree(sharded / "step_7", tmp)
    (tmp / ".metadata").rename(tmp / ".metadata.tmp")
    cat = cv.open(sharded)
    assert cat.serials["complete"].tolist() == [True, False]
    assert cat.latest == 7 and "not committed" in cat.serials.loc[9, "error"]
    (sharded / "step_7" / "__1_0.distcp").unlink()
    cat = cv.open(sharded)
    assert not cat.serials.loc[7, "loadable"] and "__1_0.distcp: missing" in cat.serials.loc[7, "error"]
    assert cat.latest is None  # step_9 was never committed, step_7 lost a data file
    with pytest.raises(ValueError, match="__1_0.distcp: missing"):
        cat.read("model/w", serial=7)


def test_corrupt_metadata_is_an_error_row(sharded):
    meta = sharded / "step_7" / ".metadata"
    meta.write_bytes(meta.read_bytes()[:50])
    cat = cv.open(sharded)
    v = cat.variables
    assert len(v) == 1 and isinstance(v["error"].iloc[0], str)
    assert cat.latest is None
