"""``ckptview.open``: detect a tree's layout and return its Catalog."""

from __future__ import annotations

import os
from concurrent.futures import Executor

from .catalog import Catalog
from .experiment import Experiment, open_experiment
from .scan.detect import UnknownTreeError, detect, list_tree

__all__ = ["Experiment", "UnknownTreeError", "open", "open_experiment"]


def open(  # noqa: A001 - the public name is ckptview.open
    url: str | os.PathLike,
    *,
    layout: str | None = None,
    storage_options: dict | None = None,
    executor: Executor | None = None,
    cache=None,
    progress=None,
) -> Catalog:
    """Open a checkpoint tree (a directory, a file, or a file prefix) at any fsspec URL.

    ``cache`` (an extra to the DESIGN.md signature): None uses the process-wide header cache,
    a directory path adds an on-disk cache there, False keeps the catalog's cache private
    (see :mod:`ckptview.scan.cache`). A rescan of unchanged files reads no header again.
    ``progress`` (also an extra): ``progress(done, total)`` is called once per file while
    the catalog lists headers (the CLI passes a tqdm bar); the core itself shows nothing.
    """
    tree = list_tree(url, storage_options, cache)
    return Catalog(tree, detect(tree, layout, url), executor, tree.cache, progress)
