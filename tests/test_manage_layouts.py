"""restore (dry run, in place, to another tree) and retention on every layout, on tmp copies.

Each case builds a real tree (a corpus copy or a writer from the layout's own tests). In-place
promotion either copies a serial as the next one (``copy``) or moves the framework's pointer
(``pointer``: TF state file, DeepSpeed ``latest``, Lightning's newest ``last-vN.ckpt``);
one-serial layouts (``single``) only export.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fsspec
import numpy as np
import pytest
from test_deepspeed import write_tag
from test_paddle import _incubate_tree
from test_restore import copy_corpus, journal_events, snapshot

import ckptview as cv
from ckptview.layouts.tf import parse_state


@dataclass
class Case:
    build: Callable[[Path], Path]
    layout: str
    mode: str  # copy | pointer | single
    pointer_file: str | None = None  # pointer mode: the one file promote rewrites or adds


def corpus(rel: str) -> Callable[[Path], Path]:
    return lambda d: copy_corpus(rel, d)


def incubate(d: Path) -> Path:
    _incubate_tree(d)
    return d


def deepspeed(d: Path) -> Path:
    for step in (10, 20):
        write_tag(d, step)
    write_tag(d, 30, ranks=(0,), model=False)  # interrupted save, newer than latest
    (d / "latest").write_text("global_step20")
    return d


def lightning_without_last(d: Path) -> Path:
    copy_corpus("modern/lightning", d)
    (d / "lightning_logs/version_0/checkpoints/last.ckpt").unlink()
    return d


LAST_V1 = "lightning_logs/version_0/checkpoints/last-v1.ckpt"
CASES = {
    "paddle-fluid": Case(corpus("paddle/fluid_ckpt"), "paddle-fluid", "copy"),
    "paddle-fluid-flat": Case(corpus("paddle/fluid_ckpt_flat_2018"), "paddle-fluid", "copy"),
    "paddle-incubate": Case(incubate, "paddle-incubate", "copy"),
    "paddle-dcp": Case(corpus("paddle/dist_ckpt"), "paddle-dcp", "copy"),
    "paddle-static": Case(corpus("paddle/static_save"), "paddle-static", "single"),
    "caffe2": Case(corpus("caffe2/ckpt"), "caffe2", "copy"),
    "tf": Case(corpus("modern/tf/run_ckpt"), "tf", "pointer", "checkpoint"),
    "orbax": Case(corpus("tf_orbax/orbax/run3_noocdbt"), "orbax", "copy"),
    "hf-trainer": Case(corpus("modern/hf"), "hf-trainer", "copy"),
    "lightning": Case(corpus("modern/lightning"), "lightning", "pointer", LAST_V1),
    "lightning-no-last": Case(lightning_without_last, "lightning", "copy"),
    "numbered-torch": Case(corpus("modern/torch/run_A"), "numbered", "copy"),
    "numbered-npz": Case(corpus("modern/npz"), "numbered", "copy"),
    "dcp": Case(corpus("modern/dcp"), "dcp", "copy"),
    "deepspeed": Case(deepspeed, "deepspeed", "pointer", "latest"),
    "safetensors-sharded": Case(
        corpus("modern/safetensors/sharded"), "safetensors-sharded", "single"
    ),  # fmt: skip
    "files": Case(corpus("modern/safetensors/single"), "files", "single"),
}


def source_serial(cat) -> int:
    """The oldest complete serial that is not the resume point (the latest when single)."""
    table = cat.serials
    others = [int(s) for s in table.index[table["complete"]] if s != cat.latest]
    return min(others) if others else int(cat.latest)


def assert_values_equal(cat_a, a: int, cat_b, b: int) -> None:
    """Every variable of serial ``a`` reads the same from serial ``b`` (and no more)."""
    va, vb = (c.variables[c.variables["serial"] == s] for c, s in ((cat_a, a), (cat_b, b)))
    keys = lambda v: sorted(zip(v["node"], v["name"], v["error"].isna()))  # noqa: E731
    assert keys(va) == keys(vb) and len(va)
    ok = va[va["error"].isna()]
    for node, name in zip(ok["node"], ok["name"]):
        np.testing.assert_array_equal(cat_a.read(name, a, node), cat_b.read(name, b, node))


def build(case_id: str, tmp_path: Path) -> tuple[Case, Path]:
    case = CASES[case_id]
    root = case.build(tmp_path / case_id)
    assert cv.open(root).layout == case.layout
    return case, root


@pytest.mark.parametrize("case_id", CASES)
def test_promote_in_place(case_id, tmp_path):
    case, root = build(case_id, tmp_path)
    cat = cv.open(root)
    src, old_serials = source_serial(cat), set(cat.serials.index)
    before = snapshot(root)
    plan = cat.restore(src, dry_run=True)
    assert snapshot(root) == before and not (root / ".ckptview").exists()
    if case.mode == "single":
        assert cat.latest == src and len(plan.ops) == 0 and "already" in plan.message
        with pytest.raises(ValueError, match="one serial"):
            cat._scan.layout.promote_ops(cat.tree, cat.scan, cat.scan.serials[0])
        return
    assert len(plan.ops) and not plan.done

    result = cat.restore(src)
    assert result.done and result.new_serial == plan.new_serial
    new = cv.open(root)
    after = snapshot(root)
    if case.mode == "pointer":  # the chosen serial itself becomes the resume point
        assert result.new_serial == src and new.latest == src
        assert set(new.serials.index) == old_serials
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
        assert changed == {case.pointer_file}
    else:  # a copy as the next serial, committed, resumed from; nothing else touched
        assert result.new_serial == max(old_serials) + 1 == new.latest
        assert bool(new.serials.loc[new.latest, "complete"])
        assert set(new.serials.index) == old_serials | {new.latest}
        assert {k: v for k, v in after.items() if k in before} == before
        assert_values_equal(cat, src, new, new.latest)
    events = [e["event"] for e in journal_events(str(root))]
    assert events[0] == "begin" and events[-1] == "end"


@pytest.mark.parametrize("case_id", CASES)
def test_restore_to_another_tree(case_id, tmp_path):
    case, root = build(case_id, tmp_path)
    cat = cv.open(root)
    src = source_serial(cat)
    dest = tmp_path / "dest"
    assert len(cat.restore(src, to=dest, dry_run=True).ops) and not dest.exists()
    result = cat.restore(src, to=dest)
    assert result.done and result.new_serial == src
    out = cv.open(dest)
    assert out.layout == case.layout and list(out.serials.index) == [src] and out.latest == src
    assert_values_equal(cat, src, out, src)
    with pytest.raises(FileExistsError):
        cat.restore(src, to=dest)  # never overwrites


@pytest.mark.parametrize("case_id", CASES)
def test_retention_keep_last_one(case_id, tmp_path):
    case, root = build(case_id, tmp_path)
    cat = cv.open(root)
    latest, table = cat.latest, cat.serials
    latest_complete = int(table.index[table["complete"]].max())
    plan = cat.plan_retention(keep_last=1)
    doomed = {int(s) for s in plan.index[plan["action"] == "delete"]}
    assert latest_complete not in doomed and latest not in doomed
    kept_files = snapshot(root)
    gone = {cat.tree.rel(p) for s in doomed for p in _serial_paths(cat, s)}
    deleted = cat.apply_retention(plan).deleted
    assert set(deleted.index) == doomed
    new = cv.open(root)
    assert set(new.serials.index) == set(table.index) - doomed
    assert new.latest == latest and bool(new.serials.loc[latest_complete, "complete"])
    assert all(not (root / p).exists() for p in gone)
    after = snapshot(root)
    untouched = {k: v for k, v in kept_files.items() if k not in gone and k != "checkpoint"}
    assert {k: after.get(k) for k in untouched} == untouched
    if case.layout == "tf":  # the state file no longer lists what was deleted
        state = parse_state((root / "checkpoint").read_text())
        assert state["all_model_checkpoint_paths"] == [f"ckpt-{latest}"]
        assert state["model_checkpoint_path"] == [f"ckpt-{latest}"]
    expected = {  # worked out from each tree by hand
        "paddle-fluid": {0, 1}, "paddle-fluid-flat": {0}, "paddle-incubate": {0},
        "paddle-dcp": {0}, "caffe2": {0, 1, 2, 3}, "tf": {300}, "orbax": {2},
        "hf-trainer": {100, 200}, "lightning": {100}, "lightning-no-last": {100},
        "numbered-torch": {100, 200}, "numbered-npz": {100, 200}, "dcp": {1},
        "deepspeed": {10},
    }  # fmt: skip
    assert doomed == expected.get(case_id, set())


def _serial_paths(cat, serial: int) -> list[str]:
    info = next(s for s in cat.scan.serials if s.serial == serial)
    return [cat.tree.abs(f) for f in cat._scan.layout.serial_files(cat.tree, info)]


def test_export_to_memory_filesystem(tmp_path):
    _case, root = build("hf-trainer", tmp_path)
    cat = cv.open(root)
    url = "memory://manage-layouts/hf"
    try:
        result = cat.restore(200, to=url)
        assert result.done and result.target.startswith("memory://")
        out = cv.open(url)
        assert out.layout == "hf-trainer" and out.latest == 200
        assert_values_equal(cat, 200, out, 200)
    finally:
        fsspec.filesystem("memory").rm("/manage-layouts", recursive=True)


def test_paddle_dcp_promote_renames_shards_in_metadata(tmp_path):
    _case, root = build("paddle-dcp", tmp_path)
    cat = cv.open(root)
    plan = cat.restore(0, dry_run=True)
    assert list(plan.ops["path"]) == ["0_2.distcp", "2.metadata"]
    assert list(plan.ops["kind"]) == ["copy", "write"]
    cat.restore(0)
    meta = (root / "2.metadata").read_bytes()
    assert b"0_2.distcp" in meta and b"0_0.distcp" not in meta
    assert cv.open(root).serials.loc[2, "error"] is None


def test_paddle_incubate_promote_and_delete_go_through_tmp(tmp_path):
    _case, root = build("paddle-incubate", tmp_path)
    cat = cv.open(root)
    plan = cat.restore(0, dry_run=True)
    staged = "__paddle_checkpoint__.3.tmp/"
    assert all(p.startswith(staged) for p in plan.ops["path"].iloc[:-1])
    assert list(plan.ops.iloc[-1][["kind", "path"]]) == ["rename", "__paddle_checkpoint__.3"]
    ops = cat._scan.layout.delete_ops(cat.tree, cat.scan, cat.scan.serials[0])
    assert (ops[0].kind, ops[0].src, ops[0].path) == (
        "rename", "__paddle_checkpoint__.0", "__paddle_checkpoint__.0.tmp")  # fmt: skip
    assert ops[-1].kind == "rmdir" and ops[-1].path == "__paddle_checkpoint__.0.tmp"


def test_fluid_markers_last_and_fresh(tmp_path):
    _case, root = build("paddle-fluid", tmp_path)
    plan = cv.open(root).restore(1, dry_run=True)
    markers = plan.ops[plan.ops["note"] == "marker"]
    assert list(markers["path"]) == ["checkpoint_4/trainer_0/_SUCCESS",
                                     "checkpoint_4/trainer_1/_SUCCESS",
                                     "checkpoint_4/__model__/_SUCCESS"]  # fmt: skip
    assert plan.ops["path"].iloc[-1] == "checkpoint_4/__model__/_SUCCESS"
    assert (markers["kind"] == "write").all()


def test_hf_promoted_copy_keeps_its_global_step(tmp_path):
    _case, root = build("hf-trainer", tmp_path)
    cv.open(root).restore(100)
    new = cv.open(root)
    assert new.latest == 301 and bool(new.serials.loc[301, "complete"])
    assert new.serials.loc[301, "step"] == 100
    info = next(s for s in new.scan.serials if s.serial == 301)
    assert info.attrs["global_step_mismatch"] == "global_step 100 != 301"
    plan = cv.open(root).restore(200, dry_run=True)
    assert plan.ops["path"].iloc[-1] == "checkpoint-302/trainer_state.json"


def test_lightning_never_overwrites_last_ckpt(tmp_path):
    _case, root = build("lightning", tmp_path)
    last = root / "lightning_logs/version_0/checkpoints/last.ckpt"
    before = last.read_bytes()
    cat = cv.open(root)
    cat.restore(100)
    assert last.read_bytes() == before
    assert (root / LAST_V1).read_bytes() == (
        root / "lightning_logs/version_0/checkpoints/epoch=0-step=100.ckpt"
    ).read_bytes()
    _case, plain = build("lightning-no-last", tmp_path / "b")
    plan = cv.open(plain).restore(100, dry_run=True)
    assert list(plan.ops["path"]) == ["lightning_logs/version_0/checkpoints/epoch=0-step=201.ckpt"]


def test_orbax_delete_uncommits_first(tmp_path):
    _case, root = build("orbax", tmp_path)
    cat = cv.open(root)
    ops = cat._scan.layout.delete_ops(cat.tree, cat.scan, cat.scan.serials[0])
    assert (ops[0].kind, ops[0].src, ops[0].path) == ("rename", "2", "2.orbax-checkpoint-tmp")
    assert all(o.path.startswith("2.orbax-checkpoint-tmp") for o in ops[1:])
    markers = [o.path for o in ops if o.note == "marker"]
    assert markers and all(p.endswith("commit_success.txt") for p in markers)
    (root / "2.orbax-checkpoint-tmp").mkdir()  # a leftover tmp of the same step
    cat.refresh()
    ops = cat._scan.layout.delete_ops(cat.tree, cat.scan, cat.scan.serials[0])
    assert ops[0].path.startswith("2.orbax-checkpoint-tmp-") and ops[0].src == "2"


def test_tf_export_writes_state_file_last(tmp_path):
    _case, root = build("tf", tmp_path)
    plan = cv.open(root).restore(300, to=tmp_path / "out", dry_run=True)
    assert list(plan.ops["path"]) == ["ckpt-300.data-00000-of-00001", "ckpt-300.index",
                                      "checkpoint"]  # fmt: skip
    shutil.rmtree(root)
