"""ckptview: browse, compare, restore and retain training checkpoints without the framework."""

from .api import UnknownTreeError, open, open_experiment  # noqa: A004 - ckptview.open
from .catalog import Catalog
from .experiment import Experiment

__all__ = ["Catalog", "Experiment", "UnknownTreeError", "open", "open_experiment"]
__version__ = "0.1.0"


def __dir__() -> list[str]:
    """The public names only (the submodules still import as ``ckptview.<name>``)."""
    return [*__all__, "__version__"]
