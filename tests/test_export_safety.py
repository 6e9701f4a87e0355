"""Exports the reference loader accepts, and killed exports that recovery removes (issue 25
item 4).

- A plan with two tensors under one name, or one named ``__metadata__``, is refused before
  anything is written, naming them (the header would keep one and leave the other's bytes
  unowned; the loader reads ``__metadata__`` as its metadata).
- Every written file is re-read with ckptview's own parser and must follow the reference
  loader's rules and hold exactly the planned tensors.
- ``verify`` flags safetensors files with unowned bytes (a gap, trailing bytes) or a tensor
  entry named ``__metadata__``.
- ``kill -9`` in the middle of an export, then ``ckptview journal TARGET --recover --yes``: the
  partial staging directory is gone.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_lowbit import safetensors

import ckptview as cv
from ckptview.cli import main
from ckptview.formats.safetensors import gap_problem, header, reference_problems

ROOT = Path(__file__).resolve().parent.parent


def _npz_run(root: Path, **arrays) -> Path:
    root.mkdir(parents=True)
    np.savez(root / "step_1.npz", **arrays)
    return root


def _dup_run(root: Path) -> Path:
    """Two shards without an index that both hold ``w`` (catalog name ``model/w`` twice)."""
    d = root / "checkpoint-1"
    d.mkdir(parents=True)
    a = np.arange(4, dtype=np.float32).tobytes()
    b = np.arange(4, 8, dtype=np.float32).tobytes()
    safetensors(d / "model-00001-of-00002.safetensors", {"w": ("F32", (4,), a)})
    safetensors(d / "model-00002-of-00002.safetensors", {"w": ("F32", (4,), b),
                                                         "v": ("F32", (1,), a[:4])})  # fmt: skip
    return root


def test_two_tensors_under_one_name_are_refused_before_writing(tmp_path):
    cat = cv.open(_dup_run(tmp_path / "run"), cache=False)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="'model/w'") as e:
        cat.export(1, to=out, force=True)
    assert "twice" in str(e.value)
    assert not out.exists() and not list(tmp_path.glob("out.ckptview-partial-*"))
    with pytest.raises(ValueError, match="'model/w'"):  # the plan says so too
        cat.export(1, to=out, force=True, dry_run=True)
    # the other names export
    res = cat.export(1, to=out, force=True, names=["model/v"])
    assert res.done and (out / "model.safetensors").exists()


def test_a_variable_named_metadata_is_refused(tmp_path):
    run = _npz_run(tmp_path / "run", __metadata__=np.ones(3, np.float32),
                   w=np.arange(4, dtype=np.float32))  # fmt: skip
    cat = cv.open(run, cache=False)
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="__metadata__"):
        cat.export(1, to=out)
    assert not out.exists() and not list(tmp_path.glob("out.ckptview-partial-*"))
    res = cat.export(1, to=out, names=["w"])
    assert res.done
    written = cv.open(out, cache=False)
    assert written.verify().empty and written.read("w").tolist() == [0, 1, 2, 3]


def test_cli_export_of_duplicates_exits_non_zero(tmp_path, capsys):
    run = _dup_run(tmp_path / "run")
    code = main(["export", str(run), "1", "--to", str(tmp_path / "out"), "--force"])
    err = capsys.readouterr().err
    assert code != 0 and "model/w" in err
    assert not (tmp_path / "out").exists()


def test_written_files_follow_the_reference_rules(tmp_path):
    run = _npz_run(tmp_path / "run", a=np.arange(6, dtype=np.float32).reshape(2, 3),
                   b=np.zeros((0, 4), np.int64), c=np.array(True))  # fmt: skip
    cat = cv.open(run, cache=False)
    for shard in (1 << 30, 8):
        out = tmp_path / f"out{shard}"
        cat.export(1, to=out, max_shard_bytes=shard)
        for f in sorted(out.glob("*.safetensors")):
            raw = f.read_bytes()
            (n,) = struct.unpack("<Q", raw[:8])
            assert reference_problems(raw[8 : 8 + n], len(raw) - 8 - n) == [], f


def test_the_written_header_is_checked_against_the_plan(tmp_path, monkeypatch):
    """A writer bug that drops a tensor from the header fails the export (and leaves no
    staging dir), instead of exiting 0 with a file the loader refuses."""
    import ckptview.engine.export as ex

    def lossy(entries, metadata=None):  # the second tensor's name reuses the first's
        entries = [(entries[0][0] if i else k, *rest) for i, (k, *rest) in enumerate(entries)]
        return header(entries, metadata)

    monkeypatch.setattr(ex, "header", lossy)
    run = _npz_run(tmp_path / "run", a=np.ones(3, np.float32), b=np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="would not load"):
        cv.open(run, cache=False).export(1, to=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob("out.ckptview-partial-*"))


def _raw_file(path: Path, head: dict, data: bytes) -> None:
    h = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


@pytest.mark.parametrize("case", ["gap", "trailing", "metadata-entry", "dup-dropped"])
def test_verify_flags_what_the_loader_refuses(tmp_path, case):
    f32 = {"dtype": "F32", "shape": [1]}
    if case == "gap":
        head = {"a": {**f32, "data_offsets": [0, 4]}, "b": {**f32, "data_offsets": [8, 12]}}
        data = bytes(12)
    elif case == "trailing":
        head, data = {"a": {**f32, "data_offsets": [0, 4]}}, bytes(8)
    elif case == "metadata-entry":  # what today's export wrote for a variable __metadata__
        head = {"__metadata__": {**f32, "data_offsets": [0, 4]},
                "w": {**f32, "data_offsets": [4, 8]}}  # fmt: skip
        data = bytes(8)
    else:  # two tensors under one name: the header kept the second, the first's bytes unowned
        head = {"w": {**f32, "data_offsets": [4, 8]}}
        data = bytes(8)
    _raw_file(tmp_path / "model.safetensors", head, data)
    cat = cv.open(tmp_path / "model.safetensors", cache=False)
    found = cat.verify()
    assert (found["severity"] == "error").any(), case
    text = " ".join(found["message"])
    assert ("__metadata__" in text) if case == "metadata-entry" else ("no tensor" in text), text
    assert not bool(cat.serials["loadable"].iloc[0])


def test_verify_of_a_dense_file_is_clean(tmp_path):
    head = {"__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
            "b": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}}  # fmt: skip
    _raw_file(tmp_path / "model.safetensors", head, bytes(8))
    assert cv.open(tmp_path / "model.safetensors", cache=False).verify().empty


def test_gap_problem_helper():
    assert gap_problem([0, 4], [4, 8], 8) is None
    assert gap_problem([], [], 0) is None
    assert "no tensor" in gap_problem([0, 8], [4, 12], 12)
    assert "twice" in gap_problem([0, 2], [4, 6], 6)
    assert "after the last" in gap_problem([0], [4], 5)


# -- kill -9 mid-export ------------------------------------------------------------------------
EXPORT = ("import sys, ckptview as cv\ncat = cv.open(sys.argv[1], cache=False)\ncat.serials\n"
          "print('go', flush=True)\ncat.export(1, to=sys.argv[2], max_shard_bytes=48 << 20)\n")  # fmt: skip


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kill") / "run"
    root.mkdir()
    rng = np.random.default_rng(0)
    np.savez(root / "step_1.npz", **{f"w{i}": rng.standard_normal((2048, 2048), np.float32)
                                     for i in range(12)})  # 192 MiB  # fmt: skip
    return root


@pytest.mark.parametrize("trial", range(3))
def test_kill_9_mid_export_then_recover_removes_the_partial_dir(big_run, tmp_path, trial):
    out = tmp_path / "exported"
    proc = subprocess.Popen([sys.executable, "-c", EXPORT, str(big_run), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)  # fmt: skip
    assert proc.stdout.readline().strip() == b"go"
    deadline = time.monotonic() + 60
    partial: list[Path] = []
    want = 1 + trial  # kill once this many shard files have started
    while time.monotonic() < deadline and proc.poll() is None:
        partial = list(tmp_path.glob("exported.ckptview-partial-*"))
        if partial and len(list(partial[0].glob("*.safetensors"))) >= want:
            break
        time.sleep(0.002)
    assert proc.poll() is None, "the export finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert partial and partial[0].exists()  # what a kill leaves
    assert not out.exists()
    where = str(out) if trial == 0 else str(tmp_path)  # the target, or the dir holding it
    assert main(["journal", where, "--recover", "--yes"]) == 0
    assert not partial[0].exists(), "recovery left the partial export"
    assert not out.exists()
    assert main(["journal", str(tmp_path), "--recover", "--yes"]) == 0  # nothing left: a no-op
    cat = cv.open(big_run, cache=False)
    assert bool(cat.serials.loc[1, "loadable"])  # the source is untouched
    assert not (big_run / ".ckptview").exists()  # an export writes nothing into its source
