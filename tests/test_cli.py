"""The ``ckptview stats|diff|restore|retain`` commands (run in-process through main())."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import corpus_path
from test_restore import copy_corpus, snapshot
from test_stats_diff import read_lod

import ckptview as cv
from ckptview.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_stats_json_and_follow(capsys):
    fluid = corpus_path("paddle/fluid_ckpt")
    code, out, _ = run(capsys, "stats", fluid, "--serial", 1, "--name", "fc_0.w_0", "--json")
    rows = json.loads(out)
    arr = read_lod(corpus_path("paddle/fluid_ckpt/checkpoint_1/__model__/fc_0.w_0"))
    assert code == 0 and len(rows) == 1
    assert np.isclose(rows[0]["l2"], np.linalg.norm(arr.astype(np.float64)), rtol=1e-9)
    code, out, _ = run(capsys, "stats", fluid, "--follow", "fc_0.w_0", "--stat", "max", "--json")
    assert code == 0 and [r["serial"] for r in json.loads(out)] == [0, 1, 2, 3]


def test_diff_table_json_and_bad_input(capsys):
    fluid = corpus_path("paddle/fluid_ckpt")
    code, out, _ = run(capsys, "diff", fluid, 1, 2, "--json")
    rows = {(r["node"], r["name"]): r for r in json.loads(out)}
    assert code == 0 and rows[("", "learning_rate_0")]["status"] == "identical"
    code, out, _ = run(capsys, "diff", fluid, 1, 2, "--changed")
    assert code == 0 and "learning_rate_0" not in out and "fc_0.w_0" in out
    code, out, err = run(capsys, "diff", fluid, 1, 42)
    assert code != 0 and out == "" and len(err.strip().splitlines()) == 1 and "42" in err
    code, _, err = run(capsys, "diff", "/no/such/tree", 1, 2)
    assert code != 0 and len(err.strip().splitlines()) == 1


def test_restore_needs_yes(tmp_path, capsys):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    before = snapshot(root)
    code, out, err = run(capsys, "restore", root, 1)
    assert code == 0 and "would run" in out and "--yes" in err
    assert snapshot(root) == before
    code, out, _ = run(capsys, "restore", root, 1, "--yes", "--json")
    head = json.loads(out)
    assert code == 0 and head["done"] and head["new_serial"] == 4
    assert cv.open(root).latest == 4
    code, _, err = run(capsys, "restore", root, 3)  # incomplete
    assert code != 0 and "incomplete" in err
    code, _, _ = run(capsys, "restore", root, 2, "--to", tmp_path / "copy", "--yes")
    assert code == 0 and cv.open(tmp_path / "copy").latest == 2


def test_retain_plan_apply_and_stored_policy(tmp_path, capsys):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    before = snapshot(root)
    code, out, err = run(capsys, "retain", root, "--keep-last", 1, "--json")
    plan = {r["serial"]: r["action"] for r in json.loads(out)}
    assert code == 0 and plan == {0: "delete", 1: "delete", 2: "keep", 3: "keep"}
    code, _, err = run(capsys, "retain", root, "--keep-last", 1, "--apply")  # no --yes
    assert code == 0 and "--yes" in err and snapshot(root) == before
    code, _, _ = run(capsys, "retain", root, "--keep-last", 1, "--pin", 0, "--save")
    assert code == 0 and cv.open(root).retention_policy() is not None
    code, out, _ = run(capsys, "retain", root, "--apply", "--yes", "--json")  # stored policy
    assert code == 0 and [r["serial"] for r in json.loads(out)["deleted"]] == [1]
    assert list(cv.open(root).serials.index) == [0, 2, 3]
    code, _, err = run(capsys, "retain", root, "--keep-best", "loss:x")
    assert code != 0 and len(err.strip().splitlines()) == 1


def test_retain_refuses_locked_tree(tmp_path, capsys):
    import os
    import socket

    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    (root / ".ckptview").mkdir()
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "time": "now", "token": "t"}
    (root / ".ckptview/lock").write_text(json.dumps(holder))
    code, _, err = run(capsys, "retain", root, "--keep-last", 1, "--apply", "--yes")
    assert code == 2 and "locked" in err and len(err.strip().splitlines()) == 1
    code, _, _ = run(capsys, "retain", root, "--keep-last", 1, "--apply", "--yes",
                     "--break-lock")  # fmt: skip
    assert code == 0 and list(cv.open(root).serials.index) == [2, 3]


# -- progress on the catalog scan ------------------------------------------------------------
def test_scan_progress_hook_sees_every_file(tmp_path):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    data_files = [p for p in root.rglob("*") if p.is_file() and p.name != "_SUCCESS"]
    calls: list[tuple[int, int]] = []
    cat = cv.open(root, progress=lambda done, total: calls.append((done, total)), cache=False)
    assert calls == []  # lazy: nothing listed before a table is asked for
    files = cat.files[cat.files["role"] == "data"]  # the files whose headers are listed
    n = len(files)
    assert n == len(set(files["path"])) > 10
    assert calls == [(i, n) for i in range(1, n + 1)]  # once per file, in order, main thread
    listed = {p for p in files["path"]}
    assert {str(p) for p in data_files} - listed <= {str(p) for p in data_files
                                                     if "trainer_" in str(p)}  # fmt: skip
    calls.clear()
    again = cv.open(root, progress=lambda d, t: calls.append((d, t)))  # header cache: hits
    again.serials  # noqa: B018
    again2 = cv.open(root, progress=lambda d, t: calls.append((d, t)))
    again2.serials  # noqa: B018
    assert calls[-1] == (n, n) and len(calls) == 2 * n


def test_cli_progress_flags(tmp_path, capsys):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    files = cv.open(root).files
    n = int((files["role"] == "data").sum())
    code, out, err = run(capsys, "ls", root, "--progress")  # stderr is not a TTY here
    assert code == 0 and "scan" in err and f"0/{n} " in err  # a bar over every file
    code, out, err = run(capsys, "ls", root)  # default: silent when not a terminal
    assert code == 0 and err == "" and "checkpoint_3" in out
    with pytest.raises(SystemExit) as e:  # argparse: mutually exclusive flags
        main(["vars", str(root), "--quiet", "--progress"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err
    code, out, err = run(capsys, "diff", root, 1, 2, "--progress", "--json")
    assert code == 0 and "scan" in err and "diff" in err
    json.loads(out)
    code, out, err = run(capsys, "restore", root, 1, "--yes", "-q")
    assert code == 0 and err == "" and "did run" in out
