"""The newest serial's values of each variable, kept in memory between health calls.

``update_rel`` of a serial needs its predecessor's values. On a live run (a dashboard or a
notebook that calls ``refresh()`` then ``health()`` as serials land) that predecessor was the
newest serial of the last call: :func:`ckptview.health.health` keeps its values here,
so the new serial costs one read of its own files instead of two. Entries are keyed by the
identities (URL, size, mtime, ETag) of the files the values came from, so a changed file is
never served from memory; a variable's older entry goes when a newer one is kept; the whole
store holds at most :data:`KEEP_BYTES` (least recently used first out), and a variable larger
than that is not kept (read again). ``KEEP_BYTES = 0`` turns it off. Per process: a Dask
worker keeps its own.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

#: the most bytes of values kept in all (a variable larger than this is never kept)
KEEP_BYTES = 128 << 20


Values = list[np.ndarray]


class KeptValues:
    """An LRU store of values by key (a variable's flat pieces, in order: the blocks as they
    streamed by, kept without a copy), one entry per variable (``owner``), bounded in bytes by
    ``budget`` (read at each :meth:`put`, so it may change at run time)."""

    def __init__(self, budget: int | None = None) -> None:
        self._budget = budget
        self._items: OrderedDict[Hashable, tuple[Hashable, Values, int]] = OrderedDict()
        self._by_owner: dict[Hashable, Hashable] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def budget(self) -> int:
        return KEEP_BYTES if self._budget is None else self._budget

    @property
    def nbytes(self) -> int:
        return self._bytes

    def fits(self, nbytes: int) -> bool:
        """True when an array of ``nbytes`` may be kept at all."""
        return 0 < nbytes <= self.budget

    def get(self, key: Hashable) -> Values | None:
        with self._lock:
            got = self._items.get(key)
            if got is None:
                return None
            self._items.move_to_end(key)
            return got[1]

    def put(self, owner: Hashable, key: Hashable, values: Values) -> bool:
        """Keep ``values`` (read-only from now on) as ``owner``'s newest under ``key``,
        replacing the owner's older entry; False when they do not fit the budget."""
        nbytes = sum(v.nbytes for v in values)
        if not self.fits(nbytes):
            return False
        for v in values:
            v.flags.writeable = False
        with self._lock:
            old = self._by_owner.pop(owner, None)
            if old is not None:
                self._drop(old)
            self._drop(key)
            while self._items and self._bytes + nbytes > self.budget:
                self._drop(next(iter(self._items)))
            self._items[key] = (owner, values, nbytes)
            self._by_owner[owner] = key
            self._bytes += nbytes
        return True

    def release(self, owner: Hashable) -> None:
        """Forget ``owner``'s entry (its newer values are about to be collected)."""
        with self._lock:
            key = self._by_owner.get(owner)
            if key is not None:
                self._drop(key)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._by_owner.clear()
            self._bytes = 0

    def _drop(self, key: Hashable) -> None:
        got = self._items.pop(key, None)
        if got is not None:
            owner, _, nbytes = got
            self._bytes -= nbytes
            if self._by_owner.get(owner) == key:
                del self._by_owner[owner]


#: the process's store (health's)
KEPT = KeptValues()
