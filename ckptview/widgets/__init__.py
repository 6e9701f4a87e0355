"""Panel components for ckptview: the same widgets in Jupyter and in the served dashboard.

>>> import ckptview as cv
>>> from ckptview.widgets import RunBrowser, RunsView, extension
>>> extension()  # in a notebook: Panel with every resource inline (works offline)  # doctest: +SKIP
>>> RunBrowser(cv.open("runs/exp1"))  # doctest: +SKIP
>>> RunsView(cv.open_experiment("runs/"))  # the runs of an experiment  # doctest: +SKIP
"""

from . import _panel_fixes
from ._base import Workspace
from .guard import AccessRefused, Guard
from .pages.browse.browser import RunBrowser
from .pages.browse.detail import VariableDetail
from .pages.browse.serials import SerialsTable
from .pages.browse.variables import VariablesTable
from .pages.compare import CompareView
from .pages.restore import RestoreView
from .pages.retention import RetentionView
from .pages.runs import RunsView
from .pages.trajectory import TrajectoryPlot
from .shell.app import Dashboard, build_app
from .shell.notebook import extension
from .shell.picker import TreePicker

_panel_fixes.apply()
_panel_fixes.cache_component_resources()
_panel_fixes.cache_model_definitions()
_panel_fixes.tag_data_models_locally()
_panel_fixes.read_set_properties_only()

__all__ = [
    "AccessRefused", "CompareView", "Dashboard", "Guard", "RestoreView", "RetentionView",
    "RunBrowser", "RunsView", "SerialsTable", "TrajectoryPlot", "TreePicker", "VariableDetail",
    "VariablesTable", "Workspace", "build_app", "extension",
]  # fmt: skip
