"""Catalog: a checkpoint tree as pandas tables, built from headers only."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .engine import stats as _stats
from .io import Storage
from .layouts.base import Layout
from .model import TreeScan, VarInfo
from .scan.cache import HeaderCache
from .scan.core import Scan
from .tree import Tree


class _Lazy:
    """A module imported on first attribute access."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


if TYPE_CHECKING:
    from .engine import diff as _diff
    from .engine import export as _export
    from .engine import restore as _restore
    from .engine import retention as _retention
    from .engine import summary as _summary
    from .engine import usage as _usage
    from .engine import verify as _verify
    from .engine.policies import AnyOf
else:  # imported on first use: ``import ckptview`` and ``open`` stay light
    _diff, _export, _restore, _retention, _summary, _usage, _verify = (
        _Lazy(f"{__package__}.engine.{name}")
        for name in ("diff", "export", "restore", "retention", "summary", "usage", "verify")
    )

#: attributes kept out of tab completion (they still work)
_INTERNALS = frozenset({"tree", "storage", "scan", "cache"})


class Catalog:
    """A checkpoint tree's serials, variables and metrics."""

    def __init__(self, tree: Tree, layout: Layout, executor: Executor | None = None, cache=None,
                 progress: Callable[[int, int], None] | None = None):  # fmt: skip
        self._scan = Scan(tree, layout, executor, cache, progress)

    # -- construction ---------------------------------------------------------------
    @property
    def tree(self) -> Tree:
        return self._scan.tree

    @property
    def storage(self) -> Storage:
        return self._scan.storage

    @property
    def executor(self) -> Executor | None:
        return self._scan.executor

    @property
    def cache(self) -> HeaderCache:
        """The header cache (see ckptview.scan.cache)."""
        return self._scan.cache

    @property
    def progress(self) -> Callable[[int, int], None] | None:
        """``progress(done, total)``: called per file as a scan lists headers (a UI hook)."""
        return self._scan.progress

    @property
    def layout(self) -> str:
        return self._scan.layout.name

    @property
    def url(self) -> str:
        return self._scan.url

    def __repr__(self) -> str:
        """Layout, root, serials by status, latest, sizes and warnings (scans the tree)."""
        return _summary.as_text(_summary.summarize(self._scan))

    def _repr_html_(self) -> str:
        return _summary.as_html(_summary.summarize(self._scan))

    def __dir__(self) -> list[str]:
        """Tab completion without the internals (``tree``, ``storage``, ``scan``, ``cache``
        still work: the dashboard and plugins use them)."""
        return sorted(set(super().__dir__()) - _INTERNALS)

    @property
    def scan(self) -> TreeScan:
        return self._scan.tree_scan

    # -- tables ---------------------------------------------------------------------
    @property
    def variables(self) -> pd.DataFrame:
        return self._scan.variables

    @property
    def shards(self) -> pd.DataFrame:
        """One row per stored piece of each variable: file, offsets, placement (§3b)."""
        return self._scan.shards

    @property
    def serials(self) -> pd.DataFrame:
        return self._scan.serials

    @property
    def latest(self) -> int | None:
        return self._scan.latest

    @property
    def metrics(self) -> pd.DataFrame:
        return self._scan.metrics

    @property
    def files(self) -> pd.DataFrame:
        """One row per data file: serial, node, path, size, codec, n_variables, error."""
        return self._scan.files

    @property
    def attrs(self) -> dict:
        """Tree-level facts a layout found (``best_model_checkpoint``, …), the framework's
        own resume pointer when it differs from ``latest`` (``framework_latest``) and
        ``warnings`` about files outside every serial."""
        self._scan.serials  # noqa: B018 - the verdicts set framework_latest
        out = dict(self._scan.tree_scan.attrs)
        warnings = self._scan.warnings
        if warnings:
            out["warnings"] = warnings
        return out

    # -- values ---------------------------------------------------------------------
    def variable(self, name: str, serial: int | None = None, node: str = "") -> VarInfo:
        """The header record of one variable."""
        return self._scan.resolve(name, self._serial(serial), node)[0]

    def _serial(self, serial: int | None) -> int:
        """``serial`` checked to exist (KeyError naming the serials if not); None: the latest."""
        return _stats.resolve_serial(self._scan, serial)

    def read(self, name: str, serial: int | None = None, node: str = "",
             dequantize: bool = True) -> np.ndarray:  # fmt: skip
        """One variable's values (default serial: the latest): a logical tensor assembled
        from its pieces, a quantized group dequantized (``dequantize=False``: its stored
        weight or blocks)."""
        return self._scan.read(name, self._serial(serial), node, dequantize)

    def iter_chunks(self, name: str, serial: int | None = None, node: str = "",
                    max_bytes: int = 64 << 20):  # fmt: skip
        """A variable's values as flat pieces of about ``max_bytes`` (bounded memory)."""
        return self._scan.iter_chunks(name, self._serial(serial), node, max_bytes)

    def load(self, serial: int | None = None) -> dict[str, np.ndarray]:
        """Every variable of a serial keyed by name (``node/name`` where a name repeats)."""
        return self._scan.load(self._serial(serial))

    # -- compare, follow, restore, retain (thin delegations to ckptview.engine) ----------
    def refresh(self) -> Catalog:
        """Forget the listing and every table: the next access rescans the tree."""
        self._scan.refresh()
        return self

    def stats(self, serial: int | None = None, names: str | Iterable[str] | None = None, *,
              chunk_bytes: int = _stats.CHUNK_BYTES) -> pd.DataFrame:  # fmt: skip
        """Per-variable min, max, mean, std, l2, n_nan, n_inf, frac_zero of ``serial``
        (default: the latest), for every variable or only ``names``; values are streamed
        ``chunk_bytes`` at a time."""
        return _stats.stats(self._scan, serial, names, chunk_bytes)

    def diff(self, a: int | None, b: int | None, other: Catalog | None = None,
             names: str | Iterable[str] | None = None, *, match: str | None = None,
             rename: Callable[[str], str] | dict[str, str] | None = None,
             chunk_bytes: int = _stats.CHUNK_BYTES,
             progress: Callable[[int], None] | None = None) -> pd.DataFrame:  # fmt: skip
        """Variable-by-variable numeric diff of serial ``a`` and serial ``b`` (of ``other``, a
        second run, when given), biggest change first (:func:`ckptview.engine.diff.by_change`).

        ``names``: only these variables. ``match``: ``"exact"`` pairs by (node, name) only,
        ``"auto"`` (None, the default) also pairs a name unique on both sides across nodes,
        then by logical name (container prefixes ``model/``, ``module.``, ``_orig_mod.``,
        ``model.`` stripped); ``df.attrs["pairing"]`` says how. ``rename``: maps
        ``b``'s names onto ``a``'s (a dict or a function) before pairing. ``progress(n)``
        is called with the bytes compared as values stream by."""
        theirs = None if other is None else other._scan
        return _diff.diff(self._scan, a, b, theirs, names, match, rename, chunk_bytes, progress)

    def trajectory(self, name: str, stat: str = "l2", node: str = "") -> pd.Series:
        """One statistic of one variable across serials."""
        return _stats.trajectory(self._scan, name, stat, node)

    def verify(self, serial: int | Iterable[int] | None = None, deep: bool = False) -> pd.DataFrame:
        """Findings (serial, file, check, severity, message) for one serial, several or all;
        header reads only unless ``deep`` (values read, zip CRC-32s checked)."""
        serials = [serial] if isinstance(serial, (int, np.integer)) else serial
        return _verify.verify(self._scan, serials, deep)

    def restore(self, serial: int, to: str | os.PathLike | None = None, dry_run: bool = False, *,
                storage_options: dict | None = None, force: bool = False,
                progress: Callable[[int], None] | None = None) -> _restore.RestoreResult:  # fmt: skip
        """Copy ``serial`` to the tree at ``to`` (``storage_options`` for its filesystem), or
        promote it in place so the framework resumes from it; never deletes. ``dry_run``:
        the plan only. ``force``: allow a serial that is incomplete or does not load.
        ``progress(n)``: bytes copied. Returns a :class:`~ckptview.engine.restore.RestoreResult`."""
        return _restore.restore(self._scan, serial, to, dry_run, storage_options, force, progress)

    def export(self, serial: int | None = None, to: str | os.PathLike | None = None,
               names: list[str] | None = None, max_shard_bytes: int = 5 << 30,
               dequantize: bool = False, dry_run: bool = False, *, force: bool = False,
               kinds: Iterable[str] | None = None, storage_options: dict | None = None,
               progress: Callable[[int], None] | None = None) -> _export.ExportResult:  # fmt: skip
        """Write a serial's logical tensors as safetensors in the new directory ``to``
        (shards and ``model.safetensors.index.json`` above ``max_shard_bytes``), one tensor
        at a time, journaled, committed by a rename last. ``names``: only these variables.
        ``kinds``: only variables of these kinds (the ``kind`` column: ``["model"]`` for
        the weights alone, without optimizer, trainer, RNG or scheduler state); None:
        every kind. ``force``: export what reads of a serial that does not load.
        ``progress(n)``: bytes written. Returns an
        :class:`~ckptview.engine.export.ExportResult`."""
        if to is None:
            raise ValueError("export needs a target: to=URL")
        if kinds is not None:
            names = self._names_of_kinds(serial, names, kinds)
        return _export.export(self._scan, serial, to, names, max_shard_bytes, dequantize,
                              dry_run, force, storage_options, progress)  # fmt: skip

    def _names_of_kinds(self, serial: int | None, names: list[str] | None,
                        kinds: Iterable[str]) -> list[str]:  # fmt: skip
        """The variable names of ``serial`` (default: the latest) whose kind is one of
        ``kinds``, within ``names`` when given; ValueError when none is."""
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        if serial is None:
            serial = self.latest
        v = self.variables
        rows = v[v["serial"] == serial] if serial is not None else v.iloc[:0]
        if names is not None:
            missing = set(names) - set(rows["name"])
            if missing:
                raise KeyError(f"no variable {sorted(missing)[0]!r} in serial {serial}")
            rows = rows[rows["name"].isin(set(names))]
        picked = rows[rows["kind"].isin(kinds)]
        if not len(picked) and len(rows):
            have = ", ".join(sorted(set(rows["kind"])))
            raise ValueError(f"serial {serial} has no variable of kind {', '.join(kinds)} "
                             f"(its kinds: {have}); pick others with kinds=")  # fmt: skip
        return list(dict.fromkeys(picked["name"]))

    def usage(self) -> pd.DataFrame:
        """Bytes per serial and kind (model, optimizer, trainer, rng, …, ``other``): why a
        checkpoint is as big as it is."""
        return _usage.usage(self._scan)

    def plan_retention(self, keep_last: int | None = None, keep_every: int | None = None,
                       keep_best: str | None = None, pinned: Iterable[int] = (),
                       older_than: str | None = None, *, policy: AnyOf | None = None,
                       every_by: str = "serial", slim_older_than: str | None = None,
                       now: datetime | None = None) -> pd.DataFrame:  # fmt: skip
        """Which serials a retention policy keeps, slims and deletes; nothing is changed.

        A serial is kept when any part keeps it: the ``keep_last`` newest complete ones,
        those divisible by ``keep_every`` (``every_by="step"``: by step), the ``keep_best``
        by a metric (``"loss:3:min"``), the ``pinned`` ones, those newer than ``older_than``
        (``"7d"``, ``"12h"``); ``policy`` gives them as one object. No part at all: the
        policy stored with the tree. ``slim_older_than``: kept serials older than that lose
        their optimizer state. ``now``: the time ages count from (default: now).

        Returns a DataFrame indexed by serial: ``action`` (keep | slim | delete), ``reason``,
        ``nbytes``, ``frees``, …; its ``.attrs`` hold what :meth:`apply_retention` re-checks
        (tree, fingerprint, policy)."""
        return _retention.plan_retention(self._scan, keep_last, keep_every, keep_best, pinned,
                                         older_than, policy, every_by, now, slim_older_than)  # fmt: skip

    def apply_retention(self, plan: pd.DataFrame, *,
                        progress: Callable[[int], None] | None = None) -> _retention.RetentionResult:  # fmt: skip
        """Delete (and slim) what ``plan`` says, after re-checking the tree against it; never
        the newest loadable serial. ``progress(n)``: serials done. Returns a
        :class:`~ckptview.engine.retention.RetentionResult`: ``.deleted`` is what was
        deleted (indexed by serial)."""
        return _retention.apply_retention(self._scan, plan, progress)

    def set_retention(self, policy: AnyOf | dict | None = None, *, keep_last: int | None = None,
                      keep_every: int | None = None, keep_best: str | None = None,
                      pinned: Iterable[int] = (), older_than: str | None = None,
                      every_by: str = "serial") -> AnyOf | None:  # fmt: skip
        """Store a retention policy with the tree (``.ckptview/retention.json``): a
        ``policy`` object or dict, or :meth:`plan_retention`'s keywords; no policy and no
        keyword removes the stored one. Returns the policy stored."""
        keywords = dict(keep_last=keep_last, keep_every=keep_every, keep_best=keep_best,
                        pinned=tuple(pinned), older_than=older_than)  # fmt: skip
        given = {k: v for k, v in keywords.items() if v not in (None, ())}
        if given and every_by != "serial":
            given["every_by"] = every_by
        return _retention.set_retention(self._scan, policy, **given)

    def retention_policy(self):
        """The policy stored with the tree, or None."""
        return _retention.retention_policy(self._scan)

    # -- health over serials (ckptview.health) ----------------------
    def health(self, serials: int | Iterable[int] | None = None,
               names: str | Iterable[str] | None = None, spectral: bool = False, *,
               kinds: str | Iterable[str] | None = None,
               progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:  # fmt: skip
        """One row per (serial, node, name) of floating-point variables: ``l2``, ``rms``,
        ``max_abs``, ``n_nan``, ``n_inf``, ``update_rel`` (vs the previous serial holding
        it), with ``spectral`` also ``sigma_max`` and ``alpha`` of 2-D weights. Streamed,
        and cached per file identity: a reopened or grown tree reads only new files."""
        from . import health as _health

        return _health.health(self._scan, serials, names, spectral, kinds, progress=progress)

    def health_summary(self, spike_factor: float = 10.0, kinds: Iterable[str] | None = ("model",),
                       *, loss_factor: float = 3.0,
                       progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:  # fmt: skip
        """Per serial: ``status`` (ok | nonfinite | spike | frozen | not_loadable),
        ``findings``, ``onset``; ``.attrs``: ``first``, ``divergence``, ``rollback_point``,
        ``top`` (docs/health.md)."""
        from . import health as _health

        return _health.health_summary(self._scan, spike_factor, kinds, loss_factor, progress)

    @property
    def rollback_point(self) -> int | None:
        """The newest loadable serial before the run's first divergence (NaN/inf, update or
        l2 spike, loss spike); ``latest`` when the run is healthy. Reads values (cached)."""
        return self.health_summary().attrs["rollback_point"]
