"""The Panel components in-process, on the demo tree and corpus trees (no browser).

Expected values come from the catalog (or the demo's own arrays), never from the widgets.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil

import numpy as np
import pandas as pd
import panel as pn
import pytest
from conftest import corpus_copy, corpus_path

import ckptview as cv
from ckptview.demo import model_arrays, write_demo, write_sweep
from ckptview.widgets import (
    AccessRefused,
    CompareView,
    Dashboard,
    Guard,
    RestoreView,
    RetentionView,
    RunBrowser,
    RunsView,
    SerialsTable,
    TrajectoryPlot,
    TreePicker,
    VariablesTable,
    Workspace,
    build_app,
)
from ckptview.widgets._base import size_formatter, table
from ckptview.widgets._format import (
    badge,
    filter_choices,
    fmt_number,
    html_choices,
    human_bytes,
    md_code,
    md_text,
    once_per_tables,
    serials_frame,
    streamed_histogram,
)
from ckptview.widgets.pages.browse.detail import VariableDetail

SERIALS = 6


@pytest.fixture
def demo(tmp_path):
    return write_demo(tmp_path / "tree", serials=SERIALS)


@pytest.fixture
def cat(demo):
    return cv.open(demo.root)


def test_human_bytes():
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"


@pytest.mark.parametrize("tree", ["paddle/fluid_ckpt", "caffe2/ckpt"])
def test_serials_table_statuses_match_the_catalog(tree):
    cat = cv.open(corpus_path(*tree.split("/")))
    table = SerialsTable(cat)
    frame = table.frame
    s = cat.serials
    assert list(frame["serial"]) == list(s.index)
    latest = frame.set_index("serial")["status"] == "latest"
    assert list(latest[latest].index) == [cat.latest]
    incomplete = set(s.index[~s["complete"]])
    assert set(frame.loc[frame["status"] == "incomplete", "serial"]) == incomplete
    assert table.selected == cat.latest
    assert table.table.pagination == "remote"
    assert f"{len(s)} serials" in table.summary.object


def test_serials_frame_sizes_and_metrics(cat):
    frame = serials_frame(cat)
    assert list(frame["size"]) == [human_bytes(n) for n in cat.serials["nbytes"]]
    assert list(frame["nodes"])[0] == ", ".join(cat.serials["nodes"].iloc[0])


def test_what_the_sessions_of_a_served_catalog_share_is_made_once_per_table(cat):
    """Each page of a served tree made its serials frame and filter choices again (a tenth of
    a page's server time on a 1 M-row tree): now once per catalog state, fresh after a
    refresh, and gone with the tables."""
    import gc
    from functools import partial

    calls = []

    def make(df):
        calls.append(1)
        return len(df)

    a = pd.DataFrame({"x": [1, 2]})
    assert once_per_tables("n", (a,), partial(make, a)) == 2
    assert once_per_tables("n", (a,), partial(make, a)) == 2 and len(calls) == 1
    b = pd.DataFrame({"x": [1, 2, 3]})
    assert once_per_tables("n", (b,), partial(make, b)) == 3 and len(calls) == 2
    from ckptview.widgets import _format

    keys = [k for k in _format._MADE if k[1] == id(a)]
    del a
    gc.collect()
    assert keys and not any(k in _format._MADE for k in keys)  # gone with its table

    first, again = serials_frame(cat), serials_frame(cat)
    pd.testing.assert_frame_equal(first, again)
    assert first is not again  # a copy each: a table may change its own
    kinds = filter_choices(cat.variables)
    assert kinds is filter_choices(cat.variables)
    assert kinds == tuple(sorted(map(str, cat.variables[c].unique()))
                          for c in ("kind", "node", "dtype"))  # fmt: skip
    one, two = VariablesTable(cat), VariablesTable(cat)
    assert one.param.kinds.objects == two.param.kinds.objects
    old = cat.variables
    cat.refresh()
    assert cat.variables is not old  # a refresh makes the tables again …
    again = filter_choices(cat.variables)
    assert again == kinds and again is not kinds  # … and the choices from them


def test_clicking_a_serial_shows_its_variables(cat):
    browser = RunBrowser(cat)
    counts = cat.variables.groupby("serial").size()
    assert (
        f"Serial {cat.latest} · {counts[cat.latest]} variables" in browser.variables.heading.object
    )
    browser.serials.select(1)
    assert browser.variables.serial == 1
    assert len(browser.variables.table.value) == counts[1]
    assert f"Serial 1 · {counts[1]} variables" in browser.variables.heading.object


def test_variable_filters_and_totals(cat):
    vt = VariablesTable(cat, serial=2)
    v = cat.variables[cat.variables["serial"] == 2]
    biggest = v.loc[v["nbytes"] == v["nbytes"].max(), "name"]
    assert vt.table.value["name"].iloc[0] in set(biggest)  # the big ones first
    vt.kinds = ["optimizer"]
    assert len(vt.table.value) == (v["kind"] == "optimizer").sum()
    vt.kinds, vt.name_filter = [], "MOMENT1"
    assert set(vt.table.value["name"]) == {n for n in v["name"] if "moment1" in n}
    vt.name_filter, vt.nodes = "", ["pserver_0"]
    assert list(vt.table.value["name"]) == list(v.loc[v["node"] == "pserver_0", "name"])
    vt.nodes, vt.dtypes = [], ["int64"]
    assert len(vt.table.value) == (v["dtype"] == "int64").sum()
    vt.dtypes = []
    by_kind = vt.kind_totals.set_index("kind")
    for kind, nbytes in v.groupby("kind")["nbytes"].sum().items():
        assert by_kind.loc[kind, "nbytes"] == nbytes
        assert by_kind.loc[kind, "size"] == human_bytes(nbytes)
    by_node = vt.node_totals.set_index("node")
    assert by_node.loc["(shared)", "count"] == (v["node"] == "").sum()
    shown = vt.by_kind.object  # what the page shows: name, count, readable size
    assert list(shown.columns) == ["kind", "count", "size"] and len(shown) == len(by_kind)


def test_variable_detail_stats_and_histogram(cat, demo):
    browser = RunBrowser(cat)
    browser.serials.select(2)
    row = browser.variables.table.value.index[browser.variables.table.value["name"] == "fc_0.w_0"]
    browser.variables.table.selection = [int(row[0])]
    detail = browser.detail
    assert detail.variable == "fc_0.w_0" and detail.serial == 2
    assert "256×64" in detail.info.object
    detail.show(detail.compute())
    values = model_arrays(2)["fc_0.w_0"].astype(np.float64)
    stats = dict(zip(detail.stats.value["statistic"], detail.stats.value["value"]))
    assert float(stats["max"]) == pytest.approx(values.max(), rel=1e-3)
    assert float(stats["l2"]) == pytest.approx(np.linalg.norm(values), rel=1e-3)
    counts, edges = streamed_histogram(lambda: [values])
    assert counts.sum() == values.size
    assert type(detail.plot.object).__name__ == "Histogram"


def test_compare_view_sorted_by_rel_l2_with_plots(cat):
    view = CompareView(Workspace([cat]))
    view.param.update(serial_a=1, serial_b=4)
    view.show(view.compute())
    diff = cat.diff(1, 4)
    shown = view.table.value
    assert len(shown) == len(diff)
    changed = diff[diff["status"] == "changed"].sort_values("rel_l2", ascending=False)
    top = changed.iloc[0]
    assert top["name"] in shown["name"].iloc[0] or shown["name"].iloc[0] == top["name"]
    assert "changed" in shown["status"].iloc[0]
    view.show_variable("", "fc_1.w_0")
    kinds = [type(p.object).__name__ for p in view.plots.objects[1].objects]
    assert kinds == ["Histogram", "Histogram", "Histogram", "Image"]
    view.hide_identical = True
    assert len(view.table.value) == (diff["status"] != "identical").sum()


def test_compare_across_runs(tmp_path, cat):
    other = cv.open(write_demo(tmp_path / "other", serials=4, seed=7).root)
    ws = Workspace([cat, other])
    view = CompareView(ws)
    view.param.update(run_a=list(ws.runs)[0], serial_a=2, run_b=list(ws.runs)[1], serial_b=2)
    shown = view.compute()
    expected = cat.diff(2, 2, other=other)
    assert list(shown["rel_l2"].fillna(-1)) == list(expected["rel_l2"].fillna(-1))


def test_trajectory_plot_follows_the_catalog(cat):
    plot = TrajectoryPlot(cat, names=["fc_0.w_0"])
    expected = cat.trajectory("fc_0.w_0", stat="l2")
    assert list(plot.series[0].values) == pytest.approx(list(expected.values))
    plot.stat = "max"
    assert list(plot.series[0].values) == pytest.approx(list(cat.trajectory("fc_0.w_0", "max")))


def test_restore_plan_then_confirm(cat, tmp_path):
    ws = Workspace([cat], guard=Guard(roots=[str(tmp_path)], allow_write=True))
    view = RestoreView(ws)
    view.serial = 1
    view.mode = "copy"
    view.destination = str(tmp_path / "restored")
    view.show_plan(view.plan())
    assert view.confirm.visible and not (tmp_path / "restored").exists()
    view.show_result(view.apply())
    copy = cv.open(tmp_path / "restored")
    assert copy.latest == 1
    view.param.update(destination="/elsewhere/restored")
    with pytest.raises(AccessRefused):
        view.plan()


def test_retention_plan_confirm_apply(cat):
    view = RetentionView(Workspace([cat]))
    view.keep_last = 2
    view.show_plan(view.make_plan())
    expected = cat.plan_retention(keep_last=2)
    doomed = [int(s) for s in expected.index[expected["action"] == "delete"]]
    assert view.doomed() == doomed and len(cat.serials) == SERIALS  # nothing deleted yet
    assert view.delete.visible and view.delete.label.startswith(f"Delete {len(doomed)} checkpoints")
    view.ask()
    assert view.confirm.label == f"Delete {len(doomed)} checkpoints" and view.dialog.open
    assert type(view.dialog).__name__ == "Dialog"  # a real modal (panel-material-ui)
    view.show_result(view.apply())
    assert sorted(set(range(SERIALS)) - set(cat.refresh().serials.index)) == doomed
    assert f"Deleted {len(doomed)} checkpoints" in view.message.object


def test_retention_policy_saved_with_the_tree(cat):
    view = RetentionView(Workspace([cat]))
    view.param.update(keep_last=4, pinned=[0])
    view.save()
    again = RetentionView(Workspace([cv.open(cat.url)]))
    assert again.keep_last == 4 and again.pinned == [0]


def test_read_only_offers_and_does_nothing(cat):
    ws = Workspace([cat], guard=Guard(roots=[cat.url], allow_write=False))
    ret = RetentionView(ws)
    ret.keep_last = 1
    ret.show_plan(ret.make_plan())
    assert not ret.delete.visible and not ret.save_button.visible
    with pytest.raises(AccessRefused):
        ret.ask()
    with pytest.raises(AccessRefused):
        ret.apply()
    with pytest.raises(AccessRefused):
        ret.save()
    ret._on_delete()  # a forced click is refused and shown
    assert "Refused" in ret.message.object and not ret.dialog.open
    rv = RestoreView(ws)
    rv.serial = 1
    rv.show_plan(rv.plan())
    assert not rv.confirm.visible
    with pytest.raises(AccessRefused):
        rv.apply()
    assert len(cat.refresh().serials) == SERIALS


def test_picker_refuses_urls_outside_the_roots(tmp_path, demo):
    inside = tmp_path / "tree"
    shutil.copytree(corpus_path("caffe2", "ckpt"), tmp_path / "runs" / "caffe2")
    ws = Workspace(guard=Guard(roots=[str(inside), str(tmp_path / "runs")]))
    picker = TreePicker(ws)
    picker.url = str(tmp_path / "runs" / "caffe2")
    assert picker.open() == "caffe2" and ws.runs["caffe2"].layout == "caffe2"
    for url in ("/etc", str(inside / ".." / ".."), "memory://x"):
        picker.url = url
        with pytest.raises(AccessRefused):
            picker.open()
    picker.url, picker.storage_options = str(inside), "{not json"
    with pytest.raises(ValueError, match="JSON"):
        picker.open()


def test_build_app_renders(demo):
    page = build_app([str(demo.root)])
    model = page.get_root()
    assert model is not None


def test_a_dashboard_that_fails_without_an_experiment_raises_its_own_error(demo, monkeypatch):
    """build_app's fallback is for an experiment refused; with none, the error is the
    dashboard's own (it was masked by an AttributeError on ``experiment.root``)."""
    from ckptview.widgets.shell import app as appmod

    def broken(self, *args, **kwargs):
        raise RuntimeError("the dashboard's own failure")

    monkeypatch.setattr(appmod.Dashboard, "__init__", broken)
    with pytest.raises(RuntimeError, match="dashboard's own failure"):
        build_app([str(demo.root)])


def test_a_tree_that_cannot_be_catalogued_is_an_error_on_the_page(demo, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("no checkpoint here")
    page = build_app([str(notes), str(demo.root)], isolate=True)
    shown = [p.object for p in page.main if isinstance(getattr(p, "object", None), str)]
    assert any("UnknownTreeError" in s and "notes" in s for s in shown), shown
    assert page.get_root() is not None  # the page is served, with the other tree


# -- sizes sort by bytes; readable column sets -----------------------------------------------------
def test_size_columns_hold_bytes_so_they_sort_by_size(cat):
    table = SerialsTable(cat, poll_seconds=0)
    assert list(table.table.value["size"]) == list(cat.serials["nbytes"])
    table.table.sorters = [{"field": "size", "dir": "desc"}]
    want = cat.serials.sort_values("nbytes", ascending=False).index
    assert list(table.table.current_view["serial"]) == list(want)
    vt = VariablesTable(cat, serial=2)
    vt.table.sorters = [{"field": "size", "dir": "asc"}]
    sizes = list(vt.table.current_view["size"])
    assert sizes == sorted(sizes) and sizes[-1] > 1024  # numeric order, not "9.0 KiB" < "10 B"
    assert type(vt.table.formatters["size"]).__name__ == "HTMLTemplateFormatter"


def test_hf_serials_show_a_readable_set_of_columns():
    cat = cv.open(corpus_path("modern", "hf"))
    table = SerialsTable(cat, poll_seconds=0)
    metrics = set(cat.metrics["name"])
    titles = table.table.titles  # a metric's column is titled by its name
    shown = [titles.get(c, c) for c in table.table.value.columns
             if c not in table.table.hidden_columns]  # fmt: skip
    assert len([c for c in shown if c in metrics]) == 2 and "loss" in shown
    assert "nodes" not in shown  # empty on this tree
    table.columns = [*table.columns, "grad_norm"]  # the column chooser
    hidden = {titles.get(c, c) for c in table.table.hidden_columns}
    assert "grad_norm" not in hidden and "grad_norm" in metrics
    shown = {titles.get(c, c) for c in table.table.value.columns}  # only what is shown is sent
    assert "grad_norm" in shown and "nodes" not in shown and len(shown) == 2 + len(table.columns)


# -- live runs ---------------------------------------------------------------------------------------
def add_serial(root, source: int, new: int) -> None:
    """A new serial on disk, as a running job would write it (a copy of a complete one)."""
    shutil.copytree(root / f"checkpoint_{source}", root / f"checkpoint_{new}")


def test_live_run_new_serial_is_added_in_place(cat, demo):
    browser = RunBrowser(cat, poll_seconds=0)
    table = browser.serials
    table.select(2)
    assert browser.poll() == [] and not table.live.visible  # nothing changed: nothing redone
    add_serial(demo.root, 4, SERIALS)
    assert browser.poll() == [SERIALS]
    expected = cv.open(demo.root).serials
    assert list(table.table.value["serial"]) == list(expected.index)
    assert table.selected == 2 and table.table.selection == [2] and browser.variables.serial == 2
    assert table.live.visible and f"new serial {SERIALS}" in table.live.object
    assert f"{SERIALS + 1} serials" in table.summary.object
    assert f"resume point: **{SERIALS}**" in table.summary.object
    assert table.frame.set_index("serial").loc[SERIALS, "status"] == "latest"


def test_live_notice_is_built_with_the_first_news_under_the_summary(cat, demo):
    """A page's live notice is built only once there is news (most pages never get any), then
    joins the serials' Column under the summary; the parts below the serials share that
    Column (no Column of their own per page)."""
    browser = RunBrowser(cat, poll_seconds=0)
    table = browser.serials
    column = browser.__panel__()
    assert column is table.view() and column.objects[0] is table.summary
    # + the chooser's button, the timeline, and verify, variables and detail with a rule
    # between each
    assert table.table in column.objects and len(column.objects) == 9
    assert column.objects[3].css_classes == ["ckptview-timeline"]
    assert browser.poll() == [] and "live" not in table.__dict__  # no news: not built
    add_serial(demo.root, 4, SERIALS)
    assert browser.poll() == [SERIALS]
    assert column.objects[1] is table.live and table.live.visible
    assert f"new serial {SERIALS}" in table.live.object and len(column.objects) == 10


def test_lean_tables_build_only_the_cell_models_they_send(monkeypatch):
    """One editor per table and one formatter per kind of column: no editor or formatter is
    built to be dropped (Panel's own definitions build both for every column)."""
    from bokeh.models.widgets.tables import CellEditor, CellFormatter

    frame = pd.DataFrame({"a": [1, 2], "b": [1.5, 2.5], "c": ["x", "y"], "d": [3, 4],
                          "e": [True, False], "f": pd.to_datetime(["2024-01-01", "2024-01-02"])})  # fmt: skip
    built = []
    for base in (CellEditor, CellFormatter):
        init = base.__init__

        def counted(self, *args, _init=init, **kwargs):
            built.append(self)
            _init(self, *args, **kwargs)

        monkeypatch.setattr(base, "__init__", counted)
    tab = table(frame, formatters={"c": {"type": "textarea"}, "d": size_formatter()},
                text_align={"b": "center"})  # fmt: skip
    built.clear()
    columns = tab._get_columns()
    sent = {id(c.editor) for c in columns} | {id(c.formatter) for c in columns}
    assert len(sent) == 1 + 6  # one editor; a: int, b: float centred, c: text, d, e, f
    # and Bokeh's own: a TableColumn given an editor and a formatter builds its default ones
    # first (to compare the new values with), two a column
    assert len(built) == len(sent) + 2 * len(columns)
    plain = pn.widgets.Tabulator(frame, formatters={"c": {"type": "textarea"}, "d": size_formatter()},
                                 text_align={"b": "center"}, disabled=True, show_index=False)  # fmt: skip
    for lean, panel_own in zip(columns, plain._get_columns(), strict=True):
        assert (lean.field, lean.title, lean.width) == (panel_own.field, panel_own.title,
                                                        panel_own.width)  # fmt: skip
        assert type(lean.formatter) is type(panel_own.formatter)
        assert (lean.formatter.properties_with_values(include_defaults=False)
                == panel_own.formatter.properties_with_values(include_defaults=False))  # fmt: skip


def test_live_run_polls_on_its_own_period(cat, demo):
    table = SerialsTable(cat, poll_seconds=0.01)
    table.table.page = 1
    add_serial(demo.root, 3, SERIALS)
    asyncio.run(table._tick())  # what the periodic callback runs
    assert SERIALS in set(table.table.value["serial"]) and table.table.page == 1
    table.poll_seconds = 0
    add_serial(demo.root, 3, SERIALS + 1)
    asyncio.run(table._tick())  # polling off: the table stays as it is
    assert SERIALS + 1 not in set(table.table.value["serial"])


def test_dashboard_poll_updates_every_view(demo):
    ws = Workspace([cv.open(demo.root)], guard=Guard(roots=[str(demo.root)], allow_write=True))
    dash = Dashboard(ws, poll_seconds=0)
    add_serial(demo.root, 4, SERIALS)
    assert dash.poll() == [SERIALS]
    assert SERIALS in dash.compare.param.serial_a.objects
    assert SERIALS in dash.restore.param.serial.objects.values()
    assert SERIALS in dash.retention.param.pinned.objects


# -- restore of an incomplete serial ----------------------------------------------------------------
def test_restore_of_an_incomplete_serial_needs_force(cat, tmp_path):
    ws = Workspace([cat], guard=Guard(roots=[str(tmp_path)], allow_write=True))
    view = RestoreView(ws)
    crashed = SERIALS - 1
    assert view.param.serial.objects[f"{crashed} (incomplete)"] == crashed
    assert not view.force_box.visible
    view.param.update(serial=crashed, mode="copy", destination=str(tmp_path / "forced"))
    assert view.force_box.visible
    with pytest.raises(ValueError, match="incomplete.*force"):
        view.plan()
    view.force = True
    view.show_plan(view.plan())
    assert view.confirm.visible and "Forced" in view.message.object
    view.show_result(view.apply())
    assert (tmp_path / "forced").exists()


# -- verdicts on the page (DESIGN.md §3c) -------------------------------------------------------
def _broken_newest(tmp_path):
    """A DeepSpeed run whose newest tag (the one ``latest`` names) has garbage model states."""
    root = tmp_path / "ds"
    shutil.copytree(corpus_path("llm/deepspeed_zero"), root)
    newest = root / (root / "latest").read_text().strip()
    for f in newest.glob("*model_states.pt"):
        f.write_bytes(b"\0" * f.stat().st_size)
    return cv.open(root, cache=False), int(newest.name[11:])


def test_serials_view_shows_loadable_warnings_and_the_framework_pointer(tmp_path):
    cat, broken = _broken_newest(tmp_path)
    frame = serials_frame(cat).set_index("serial")
    assert frame.loc[broken, "loadable"] == "no" and frame.loc[broken, "status"] == "error"
    assert "model_states.pt" in frame.loc[broken, "error"]
    view = SerialsTable(cat)
    assert {"loadable", "error"} <= set(view.columns)
    assert f"pointer names serial **{broken}**" in view.summary.object


def test_variables_errors_only_filter_and_detail_reason(tmp_path):
    cat, broken = _broken_newest(tmp_path)
    table = VariablesTable(cat, serial=broken)
    n_all = len(table.filtered())
    table.errors_only = True
    bad = table.filtered()
    assert 0 < len(bad) < n_all and (bad["error"] != "").all()
    assert "unreadable" in table.heading.object
    row = bad.iloc[0]
    detail = VariableDetail(cat, serial=broken, node=row["node"], variable=row["name"])
    assert detail.button.disabled and "**error:**" in detail.info.object


def test_verify_action_shows_the_findings(tmp_path):
    cat, broken = _broken_newest(tmp_path)
    browser = RunBrowser(cat, poll_seconds=0)
    browser.serials.select(broken)
    panel = browser.verify
    assert panel.serial == broken
    panel.show(panel.run())
    assert "finding(s)" in panel.message.object and "cv-notice-danger" in panel.message.css_classes
    assert panel.findings.visible and (panel.findings.value["severity"] == "error").any()
    browser.serials.select(cat.latest)
    assert not panel.message.visible  # another serial: the old findings are not shown
    panel.show(panel.run())
    assert "no findings" in panel.message.object and not panel.findings.visible


def _verl_copy(tmp_path):
    return corpus_copy("llm/fsdp_verl", tmp_path / "verl")


def test_retention_tab_slims(tmp_path):
    root = _verl_copy(tmp_path)
    cat = cv.open(root)
    view = RetentionView(Workspace([cat], guard=Guard(roots=[str(root)], allow_write=True)))
    view.slim_older_than = "0s"
    view.show_plan(view.make_plan())
    assert view.doomed() == [5]
    assert "slim **1**" in view.message.object and view.delete.visible
    view.show_result(view.apply())
    assert "slimmed 1" in view.message.object
    assert not (root / "global_step_5" / "actor" / "optim_world_size_2_rank_0.pt").exists()
    assert not cv.open(root).serials.loc[5, "loadable"]


def test_restore_tab_exports_safetensors(tmp_path):
    src = tmp_path / "run"
    shutil.copytree(corpus_path("llm/megatron_legacy"), src)
    cat = cv.open(src)
    ws = Workspace([cat], guard=Guard(roots=[str(tmp_path)], allow_write=True))
    view = RestoreView(ws)
    view.serial = 15
    view.mode = "export"
    view.destination = str(tmp_path / "exported")
    view.show_plan(view.plan())
    assert "as safetensors" in view.message.object and view.confirm.visible
    assert list(view.ops.value["path"]) == ["model.safetensors"]
    assert not (tmp_path / "exported").exists()
    view.show_result(view.apply())
    out = cv.open(tmp_path / "exported")
    name = "model/decoder.layers.0.mlp.linear_fc1.weight"
    np.testing.assert_array_equal(out.read(name), cat.read(name, serial=15))


def test_timeline_shows_bytes_by_kind():
    from ckptview.widgets.pages.browse.serials import BY_KIND

    view = SerialsTable(cv.open(corpus_path("llm/deepspeed_zero")), poll_seconds=0)
    assert BY_KIND in view.param.y.objects
    view.y = BY_KIND
    plot = view.timeline()
    usage = view.catalog.usage()
    data = plot.renderers[0].data_source.data
    assert list(data["serial"]) == [str(s) for s in usage.index]
    assert list(data["optimizer bytes"]) == list(usage["optimizer"].astype("float64"))
    assert len(plot.renderers) == len(usage.columns)  # one stacked bar per kind
    assert [item.label.value for item in plot.legend[0].items] == list(usage.columns)


# -- names from a tree are text on the page ----------------------------------------------------
HOSTILE = '<img src=x onerror="go()">`*_[link](javascript:go())$x$ &amp;\nline'


def test_names_in_markdown_render_as_their_text():
    import panel as pn

    rendered = pn.pane.Markdown(f"**{md_text(HOSTILE)}** {md_code(HOSTILE)}")
    out = html.unescape(rendered._transform_object(rendered.object)["object"])
    shown = html.escape(HOSTILE.replace("\n", " "))  # the literal text, as HTML
    assert out.count(shown) == 2, out
    assert "<img" not in out and "<a" not in out and "<em>" not in out


def test_html_widgets_get_escaped_labels_and_tables_text_titles():
    assert html_choices([HOSTILE, "plain"]) == {html.escape(HOSTILE): HOSTILE, "plain": "plain"}
    assert "<img" not in badge(HOSTILE) and badge("latest").endswith(">latest</span>")
    defaults = table(pd.DataFrame({HOSTILE: [1]}))._configuration["columnDefaults"]
    assert defaults["titleFormatter"] == "plaintext" and "textContent" in defaults["tooltip"].js_code


CODE = "--x_x--0_0--go('loss')--x_x--0_0--"  # Panel compiles such a string as JavaScript


def test_metric_names_are_titles_never_table_fields(tmp_path):
    root = corpus_copy("modern/hf", tmp_path / "hf")
    for state in root.glob("checkpoint-*/trainer_state.json"):
        data = json.loads(state.read_text())
        data["log_history"][-1][CODE] = 1.0  # Panel's JSCode marker
        data["log_history"][-1]["val.loss"] = 2.0  # Tabulator reads dots as nesting
        state.write_text(json.dumps(data))
    view = SerialsTable(cv.open(root), poll_seconds=0)
    fields = list(view.table.value.columns)
    titles = view.table.titles
    assert CODE in titles.values() and "val.loss" in titles.values()
    assert all(re.fullmatch(r"[a-z_]+(_\d+)?", f) for f in fields), fields
    view.columns = [*view.columns, "val.loss"]
    key = next(f for f, t in titles.items() if t == "val.loss")
    assert key not in view.table.hidden_columns


# -- the Runs page of an experiment -------------------------------------------------------------
@pytest.fixture
def sweep(tmp_path):
    write_sweep(tmp_path / "sweep")
    return tmp_path / "sweep"


def test_runs_view_shows_exp_runs_plots_compares_and_opens_a_run(sweep):
    exp = cv.open_experiment(sweep)
    view = RunsView(exp)
    runs, frame = exp.runs, view.frame
    assert list(frame["run"]) == list(runs.index)
    for shown, column in [("latest", "latest"), ("best", "best"), ("size", "nbytes"),
                          ("serials", "n_serials"), ("step", "latest_step")]:  # fmt: skip
        assert list(frame[shown]) == [None if pd.isna(v) else int(v) for v in runs[column]]
    status = dict(zip(frame["run"], frame["status"], strict=True))
    assert status.pop("paddle_fluid_crashed") == "incomplete"  # its last save crashed
    assert set(status.values()) == {"complete"}
    assert all(f'class="cv-badge cv-{s}"' in html_ for s, html_ in
               zip(frame["status"], view._shown()["status"], strict=True))  # fmt: skip
    # one line per run: size for all of them, the metric for those that record it
    size = [r for r in view.size_plot().renderers if r.name == "ckptview-size-line"]
    assert len(size) == len(runs)
    assert view.metric == "loss"
    with_loss = exp.metrics.loc[exp.metrics["name"] == "loss", "run"].nunique()
    metric = [r for r in view.metric_plot().renderers if r.name == "ckptview-metric-line"]
    assert len(metric) == with_loss == 3
    # compare at a step: one row per variable, one column per run, exp.compare's numbers
    view.param.update(at="step", step=300)
    asyncio.run(view._on_compare())
    want = exp.compare(at=300)
    shown = view.compare_table.value
    assert view.compare_table.visible and len(shown) == want.shape[1]
    assert list(view.compare_table.titles.values()) == list(want.index)
    row = shown.set_index("variable").loc["model.fc1.weight"]
    field = f"run_{list(want.index).index('lr_1e-3')}"
    assert row[field] == fmt_number(want.loc["lr_1e-3", "model.fc1.weight"])
    assert "lr\\_1e\\-3: serial 300" in view.compare_message.object
    # a click without a dashboard: the run's browser below the table
    asyncio.run(view.open("lr_1e-3"))
    assert view.opened == "lr_1e-3"
    assert isinstance(view.browser, RunBrowser) and view.browser.catalog is exp["lr_1e-3"]
    assert view.__panel__() is view.__panel__()  # built once
    assert RunsView(str(sweep)).frame.equals(frame)  # a URL opens the experiment


def test_dashboard_of_an_experiment_opens_on_runs_and_a_click_opens_browse(sweep):
    page = build_app([str(sweep)])
    tabs = next(o for o in page.main if hasattr(o, "active"))
    assert tabs.active == 0 and "ckptview-runs" in tabs[0][0].css_classes
    exp = cv.open_experiment(sweep)
    dash = Dashboard(Workspace(guard=Guard(roots=[str(sweep)])), exp)
    assert dash.tab_names[0] == "Runs" and dash.tabs.active == 0
    assert list(dash.workspace.runs) == exp.names  # the runs, by their names
    asyncio.run(dash.runs_view.open("paddle_fluid_crashed"))
    assert dash.run == "paddle_fluid_crashed"
    assert dash.tab_names[dash.tabs.active] == "Browse"
    assert dash._browsers["paddle_fluid_crashed"].catalog is exp["paddle_fluid_crashed"]
    dash.tabs.active = 0  # back to the Runs page
    assert page.get_root() is not None
    plain = Dashboard(Workspace([exp["lr_1e-3"]]))  # one tree: the usual tabs only
    assert plain.tab_names[0] == "Browse" and plain.runs_view is None


def test_text_tabs_keep_their_headers_in_step_and_send_none_for_text_titles():
    """``TextTabs`` sends no header for tabs titled by text, and its headers stay in step with
    its tabs when tabs are inserted, appended and removed (a header pane stays on its tab)."""
    import panel as pn
    from bokeh.document import Document

    from ckptview.widgets.shell.app import TextTabs

    tabs = TextTabs(("A", pn.Column()), ("B", pn.Column()))
    tabs.insert(0, ("Runs", pn.Column()))  # as the dashboard of an experiment does
    tabs.append(("C", pn.Column()))
    assert tabs._names == ["Runs", "A", "B", "C"] and len(tabs._headers) == 4
    model = tabs.get_root(Document())
    assert model.data._headers == []  # titles only: no header model sent
    header = pn.pane.Markdown("**mine**")
    tabs.insert(2, (header, pn.Column()))
    assert len(tabs._headers) == len(tabs) == 5 and tabs._headers.index(header) == 2
    sent = model.data._headers  # one per tab now, the pane's own on its tab
    assert len(sent) == 5 and sent[2] is header._models[model.ref["id"]][0]
    tabs.append(("D", pn.Column()))
    assert tabs._headers.index(header) == 2 and len(tabs._headers) == 6
    tabs.remove(tabs[2])  # its header goes with it: titles only again
    assert tabs._names == ["Runs", "A", "B", "C", "D"] and model.data._headers == []


def test_run_names_on_the_runs_page_are_text(sweep):
    name = 'lr<img src=x onerror="alert(1)">'
    shutil.move(sweep / "lr_3e-4", sweep / name)
    view = RunsView(cv.open_experiment(sweep))
    assert name in list(view.frame["run"])  # a plain-text cell (Tabulator's default)
    assert "<img" not in view._summary()  # (the experiment's root is its only name there)
    assert all("<img" not in s for s in view._shown()["status"])  # the html column is ours
    asyncio.run(view._on_compare())
    assert name in view.compare_table.titles.values()  # titles are plain text (table())
    assert md_text(name) in view.compare_message.object  # Markdown: every <, =, " escaped
    asyncio.run(view.open(name))
    assert md_code(name) in view.detail.objects[0].object
