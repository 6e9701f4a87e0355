"""The :class:`Experiment`: many runs side by side (tables, comparisons, health, retention)."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pandas as pd

from ..catalog import Catalog
from ..engine.stats import STAT_COLUMNS
from ..fmt import human_bytes
from .retention import ExperimentRetention, parse_bytes, pins_of
from .run import Run, error_text, run_row, runs_frame


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
        from ..engine.diff import logical_name  # the engine loads on first use

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
                rows[name] = {"error": error_text(e)}
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
        from ..engine.usage import FIRST

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
        from ..engine.retention import _protected  # the rule each run's own plan keeps

        limit = None if budget is None else parse_bytes(budget)
        pins = policy.pop("pinned", ())
        frames: dict[str, pd.DataFrame] = {}
        run_attrs: dict[str, dict] = {}
        guard: dict[tuple[str, int], str] = {}
        table = self.runs
        for run, cat in self._readable().items():
            mine = pins_of(pins, run)
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
        from ..engine.retention import TreeChangedError

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
                out.errors[run] = error_text(e)
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
