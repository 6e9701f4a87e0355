"""Issue 29, the API and CLI items: permission errors that say so, input that holds no
checkpoint, weights-only export with right kinds, and the words of the command line."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_path
from test_restore import copy_corpus, snapshot

import ckptview as cv
from ckptview.cli import build_parser, main
from ckptview.kinds import guess_kind

NOBODY = 65534
SETPRIV = shutil.which("setpriv")


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    """``ckptview ARGV`` run as the unprivileged user ``nobody`` (tests run as root, who may
    read anything)."""
    assert SETPRIV, "setpriv is missing: apt-get install util-linux"
    cmd = [SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           sys.executable, "-m", "ckptview.cli", *argv]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=120)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory ``nobody`` may enter (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="ckptview-perm-"))
    d.chmod(0o755)
    yield d
    for p in [d, *d.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(d)


# -- 2. permission problems say so ---------------------------------------------------------


def test_unreadable_root_is_a_permission_error(shared_dir):
    root = copy_corpus("paddle/fluid_ckpt", shared_dir / "run")
    root.chmod(0o000)
    proc = as_nobody("ls", str(root))
    assert proc.returncode == 1, proc
    assert proc.stderr.count("\n") == 1 and "permission denied" in proc.stderr
    assert str(root) in proc.stderr and "no layout recognizes" not in proc.stderr
    proc = as_nobody("verify", str(root))
    assert proc.returncode == 1 and "permission denied" in proc.stderr


def test_unreadable_serial_dir_is_named_by_ls_vars_and_verify(shared_dir):
    root = copy_corpus("paddle/fluid_ckpt", shared_dir / "run")
    (root / "checkpoint_1").chmod(0o000)
    proc = as_nobody("ls", str(root))
    assert proc.returncode == 1
    assert "permission denied: checkpoint_1" in proc.stdout
    assert f"permission denied: {root / 'checkpoint_1'}" in proc.stderr
    proc = as_nobody("ls", str(root), "--json")
    rows = {r["serial"]: r for r in json.loads(proc.stdout)}
    assert rows[1]["error"] == "permission denied: checkpoint_1" and not rows[1]["complete"]
    proc = as_nobody("vars", str(root), "--serial", "1")
    assert proc.returncode == 1 and "permission denied" in proc.stderr
    assert as_nobody("vars", str(root), "--serial", "2").returncode == 0
    proc = as_nobody("verify", str(root), "--json")
    found = json.loads(proc.stdout)
    assert proc.returncode == 1
    assert [(f["serial"], f["check"], f["severity"]) for f in found] == [(1, "permission", "error")]
    assert found[0]["file"].endswith("checkpoint_1")
    proc = as_nobody("verify", str(root))
    assert proc.returncode == 1 and "no findings" not in proc.stdout
    assert as_nobody("verify", str(root), "2").returncode == 0  # serial 2 reads fine


# -- 4. input that holds no checkpoint -------------------------------------------------------


def test_a_file_that_holds_no_checkpoint_is_one_line_exit_1(tmp_path, capsys):
    text = tmp_path / "hostname"
    text.write_text("box\n")
    readme = tmp_path / "README.md"
    readme.write_text("# hi\n")
    for path in (text, readme):
        code, out, err = run(capsys, "ls", path)
        assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    code, _, err = run(capsys, "ls", text)
    assert "no checkpoint in" in err and "hostname" in err
    code, _, err = run(capsys, "verify", text)
    assert code == 1 and "no checkpoint" in err


KERAS_WITHOUT_H5PY = (
    "import sys; sys.modules['h5py'] = None\n"
    "from ckptview.cli import main; sys.exit(main(sys.argv[1:]))"
)


def test_a_missing_extra_is_named_in_full():
    keras = corpus_path("tf_orbax/tf/keras/m.keras")
    proc = subprocess.run([sys.executable, "-c", KERAS_WITHOUT_H5PY, "ls", str(keras)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().endswith("needs h5py: pip install 'ckptview[keras]'")
    assert len(proc.stderr.strip().splitlines()) == 1


# -- 5. kinds and weights-only export --------------------------------------------------------


@pytest.mark.parametrize("name, kind", [
    ("args/hidden_size", "trainer"), ("args/adam_beta1", "trainer"), ("args/optimizer", "trainer"),
    ("tp0/args/seed", "trainer"), ("rng_state/0/random_rng_state/0", "rng"),
    ("optimizer/state/0/exp_avg", "optimizer"), ("optim/param_groups/0/lr", "optimizer"),
    ("ds_config/zero_optimization/stage", "trainer"), ("global_steps", "trainer"),
    ("loops/fit_loop/epoch_loop.state_dict/_batches_that_stepped", "trainer"),
    ("model/decoder.layers.0.mlp.linear_fc1.weight", "model"),
])  # fmt: skip
def test_kinds_by_name(name, kind):
    assert guess_kind(name) == kind


def test_megatron_kinds_and_weights_only_export(tmp_path, capsys):
    src = corpus_path("llm/megatron_legacy")
    v = cv.open(src).variables
    v = v[v["serial"] == 15]
    kinds = dict(zip(v["name"], v["kind"]))
    assert all(kinds[n] == "trainer" for n in kinds if n.startswith("args/"))
    assert all(kinds[n] == "rng" for n in kinds if n.startswith("rng_state/"))
    assert all(kinds[n] == "optimizer" for n in kinds if n.startswith("optimizer/"))
    weights = sorted(n for n, k in kinds.items() if k == "model")
    assert weights and all(n.startswith("model/") for n in weights)
    code, _, err = run(capsys, "export", src, 15, "--to", tmp_path / "w", "-q")
    assert code == 0 and "--kinds all" in err and "optimizer" in err
    out = cv.open(tmp_path / "w").variables
    assert sorted(out["name"]) == weights and set(out["kind"]) == {"model"}
    code, out_text, _ = run(capsys, "export", src, 15, "--to", tmp_path / "all", "-q",
                            "--kinds", "all", "--json")  # fmt: skip
    assert code == 0 and json.loads(out_text)["files"][0]["n_tensors"] > 200
    code, _, _ = run(capsys, "export", src, 15, "--to", tmp_path / "o", "-q",
                     "--kinds", "model,optimizer")  # fmt: skip
    assert code == 0 and set(cv.open(tmp_path / "o").variables["kind"]) == {"model", "optimizer"}
    plan = cv.open(src).export(15, to=tmp_path / "api", kinds=["model"], dry_run=True)
    assert int(plan.files["n_tensors"].sum()) == len(weights)
    with pytest.raises(ValueError, match="no variable of kind"):
        cv.open(src).export(15, to=tmp_path / "none", kinds=["lookup_table"], dry_run=True)


# -- 7. the words of the command line --------------------------------------------------------


def test_version_and_usage_words(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"ckptview {cv.__version__}"
    with pytest.raises(SystemExit):
        main(["diff", str(corpus_path("paddle/fluid_ckpt"))])
    err = capsys.readouterr().err
    assert "SERIAL_A, SERIAL_B" in err and "a, b" not in err
    parser = build_parser()
    helps = {a.dest: a for a in parser._subparsers._group_actions[0].choices["restore"]._actions}
    assert helps["serial"].help and helps["serial"].metavar == "SERIAL"


def test_retain_deletes_only_with_apply_and_yes(tmp_path, capsys):
    root = copy_corpus("paddle/fluid_ckpt", tmp_path / "fluid")
    before = snapshot(root)
    code, _, err = run(capsys, "retain", root, "--keep-last", 1, "--yes")
    assert code == 0 and snapshot(root) == before and "add --apply" in err
    code, _, err = run(capsys, "retain", root, "--keep-last", 1, "--apply")
    assert code == 0 and snapshot(root) == before and "add --yes" in err
    assert "policy: keep the last 1 complete;" in err and "KeepLast(" not in err
    with pytest.raises(SystemExit):
        main(["-h"])
    assert "with both --apply and --yes" in " ".join(capsys.readouterr().out.split())
    retain = build_parser()._subparsers._group_actions[0].choices["retain"]
    older = next(a for a in retain._actions if a.dest == "older_than")
    assert "older ones may be deleted" in older.help and "newer than (" not in older.help
    code, _, _ = run(capsys, "retain", root, "--keep-last", 1, "--apply", "--yes")
    assert code == 0 and list(cv.open(root).serials.index) == [2, 3]


def test_diff_json_says_why_a_number_is_null(tmp_path, capsys):
    np.savez(tmp_path / "step_1.npz", w=np.zeros(4, np.float32), v=np.ones(3, np.float32))
    np.savez(tmp_path / "step_2.npz", w=np.ones(4, np.float32), v=2 * np.ones(3, np.float32))
    code, out, _ = run(capsys, "diff", tmp_path, 1, 2)
    assert code == 0 and "inf" in out
    code, out, _ = run(capsys, "diff", tmp_path, 1, 2, "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["w"]["rel_l2"] is None and "rel_l2 is infinite" in rows["w"]["note"]
    assert "all zeros" in rows["w"]["note"] and rows["v"]["note"] is None


def test_public_surface_has_no_design_doc_or_submodules():
    assert "DESIGN.md" not in inspect.getdoc(cv.open)
    for name in ("export", "verify", "usage", "plan_retention"):
        assert "DESIGN.md" not in (getattr(cv.Catalog, name).__doc__ or "")
    assert "DESIGN.md" not in (cv.Catalog.__doc__ or "") + (cv.Experiment.__doc__ or "")
    assert set(dir(cv)) == {*cv.__all__, "__version__"}
    assert cv.api is not None and os.path.basename(cv.catalog.__file__) == "catalog.py"
