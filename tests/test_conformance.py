"""Conformance over every reader: detection precision, layout precision, the DESIGN.md §3
table contract and header-only scans, run on every tree and file of the real corpus.

Expected values come from the corpus INDEX.json (families, roots) and file names, never from
ckptview's own output.
"""

from __future__ import annotations

import json
import math
import posixpath
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import CORPUS

import ckptview as cv
from ckptview import registry
from ckptview.dtypes import np_dtype

INDEX = json.loads((CORPUS / "INDEX.json").read_text()) if (CORPUS / "INDEX.json").exists() else {}
TREES = [t for t in INDEX.get("trees", []) if not t.get("hostile")]
SKIP_NAMES = {"INDEX.json", "ground_truth.json"}

#: layouts plausible for each INDEX.json family
LAYOUTS = {
    "paddle-fluid": {"paddle-fluid"},
    "paddle-incubate": {"paddle-incubate"},
    "caffe2": {"caffe2", "files"},
    "hf-trainer": {"hf-trainer"},
    "tf": {"tf"},
    "orbax": {"orbax"},
    "lightning": {"lightning"},
    "torch": {"numbered"},
    "npz": {"numbered"},
    "dcp": {"dcp"},
    "deepspeed": {"deepspeed"},
    "paddle-dcp": {"paddle-dcp"},
    "paddle-static": {"paddle-static", "files"},
    "paddle-pickle": {"files", "paddle-static"},
    "safetensors": {"files", "safetensors-sharded"},
    "keras": {"files"},
}

SERIAL_COLUMNS = ["path", "complete", "latest", "timestamp", "nbytes", "n_files",
                  "n_variables", "epoch", "step", "nodes", "error"]  # fmt: skip
VARIABLE_COLUMNS = ["serial", "node", "name", "kind", "dtype", "shape", "numel", "nbytes",
                    "file", "error"]  # fmt: skip
KINDS = {"model", "optimizer", "trainer", "lookup_table", "rng", "scheduler", "other"}


def corpus_files() -> list[str]:
    """Every data-bearing file of the corpus, relative to its root (no generators, no JSON
    ground truth)."""
    if not CORPUS.exists():
        return []
    out = []
    for p in sorted(CORPUS.rglob("*")):
        rel = p.relative_to(CORPUS).as_posix()
        if p.is_file() and "generators" not in p.parts and p.name not in SKIP_NAMES:
            out.append(rel)
    return out


FILES = corpus_files()


def family_of(rel: str) -> str | None:
    """The family of the deepest INDEX.json tree holding ``rel`` (None: outside every tree)."""
    best = None
    for t in TREES:
        root = t["root"].rstrip("/") + "/"
        if rel.startswith(root) and (best is None or len(root) > len(best[0])):
            best = (root, t["family"])
    return best[1] if best else None


def expected_codecs(family: str | None, rel: str) -> set[str | None]:
    """The codecs allowed to claim ``rel`` (None: no codec should, or none needs to)."""
    name = posixpath.basename(rel).lower()
    suffix = posixpath.splitext(name)[1]
    if family is None or suffix in (".md", ".txt", ".yaml", ".csv") or name == "checkpoint":
        return {None}
    if family.startswith("paddle"):
        if suffix in (".pdparams", ".pdopt", ".pdckpt"):
            return {"paddle-pickle"}
        if suffix == ".distcp":
            return {"paddle-dcp"}
        if suffix == ".metadata":
            return {None, "paddle-dcp"}
        if name in ("_success", "epoch_id", "step_id") or suffix in (".pdmodel", ".json"):
            return {None, "paddle-text-int"}
        return {"paddle"}
    if family == "caffe2":
        return {"caffe2"} if Path(CORPUS, rel).stat().st_size else {None, "caffe2"}
    if family in ("torch", "lightning", "hf-trainer"):
        if suffix in (".pt", ".pth", ".bin", ".ckpt"):
            return {"torch"}
        return {"safetensors"} if suffix == ".safetensors" else {None}
    if family == "dcp":  # .distcp files are torch.save payloads laid end to end
        return {"torch_dcp"} if name == ".metadata" else {"torch", "torch_dcp"}
    if family == "npz":
        return {"npz", "npy"}
    if family == "safetensors":
        return {"safetensors"} if suffix == ".safetensors" else {None}
    if family == "tf":
        return {"tf"} if suffix == ".index" else {None, "tf"}
    if family == "keras":
        return {"keras"}
    if family == "orbax":
        return {None, "orbax", "orbax-json"}
    raise AssertionError(f"family {family!r} has no expectation in this test")


def _head(rel: str) -> bytes:
    with open(CORPUS / rel, "rb") as f:
        return f.read(4096)


# -- detection precision -------------------------------------------------------------------
def test_corpus_is_there():
    """The corpus holds files of every family INDEX.json lists (guards the parametrization)."""
    assert len(FILES) > 500
    assert {family_of(f) for f in FILES} >= set(INDEX["families"])


@pytest.mark.parametrize("rel", FILES)
def test_detected_codec_matches_family(rel):
    """The first codec claiming a file belongs to the file's family."""
    codec = registry.detect_codec(posixpath.basename(rel), _head(rel))
    got = codec.name if codec else None
    assert got in expected_codecs(family_of(rel), rel), f"{rel}: claimed by {got}"


@pytest.mark.parametrize("name", list(registry.codecs()))
def test_codec_claims_only_its_families(name):
    """No codec's cheap check accepts a file of another family (whatever its priority)."""
    codec = registry.get_codec(name)
    wrong = []
    for rel in FILES:
        claimed = codec.guess_can_open(posixpath.basename(rel), _head(rel))
        if claimed and name not in expected_codecs(family_of(rel), rel):
            wrong.append(rel)
    assert not wrong, f"{name} claims {wrong[:5]} ({len(wrong)} files of other families)"


# -- per-tree checks -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def catalogs() -> dict[str, cv.Catalog]:
    """One catalog per tree, variables listed; ``SCAN_BYTES`` keeps what the scan read."""
    out = {}
    for t in TREES:
        cat = cv.open(str(CORPUS / t["root"]), cache=False)
        cat.scan  # noqa: B018 - the layout's reads (detection, markers, state files)
        layout_bytes = cat.storage.counters.bytes_read
        cat.variables  # noqa: B018 - the codecs' reads
        SCAN_BYTES[t["root"]] = (layout_bytes, cat.storage.counters.bytes_read - layout_bytes)
        out[t["root"]] = cat
    return out


SCAN_BYTES: dict[str, tuple[int, int]] = {}  # root -> (layout bytes, codec bytes)
PEEK = 4096  # what a layout may read on top (a head to recognise a tree, a small marker)


TREE_IDS = [t["root"] for t in TREES]


@pytest.mark.parametrize("tree", TREES, ids=TREE_IDS)
def test_layout_plausible(tree, catalogs):
    assert catalogs[tree["root"]].layout in LAYOUTS[tree["family"]]


@pytest.mark.parametrize("tree", TREES, ids=TREE_IDS)
def test_files_codec_matches_family(tree, catalogs):
    """The codec used for each catalogued file (detected or forced by the layout)."""
    files = catalogs[tree["root"]].files
    assert len(files), "no file catalogued"
    for path, codec in zip(files["path"], files["codec"]):
        rel = Path(path).relative_to(CORPUS).as_posix()
        got = codec if isinstance(codec, str) else None
        assert got in expected_codecs(tree["family"], rel), f"{rel}: {got}"


def _check_serials(df: pd.DataFrame) -> None:
    assert list(df.columns) == SERIAL_COLUMNS
    assert df.index.name == "serial" and df.index.dtype == np.int64
    assert df.index.is_monotonic_increasing and df.index.is_unique
    assert df["complete"].dtype == bool and df["latest"].dtype == bool
    assert df["timestamp"].dtype == "datetime64[ns, UTC]"
    for col in ("nbytes", "n_files", "n_variables"):
        assert df[col].dtype == np.int64, col
        assert (df[col] >= 0).all(), col
    assert df["epoch"].dtype == "Int64" and df["step"].dtype == "Int64"
    assert all(isinstance(p, str) and p for p in df["path"])
    assert all(isinstance(n, tuple) and all(isinstance(x, str) for x in n) for n in df["nodes"])
    assert all(e is None or (isinstance(e, str) and e) for e in df["error"])
    assert df["latest"].sum() <= 1
    if df["latest"].any():
        assert df.loc[df["latest"], "complete"].all(), "the latest serial is incomplete"
    if df["complete"].any():
        assert df["latest"].sum() == 1, "complete serials but none is latest"


def _check_variables(df: pd.DataFrame, serials: pd.DataFrame) -> None:
    # DESIGN.md: "columns, at least" these, in this order; extras must be documented ones
    assert list(df.columns[: len(VARIABLE_COLUMNS)]) == VARIABLE_COLUMNS
    assert set(df.columns[len(VARIABLE_COLUMNS) :]) <= {"alias"}
    assert df["alias"].map(lambda a: a is None or isinstance(a, str)).all()
    for col in ("serial", "numel", "nbytes"):
        assert df[col].dtype == np.int64, col
    for col in ("node", "name", "kind", "dtype", "file"):
        assert all(isinstance(x, str) for x in df[col]), col
    assert set(df["kind"]) <= KINDS
    assert all(e is None or (isinstance(e, str) and e) for e in df["error"])
    for row in df.itertuples():
        assert isinstance(row.shape, tuple) and all(type(d) is int and d >= 0 for d in row.shape)
        if row.error is not None:  # a file that could not be listed: no values
            assert row.numel == 0 and row.nbytes == 0, row.name
            continue
        assert row.numel == math.prod(row.shape), (row.name, row.shape, row.numel)
        if row.dtype != "object":
            assert row.nbytes >= 0
            np_dtype(row.dtype)  # a known numpy / ml_dtypes name
    assert set(df["serial"]) <= set(serials.index)
    counts = df.groupby("serial").size().reindex(serials.index, fill_value=0)
    assert (counts == serials["n_variables"]).all(), "n_variables != variable rows"
    assert not df.duplicated(["serial", "node", "name"]).any(), "duplicate variable rows"


@pytest.mark.parametrize("tree", TREES, ids=TREE_IDS)
def test_contract(tree, catalogs):
    """Column names and types of both tables, and their consistency (DESIGN.md §3)."""
    cat = catalogs[tree["root"]]
    _check_serials(cat.serials)
    _check_variables(cat.variables, cat.serials)
    latest = cat.latest
    want = tree.get("latest_resumable_serial")
    if tree.get("serials"):
        assert latest == want
    if latest is not None:
        assert bool(cat.serials.loc[latest, "complete"])


@pytest.mark.parametrize("tree", TREES, ids=TREE_IDS)
def test_read_matches_catalog(tree, catalogs):
    """``read`` of every non-error, non-object row: an ndarray of the catalogued dtype/shape."""
    cat = catalogs[tree["root"]]
    df = cat.variables
    rows = df[df["error"].isna() & (df["dtype"] != "object")]
    for row in rows.itertuples():
        arr = cat.read(row.name, serial=row.serial, node=row.node)
        assert isinstance(arr, np.ndarray), (row.name, type(arr))
        assert arr.dtype == np_dtype(row.dtype), (row.name, arr.dtype, row.dtype)
        assert arr.shape == row.shape, (row.name, arr.shape, row.shape)


def test_every_tree_reads_something(catalogs):
    """Guard: the read test is not vacuous on the trees that hold values."""
    empty = [
        root
        for root, cat in catalogs.items()
        if not (cat.variables["error"].isna() & (cat.variables["dtype"] != "object")).any()
    ]
    assert empty == [], empty


# -- header-only -----------------------------------------------------------------------------
@pytest.mark.parametrize("tree", TREES, ids=TREE_IDS)
def test_scan_reads_no_file_twice(tree, catalogs):
    """A catalog scan never reads a file twice over: the codecs read at most the tree's bytes,
    the layout no more than a small peek on top."""
    root = CORPUS / tree["root"]
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    catalogs  # noqa: B018 - fills SCAN_BYTES
    layout_bytes, codec_bytes = SCAN_BYTES[tree["root"]]
    assert 0 < codec_bytes <= total, f"codecs read {codec_bytes} of {total} bytes"
    assert layout_bytes + codec_bytes <= total + PEEK, f"layout read {layout_bytes} more"


BIG = [f for f in FILES if (CORPUS / f).stat().st_size > 64 << 10]


def test_big_files_exist():
    assert len(BIG) >= 3, BIG


@pytest.mark.parametrize("rel", BIG)
def test_big_file_scan_is_header_only(rel):
    """A file over 64 KiB, opened alone, is catalogued from a small part of its bytes."""
    size = (CORPUS / rel).stat().st_size
    cat = cv.open(str(CORPUS / rel), cache=False)
    cat.variables  # noqa: B018
    got = cat.storage.counters.bytes_read
    assert got <= max(16 << 10, size // 8), f"{rel}: read {got} of {size} bytes"
