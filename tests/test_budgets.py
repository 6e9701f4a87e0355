"""Parsers with budgets: each structured attack of the red-team report, planted in a real
tree and catalogued in a child process (a crash there cannot take pytest down). The file
becomes an error row naming the budget, the rest of the tree is catalogued, the resume point
stays the newest loadable serial, and the child's peak memory stays under 1 GiB."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import structured
from conftest import corpus_path

import ckptview as cv

CHILD = r"""
import json, resource, sys
import ckptview as cv
root, fname = sys.argv[1], sys.argv[2]
cat = cv.open(root, cache=False)
df = cat.variables
rows = df[df["file"].str.endswith(fname)]
print(json.dumps({
    "errors": sorted(set(rows["error"].dropna())),
    "rows": len(rows),
    "others": int((~df["file"].str.endswith(fname)).sum()),
    "latest": None if cat.latest is None else int(cat.latest),
    "layout": cat.layout,
    "serial_errors": {str(k): v for k, v in cat.serials["error"].dropna().items()},
    "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
}))
"""
GIB = 1 << 30


def catalogue(root: Path, fname: str) -> dict:
    """``ckptview.open(root).variables`` in a child limited to 4 GiB of address space."""

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 * GIB, 4 * GIB))

    p = subprocess.run([sys.executable, "-c", CHILD, str(root), fname], capture_output=True,
                       text=True, timeout=120, preexec_fn=limit)  # fmt: skip
    assert p.returncode == 0, f"child died ({p.returncode}): {p.stderr[-2000:]}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def torch_run(tmp_path: Path, payload: bytes, name: str = "step_300.pt") -> Path:
    root = tmp_path / "run"
    root.mkdir()
    for n in ("step_100.pt", "step_200.pt"):
        shutil.copyfile(corpus_path("modern/torch/run_A/step_100.pt"), root / n)
    (root / name).write_bytes(payload)
    return root


PICKLES = {
    "deep tuple as a dict key": (structured.deep_tuple_key, "deep"),
    "deep tuple in a frozenset": (structured.deep_frozenset, "deep"),
    "builtins.list copies": (structured.list_copies, "budget"),
    "builtins.tuple copies (NEWOBJ)": (structured.tuple_copies, "budget"),
}


@pytest.mark.parametrize("case", list(PICKLES))
def test_pickle_budgets(tmp_path, case):
    """Before: SIGSEGV (deep tuples) or > 4 GiB in 5 s (copies). After: an error row."""
    make, word = PICKLES[case]
    out = catalogue(torch_run(tmp_path, structured.as_torch(make())), "step_300.pt")
    assert out["rows"] == 1 and word in " ".join(out["errors"]), out
    assert out["latest"] == 200 and out["others"] > 0
    assert out["maxrss_mib"] < 1024, out


@pytest.mark.parametrize("victim", ["training_args.bin", "optimizer.pt"])
def test_pickle_budget_inside_hf_checkpoint(tmp_path, victim):
    """The same payload posing as an HF Trainer file fails the same way."""
    root = tmp_path / "hf"
    shutil.copytree(corpus_path("modern/hf"), root)
    (root / "checkpoint-300" / victim).write_bytes(structured.as_torch(structured.list_copies()))
    out = catalogue(root, f"checkpoint-300/{victim}")
    assert out["layout"] == "hf-trainer" and "budget" in " ".join(out["errors"]), out
    assert out["latest"] == (300 if victim == "training_args.bin" else 200)


def test_pickle_budget_inside_lightning_ckpt(tmp_path):
    root = tmp_path / "lt"
    shutil.copytree(corpus_path("modern/lightning_real"), root)
    ck = root / "lightning_logs/version_0/checkpoints"
    (ck / "epoch=2-step=300.ckpt").write_bytes(structured.as_torch(structured.deep_tuple_key()))
    (ck / "last.ckpt").unlink()
    out = catalogue(root, "epoch=2-step=300.ckpt")
    assert "deep" in " ".join(out["errors"]) and out["latest"] == 100, out


def test_memo_flood(tmp_path):
    """4.5 M memo entries (31 MB): before 68 s, 1 GiB and no row; now a budget error row."""
    out = catalogue(
        torch_run(tmp_path, structured.as_torch(structured.memo_flood())), "step_300.pt"
    )
    assert out["rows"] == 1 and "budget" in " ".join(out["errors"]), out
    assert out["maxrss_mib"] < 1024 and out["latest"] == 200


def test_budget_scales_with_the_pickle():
    """A legitimate pickle well past the base budget still loads: the budget grows with it."""
    from ckptview.formats.pickle import BudgetError, budget_for, load_pickle

    items = [f"name-{i}" for i in range(400_000)]  # ~6 MB pickle, ~40 MB of objects
    import pickle

    raw = pickle.dumps({"names": items, "ids": list(range(400_000))}, protocol=4)
    assert load_pickle(raw)["names"] == items
    assert budget_for(len(raw)) < budget_for(10 * len(raw)) <= 1 << 30
    with pytest.raises(BudgetError, match="deep"):
        load_pickle(b"\x80\x02" + b")" + b"\x85" * 1001 + b".")
    assert len(str(load_pickle(b"\x80\x02" + b")" + b"\x85" * 900 + b"."))) > 0


DEEP_JSON = {
    "trainer_state.json": ("modern/hf", "checkpoint-300/trainer_state.json", "hf-trainer", 200),
    "index.json": (
        "modern/safetensors/sharded",
        "model.safetensors.index.json",
        "safetensors-sharded",
        None,
    ),  # fmt: skip
    "index.json of DCP-HF": ("llm/dcp_hf", "step-15/model.safetensors.index.json", None, 5),
    "Orbax _CHECKPOINT_METADATA": (
        "tf_orbax/orbax/run2_policy",
        "ckpt_000010/_CHECKPOINT_METADATA",
        "orbax",
        8,
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(DEEP_JSON))
def test_deep_json_marks_its_serial_bad(tmp_path, case):
    """Before: RecursionError out of ``.variables`` (a traceback from ``ckptview ls``) or a
    different layout. After: the serial carries the error, the rest is catalogued."""
    src, rel, layout, latest = DEEP_JSON[case]
    root = tmp_path / "t"
    shutil.copytree(corpus_path(src), root)
    before = cv.open(str(root), cache=False)
    (root / rel).write_bytes(structured.deep_json())
    cat = cv.open(str(root), cache=False)
    assert cat.layout == (layout or before.layout)
    errors = " ".join(cat.serials["error"].dropna())
    assert "deep" in errors, cat.serials
    if latest is not None:
        assert cat.latest == latest and cat.latest < before.latest
    else:
        assert cat.latest is None
    assert len(cat.variables) > 0


def test_deep_json_through_the_cli(tmp_path, capsys):
    from ckptview.cli import main

    root = tmp_path / "hf"
    shutil.copytree(corpus_path("modern/hf"), root)
    (root / "checkpoint-300/trainer_state.json").write_bytes(structured.deep_json())
    assert main(["ls", str(root)]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and "300" in out.out


TF_INDEXES = {
    "100k index entries naming one block": (structured.tf_index_repeated_block, "twice"),
    "keys growing a byte per entry": (structured.tf_index_growing_keys, "keys"),
}


@pytest.mark.parametrize("case", list(TF_INDEXES))
def test_tf_index_budgets(tmp_path, case):
    """Before: 5e9 entries walked (never finishes) / > 4 GiB in 28 s. After: an error row."""
    make, word = TF_INDEXES[case]
    root = tmp_path / "tf"
    shutil.copytree(corpus_path("modern/tf/run_ckpt"), root)
    (root / "ckpt-400.index").write_bytes(make())
    out = catalogue(root, "ckpt-400.index")
    assert word in " ".join(out["errors"]) and out["latest"] == 300, out
    assert out["maxrss_mib"] < 1024


def test_caffe2_million_records(tmp_path):
    """Before: 59 s and 1.6 GiB. After: listing stops at the record budget, with an error."""
    from ckptview.formats.minidb import MAX_RECORDS

    root = tmp_path / "c2"
    root.mkdir()
    (root / "model.minidb").write_bytes(structured.minidb_many_records(1_000_000))
    out = catalogue(root, "model.minidb")
    assert f"{MAX_RECORDS:,} records" in " ".join(out["errors"]), out
    assert out["maxrss_mib"] < 1024


def test_caffe2_many_chunks_of_one_blob(tmp_path):
    """A blob in 40,000 chunks (below the record budget) is one variable that reads whole."""
    root = tmp_path / "c2"
    root.mkdir()
    (root / "model.minidb").write_bytes(structured.minidb_many_chunks(40_000))
    cat = cv.open(str(root), cache=False)
    df = cat.variables
    assert df["name"].tolist() == ["w"] and df["error"].isna().all()
    assert df["shape"].iloc[0] == (40_000,)
    np.testing.assert_array_equal(cat.read("w"), np.ones(40_000, np.float32))


def test_npz_member_inflates_in_place(tmp_path):
    """Before: ``read`` held 2x the inflated member (3.1 GiB for 1.5 GiB). After: ~1x."""
    nbytes = 256 << 20
    path = tmp_path / "w.npz"
    path.write_bytes(structured.npz_inflating(nbytes))
    child = r"""
import resource, sys
import ckptview as cv
cat = cv.open(sys.argv[1], cache=False)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
a = cat.read("w")
assert a.nbytes == int(sys.argv[2]) and not a[-1000:].any()
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024 / a.nbytes)
"""
    p = subprocess.run([sys.executable, "-c", child, str(path), str(nbytes)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert float(p.stdout.strip()) < 1.2


def test_safetensors_duplicate_keys_and_overlaps(tmp_path):
    for name in ("safetensors_duplicate_keys", "safetensors_overlapping"):
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(getattr(structured, name)())
        err = " ".join(cv.open(str(path), cache=False).variables["error"].dropna())
        assert ("twice" if "duplicate" in name else "share bytes") in err, err


def test_zip_entries_sharing_one_local_header(tmp_path):
    path = tmp_path / "bomb.npz"
    path.write_bytes(structured.zip_overlapping())
    err = " ".join(cv.open(str(path), cache=False).variables["error"].dropna())
    assert "overlap" in err, err


def test_structured_generators_seeded(tmp_path):
    """The structured fuzz suite: every generator at random sizes (seeded), all in one tree,
    catalogued in one child: it survives, every file is accounted for, and the payloads that
    are hostile at any size are refused."""
    import random

    rng = random.Random(20261125)
    makers = [
        (".pt", lambda: structured.as_torch(structured.deep_tuple_key(rng.randint(1001, 5000)))),
        (".pt", lambda: structured.as_torch(structured.deep_frozenset(rng.randint(1001, 5000)))),
        (".pt", lambda: structured.as_torch(
            structured.list_copies(rng.randint(1000, 200_000), rng.randint(10, 400)))),
        (".pt", lambda: structured.as_torch(
            structured.tuple_copies(rng.randint(1000, 200_000), rng.randint(10, 400)))),
        (".pt", lambda: structured.as_torch(structured.memo_flood(rng.randint(1000, 300_000)))),
        (".index", lambda: structured.tf_index_repeated_block(rng.randint(2, 2000),
                                                              rng.randint(10, 2000))),
        (".index", lambda: structured.tf_index_growing_keys(rng.randint(100, 20_000))),
        (".minidb", lambda: structured.minidb_many_records(rng.randint(10, 20_000))),
        (".minidb", lambda: structured.minidb_many_chunks(rng.randint(10, 5_000))),
        (".npz", lambda: structured.zip_overlapping(rng.randint(2, 6))),
        (".npz", lambda: structured.npz_inflating(rng.randint(1, 64) << 20)),
        (".safetensors", structured.safetensors_duplicate_keys),
        (".safetensors", structured.safetensors_overlapping),
    ]  # fmt: skip
    root = tmp_path / "zoo"
    root.mkdir()
    names = []
    for i in range(3 * len(makers)):
        ext, make = makers[i % len(makers)]
        names.append(f"case{i:02d}{ext}")
        (root / names[-1]).write_bytes(make())
    child = r"""
import json, sys
import ckptview as cv
cat = cv.open(sys.argv[1], cache=False)
files = cat.files
print(json.dumps({p.rsplit("/", 1)[-1]: [int(n), e] for p, n, e in
                  zip(files["path"], files["n_variables"], files["error"])}))
"""
    p = subprocess.run([sys.executable, "-c", child, str(root)], capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    seen = json.loads(p.stdout.strip().splitlines()[-1])
    assert sorted(seen) == sorted(names)
    refused = {0, 1, 5, 9, 11, 12}  # always hostile; the others are valid at small sizes
    for i, name in enumerate(names):
        if i % len(makers) in refused:
            assert seen[name][1], f"{name}: not refused"
