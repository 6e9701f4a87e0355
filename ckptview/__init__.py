"""ckptview: browse, compare, restore and retain training checkpoints without the framework."""

from .api import UnknownTreeError, open, open_experiment  # noqa: A004 - ckptview.open
from .catalog import Catalog
from .experiment import Experiment

__all__ = ["Catalog", "Experiment", "UnknownTreeError", "open", "open_experiment"]
__version__ = "0.1.0"
