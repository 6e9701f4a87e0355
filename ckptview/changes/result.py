"""``ChangeResult``: the one kind of object every change to a tree returns.

``cat.restore``, ``cat.export``, ``cat.apply_retention`` and ``changes.recover`` each return a
subclass: the same fields (``target``, ``dry_run``, ``done``, ``message``, ``ops``), a
one-line :meth:`~ChangeResult.headline`, a text and an HTML form, and :meth:`to_dict` (plain
JSON types, what ``ckptview … --json`` prints). Plans of a change are the same object with
``dry_run=True``; only a retention plan is a DataFrame (DESIGN.md: indexed by serial, its
``.attrs`` carry what ``apply_retention`` re-checks).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import pandas as pd

from .ops import ops_frame


def _no_ops() -> pd.DataFrame:
    return ops_frame([])


def records(df: pd.DataFrame, index: bool = True) -> list[dict]:
    """A DataFrame as JSON-ready records (the index as a column unless it is a bare range;
    NaN/NA as None, timestamps as ISO strings, tuples as lists)."""
    named = df.index.name is not None or isinstance(df.index, pd.MultiIndex)
    out = df.reset_index() if index and named else df
    return json.loads(out.to_json(orient="records", date_format="iso", default_handler=str))


@dataclass(kw_only=True)
class ChangeResult:
    """What a change did, or with ``dry_run`` would do.

    ``target``: URL of the tree that changes; ``dry_run``: nothing was changed (a plan);
    ``done``: the change ran to its end; ``message``: why nothing had to run, or a note;
    ``ops``: the steps planned or run (``kind``, ``path``, ``src``, ``nbytes``, ``note``;
    index ``step``)."""

    action: ClassVar[str] = "change"
    #: the table ``str()`` and the notebook show under the headline
    main_table: ClassVar[str] = "ops"

    target: str
    dry_run: bool
    done: bool
    message: str = ""
    ops: pd.DataFrame = field(default_factory=_no_ops, repr=False)

    @property
    def verb(self) -> str:
        return "would run" if self.dry_run else ("did run" if self.done else "did not run")

    def headline(self) -> str:
        """One line: what changed (or would) where."""
        return self._with_message(f"{self.action} {self.target}: {self.verb} {len(self.ops)} steps")

    def _with_message(self, head: str) -> str:
        return f"{head} ({self.message})" if self.message else head

    def notes(self) -> list[str]:
        """Lines worth reading after the headline (none by default)."""
        return []

    def table(self) -> pd.DataFrame:
        return getattr(self, self.main_table)

    def __str__(self) -> str:
        lines = [self.headline(), *(f"  {n}" for n in self.notes())]
        table = self.table()
        if len(table):
            with pd.option_context("display.max_colwidth", 80, "display.width", 200):
                lines.append(table.to_string())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes())
        table = self.table()
        body = table.to_html(escape=True) if len(table) else ""
        return f"<p>{html.escape(self.headline())}</p>{f'<ul>{notes}</ul>' if notes else ''}{body}"

    def to_dict(self) -> dict[str, Any]:
        """Every field with plain JSON types (DataFrames as lists of records)."""
        out: dict[str, Any] = {"action": self.action}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = records(value) if isinstance(value, pd.DataFrame) else value
        return json.loads(json.dumps(out, default=json_default))


def json_default(value: Any) -> Any:
    """``json.dumps(default=)`` for numpy scalars, tuples and sets (else ``str``)."""
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
