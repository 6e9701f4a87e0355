"""Health over serials (DESIGN.md §3e): per-variable statistics across a run, the rules that
find where it went wrong, and the serial to roll back to.

- :mod:`.measure`: one variable over several serials, each read once (statistics,
  ``update_rel``, spectra), streamed with bounded memory;
- :mod:`.spectral`: ``sigma_max`` and WeightWatcher's ``alpha`` of a 2-D weight;
- :mod:`.table`: :func:`health`, the table of a scan, cached per file identity;
- :mod:`.kept`: the newest serial's values kept in memory for a live run's next call;
- :mod:`.rules`: :func:`health_summary` — flags, statuses, onsets and the rollback point.
"""

from __future__ import annotations

from .measure import HEALTH_STATS
from .rules import STATUSES, SUMMARY_COLUMNS, health_summary, summarize, top_spikes, variable_rules
from .table import HEALTH_COLUMNS, SPECTRAL, health

__all__ = ["HEALTH_COLUMNS", "HEALTH_STATS", "SPECTRAL", "STATUSES", "SUMMARY_COLUMNS", "health",
           "health_summary", "summarize", "top_spikes", "variable_rules"]  # fmt: skip
