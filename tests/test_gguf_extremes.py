"""GGUF and DCP metadata extremes (issue 25 item 5): dims no file can hold, and entry counts
over the budget, are one clear error row each, within the parsers' budget (docs/budgets.md:
under 2 s and 256 MiB), and the rest of the tree is catalogued.

Each hostile listing runs in a child process: wall time of ``cv.open`` + ``.files`` and the
peak of traced allocations are measured there."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from extremes import (
    dcp_many_chunks,
    gguf,
    gguf_huge_dims,
    gguf_many_tensors,
    gguf_string,
    gguf_zero_and_huge_dims,
)

import ckptview as cv
from ckptview.formats import dcp_budget
from ckptview.formats import gguf as gguf_format

MIB = 1 << 20
MAX_TENSORS = getattr(gguf_format, "MAX_TENSORS", 1 << 16)
ROOT = Path(__file__).resolve().parent.parent
SECONDS = 2.0
PEAK = 256 * MIB

CHILD = r"""
import json, sys, time, tracemalloc
import ckptview as cv
root, fname = sys.argv[1], sys.argv[2]
tracemalloc.start()
t0 = time.perf_counter()
cat = cv.open(root, cache=False)
files = cat.files
row = files[files["path"].astype(str).str.endswith(fname)].iloc[0]
others = files[~files["path"].astype(str).str.endswith(fname)]
seconds = time.perf_counter() - t0
print(json.dumps({"error": row["error"], "seconds": seconds,
                  "peak": tracemalloc.get_traced_memory()[1],
                  "others_ok": bool(others["error"].isna().all()), "n_others": len(others)}))
"""


def catalog_in_child(root: Path, fname: str, hook: str = "", timeout: float = 120) -> dict:
    p = subprocess.run([sys.executable, "-c", hook + CHILD, str(root), fname],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _tree(tmp_path: Path, name: str, payload: bytes) -> Path:
    """A directory with a good GGUF beside the hostile one."""
    root = tmp_path / "t"
    root.mkdir()
    ok = np.arange(8, dtype="<f4").tobytes()
    (root / "good.gguf").write_bytes(gguf([("w", (8,), 0, 0)], ok))
    (root / name).write_bytes(payload)
    return root


@pytest.mark.parametrize("make, message", [
    (gguf_huge_dims, "exceeds"),
    (lambda: gguf_huge_dims(2), "exceeds"),
    (gguf_zero_and_huge_dims, "exceeds"),
])  # fmt: skip
def test_dims_no_file_can_hold_are_an_error_row(tmp_path, make, message):
    root = _tree(tmp_path, "bad.gguf", make())
    cat = cv.open(root, cache=False)
    files = cat.files.set_index(cat.files["path"].astype(str).str.rsplit("/", n=1).str[-1])
    assert message in files.loc["bad.gguf", "error"]
    assert files.loc["good.gguf", "error"] is None
    assert cat.read("good.gguf/w", serial=0).tolist() == list(range(8))


def test_product_of_dims_checked_before_it_grows(tmp_path):
    """Dims each within the file's reach whose product is not: refused by the running
    product, naming the tensor."""
    payload = gguf([("p", (1000, 1000, 1000), 0, 0)], bytes(1000))
    root = _tree(tmp_path, "p.gguf", payload)
    cat = cv.open(root, cache=False)
    err = cat.files.set_index("path").filter(like="p.gguf", axis=0)["error"].iloc[0]
    assert "'p'" in err and "hold more values" in err


def test_a_data_offset_past_the_file_is_an_error_row(tmp_path):
    root = _tree(tmp_path, "o.gguf", gguf([("w", (4,), 0, 2**64 - 1)], bytes(16)))
    cat = cv.open(root, cache=False)
    err = cat.files.set_index("path").filter(like="o.gguf", axis=0)["error"].iloc[0]
    assert "past the end" in err


def test_huge_dims_within_the_budget(tmp_path):
    root = _tree(tmp_path, "bad.gguf", gguf_huge_dims())
    out = catalog_in_child(root, "bad.gguf")
    assert out["error"] and "exceeds" in out["error"]
    assert out["others_ok"] and out["n_others"] == 1
    assert out["seconds"] < SECONDS and out["peak"] < PEAK, out


def test_1_5_million_tensor_entries_are_one_error_row_within_the_budget(tmp_path):
    root = _tree(tmp_path, "many.gguf", gguf_many_tensors(1_500_000))
    out = catalog_in_child(root, "many.gguf")
    assert out["error"] and "tensor budget" in out["error"], out
    assert out["others_ok"]
    assert out["seconds"] < SECONDS and out["peak"] < PEAK, out


def test_tensors_at_the_budget_still_list(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_many_tensors(MAX_TENSORS))
    cat = cv.open(path, cache=False)
    assert len(cat.variables) == MAX_TENSORS and cat.variables["error"].isna().all()


def test_metadata_entry_budget(tmp_path):
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 20)
    kv = (gguf_string("k") + struct.pack("<IB", 0, 1)) * 16
    root = _tree(tmp_path, "kv.gguf", head + kv)
    cat = cv.open(root, cache=False)
    err = cat.files.set_index("path").filter(like="kv.gguf", axis=0)["error"].iloc[0]
    assert "entry budget" in err


def _dcp_tree(tmp_path: Path, n: int) -> Path:
    meta, item = dcp_many_chunks(n)
    d = tmp_path / "run" / "step_1"
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(meta)
    (d / "__0_0.distcp").write_bytes(item)
    return tmp_path / "run"


def test_dcp_metadata_of_200k_chunks_is_refused_within_the_budget(tmp_path):
    """200,000 chunks: refused by the object bound of the raw pickle before unpickling, in
    under the time and memory budgets."""
    root = _dcp_tree(tmp_path, 200_000)
    out = catalog_in_child(root, ".metadata", "", timeout=120)
    assert out["error"] and "budget" in out["error"], out
    assert out["seconds"] < SECONDS and out["peak"] < PEAK, out


def test_dcp_just_under_the_budget_lists(tmp_path):
    """A metadata under the budget lists through the helper (no false refusal)."""
    root = _dcp_tree(tmp_path, 3000)
    meta = (root / "step_1" / ".metadata").read_bytes()
    dcp_budget.check_metadata_bytes("m", lambda a, n: meta[a : a + n], len(meta), 3000)


def test_dcp_budget_helpers(tmp_path):
    meta, _ = dcp_many_chunks(2000)
    # the object bound is an upper bound of the chunks' objects
    assert dcp_budget.object_bound(meta) >= 3 * 2000
    dcp_budget.check_metadata_bytes("m", lambda a, n: meta[a : a + n], len(meta))
    with pytest.raises(dcp_budget.BudgetError, match="budget"):
        dcp_budget.check_metadata_bytes("m", lambda a, n: meta[a : a + n], len(meta),
                                        max_chunks=500)  # fmt: skip
    from ckptview.formats.pickle import load_pickle
    from ckptview.io import Storage

    path = tmp_path / ".metadata"
    path.write_bytes(meta)
    import fsspec

    fields = load_pickle(Storage(fsspec.filesystem("file")).blob(str(path)), lazy_min=None).fields()
    assert dcp_budget.count_chunks(fields["state_dict_metadata"]) == 2000
    dcp_budget.check_entries("m", fields)
    with pytest.raises(dcp_budget.BudgetError, match="2,000 chunks"):
        dcp_budget.check_entries("m", fields, max_chunks=1999)
