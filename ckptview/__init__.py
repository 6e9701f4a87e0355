"""ckptview: browse, compare, restore and retain training checkpoints without the framework."""

from .api import UnknownTreeError, open  # noqa: A004 - the public name is ckptview.open
from .catalog import Catalog

__all__ = ["Catalog", "UnknownTreeError", "open"]
__version__ = "0.1.0"
