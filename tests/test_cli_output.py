"""What the command line prints: tables that fit the terminal, one JSON document per
``--json`` with the API's types, flags (not Python arguments) in messages, quiet closed pipes,
one-line errors for missing extras. Trees are real corpus trees; COLUMNS sets the width."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import corpus_copy, corpus_path

import ckptview as cv
from ckptview.cli import build_parser, main

FLUID = "paddle/fluid_ckpt"  # 4 serials (3 complete), 4 nodes, 27 short variable names
MEGATRON = "llm/megatron_legacy"  # long names, tensor-parallel pieces
TRUNCATED = "caffe2/extra/truncated"  # long error and warning messages


def run(capsys, monkeypatch, width: int, *argv) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", str(width))
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def fits(out: str, width: int) -> list[str]:
    lines = out.splitlines()
    assert lines, "nothing printed"
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, f"{len(too_long)} line(s) over {width}: {too_long[:2]}"
    return lines


def rows_starting(lines: list[str], word: str) -> list[str]:
    return [line for line in lines if line.split()[:1] == [word]]


@pytest.mark.parametrize("width", [80, 200])
def test_ls_fits_and_shows_every_serial(capsys, monkeypatch, width):
    tree = corpus_path(FLUID)
    truth = cv.open(tree).serials
    code, out, err = run(capsys, monkeypatch, width, "ls", tree)
    lines = fits(out, width)
    assert code == 0 and err == ""
    for s, row in truth.iterrows():  # serial, its status word, its path relative to the tree
        (line,) = rows_starting(lines, str(s))
        status = "latest" if row["latest"] else ("complete" if row["complete"] else "incomplete")
        assert line.split()[1] == status
        assert f"checkpoint_{s}" in line and str(tree) not in line
        assert "KiB" in line  # a human size, never raw bytes
    assert "None" not in out and "error" not in lines[1]  # no error column: no serial has one
    if width == 200:  # room for every column: nodes as names, not a tuple
        assert "trainer_0, trainer_1, pserver_0, pserver_1" in out and "('trainer_0'" not in out


@pytest.mark.parametrize("width", [80, 200])
def test_ls_errors_only_where_there_are_some(capsys, monkeypatch, width):
    tree = corpus_path(TRUNCATED)
    error = cv.open(tree).serials["error"].iloc[0]
    code, out, err = run(capsys, monkeypatch, width, "ls", tree)
    lines = fits(out, width)
    assert code == 0 and "error" in lines[1].split() and "warning" in lines[1].split()
    assert error[:12] in out  # the message starts in its cell; --json has it whole
    assert len(error) > width and "ls --json" in err


@pytest.mark.parametrize("width", [80, 200])
def test_vars_and_stats_keep_names_whole(capsys, monkeypatch, width):
    tree = corpus_path(FLUID)
    cat = cv.open(tree)
    names = set(cat.variables.query(f"serial == {cat.latest}")["name"])
    for command in ("vars", "stats"):
        code, out, _ = run(capsys, monkeypatch, width, command, tree)
        lines = fits(out, width)
        assert code == 0 and {line.split()[0] for line in lines[3:]} == names, command
        assert "pserver_0" in out and "pserver_1" in out  # share_w is on two nodes
    code, out, _ = run(capsys, monkeypatch, width, "vars", corpus_path(MEGATRON))
    fits(out, width)
    longest = max(cv.open(corpus_path(MEGATRON)).variables["name"], key=len)
    assert len(longest) > 40 and longest[:10] in out  # folded onto more lines, never cut


@pytest.mark.parametrize("width", [80, 200])
def test_diff_biggest_change_first(capsys, monkeypatch, width):
    tree = corpus_path(FLUID)
    code, out, _ = run(capsys, monkeypatch, width, "diff", tree, 1, 2, "--changed")
    lines = fits(out, width)
    expected = cv.open(tree).diff(1, 2)
    expected = expected[expected["status"] != "identical"]
    shown = [line.split()[1] for line in lines if line.split()[:1] == ["changed"]]
    assert code == 0 and shown == list(expected["name"])
    rel = expected["rel_l2"].astype(float).fillna(-1).tolist()
    assert rel == sorted(rel, reverse=True)  # the engine's order: largest change first


def test_journal_on_a_fresh_tree_and_after_changes(tmp_path, capsys, monkeypatch):
    root = corpus_copy(FLUID, tmp_path / "fluid")
    code, out, _ = run(capsys, monkeypatch, 80, "journal", root)
    assert code == 0 and " ".join(out.split()) == f"no changes journaled in {root}"
    assert "DataFrame" not in out
    assert run(capsys, monkeypatch, 80, "restore", root, 1, "--yes", "-q")[0] == 0
    code, out, _ = run(capsys, monkeypatch, 80, "journal", root)
    (line,) = rows_starting(fits(out, 80)[2:], out.splitlines()[2].split()[0])
    assert "restore" in line and "finished" in line and "30/30" in line


# -- --json: one document per command, the API's types ------------------------------------
def json_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {name for name, p in sub.choices.items()
            if any("--json" in a.option_strings for a in p._actions)}  # fmt: skip


def test_every_json_output_is_one_document_with_api_types(tmp_path, capsys, monkeypatch):
    root = corpus_copy(FLUID, tmp_path / "fluid")
    cat = cv.open(root)

    def doc(*argv):
        code, out, _ = run(capsys, monkeypatch, 80, *argv, "--json")
        assert code == 0, argv
        return json.loads(out)  # exactly one document, or this raises

    seen = set()

    def check(command, *argv):
        seen.add(command)
        return doc(command, root, *argv)

    serials = check("ls")
    assert [r["serial"] for r in serials] == list(cat.serials.index)
    first = serials[0]
    assert isinstance(first["nbytes"], int) and isinstance(first["nodes"], list)
    assert isinstance(first["timestamp"], str) and first["error"] is None
    assert isinstance(first["complete"], bool) and first["step"] == cat.serials["step"].iloc[0]
    variables = check("vars", "--serial", 1)
    assert {r["serial"] for r in variables} == {1} and all(isinstance(r["shape"], list)
                                                            for r in variables)  # fmt: skip
    stats = check("stats", "--serial", 1)
    assert isinstance(stats[0]["l2"], float) and isinstance(stats[0]["n_nan"], int)
    trajectory = check("stats", "--follow", "fc_0.w_0")
    assert [r["serial"] for r in trajectory] == list(cat.trajectory("fc_0.w_0").index)
    code, out, _ = run(capsys, monkeypatch, 80, "health", root, "--json")
    seen.add("health")
    health = json.loads(out)  # exactly one document, exit 1: the crashed serial 3 is a finding
    assert code == 1 and health["rollback_point"] == cat.latest and not health["healthy"]
    assert health["first"]["not_loadable"] == 3 and isinstance(health["top"], list)
    diff = check("diff", 1, 2)
    assert [r["name"] for r in diff] == list(cat.diff(1, 2)["name"])
    assert check("verify") == []
    plan = check("retain", "--keep-last", 1)
    assert {r["serial"]: r["action"] for r in plan} == {0: "delete", 1: "delete", 2: "keep",
                                                         3: "keep"}  # fmt: skip
    export = check("export", "--to", tmp_path / "export", "--dry-run")
    assert export["action"] == "export" and export["dry_run"] and export["serial"] == 2
    assert export["nbytes"] == sum(f["nbytes"] for f in export["files"]) > 0
    restore = check("restore", 1, "--yes")
    assert restore["action"] == "restore" and restore["done"] and restore["new_serial"] == 4
    assert len(restore["ops"]) == 30 and isinstance(restore["ops"][0]["nbytes"], int)
    journal = check("journal")
    assert [(r["action"], r["serial"], r["serials"]) for r in journal] == [("restore", 1, [1])]
    recovered = check("journal", "--recover")
    assert recovered["action"] == "recover" and recovered["outcomes"] == []
    applied = check("retain", "--keep-last", 1, "--apply", "--yes")
    assert applied["action"] == "retention" and applied["done"]
    assert [r["serial"] for r in applied["deleted"]] == [0, 1, 2, 3]
    assert seen == json_commands()  # a new command with --json gets a check here


# -- messages ------------------------------------------------------------------------------
def test_messages_name_flags_not_python_arguments(tmp_path, capsys, monkeypatch):
    root = corpus_copy(FLUID, tmp_path / "fluid")
    code, _, err = run(capsys, monkeypatch, 80, "restore", root, 3)  # serial 3 is incomplete
    assert code == 1 and "--force" in err and "force=True" not in err
    code, _, err = run(capsys, monkeypatch, 80, "stats", root, "--follow", "share_w")
    assert code == 1 and "pass --node" in err and "node=" not in err
    code, _, err = run(capsys, monkeypatch, 80, "retain", root, "--keep-last", 0)
    assert code == 1 and "--keep-last must be at least 1" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="force=True"):  # the API keeps its own words
        cv.open(root).restore(3)


def test_every_flag_has_help_text():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():
        missing = [a.option_strings[0] for a in command._actions
                   if a.option_strings and not a.help and a.dest != "help"]  # fmt: skip
        assert not missing, f"ckptview {name}: no help for {missing}"


# -- pipes and missing extras (real processes) ----------------------------------------------
CLI = [sys.executable, "-m", "ckptview.cli"]


def test_closed_pipe_exits_quietly():
    """``ckptview stats TREE | head -2``: the reader is gone before the table is written."""
    for argv in (["stats", str(corpus_path(FLUID))], ["vars", str(corpus_path(FLUID)), "--json"]):
        proc = subprocess.Popen(CLI + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait() == 141 and err == "", err


def test_head_sees_the_first_lines():
    shell = f"{' '.join(CLI)} stats {corpus_path(FLUID)} | head -2"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "80"})  # fmt: skip
    assert done.stderr == "" and len(done.stdout.splitlines()) == 2
    assert done.stdout.splitlines()[1].split()[0] == "name"


def blocked(module: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where ``import module`` fails."""
    prelude = f"import sys; sys.modules[{module!r}] = None\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True)


def test_s3_without_s3fs_is_one_line_naming_the_extra():
    done = blocked("s3fs", "from ckptview.cli import main; sys.exit(main(['ls', 's3://b/run']))")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "ckptview ls: s3:// URLs need s3fs: pip install 'ckptview[s3]'\n"


def test_other_missing_filesystems_name_their_package():
    from ckptview.io import MissingDependencyError, Storage

    with pytest.raises(MissingDependencyError, match=r"^gs:// URLs need gcsfs: pip install gcsfs$"):
        Storage.from_url("gs://bucket/run")


def test_orbax_and_keras_without_their_extra(tmp_path):
    orbax = corpus_path("tf_orbax/orbax/run1")  # OCDBT: its arrays are read with tensorstore
    code = (f"import ckptview as cv\ntry:\n    cv.open({str(orbax)!r}).read('state/opt/mu')\n"
            "except ImportError as e:\n    print(e)\n")  # fmt: skip
    done = blocked("tensorstore", code)
    assert done.returncode == 0 and "ckptview[orbax]" in done.stdout, done.stderr[-500:]
    assert len(done.stdout.strip().splitlines()) == 1
    keras = next(Path(corpus_path("tf_orbax/tf/keras")).rglob("*.h5"))
    done = blocked("h5py", f"import ckptview as cv\nprint(cv.open({str(keras)!r}).files['error'].iloc[0])")
    assert "ckptview[keras]" in done.stdout and len(done.stdout.strip().splitlines()) == 1


def test_dev_sh_usage_is_whole():
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["bash", str(root / "dev.sh")], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
    header = [line[2:] if line.startswith("# ") else line[1:]
              for line in (root / "dev.sh").read_text().splitlines()[1:]
              if line.startswith("#")]  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == header[: len(done.stderr.splitlines())]
    assert done.stderr.rstrip().endswith("$PYTHON picks the interpreter.")
    for command in ("dashboard", "test", "setup", "help"):
        assert f"./dev.sh {command}" in done.stderr
