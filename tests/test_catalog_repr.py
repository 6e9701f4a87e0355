"""The catalog in a notebook: its summary (text and HTML, every name escaped), signatures and
tab completion, serial checks, and one kind of result for every change."""

from __future__ import annotations

import inspect
import json
import shutil

import pandas as pd
import pytest
from conftest import corpus_copy, corpus_path

import ckptview as cv
from ckptview.changes.recover import recover
from ckptview.changes.result import ChangeResult
from ckptview.fmt import human_bytes

FLUID = "paddle/fluid_ckpt"


def test_repr_summarizes_the_tree():
    cat = cv.open(corpus_path(FLUID))
    table = cat.serials
    text = repr(cat)
    lines = dict(line.split(":", 1) for line in text.splitlines()[1:])
    assert lines["layout"].strip() == "paddle-fluid"
    assert lines["root"].strip() == cat.url
    assert lines["serials"].strip() == "4 (0 … 3): 1 latest, 2 complete, 1 incomplete"
    latest = table.loc[cat.latest]
    assert lines["latest"].strip().startswith(f"{cat.latest} (epoch {latest['epoch']}, step "
                                              f"{latest['step']}, {human_bytes(latest['nbytes'])}")  # fmt: skip
    assert lines["size"].strip() == (f"{human_bytes(table['nbytes'].sum())} in "
                                     f"{table['n_files'].sum()} files; "
                                     f"{latest['n_variables']} variables per serial")  # fmt: skip
    assert "problems" not in lines and "warning" not in lines


def test_repr_of_a_damaged_tree_says_so():
    cat = cv.open(corpus_path("caffe2/extra/truncated"))
    text = repr(cat)
    assert "latest:   none (no serial loads)" in text
    assert "1 serial(s) with errors; 1 serial(s) with warnings" in text


def test_repr_html_escapes_every_name(tmp_path):
    evil = "<img src=x onerror=alert(1)>run"  # no "/" in a file name
    root = corpus_copy(FLUID, tmp_path / evil)
    (root / "<i>stray.bin").write_bytes(b"\0" * 16)  # a file outside every serial: a warning
    cat = cv.open(root)
    assert cat.attrs.get("warnings"), "the stray file should give a tree warning"
    page = cat._repr_html_()
    assert "<img" not in page and "<i>stray" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;run" in page and "&lt;i&gt;stray" in page
    assert page.count("<tr>") >= 5 and "<details>" in page  # the summary rows and the serials


def test_tab_completion_hides_internals_that_still_work():
    cat = cv.open(corpus_path(FLUID))
    names = dir(cat)
    for internal in ("tree", "storage", "scan", "cache"):
        assert internal not in names
        assert getattr(cat, internal) is not None  # the dashboard and plugins use them
    for public in ("serials", "variables", "diff", "restore", "plan_retention", "layout"):
        assert public in names


@pytest.mark.parametrize("method, params", [
    ("diff", {"match", "rename", "progress", "chunk_bytes"}),
    ("stats", {"chunk_bytes"}),
    ("restore", {"storage_options", "force", "progress"}),
    ("export", {"force", "storage_options", "progress"}),
    ("plan_retention", {"policy", "every_by", "slim_older_than", "now"}),
    ("apply_retention", {"progress"}),
    ("set_retention", {"keep_last", "keep_every", "keep_best", "pinned", "older_than"}),
])  # fmt: skip
def test_signatures_show_every_parameter(method, params):
    fn = getattr(cv.Catalog, method)
    sig = inspect.signature(fn)
    kinds = {p.kind for p in sig.parameters.values()}
    assert inspect.Parameter.VAR_KEYWORD not in kinds, f"{method} hides parameters in **kwargs"
    assert params <= set(sig.parameters)
    assert fn.__doc__ and all(p in fn.__doc__ for p in params - {"chunk_bytes", "now", "keep_every",
                                                                  "keep_best", "pinned", "older_than",
                                                                  "keep_last", "storage_options"})  # fmt: skip


def test_read_names_the_missing_serial():
    cat = cv.open(corpus_path(FLUID))
    for call in (lambda: cat.read("fc_0.w_0", serial=42), lambda: cat.variable("w", serial=42),
                 lambda: cat.load(42), lambda: next(cat.iter_chunks("fc_0.w_0", serial=42))):  # fmt: skip
        with pytest.raises(KeyError, match=r"no serial 42; serials: \[0, 1, 2, 3\]"):
            call()
    with pytest.raises(KeyError, match="no variable 'w' in serial 2"):
        cat.read("w", serial=2)


def test_every_change_returns_a_change_result(tmp_path):
    root = corpus_copy(FLUID, tmp_path / "fluid")
    cat = cv.open(root)
    results = {
        "restore plan": cat.restore(1, dry_run=True),
        "restore": cat.restore(1),
        "export plan": cat.export(2, to=tmp_path / "export", dry_run=True),
        "export": cat.export(2, to=tmp_path / "export"),
        "recover plan": recover(root, dry_run=True),
    }
    plan = cat.plan_retention(keep_last=1)  # DESIGN.md: a DataFrame indexed by serial
    assert isinstance(plan, pd.DataFrame) and plan.index.name == "serial"
    assert {"action", "reason", "nbytes"} <= set(plan.columns) and "fingerprint" in plan.attrs
    results["retention"] = applied = cat.apply_retention(plan)
    assert list(applied.deleted.index) == [0, 1, 2, 3]  # what was deleted, by serial
    assert applied.nbytes == int(plan.loc[[0, 1, 2, 3], "nbytes"].sum())
    for what, result in results.items():
        assert isinstance(result, ChangeResult), what
        assert result.dry_run == what.endswith("plan") and result.done != result.dry_run, what
        doc = result.to_dict()
        assert json.loads(json.dumps(doc)) == doc and doc["target"] == result.target, what
        assert str(result).splitlines()[0] == result.headline()
        assert result._repr_html_().startswith("<p>"), what
        assert isinstance(result.ops, pd.DataFrame), what
    assert results["restore"].new_serial == 4 and len(results["restore"].ops) == 30
    assert results["export"].files["nbytes"].sum() == results["export"].nbytes > 0


def test_change_result_html_is_escaped(tmp_path):
    root = tmp_path / "<script>x<script>"
    shutil.copytree(corpus_path(FLUID), root)
    html = cv.open(root).restore(1, dry_run=True)._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html
