"""Verdicts a user can act on (DESIGN.md §3c): every file under a root is a row of
``cat.files``; ``loadable`` apart from ``complete``; ``warning`` for files the resume does not
read; ``latest`` the newest complete and loadable serial, the framework's pointer kept in
``attrs["framework_latest"]`` when it names another one."""

from __future__ import annotations

import io
import os
import shutil
import zipfile

import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path
from test_deepspeed import STORAGE, Glob, _Emitter, torch_zip

import ckptview as cv
from ckptview.scan.tables import FILE_COLUMNS, ROLES

NO_CODEC = "no codec recognizes this file"


class _ShortStorage(_Emitter):
    """Tensors whose storage holds 2 elements while the tensor claims all of them."""

    def tensor(self, arr: np.ndarray) -> bytes:
        key = len(self.storages)
        self.storages.append(np.ascontiguousarray(arr.reshape(-1)[:2]))
        pid = self.emit(("storage", Glob("torch", STORAGE[arr.dtype.name]), str(key), "cpu", 2))
        return (
            b"ctorch._utils\n_rebuild_tensor_v2\n(" + pid + b"Q" + self.emit(0)
            + self.emit(tuple(arr.shape)) + self.emit((1,)) + b"\x89"
            + b"ccollections\nOrderedDict\n)R" + b"tR"
        )  # fmt: skip


def _zip(obj: object, em: _Emitter) -> bytes:
    pkl, buf = em.dump(obj), io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/byteorder", b"little")
        for i, arr in enumerate(em.storages):
            z.writestr(f"archive/data/{i}", arr.tobytes())
    return buf.getvalue()


def _files(cat: cv.Catalog) -> pd.DataFrame:
    return cat.files.assign(name=lambda d: d["path"].map(os.path.basename)).set_index("name")


# -- every file accounted for -------------------------------------------------------------------
def test_unrecognized_file_beside_a_good_one_is_an_error_row(tmp_path):
    np.save(tmp_path / "good.npy", np.arange(3))
    (tmp_path / "model.pt").write_bytes(os.urandom(4096))
    cat = cv.open(tmp_path, cache=False)
    files = _files(cat)
    assert list(cat.files.columns) == FILE_COLUMNS
    assert set(files.index) == {"good.npy", "model.pt"}
    assert files.loc["model.pt", "error"] == NO_CODEC and files.loc["model.pt", "role"] == "data"
    v = cat.variables.set_index("name")
    assert v.loc["model.pt", "error"] == NO_CODEC and v.loc["good.npy", "error"] is None
    s = cat.serials.loc[0]
    assert not s["loadable"] and "model.pt" in s["error"] and cat.latest is None


def test_a_directory_of_garbage_is_never_an_empty_complete_serial(tmp_path):
    (tmp_path / "x.index").write_bytes(b"")
    (tmp_path / "y.bin").write_bytes(os.urandom(100))
    (tmp_path / "empty").write_bytes(b"")
    cat = cv.open(tmp_path, cache=False)
    assert cat.layout == "files"
    assert sorted(_files(cat).index) == ["empty", "x.index", "y.bin"]
    assert (cat.files["error"] == NO_CODEC).all()
    s = cat.serials.loc[0]
    assert not s["loadable"] and s["error"] and cat.latest is None


def test_files_of_a_real_tree_have_roles_and_nothing_is_skipped(tmp_path):
    root = tmp_path / "hf"
    shutil.copytree(corpus_path("modern/hf"), root)
    (root / "notes.txt").write_text("run notes")
    (root / "stray.pt").write_bytes(torch_zip({"w": np.zeros(2, np.float32)}))
    cat = cv.open(root, cache=False)
    on_disk = sorted(str(p) for p in root.rglob("*") if p.is_file())
    assert sorted(cat.files["path"]) == on_disk  # one row per file under the root
    assert set(cat.files["role"]) <= set(ROLES)
    files = _files(cat)
    assert files.loc["notes.txt", "role"] == "unclaimed" and pd.isna(
        files.loc["notes.txt", "serial"]
    )
    marker = cat.files[cat.files["path"].str.endswith("checkpoint-300/trainer_state.json")]
    assert marker["role"].tolist() == ["marker"] and marker["serial"].tolist() == [300]
    assert cat.files["serial"].dtype == "Int64"
    # a checkpoint-like file outside every serial is a tree warning
    assert any("stray.pt" in w for w in cat.attrs["warnings"])
    assert not any("notes.txt" in w for w in cat.attrs["warnings"])


# -- loadable, warning, latest ------------------------------------------------------------------
def test_newest_torch_file_with_a_view_past_its_storage_is_not_latest(tmp_path):
    w = np.arange(6, dtype=np.float32)
    (tmp_path / "step_100.pt").write_bytes(torch_zip({"w": w}))
    (tmp_path / "step_200.pt").write_bytes(_zip({"w": w}, _ShortStorage()))
    cat = cv.open(tmp_path, cache=False)
    s = cat.serials
    assert s["loadable"].tolist() == [True, False]
    assert "beyond storage" in s.loc[200, "error"]
    assert cat.latest == 100
    plan = cat.plan_retention(keep_last=1)
    assert plan["action"].tolist() == ["keep", "keep"]  # 200 by the policy, 100 as below
    reason = plan.loc[100, "reason"]  # the only serial that loads is never planned for deletion
    assert "newest loadable" in reason and "200, does not load" in reason
    assert plan["loadable"].tolist() == [True, False]
    with pytest.raises(ValueError, match="does not load"):
        cat.restore(200, to=tmp_path / "out")
    assert cat.restore(200, to=tmp_path / "forced", force=True).serial == 200


def test_newest_npz_needing_pickle_is_not_loadable(tmp_path):
    np.savez(tmp_path / "step_1.npz", w=np.arange(3))
    np.savez(tmp_path / "step_2.npz", w=np.arange(3), meta=np.array([{"a": 1}], dtype=object))
    cat = cv.open(tmp_path, cache=False)
    assert cat.serials["loadable"].tolist() == [True, False]
    assert "pickle" in cat.serials.loc[2, "error"] and cat.latest == 1


def test_a_variable_past_the_end_of_its_file_is_an_error(tmp_path):
    """A header promising bytes the file does not hold: the variable cannot load."""
    np.save(tmp_path / "w.npy", np.arange(100, dtype=np.float64))
    raw = (tmp_path / "w.npy").read_bytes()
    (tmp_path / "w.npy").write_bytes(raw[:-8])  # one element short
    cat = cv.open(tmp_path / "w.npy", cache=False)
    assert not cat.serials.loc[0, "loadable"]
    assert cat.serials.loc[0, "error"]


@pytest.mark.parametrize("victim", ["training_args.bin"])
def test_a_file_the_resume_does_not_read_is_a_warning(tmp_path, victim):
    root = tmp_path / "hf"
    shutil.copytree(corpus_path("modern/hf"), root)
    (root / "checkpoint-300" / victim).write_bytes(os.urandom(300))
    cat = cv.open(root, cache=False)
    s = cat.serials.loc[300]
    assert s["loadable"] and s["error"] is None and victim in s["warning"]
    assert cat.latest == 300


def test_framework_pointer_to_a_broken_serial_is_kept_and_passed_over(tmp_path):
    """DeepSpeed's ``latest`` names the newest tag; its model states are garbage: the resume
    point is the tag before, and the pointer is kept for every face to show."""
    root = tmp_path / "ds"
    shutil.copytree(corpus_path("llm/deepspeed_zero"), root)
    newest_tag = (root / "latest").read_text().strip()
    tags = sorted(int(p.name[11:]) for p in root.glob("global_step*"))
    assert newest_tag == f"global_step{tags[-1]}"
    for f in (root / newest_tag).glob("*model_states.pt"):
        f.write_bytes(os.urandom(f.stat().st_size))
    cat = cv.open(root, cache=False)
    serials = cat.serials
    assert not serials.loc[tags[-1], "loadable"] and serials.loc[tags[-2], "loadable"]
    assert cat.latest == tags[-2] and cat.attrs["framework_latest"] == tags[-1]


# -- detection by the best explanation ----------------------------------------------------------
def test_detection_takes_the_layout_that_explains_the_tree(tmp_path):
    """A stray HF ``checkpoint-5/trainer_state.json`` beside ten numbered torch saves: the HF
    layout recognizes the tree first but explains one file of eleven; ``numbered`` explains
    the ten saves and wins."""
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text('{"global_step": 5}')
    for n in range(1, 11):
        (tmp_path / f"step_{n}.pt").write_bytes(torch_zip({"w": np.full(3, n, np.float32)}))
    from ckptview import registry
    from ckptview.scan.detect import list_tree

    tree = list_tree(tmp_path)
    assert registry.get_layout("hf-trainer").guess_can_open(tree)  # the first to say yes
    cat = cv.open(tmp_path, cache=False)
    assert cat.layout == "numbered" and list(cat.serials.index) == list(range(1, 11))
    files = _files(cat)
    assert pd.isna(files.loc["trainer_state.json", "serial"])  # outside every serial, listed


def test_caffe2_run_whose_newest_epochs_are_damaged_stays_a_caffe2_run(tmp_path):
    """The real Caffe2 tree with epochs 2–4 of both trainers overwritten: still detected as
    ``caffe2`` (the good epochs prove it), the damaged epochs are rows that do not load and
    the resume point is epoch 1."""
    root = tmp_path / "ckpt"
    shutil.copytree(corpus_path("caffe2", "ckpt"), root)
    for f in root.iterdir():
        if int(f.name.rsplit(".", 1)[1]) >= 2:
            f.write_bytes(os.urandom(50))
    cat = cv.open(root, cache=False)
    assert cat.layout == "caffe2"
    serials = cat.serials
    assert list(serials.index) == [0, 1, 2, 3, 4]
    assert serials["loadable"].tolist() == [True, True, False, False, False]
    assert serials.loc[2:, "error"].notna().all() and cat.latest == 1
    assert cat.files["error"].notna().sum() == 6  # 3 epochs × 2 trainers


def test_unreadable_last_ckpt_is_a_visible_tree_warning(tmp_path):
    """A garbage ``last.ckpt`` belongs to no serial: its row carries the reason, the tree's
    warnings name it, and ``ckptview ls`` prints the warning."""
    root = tmp_path / "lt"
    shutil.copytree(corpus_path("modern", "lightning"), root)
    last = root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    last.write_bytes(os.urandom(4096))
    cat = cv.open(root, cache=False)
    row = _files(cat).loc["last.ckpt"]
    assert pd.isna(row["serial"]) and "not a readable Lightning checkpoint" in row["error"]
    assert [w for w in cat.attrs["warnings"] if w.startswith(str(last))]
    assert cat.latest == 200  # the ckpt files named by step still decide
    from ckptview.cli import main

    out = io.StringIO()
    from contextlib import redirect_stderr, redirect_stdout

    with redirect_stdout(out), redirect_stderr(out):
        main(["ls", str(root)])
    assert f"warning: {last}: not a readable Lightning checkpoint" in out.getvalue()


def test_every_layout_says_what_its_resume_reads_and_the_docs_agree():
    from pathlib import Path

    from ckptview import registry

    doc = (Path(__file__).parent.parent / "docs" / "verdicts.md").read_text()
    for name, layout in registry.layouts().items():
        assert layout.resume_reads, name
        text = layout.resume_reads.replace("``", "`").replace("|", "\\|")
        assert f"| `{name}` | {text} |" in doc, name
