"""Trees catalogued in the background for the whole server: a page opened while a big tree is
still being catalogued shows how far it got, then the tree."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import ckptview as cv

from .._format import md_code


def open_catalog(url: str, executor: Any = None, progress=None) -> cv.Catalog:
    """``cv.open`` then the serials and variables tables (what every page shows first)."""
    cat = cv.open(url, executor=executor, progress=progress)
    cat.serials  # noqa: B018 - catalogue now, not in a page's callbacks
    cat.variables  # noqa: B018
    return cat


class TreeLoad:
    """One tree being catalogued in a background thread: its progress while it runs, then
    its catalog or its error. Every session of the server shares it; a session follows it with
    :meth:`follow` (told, from the loading thread, of progress and of the end)."""

    #: seconds between two progress reports to the followers
    REPORT_EVERY = 0.5

    def __init__(self, url: str, executor: Any = None) -> None:
        self.url = url
        self.done = 0
        self.total = 0
        self.catalog: cv.Catalog | None = None
        self.error: BaseException | None = None
        self._finished = threading.Event()
        self._followers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._reported = 0.0
        threading.Thread(target=self._run, args=(executor,), daemon=True,
                         name=f"ckptview-catalog {url}").start()  # fmt: skip

    def _run(self, executor: Any) -> None:
        try:
            self.catalog = open_catalog(self.url, executor, self._progress)
        except BaseException as e:  # noqa: BLE001 - shown on the page, raised by result()
            self.error = e
        finally:
            with self._lock:
                self._finished.set()
            self._tell()
            self._followers = []  # their pages are not kept alive by a tree they once waited for

    def _progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if now - self._reported >= self.REPORT_EVERY:
            self._reported = now
            self._tell()

    def follow(self, notify: Callable[[], None]) -> bool:
        """Call ``notify()`` (from the loading thread) on progress and when the load ends;
        ``False`` if it has already ended (nothing will be called)."""
        with self._lock:
            if self._finished.is_set():
                return False
            self._followers.append(notify)
            return True

    def _tell(self) -> None:
        for notify in list(self._followers):
            try:
                notify()
            except Exception:  # noqa: BLE001, S112 - a page gone meanwhile
                continue

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> cv.Catalog:
        """The catalog, waiting for it (its error raised)."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"{self.url} is still being catalogued")
        if self.error is not None:
            raise self.error
        assert self.catalog is not None
        return self.catalog

    def describe(self) -> str:
        """Markdown: how far the cataloguing got."""
        if self.total:
            pct = 100 * self.done / self.total
            return (f"Cataloguing {md_code(self.url)}: {self.done:,} of {self.total:,} files "
                    f"read ({pct:.0f}%)")  # fmt: skip
        return f"Cataloguing {md_code(self.url)}: listing the tree…"
