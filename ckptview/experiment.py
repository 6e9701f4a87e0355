"""Experiments: many runs side by side.

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
"""

from __future__ import annotations

import html
import math
import os
import posixpath
import re
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from . import registry
from .catalog import Catalog
from .engine.stats import STAT_COLUMNS
from .fmt import human_bytes
from .io import Storage
from .layouts.base import Layout
from .model import META_DIR
from .registry import LayoutTier
from .scan.cache import resolve
from .scan.detect import UnknownTreeError, _explained, _n_files, detect, list_tree
from .tree import Tree

if TYPE_CHECKING:
    from .engine.retention import RetentionResult

__all__ = ["Experiment", "RUN_COLUMNS", "experiment_at", "find_runs", "open_experiment", "parse_bytes"]

#: how deep below an experiment's root run roots are looked for
MAX_DEPTH = 3
#: how many runs are opened at once (the private pool's threads) on a remote store, or with
#: an executor; runs on local disk are opened one after another (:func:`runs_in_flight`)
RUN_WORKERS = 8
#: the runs table's columns (index ``run``)
RUN_COLUMNS = ["url", "layout", "n_serials", "latest", "latest_step", "best", "best_metric",
               "metric_name", "nbytes", "first_write", "last_write", "error"]  # fmt: skip
#: a metric a run is best at when it is lowest (when the tree records no best of its own)
LOSS_LIKE = re.compile(r"loss|perplexity|ppl|(^|[_/])err(or)?($|[_/])", re.I)
#: a metric of held-out data, preferred over a training one
HELD_OUT = re.compile(r"^(eval|val|valid|validation|test)[_/]", re.I)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15, "kib": 2**10,
          "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}  # fmt: skip


def parse_bytes(value: int | float | str) -> int:
    """``2TB``, ``500 GB``, ``1.5TiB``, ``4096`` (decimal units; ``KiB``… binary) as bytes."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"a size cannot be negative: {value}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    unit = m[2].lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {value!r} (e.g. 2TB, 500GB, 1.5TiB or bytes)")
    return int(float(m[1]) * _UNITS[unit])


# -- finding runs ------------------------------------------------------------------------
@dataclass
class FoundRun:
    """A run root found below an experiment's root: its relative path, tree and layout."""

    name: str
    tree: Tree
    layout: Layout


class _Walk:
    """Sub-trees of one listed tree, made from its listing (no storage request)."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self.keys = sorted(tree.entries)

    def subtree(self, rel: str) -> Tree:
        if not rel:
            return self.tree
        tree = self.tree
        prefix = rel + "/"
        lo = bisect_left(self.keys, prefix)
        hi = bisect_left(self.keys, prefix + "\U0010ffff", lo)
        entries, meta = {}, set()
        for key in self.keys[lo:hi]:
            sub = key[len(prefix) :]
            if sub.startswith(META_DIR + "/"):
                meta.add(sub)
            elif not sub.startswith(META_DIR):
                entries[sub] = tree.entries[key]
        out = Tree(tree.storage, tree.abs(rel))
        out.__dict__["entries"] = entries  # listed already; ``forget`` lists it again
        out.meta_files = meta
        out.cache = tree.cache
        return out


def _checkpoint_files(tree: Tree) -> list[str]:
    """Files directly in the tree's root with a checkpoint ending."""
    suffixes = registry.known_suffixes()
    return [f for f in tree.files(depth=1) if f.lower().endswith(suffixes)]


class _Scanned:
    """A layout whose scan of one tree is made already (detection's): ``_explained`` counts
    its claims without scanning the tree again."""

    def __init__(self, layout: Layout, found: Any):
        self.name, self.found = layout.name, found

    def scan(self, tree: Tree) -> Any:
        return self.found


def _run_layout(tree: Tree) -> Layout | None:
    """The layout that makes ``tree`` one run, or None (``files`` is returned as is: the
    caller decides whether loose files make a run). Detection's own scan is counted (and
    left in ``tree.scans`` for the run's Catalog), never a second one."""
    try:
        layout = detect(tree)
    except UnknownTreeError:
        return None
    if layout.priority >= LayoutTier.FALLBACK:
        return layout
    found = tree.scans.get(layout.name)
    counted: Any = layout if found is None else _Scanned(layout, found)
    return layout if _explained(counted, tree) * 2 >= _n_files(tree) else None


def find_runs(tree: Tree, depth: int = MAX_DEPTH) -> tuple[list[FoundRun], list[str]]:
    """The run roots at or below ``tree``'s root (to ``depth`` levels; see the module
    docstring), and the stray checkpoint files that belong to no run."""
    walk = _Walk(tree)
    stray: list[str] = []

    def visit(rel: str, level: int) -> list[FoundRun]:
        sub = walk.subtree(rel)
        name = rel or "."
        layout = _run_layout(sub)
        if layout is not None and layout.priority < LayoutTier.FAMILY:
            return [FoundRun(name, sub, layout)]
        below: list[FoundRun] = []
        if level < depth:
            for child in sub.dirs():
                if not child.startswith((".", "__pycache__")):
                    below += visit(posixpath.join(rel, child) if rel else child, level + 1)
        if layout is not None and layout.priority < LayoutTier.FALLBACK:
            own = [r for r in below if r.layout.priority < LayoutTier.FALLBACK]
            return below if len(own) >= 2 else [FoundRun(name, sub, layout)]
        loose = _checkpoint_files(sub) if layout is not None else []
        if below:
            stray.extend(posixpath.join(rel, f) if rel else f for f in loose)
            return below
        return [FoundRun(name, sub, layout)] if layout is not None and loose else []

    return visit("", 0), stray


# -- one run --------------------------------------------------------------------------------
@dataclass
class Run:
    """One run of an experiment: its catalog, or the error that kept it from opening."""

    name: str
    url: str
    catalog: Catalog | None = None
    layout: str | None = None
    error: str | None = None


def _message(e: BaseException) -> str:
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return f"{type(e).__name__}: {' '.join(text.split())}"[:300]


def best_of(cat: Catalog) -> tuple[int | None, float, str | None]:
    """The run's best serial, its metric value and the metric's name: the tree's own record
    (HF ``best_model_checkpoint``/``best_metric``, Lightning's best model) where it has one,
    else the loadable serial where a loss-like metric (held-out first) is lowest."""
    serials, attrs = cat.serials, cat.scan.attrs  # the layout's facts (``attrs`` adds warnings)
    best = attrs.get("best_serial")
    if best is not None and int(best) in serials.index:
        value = attrs.get("best_metric", attrs.get("best_model_score"))
        name = attrs.get("metric_for_best_model") or attrs.get("monitor") or "best_metric"
        return int(best), _float(value), str(name)
    metrics = cat.metrics
    if metrics.empty:
        return None, math.nan, None
    names = [n for n in metrics["name"].unique() if LOSS_LIKE.search(str(n))]
    if not names:
        return None, math.nan, None
    name = min(names, key=lambda n: (HELD_OUT.match(n) is None, len(n), n))
    loadable = serials.index[serials["loadable"]]
    rows = metrics[(metrics["name"] == name) & metrics["serial"].isin(loadable)]
    rows = rows[pd.to_numeric(rows["value"], errors="coerce").map(_finite)]
    if rows.empty:
        return None, math.nan, name
    i = rows["value"].astype("float64").idxmin()
    return int(rows.loc[i, "serial"]), float(rows.loc[i, "value"]), name


def _finite(x: Any) -> bool:
    return x is not None and not pd.isna(x) and math.isfinite(float(x))


def _float(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def run_row(run: Run) -> dict:
    """One row of the runs table, from the run's own catalog."""
    row: dict[str, Any] = dict.fromkeys(RUN_COLUMNS)
    row.update(url=run.url, layout=run.layout, error=run.error)
    cat = run.catalog
    if cat is None or run.error:
        return row
    try:
        s = cat.serials
        latest = cat.latest
        best, metric, name = best_of(cat)
        stamps = s["timestamp"].dropna()
        row.update(
            n_serials=len(s), latest=latest, best=best, best_metric=metric, metric_name=name,
            latest_step=None if latest is None else s.loc[latest, "step"],
            nbytes=int(s["nbytes"].sum()),
            first_write=stamps.min() if len(stamps) else pd.NaT,
            last_write=stamps.max() if len(stamps) else pd.NaT,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - a run that cannot be read is a row with error
        row["error"] = _message(e)
    return row


def runs_frame(rows: dict[str, dict]) -> pd.DataFrame:
    df = pd.DataFrame.from_dict(rows, orient="index", columns=RUN_COLUMNS)
    df.index.name = "run"
    if df.empty:
        df.index = df.index.astype(object)
    for col in ("n_serials", "latest", "latest_step", "best", "nbytes"):
        df[col] = pd.array([None if pd.isna(v) else int(v) for v in df[col]], dtype="Int64")
    df["best_metric"] = df["best_metric"].astype("float64")
    for col in ("first_write", "last_write"):
        df[col] = pd.to_datetime(df[col], utc=True)
    return df


# -- the experiment ---------------------------------------------------------------------------
@dataclass
class ExperimentRetention:
    """What :meth:`Experiment.apply_retention` did: each run's :class:`RetentionResult`,
    and the runs it refused (a lock held, the tree changed) with why."""

    results: dict[str, RetentionResult] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def deleted(self) -> pd.DataFrame:
        """What was deleted (and slimmed), indexed (run, serial)."""
        frames = {run: r.deleted for run, r in self.results.items()}
        cols = ["action", "path", "nbytes", "steps"]
        if not frames:
            return pd.DataFrame(columns=cols, index=pd.MultiIndex.from_tuples([], names=["run", "serial"]))
        return pd.concat(frames, names=["run", "serial"])

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.results.values())

    def headline(self) -> str:
        n = sum(len(r.deleted) for r in self.results.values())
        text = f"retention: {n} serial(s) in {len(self.results)} run(s), freed {human_bytes(self.nbytes)}"
        if self.errors:
            text += f"; refused in {len(self.errors)} run(s): " + "; ".join(
                f"{run}: {why}" for run, why in self.errors.items())
        return text

    def to_dict(self) -> dict:
        return {"nbytes": self.nbytes, "runs": {r: res.to_dict() for r, res in self.results.items()},
                "errors": dict(self.errors)}  # fmt: skip


class Experiment:
    """Many runs side by side: ``runs``, ``serials``, ``metrics``, ``compare``, ``diff``,
    ``usage`` and an experiment-wide retention plan. ``exp[run]`` is that
    run's :class:`Catalog`."""

    def __init__(self, runs: Iterable[Run], root: str | None = None,
                 stray: Iterable[str] = ()):  # fmt: skip
        self._runs = {r.name: r for r in runs}
        self.root = root
        self.attrs: dict[str, Any] = {"stray": list(stray)} if stray else {}
        self._table: pd.DataFrame | None = None

    # -- access ---------------------------------------------------------------------------
    def __getitem__(self, run: str) -> Catalog:
        if run not in self._runs:
            raise KeyError(f"no run {run!r}; runs: {', '.join(self._runs) or 'none'}")
        r = self._runs[run]
        if r.catalog is None:
            raise ValueError(f"run {run!r} did not open: {r.error}")
        return r.catalog

    def __iter__(self) -> Iterator[str]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, run: object) -> bool:
        return run in self._runs

    @property
    def names(self) -> list[str]:
        return list(self._runs)

    def catalogs(self) -> dict[str, Catalog]:
        """The runs that opened, by name."""
        return {n: r.catalog for n, r in self._runs.items() if r.catalog is not None and not r.error}

    def refresh(self) -> Experiment:
        """Rescan every run on next access."""
        for cat in self.catalogs().values():
            cat.refresh()
        self._table = None
        return self

    # -- tables ---------------------------------------------------------------------------
    @property
    def runs(self) -> pd.DataFrame:
        """One row per run (index ``run``): url, layout, n_serials, latest, latest_step,
        best, best_metric, metric_name, nbytes, first_write, last_write, error."""
        if self._table is None:
            self._table = runs_frame({n: run_row(r) for n, r in self._runs.items()})
        return self._table.copy()

    @property
    def serials(self) -> pd.DataFrame:
        """Every run's ``serials`` stacked, index (run, serial)."""
        frames = {n: cat.serials for n, cat in self._readable().items()}
        if not frames:
            return pd.DataFrame(index=pd.MultiIndex.from_tuples([], names=["run", "serial"]))
        return pd.concat(frames, names=["run", "serial"])

    @property
    def metrics(self) -> pd.DataFrame:
        """Long table: run, serial, name, value."""
        frames = [cat.metrics.assign(run=n) for n, cat in self._readable().items()]
        cols = ["run", "serial", "name", "value"]
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame(columns=cols)
        out = pd.concat(frames, ignore_index=True)
        return out[cols + [c for c in out.columns if c not in cols]]

    def _readable(self) -> dict[str, Catalog]:
        """The runs whose tables read (no error in the runs table)."""
        table = self.runs
        return {n: c for n, c in self.catalogs().items() if pd.isna(table.loc[n, "error"])}

    # -- comparing ----------------------------------------------------------------------------
    def serial_at(self, run: str, at: str | int = "latest") -> int | None:
        """The serial of ``run`` at ``at``: ``"latest"``, ``"best"``, or a step (the newest
        loadable serial at or before it; its serial number where a serial has no step)."""
        cat = self[run]
        if at == "latest":
            return cat.latest
        if at == "best":
            best = self.runs.loc[run, "best"]
            return None if pd.isna(best) else int(best)
        if isinstance(at, str) and not at.lstrip("-").isdigit():
            raise ValueError(f"at must be 'latest', 'best' or a step, not {at!r}")
        s = cat.serials
        s = s[s["loadable"]]
        steps = s["step"].astype("Float64").fillna(pd.Series(s.index, index=s.index, dtype="Float64"))
        ok = steps[steps <= int(at)]
        return None if ok.empty else int(ok.index[ok.to_numpy().argmax()])

    def compare(self, names: str | Iterable[str] | None = None, at: str | int = "latest",
                stat: str = "l2", *, match: str = "exact") -> pd.DataFrame:  # fmt: skip
        """One row per run, one column per variable (``node/name`` for node-private ones):
        ``stat`` of each at the matched serial (``at``: see :meth:`serial_at`); NaN where a
        run lacks the variable or has no such serial. ``match="auto"``: columns by logical
        name (container prefixes stripped), so ``model/fc.weight`` and ``fc.weight`` share
        one. ``df.attrs["serial"]``: the serial used per run."""
        if stat not in STAT_COLUMNS:
            raise ValueError(f"unknown stat {stat!r}; one of {', '.join(STAT_COLUMNS)}")
        if match not in ("exact", "auto"):
            raise ValueError(f"match must be 'exact' or 'auto', not {match!r}")
        from .engine.diff import logical_name  # the engine loads on first use

        wanted = None if names is None else [names] if isinstance(names, str) else list(names)
        label = (lambda n: logical_name(n)[0]) if match == "auto" else (lambda n: n)
        rows: dict[str, dict] = {}
        used: dict[str, int | None] = {}
        for run, cat in self._readable().items():
            serial = used[run] = self.serial_at(run, at)
            rows[run] = {}
            if serial is None:
                continue
            v = cat.variables
            present = v.loc[v["serial"] == serial, "name"].unique()
            if wanted is not None:
                keys = set(wanted) | {label(n) for n in wanted}
                present = [n for n in present if n in keys or label(n) in keys]
            if not len(present):
                continue
            st = cat.stats(serial, list(present))
            for node, name, value in zip(st["node"], st["name"], st[stat]):
                col = label(name) if not node else f"{node}/{label(name)}"
                rows[run].setdefault(col, value)
        df = pd.DataFrame.from_dict(rows, orient="index")
        df = df.reindex([r for r in self._runs if r in rows])
        df.index.name = "run"
        df.attrs.update({"serial": used, "at": at, "stat": stat})
        return df

    def diff(self, run_a: str, run_b: str, a: int | None = None, b: int | None = None,
             names: str | Iterable[str] | None = None, *, match: str | None = None,
             rename: Callable[[str], str] | dict[str, str] | None = None,
             progress: Callable[[int], None] | None = None) -> pd.DataFrame:  # fmt: skip
        """:meth:`Catalog.diff` of serial ``a`` of ``run_a`` and serial ``b`` of ``run_b``
        (default: each run's latest); ``match`` pairs tensors across layouts (default
        ``"auto"``: container prefixes stripped; ``df.attrs["pairing"]`` says how)."""
        cat_a, cat_b = self[run_a], self[run_b]
        df = cat_a.diff(a, b, cat_b, names, match=match, rename=rename, progress=progress)
        df.attrs.update({"run_a": run_a, "run_b": run_b})
        return df

    def health(self, spike_factor: float = 10.0,
               kinds: Iterable[str] | None = ("model",)) -> pd.DataFrame:  # fmt: skip
        """Per run (DESIGN.md §3e over §3d): ``healthy``, ``divergence`` (the first serial of
        the first anomaly, or NA), ``first_anomaly`` (its findings), ``rollback_point`` and
        ``latest``, from each run's :meth:`Catalog.health_summary` (values read, cached per
        file); a run that fails is a row with ``error``."""
        rows = {}
        for name, cat in self._readable().items():
            try:
                summary = cat.health_summary(spike_factor, kinds)
            except Exception as e:  # noqa: BLE001 - one run's failure is its row
                rows[name] = {"error": _message(e)}
                continue
            first = summary.attrs.get("divergence")
            found = summary.loc[first, "findings"] if first is not None else None
            rows[name] = {"healthy": first is None, "divergence": first,
                          "first_anomaly": found if isinstance(found, str) else None,
                          "rollback_point": summary.attrs.get("rollback_point"),
                          "latest": cat.latest, "error": None}  # fmt: skip
        df = pd.DataFrame.from_dict(rows, orient="index",
                                    columns=["healthy", "divergence", "first_anomaly",
                                             "rollback_point", "latest", "error"])  # fmt: skip
        df.index.name = "run"
        return df.astype({"divergence": "Int64", "rollback_point": "Int64", "latest": "Int64"})

    def usage(self) -> pd.DataFrame:
        """Bytes per run (rows) and kind (columns: model, optimizer, …, other); a row adds up
        to the run's ``nbytes``."""
        from .engine.usage import FIRST

        sums = {n: cat.usage().sum() for n, cat in self._readable().items()}
        df = pd.DataFrame(sums).T.fillna(0)
        if df.empty:
            return pd.DataFrame(index=pd.Index([], name="run", dtype=object))
        kinds = [k for k in FIRST if k in df.columns]
        kinds += sorted(c for c in df.columns if c not in FIRST and c != "other")
        df = df[kinds + (["other"] if "other" in df.columns else [])].astype("int64")
        df.index.name = "run"
        return df

    # -- retention --------------------------------------------------------------------------
    def plan_retention(self, budget: int | str | None = None, **policy: Any) -> pd.DataFrame:
        """One plan for the whole experiment, indexed (run, serial): ``action`` (keep |
        slim | delete), ``reason``, ``nbytes``, ``frees``, … Each run is planned with its own
        :meth:`Catalog.plan_retention` (``policy``: its keywords; ``pinned`` may be a dict
        ``{run: serials}``); then every run keeps its newest loadable serial, its best and its
        pins, and beyond that serials go oldest first across all runs until the experiment's
        bytes fit ``budget`` (``"2TB"`` or an int). ``.attrs``: ``budget``, ``total``
        (bytes now), ``after``, ``fits``, and per run what its apply re-checks. Changes
        nothing."""
        from .engine.retention import _protected  # the rule each run's own plan keeps

        limit = None if budget is None else parse_bytes(budget)
        pins = policy.pop("pinned", ())
        frames: dict[str, pd.DataFrame] = {}
        run_attrs: dict[str, dict] = {}
        guard: dict[tuple[str, int], str] = {}
        table = self.runs
        for run, cat in self._readable().items():
            mine = _pins_of(pins, run)
            plan = cat.plan_retention(pinned=mine, **policy)
            frames[run] = plan
            run_attrs[run] = dict(plan.attrs)
            for s, why in _protected(cat._scan, cat.serials).items():
                guard[(run, s)] = why
            best = table.loc[run, "best"]
            if not pd.isna(best):
                name = table.loc[run, "metric_name"]
                guard[(run, int(best))] = _join(guard.get((run, int(best))), f"best ({name})")
            for s in mine:
                if s in plan.index:
                    guard[(run, s)] = _join(guard.get((run, s)), "pinned")
        if not frames:
            plan = pd.DataFrame(columns=["action", "reason", "nbytes", "frees"],
                                index=pd.MultiIndex.from_tuples([], names=["run", "serial"]))  # fmt: skip
        else:
            plan = pd.concat(frames, names=["run", "serial"])
        # what a run's own policy deletes but the experiment protects (its best) stays
        for key, why in guard.items():
            if key not in plan.index:
                continue
            if plan.loc[key, "action"] != "keep":
                plan.loc[key, ["action", "reason", "frees"]] = ["keep", why, 0]
            else:
                old = plan.loc[key, "reason"]
                extra = ", ".join(p for p in why.split(", ") if p not in old)
                if old == "no retention policy":
                    plan.loc[key, "reason"] = why
                elif extra:
                    plan.loc[key, "reason"] = _join(old, extra)
        total = int(plan["nbytes"].sum()) if len(plan) else 0
        after = total - int(plan["frees"].sum()) if len(plan) else 0
        if limit is not None and after > limit:
            keeps = plan[(plan["action"] == "keep")]
            order = sorted(((t if not pd.isna(t) else pd.Timestamp.max.tz_localize("UTC"), run, s)
                            for (run, s), t in keeps["timestamp"].items()
                            if (run, s) not in guard), key=lambda x: (x[0], x[1], x[2]))  # fmt: skip
            for _, run, s in order:
                if after <= limit:
                    break
                nbytes = int(plan.loc[(run, s), "nbytes"])
                plan.loc[(run, s), ["action", "reason", "frees"]] = [
                    "delete", f"over the budget ({budget}): oldest first across runs", nbytes]
                after -= nbytes
        plan = plan.astype({"nbytes": "int64", "frees": "int64"}) if len(plan) else plan
        plan.attrs.update({"budget": limit, "total": total, "after": after,
                           "fits": limit is None or after <= limit, "runs": run_attrs})  # fmt: skip
        return plan

    def apply_retention(self, plan: pd.DataFrame, *,
                        progress: Callable[[int], None] | None = None) -> ExperimentRetention:  # fmt: skip
        """Apply an experiment plan run by run, each through its own
        :meth:`Catalog.apply_retention` (the run's lock and journal; its plan re-checked
        against the tree first). A run that refuses (locked, changed since the plan) is in
        ``.errors``; the other runs are applied."""
        from .engine.retention import TreeChangedError

        if "runs" not in plan.attrs:
            raise ValueError("not an experiment retention plan (make one with plan_retention)")
        out = ExperimentRetention()
        doomed = plan[plan["action"].isin(["delete", "slim"])]
        for run in dict.fromkeys(doomed.index.get_level_values("run")):
            per = plan.xs(run, level="run").copy()
            per.attrs = dict(plan.attrs["runs"][run])
            try:
                out.results[run] = self[run].apply_retention(per, progress=progress)
            except (TreeChangedError, OSError, ValueError, KeyError) as e:
                out.errors[run] = _message(e)
        self._table = None
        return out

    # -- display --------------------------------------------------------------------------
    def __repr__(self) -> str:
        table = self.runs
        errors = int(table["error"].notna().sum())
        size = human_bytes(int(table["nbytes"].fillna(0).sum()))
        head = f"Experiment {self.root or ''}: {len(table)} run(s), {size}"
        head += f", {errors} with errors" if errors else ""
        lines = [head]
        for run, r in table.iterrows():
            if not pd.isna(r["error"]):
                lines.append(f"  {run}: error: {r['error']}")
                continue
            best = "" if pd.isna(r["best"]) else f", best {r['best']} ({r['metric_name']}={r['best_metric']:.4g})"
            lines.append(f"  {run}: {r['layout']}, {r['n_serials']} serials, latest {r['latest']}"
                         f"{best}, {human_bytes(int(r['nbytes']))}")  # fmt: skip
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        table = self.runs
        shown = table.drop(columns=["url"]).assign(
            nbytes=[human_bytes(int(v)) if not pd.isna(v) else "" for v in table["nbytes"]])
        head = html.escape(f"Experiment {self.root or ''}: {len(table)} run(s), "
                           f"{human_bytes(int(table['nbytes'].fillna(0).sum()))}")  # fmt: skip
        return f"<div><b>{head}</b>{shown.to_html(na_rep='', escape=True)}</div>"


def _join(a: str | None, b: str) -> str:
    return f"{a}, {b}" if a else b


def _pins_of(pins: Any, run: str) -> list[int]:
    """A run's pinned serials from ``pinned``: ``{run: serials}``, ``(run, serial)`` pairs,
    or serial numbers (pinned in every run that has them)."""
    if isinstance(pins, Mapping):
        got = pins.get(run, ())
        return [int(got)] if isinstance(got, int) else [int(s) for s in got]
    out = []
    for p in pins or ():
        if isinstance(p, tuple) and len(p) == 2:
            if p[0] == run:
                out.append(int(p[1]))
        else:
            out.append(int(p))
    return out


# -- opening ------------------------------------------------------------------------------
def _glob_base(path: str) -> str:
    """The directory part of a glob pattern before its first wildcard."""
    head = re.split(r"[*?\[]", path, maxsplit=1)[0]
    return head.rstrip("/") if head.endswith("/") else posixpath.dirname(head)


def _names_for(urls: list[str]) -> list[str]:
    """Run names for a list of URLs: their paths relative to the common parent."""
    paths = [u.rstrip("/") for u in urls]
    if len(paths) == 1:
        return [posixpath.basename(paths[0]) or paths[0]]
    try:
        base = os.path.commonpath(paths)
    except ValueError:
        return paths
    names = [posixpath.relpath(p, base) if base else p for p in paths]
    return names if len(set(names)) == len(names) and "." not in names else paths


def open_experiment(url_or_urls: str | os.PathLike | Iterable | Mapping, *,
                    storage_options: dict | None = None, executor: Executor | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    cache: Any = None, depth: int = MAX_DEPTH) -> Experiment:  # fmt: skip
    """Open many runs: a directory whose descendants (to ``depth``) are
    checkpoint trees, a glob URL (``s3://b/sweep/*/checkpoints``: each match one run), or a
    list / dict (name -> URL). Runs are opened concurrently on a private thread pool;
    ``executor`` reads their headers (as in :func:`ckptview.open`). ``progress(done,
    total)`` is called per run opened. A run that fails to open is a row with ``error``."""
    cache = resolve(cache)

    def from_url(name: str, url: str) -> tuple[str, str, Callable[[], Run]]:
        def job() -> Run:
            tree = list_tree(url, storage_options, cache)
            layout = detect(tree, None, url)
            cat = Catalog(tree, layout, executor, tree.cache)
            return Run(name, cat.url, cat, layout.name)

        return name, url, job

    if isinstance(url_or_urls, Mapping):
        jobs = [from_url(str(n), os.fspath(u)) for n, u in url_or_urls.items()]
        flight = runs_in_flight([u for _, u, _ in jobs], storage_options, executor)
        return Experiment(_open_all(jobs, progress, flight))
    if not isinstance(url_or_urls, (str, os.PathLike)):
        urls = [os.fspath(u) for u in url_or_urls]
        jobs = [from_url(n, u) for n, u in zip(_names_for(urls), urls)]
        return Experiment(_open_all(jobs, progress,
                                    runs_in_flight(urls, storage_options, executor)))  # fmt: skip
    url = os.fspath(url_or_urls)
    storage, path = Storage.from_url(url, storage_options)
    if any(c in path for c in "*?["):
        base = _glob_base(path)
        jobs = []
        for match in sorted(storage.fs.glob(path)):
            jobs.append(from_url(posixpath.relpath(match, base) if base else match, storage.url(match)))
        flight = 1 if storage.plain_local and executor is None else RUN_WORKERS
        return Experiment(_open_all(jobs, progress, flight), storage.url(base))
    tree = list_tree(url, storage_options, cache)
    found, stray = find_runs(tree, depth)
    return _from_found(tree, found, stray, executor, progress)


def experiment_at(url: str | os.PathLike, storage_options: dict | None = None, *,
                  executor: Executor | None = None,
                  progress: Callable[[int, int], None] | None = None) -> Experiment | None:  # fmt: skip
    """The experiment at ``url`` when it is one (a directory whose runs are below its root,
    not the root itself), else None: how ``ckptview ls`` / ``retain`` / ``serve`` tell a
    parent of many runs from one tree."""
    tree = list_tree(url, storage_options)
    if tree.single is not None:
        return None
    found, stray = find_runs(tree)
    if not found or (len(found) == 1 and found[0].name == "."):
        return None
    return _from_found(tree, found, stray, executor, progress)


def _from_found(tree: Tree, found: list[FoundRun], stray: list[str], executor: Executor | None,
                progress: Callable[[int, int], None] | None) -> Experiment:  # fmt: skip
    def job(f: FoundRun) -> Callable[[], Run]:
        return lambda: Run(f.name, f.tree.url(), Catalog(f.tree, f.layout, executor, tree.cache),
                           f.layout.name)  # fmt: skip

    jobs = [(f.name, f.tree.url(), job(f)) for f in found]
    flight = 1 if tree.storage.plain_local and executor is None else RUN_WORKERS
    return Experiment(_open_all(jobs, progress, flight), tree.url(), stray)


def _open_one(name: str, url: str, make: Callable[[], Run]) -> Run:
    try:
        run = make()
    except Exception as e:  # noqa: BLE001 - a run that fails is a row, not the end
        return Run(name, url, None, None, _message(e))
    try:  # list its headers now, concurrently with the other runs
        if run.catalog is not None:
            run.catalog.serials  # noqa: B018
            run.catalog.metrics  # noqa: B018
    except Exception as e:  # noqa: BLE001
        run.error = _message(e)
    return run


def runs_in_flight(urls: list[str], storage_options: dict | None,
                   executor: Executor | None) -> int:  # fmt: skip
    """How many runs to open at once: one after another when every run is on local disk and
    no executor reads the headers (opening a run from the page cache is Python work that
    threads cannot overlap; a pool only adds contention, 1.15x slower measured), else
    :data:`RUN_WORKERS` (remote stores: each run waits on round trips)."""
    if executor is not None:
        return RUN_WORKERS
    for url in urls:
        try:
            if not Storage.from_url(url, storage_options)[0].plain_local:
                return RUN_WORKERS
        except Exception:  # noqa: BLE001 - its own open reports the error
            return RUN_WORKERS
    return 1


def _open_all(jobs: list[tuple[str, str, Callable[[], Run]]],
              progress: Callable[[int, int], None] | None, flight: int = RUN_WORKERS) -> list[Run]:  # fmt: skip
    """Each job run, ``flight`` at once on a private thread pool (header reads go to each
    catalog's executor: a run waiting on its own reads never holds a slot they need)."""
    if not jobs:
        return []
    if flight <= 1:
        runs = []
        for i, job in enumerate(jobs):
            runs.append(_open_one(*job))
            if progress is not None:
                progress(i + 1, len(jobs))
        return runs
    runs = []
    workers = min(flight, len(jobs))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptview-runs") as pool:
        futures = [pool.submit(_open_one, *job) for job in jobs]
        for i, fut in enumerate(futures):
            runs.append(fut.result())
            if progress is not None:
                progress(i + 1, len(futures))
    return runs
