"""``cat.export`` / ``ckptview export`` (DESIGN.md §3b): any readable serial as consolidated
safetensors, sharded with an index above ``max_shard_bytes``, committed by a rename last."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import corpus_path

import ckptview as cv
from ckptview.cli import main
from ckptview.engine import export as export_engine


def numeric_rows(cat, serial):
    v = cat.variables
    v = v[(v["serial"] == serial) & v["error"].isna() & (v["dtype"] != "object")]
    return v[~v["dtype"].str.match(r"^(str|bytes)\d+$")]


def assert_same_tensors(src, serial, out):
    """Every numeric tensor of ``src``'s serial is in ``out`` with the same values."""
    rows = numeric_rows(src, serial)
    counts = rows["name"].value_counts()
    got = out.variables.set_index("name")
    for r in rows.itertuples():
        key = r.name if counts[r.name] == 1 or not r.node else f"{r.node}/{r.name}"
        assert got.loc[key, "shape"] == r.shape, key
        np.testing.assert_array_equal(out.read(key), src.read(r.name, serial=serial, node=r.node))
    return len(rows)


@pytest.mark.parametrize("tree", ["llm/fsdp_verl", "llm/megatron_legacy", "llm/deepspeed_zero",
                                  "paddle/fluid_ckpt", "modern/tf/run_ckpt", "caffe2/ckpt"])  # fmt: skip
def test_any_readable_serial_exports_and_reads_back(tmp_path, tree):
    src = cv.open(corpus_path(tree))
    result = src.export(to=tmp_path / "out")
    assert result.done and list(result.files["file"]) == ["model.safetensors"]
    out = cv.open(tmp_path / "out")
    n = assert_same_tensors(src, src.latest, out)
    assert n == int(result.files["n_tensors"].sum())
    assert not list(tmp_path.glob("out.ckptview-partial-*"))


def test_sharded_export_writes_an_index(tmp_path):
    src = cv.open(corpus_path("llm/megatron_legacy"))
    result = src.export(15, to=tmp_path / "out", max_shard_bytes=100_000)
    files = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_file())
    n = len(result.files)
    assert n > 2 and files[-1] == "model.safetensors.index.json"
    assert files[:-1] == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(files[:-1])
    assert index["metadata"]["total_size"] == result.nbytes
    big = max(src.variables["nbytes"])
    assert all(b <= max(100_000, big) for b in result.files["nbytes"])
    assert_same_tensors(src, 15, cv.open(tmp_path / "out"))


def test_dry_run_writes_nothing_and_existing_targets_are_refused(tmp_path):
    src = cv.open(corpus_path("llm/fsdp_verl"))
    plan = src.export(to=tmp_path / "out", dry_run=True)
    assert not plan.done and len(plan.files) == 1 and not (tmp_path / "out").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(FileExistsError, match="never overwrites"):
        src.export(to=tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "mine"
    with pytest.raises(ValueError, match="does not load"):
        src.export(25, to=tmp_path / "broken")  # rank 1 never wrote its extra_state


def test_a_failing_export_leaves_no_target(tmp_path, monkeypatch):
    src = cv.open(corpus_path("llm/fsdp_verl"))
    calls = []

    def fail_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(*args, **kwargs)

    real = export_engine._write_file
    monkeypatch.setattr(export_engine, "_write_file", fail_second)
    with pytest.raises(OSError, match="disk full"):
        src.export(to=tmp_path / "out", max_shard_bytes=50_000)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.iterdir())  # the staging dir is removed too


KILLER = """
import os, signal, sys
import ckptview as cv
seen = [0]
def progress(n):
    seen[0] += n
    if seen[0] > int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)
cv.open(sys.argv[1]).export(to=sys.argv[2], max_shard_bytes=50_000, progress=progress)
"""


def test_killed_midway_the_target_never_appears(tmp_path):
    src = corpus_path("llm/fsdp_verl")
    total = cv.open(src).export(to=tmp_path / "plan", dry_run=True).nbytes
    for frac in (0.1, 0.5, 0.9):
        out = tmp_path / f"out{frac}"
        proc = subprocess.run([sys.executable, "-c", KILLER, str(src), str(out),
                               str(int(total * frac))], capture_output=True)  # fmt: skip
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert not out.exists()
        partial = list(tmp_path.glob(f"out{frac}.ckptview-partial-*"))
        assert len(partial) == 1
        journal = (partial[0] / ".ckptview" / "journal.jsonl").read_text().splitlines()
        assert json.loads(journal[0])["action"] == "export"
        assert not any(json.loads(line)["event"] == "commit" for line in journal)


def test_cli_export_json(tmp_path, capsys):
    target = tmp_path / "out"
    rc = main(["export", str(corpus_path("llm/megatron_legacy")), "15", "--to", str(target),
               "--json", "--quiet", "--kinds", "all"])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["done"] and doc["serial"] == 15 and doc["files"][0]["file"] == "model.safetensors"
    assert doc["skipped"] and all(s["reason"] for s in doc["skipped"])
    assert os.path.exists(target / "model.safetensors")
    rc = main(["export", str(corpus_path("llm/megatron_legacy")), "--to", str(target)])
    assert rc == 1
    assert "never overwrites" in capsys.readouterr().err
