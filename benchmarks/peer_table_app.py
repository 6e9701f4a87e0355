"""The dashboard benchmarks' peer: the same serials table as one Panel Tabulator, nothing else.

``panel serve benchmarks/peer_table_app.py --args TREE`` (what ``bench_load.py`` and
``bench_dashboard.py`` compare the dashboard with: the floor of a Panel page showing the rows).
"""

import sys

import panel as pn

from ckptview.widgets._format import serials_frame
from ckptview.widgets.shell.app import shared_catalog

if __name__.startswith("bokeh"):  # run by ``panel serve``
    pn.extension("tabulator")
    frame = pn.state.as_cached("peer-frame", lambda: serials_frame(shared_catalog(sys.argv[1])))
    pn.Column(pn.widgets.Tabulator(frame, pagination="remote", page_size=20,
                                   css_classes=["ckptview-serials"])).servable()  # fmt: skip
