"""Experiments: many runs side by side (DESIGN.md §3d).

An experiment is a set of runs, each its own checkpoint tree with its own :class:`Catalog`:
the descendants of a directory (to depth 3), the matches of a glob URL, or a list / dict of
URLs. Runs are found by names only (the layouts' cheap detection), then opened concurrently;
a run that fails to open is a row with ``error``, never the end of the experiment.

Finding run roots in a directory: a directory is a run when a layout other than the
``files`` fallback recognizes it and its serials claim at least half of its files (a
Lightning tree deep inside a parent of many runs does not make the parent one run); below a
run nothing is searched. A directory only the weak, name-number layouts (``numbered``,
``safetensors-sharded``) recognize is still split when two or more of its subdirectories are
runs of their own (``sweep/lr_1/``, ``sweep/lr_2/``). A directory only ``files`` recognizes is
a run when it holds checkpoint files directly and no subdirectory is a run; otherwise its
loose checkpoint files are ``attrs["stray"]``, not runs.

- :mod:`.find`: run roots below a directory;
- :mod:`.run`: one run, its best serial and its row;
- :mod:`.experiment`: :class:`Experiment`, the runs side by side;
- :mod:`.retention`: sizes, pins and the result of retention across runs;
- :mod:`.opening`: :func:`open_experiment`, :func:`experiment_at`.
"""

from __future__ import annotations

from .experiment import Experiment
from .find import FoundRun, find_runs
from .opening import RUN_WORKERS, experiment_at, open_experiment, runs_in_flight
from .retention import ExperimentRetention, parse_bytes
from .run import RUN_COLUMNS, Run

__all__ = ["RUN_COLUMNS", "RUN_WORKERS", "Experiment", "ExperimentRetention", "FoundRun", "Run",
           "experiment_at", "find_runs", "open_experiment", "parse_bytes", "runs_in_flight"]  # fmt: skip
