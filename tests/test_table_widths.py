"""Column widths measured in the tables' fonts (issue 29: whole names and titles at any width):
glyph widths as Chromium sets them, a name column never narrower than its widest piece, titles
of several words wrapping only when they would widen their column much (the browser side:
tests/test_jupyterlab_everyday.py, tests/test_browser_everyday.py)."""

from __future__ import annotations

import pandas as pd
import panel as pn
import pytest

from ckptview.widgets._base import name_formatter, set_min_width, table
from ckptview.widgets._format import (
    CELL_PAD,
    HEADER_PAD,
    fit_width,
    name_min_width,
    name_pieces,
    text_px,
)


@pytest.mark.parametrize(("text", "font", "bold", "chromium"), [
    ("node", "wide", True, 36.3125),  # a header title in JupyterLab (DejaVu Sans Bold, 13 px)
    ("n_changed", "wide", True, 78.17),
    ("% of serial", "wide", True, 77.31),
    ("1.409e-05", "wide", False, 66.45),
    ("node", "roboto", True, 28.96),  # the dashboard's Roboto
])  # fmt: skip
def test_text_is_as_wide_as_chromium_sets_it_never_narrower(text, font, bold, chromium):
    assert chromium <= text_px(text, font, bold) < chromium + 0.5


def test_a_name_column_holds_its_widest_piece_hyphens_included():
    names = ["rng_state/0/rng_tracker_states/model-parallel-rng", "a.b/c", "x" * 3]
    assert name_pieces(names[0]) == ["rng_state/", "0/", "rng_tracker_states/",
                                     "model-parallel-rng"]  # fmt: skip
    widest = max(text_px(p) for n in names for p in name_pieces(n))
    assert name_min_width(names) == int(widest + CELL_PAD + 0.999)
    assert name_min_width([]) == CELL_PAD
    assert name_min_width(names, "roboto") < name_min_width(names, "wide")


def test_titles_whole_on_one_line_unless_much_wider_than_their_values():
    assert fit_width(["rank0"], "node") >= text_px("node", bold=True) + HEADER_PAD
    one_line = text_px("% of serial", "roboto", bold=True) + HEADER_PAD
    assert fit_width([], "% of serial", lo=74, font="roboto") >= one_line  # 18 px wider: kept
    wrapped = fit_width([], "% of serial", lo=74, font="wide")  # 35 px wider: "serial" below
    assert 74 <= wrapped < text_px("% of serial", bold=True) + HEADER_PAD


def test_the_min_width_reaches_the_table_and_changes_only_when_it_must():
    tab = table(pd.DataFrame({"name": ["a/b"], "n": [1]}), formatters={"name": name_formatter()},
                layout="fit_columns")  # fmt: skip
    set_min_width(tab, "name", 120)
    model = pn.panel(tab).get_root()
    columns = {c["field"]: c for c in model.configuration["columns"]}
    assert columns["name"]["minWidth"] == 120
    before = tab._configuration
    set_min_width(tab, "name", 120)
    assert tab._configuration is before  # the same width: the table is not sent again
    set_min_width(tab, "name", 150)
    assert [c["minWidth"] for c in tab._configuration["columns"] if c["field"] == "name"] == [150]
