"""What the dashboard says and plots, without a browser: errors in words that clear stale
results, cosines that never round to 1, failed diff rows first, the timeline's choices and
axes, the retention result's columns (the layout itself: tests/test_browser_layout.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pandas as pd
import pytest
from bokeh.models import BasicTicker

import ckptview as cv
from ckptview.demo import write_demo
from ckptview.widgets import RestoreView, RetentionView, Workspace
from ckptview.widgets._format import STATUS_COLORS, fmt_cosine, md_problem
from ckptview.widgets.guard import AccessRefused, Guard
from ckptview.widgets.pages.browse.serials import TIMELINE, SerialsTable
from ckptview.widgets.pages.compare import diff_frame
from ckptview.widgets.pages.retention import DONE_SHOWN

SERIALS = 4


@pytest.fixture
def cat(tmp_path):
    return cv.open(write_demo(tmp_path / "demo_tree", serials=SERIALS).root)


def test_errors_say_what_happened_and_what_to_do():
    write = AccessRefused("refused: restore needs write access "
                          "(start with `ckptview serve --allow-write`)")  # fmt: skip
    text = md_problem(write, "restore")
    assert text.startswith("**Refused:** restore needs write access")
    assert "<code>ckptview serve \\-\\-allow\\-write</code>" in text and "AccessRefused" not in text
    outside = Guard(roots=["/srv/runs"])
    with pytest.raises(AccessRefused) as err:
        outside.check_url("/etc/passwd")
    assert md_problem(err.value).endswith("Only trees under those roots can be opened here.")
    assert md_problem(ValueError("give a destination URL"), "plan this restore") == (
        "**Cannot plan this restore:** give a destination URL."
    )
    assert md_problem(OSError("disk full"), "restore") == "**Could not restore:** disk full (OSError)."


def test_a_cosine_near_one_is_never_shown_as_one():
    assert fmt_cosine(1.0) == "1" and fmt_cosine(1 - 7.8e-16) == "1"  # float64 noise
    assert fmt_cosine(0.99999987) == "1 − 1.3e-07"
    assert fmt_cosine(-0.9999999) == "-1 + 1.0e-07"
    assert fmt_cosine(0.38612345) == "0.386123"
    assert fmt_cosine(float("nan")) == "" and fmt_cosine(None) == ""


def test_rows_that_could_not_be_compared_come_first():
    diff = pd.DataFrame({
        "status": ["changed", "changed", "error", "identical"], "name": ["a", "b", "c", "d"],
        "node": [""] * 4, "shape_a": [(2,)] * 4, "shape_b": [(2,)] * 4,
        "rel_l2": [0.5, 0.1, np.nan, 0.0], "l2": [1.0] * 4, "max_abs": [1.0] * 4,
        "cosine": [0.9, 0.99999999, np.nan, 1.0], "n_changed": [2, 2, np.nan, 0],
        "numel": [2] * 4, "error": [None, None, "TruncatedError: short read", None],
    })  # fmt: skip
    shown = diff_frame(diff)
    assert list(shown["name"]) == ["c", "a", "b", "d"]
    assert shown["cosine"].tolist() == ["", "0.9", "1 − 1.0e-08", "1"]


def test_a_refused_restore_clears_the_plan_on_screen(cat):
    ws = Workspace([cat], guard=Guard(roots=[cat.url], allow_write=False))
    view = RestoreView(ws)
    view.serial = 1
    view.show_plan(view.plan())
    assert view.ops.visible and len(view.ops.value)
    asyncio.run(view._on_confirm())  # a forced click on a read-only page
    message = view.message.object
    assert message.startswith("**Refused:**") and "AccessRefused" not in message
    assert "cv-notice-danger" in view.message.css_classes
    assert not view.ops.visible and view.ops.value.empty and not view.confirm.visible
    view.show_plan(view.plan())
    view.serial = 2  # other choices: the plan on screen is gone
    assert not view.ops.visible and "Plan (dry run)" in view.message.object


def test_a_refused_retention_clears_the_plan_on_screen(cat):
    ws = Workspace([cat], guard=Guard(roots=[cat.url], allow_write=False))
    view = RetentionView(ws)
    view.keep_last = 1
    view.show_plan(view.make_plan())
    assert view.table.visible and len(view.table.value)
    view._on_delete()
    assert view.message.object.startswith("**Refused:**")
    assert not view.table.visible and view.table.value.empty


def test_after_a_deletion_the_table_names_paths_under_path(cat):
    view = RetentionView(Workspace([cat]))
    view.keep_last = 2
    view.show_plan(view.make_plan())
    view.show_result(view.apply())
    shown = view.table.value
    assert list(shown.columns) == DONE_SHOWN and "reason" not in shown
    assert all(str(p).startswith(cat.url) or "checkpoint_" in str(p) for p in shown["path"])


def test_the_timeline_offers_what_the_tree_records_on_whole_number_ticks(cat):
    view = SerialsTable(cat, poll_seconds=0)
    assert view.param.y.objects[:6] == ["size", "bytes by kind", "epoch", "step", "variables",
                                        "files"]  # fmt: skip
    for choice in ("epoch", "step", "variables", "files"):
        view.y = choice
        plot = view.timeline()
        assert plot.xaxis[0].axis_label == "serial"
        assert isinstance(plot.yaxis[0].ticker, BasicTicker)
        assert plot.yaxis[0].ticker.min_interval == 1
        shown = plot.renderers[-1].data_source.data
        expected = view.frame[TIMELINE[choice]].astype("float64")
        assert list(shown["y"]) == list(expected)
        assert list(shown["serial"]) == list(view.frame["serial"])
    view.y = "size"
    plot = view.timeline()
    assert plot.xaxis[0].ticker.min_interval == 1
    mib = (view.frame["nbytes"].astype("float64") / 2**20).tolist()
    assert list(plot.renderers[-1].data_source.data["y"]) == mib
    colors = plot.renderers[-1].data_source.data["color"]
    assert colors[-1] == STATUS_COLORS[str(view.frame["status"].iloc[-1])]


def test_one_serial_is_plotted_around_its_own_values(tmp_path):
    one = cv.open(write_demo(tmp_path / "one", serials=1).root)
    view = SerialsTable(one, poll_seconds=0)
    plot = view.timeline()
    serial = int(one.serials.index[0])
    assert (plot.x_range.start, plot.x_range.end) == (serial - 0.5, serial + 0.5)  # its tick
    mib = float(one.serials["nbytes"].iloc[0]) / 2**20
    assert plot.y_range.start < mib < plot.y_range.end and plot.y_range.start > 0
    view.y = "epoch"
    epoch = float(one.serials["epoch"].iloc[0])
    plot = view.timeline()
    assert (plot.y_range.start, plot.y_range.end) == (epoch - 0.5, epoch + 0.5)
