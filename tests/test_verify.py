"""``cat.verify`` / ``ckptview verify`` (DESIGN.md §3c): indexes against shards, byte ranges,
checksums with ``--deep``, exit codes; a header-only pass reads headers only."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import corpus_path
from test_deepspeed import torch_zip

import ckptview as cv
from ckptview.cli import main
from ckptview.engine.verify import FINDING_COLUMNS


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def sharded(tmp_path):
    root = tmp_path / "sharded"
    shutil.copytree(corpus_path("modern/safetensors/sharded"), root)
    return root


def test_clean_trees_have_no_findings(capsys):
    for rel in ("modern/safetensors/sharded", "modern/torch/run_A", "paddle/fluid_ckpt"):
        cat = cv.open(corpus_path(rel), cache=False)
        findings = cat.verify(deep=True)
        assert list(findings.columns) == FINDING_COLUMNS and findings.empty, findings
    code, out, _ = run(capsys, "verify", corpus_path("modern/hf"))
    assert code == 0 and "3 serial(s) checked: no findings" in out


def test_index_against_its_shards(sharded, capsys):
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    tensors = sorted(index["weight_map"])
    # a stray copy of a shard under another name: every tensor of it is held twice
    shutil.copy(sharded / "model-00002-of-00002.safetensors", sharded / "model-copy.safetensors")
    index["metadata"]["total_size"] += 1
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    findings = cv.open(sharded, cache=False).verify()
    messages = "\n".join(findings["message"])
    assert "a shard the index does not name" in messages
    assert f"total_size {index['metadata']['total_size']} !=" in messages
    assert set(findings["check"]) == {"index"}
    assert len(tensors) == 11
    code, out, _ = run(capsys, "verify", sharded, "--json")
    assert code == 1 and json.loads(out)[0]["check"] == "index"


def test_missing_shard_is_an_error(sharded):
    (sharded / "model-00002-of-00002.safetensors").unlink()
    findings = cv.open(sharded, cache=False).verify().set_index("message")
    assert findings.loc["names model-00002-of-00002.safetensors, absent", "severity"] == "error"


def test_deep_checks_zip_crcs_and_counts_nonfinite(tmp_path, capsys):
    w = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    path = tmp_path / "step_1.pt"
    path.write_bytes(torch_zip({"w": w}))
    raw = bytearray(path.read_bytes())
    at = raw.find(w[1000:1002].tobytes())
    raw[at] ^= 0xFF  # one flipped bit pattern in the tensor's bytes: only a checksum sees it
    path.write_bytes(bytes(raw))
    cat = cv.open(tmp_path, cache=False)
    shallow = cat.verify()
    assert shallow.empty
    assert cat.storage.counters.bytes_read < len(raw) // 4  # header reads only
    deep = cat.verify(deep=True)
    assert deep["check"].tolist() == ["crc32"] and "data/0" in deep["message"].iloc[0]
    np.save(tmp_path / "nan.npy", np.array([1.0, np.nan, np.inf, -np.inf]))
    found = cv.open(tmp_path / "nan.npy", cache=False).verify(deep=True)
    assert found["message"].tolist() == ["nan.npy: 1 NaN, 2 inf"]
    code, _, _ = run(capsys, "verify", tmp_path / "nan.npy", "--deep")
    assert code == 1


def test_unknown_serial_is_a_usage_error(capsys):
    code, _, err = run(capsys, "verify", corpus_path("modern/hf"), "7")
    assert code == 2 and "no serial [7]" in err
