"""Panel components for ckptview: the same widgets in Jupyter and in the served dashboard.

>>> import ckptview as cv
>>> from ckptview.widgets import RunBrowser, RunsView, extension
>>> extension()  # in a notebook: Panel with every resource inline (works offline)  # doctest: +SKIP
>>> RunBrowser(cv.open("runs/exp1"))  # doctest: +SKIP
>>> RunsView(cv.open_experiment("runs/"))  # the runs of an experiment  # doctest: +SKIP
"""

from . import _panel_fixes
from ._base import Workspace
from .app import Dashboard, build_app
from .browser import RunBrowser
from .compare import CompareView
from .detail import VariableDetail
from .guard import AccessRefused, Guard
from .notebook import extension
from .picker import TreePicker
from .restore import RestoreView
from .retention import RetentionView
from .runs import RunsView
from .serials import SerialsTable
from .trajectory import TrajectoryPlot
from .variables import VariablesTable

_panel_fixes.apply()
_panel_fixes.cache_component_resources()

__all__ = [
    "AccessRefused", "CompareView", "Dashboard", "Guard", "RestoreView", "RetentionView",
    "RunBrowser", "RunsView", "SerialsTable", "TrajectoryPlot", "TreePicker", "VariableDetail",
    "VariablesTable", "Workspace", "build_app", "extension",
]  # fmt: skip
