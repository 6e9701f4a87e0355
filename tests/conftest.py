"""Shared fixtures: the real corpus (../shared/corpus by default, $CKPTVIEW_CORPUS to override)
and the files from the wild (../shared/wild, $CKPTVIEW_WILD)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("CKPTVIEW_CORPUS", ROOT.parent / "shared" / "corpus")).resolve()
WILD = Path(os.environ.get("CKPTVIEW_WILD", ROOT.parent / "shared" / "wild")).resolve()


#: Debian's Chromium (``.ci/run`` installs it), never a Playwright-downloaded browser
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    """Every browser test drives Debian's Chromium."""
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


def wild_path(*parts: str) -> Path:
    """A path inside ../shared/wild; fails (never skips) when it is missing."""
    path = WILD.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"wild path missing: {path} (set CKPTVIEW_WILD)")
    return path


def corpus_path(*parts: str) -> Path:
    """A path inside the corpus; fails (never skips) when the corpus is missing."""
    path = CORPUS.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"corpus path missing: {path} (set CKPTVIEW_CORPUS)")
    return path


def corpus_copy(rel: str, dest: Path) -> Path:
    """A writable copy of a corpus tree at ``dest`` (the shared corpus is read-only)."""
    shutil.copytree(corpus_path(rel), dest)
    for p in dest.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


@pytest.fixture(scope="session")
def corpus() -> Path:
    if not (CORPUS / "INDEX.json").exists():
        pytest.fail(f"no corpus at {CORPUS}; set CKPTVIEW_CORPUS")
    return CORPUS


@pytest.fixture(scope="session")
def corpus_index(corpus) -> dict:
    return json.loads((corpus / "INDEX.json").read_text())


def ground_truth(rel: str) -> dict:
    return json.loads(corpus_path(rel).read_text())


@pytest.fixture(autouse=True)
def _fresh_header_cache():
    """Each test starts with an empty process-wide header cache, so I/O counts stay its own."""
    from ckptview.scan import cache

    cache.default_cache().clear()
    yield


def pytest_collection_modifyitems(config, items):
    """Run the modules with Chromium tests last: pytest-playwright's session browser keeps an
    asyncio loop running on the main thread, under which Panel/param run async callbacks as
    scheduled tasks instead of to completion — the in-process widget and notebook tests must
    come first.

    Whole modules: under ``pytest -n 2`` (``./dev.sh test`` on 2+ cores) one unit,
    :class:`ChromiumApart`'s."""

    def uses_browser(item) -> bool:
        names = getattr(item, "fixturenames", ())
        return bool(item.get_closest_marker("browser")) or "page" in names or "browser" in names

    late = {item.path for item in items if uses_browser(item)}
    items[:] = ([item for item in items if item.path not in late]
                + [item for item in items if item.path in late])  # fmt: skip


#: the id of a test that pytest-playwright runs in Chromium (``test_x[chromium]``,
#: ``test_y[light-chromium-Browse]``)
CHROMIUM_ID = re.compile(r"\[(?:.*-)?chromium(?:-.*)?\]$")


def pytest_xdist_make_scheduler(config, log):
    """``pytest -n N`` (N > 1) hands out work as :class:`ChromiumApart` does."""
    from xdist.scheduler import LoadScopeScheduling

    class ChromiumApart(LoadScopeScheduling):
        """A module is one unit of work, handed out in the order of the collection, except the
        modules with Chromium tests: one unit, the first worker's from the start, and that
        worker's only (it never runs an in-process test after Chromium's loop started, and one
        Chromium with its servers at a time is what the pages' waits were sized for).
        With one worker it runs everything, the Chromium unit last."""

        chromium = "chromium tests"

        def _split_scope(self, nodeid: str) -> str:
            if not hasattr(self, "_browser_modules"):
                ids = next(iter(self.registered_collections.values()))
                self._browser_modules = {i.split("::", 1)[0] for i in ids if CHROMIUM_ID.search(i)}
            module = nodeid.split("::", 1)[0]
            return self.chromium if module in self._browser_modules else module

        def _assign_work_unit(self, node) -> None:
            apart = len(self.nodes) > 1
            if apart and node is self.nodes[0]:
                if self.chromium in self.workqueue:
                    self._assign(node, self.chromium)
                elif self.chromium not in self.assigned_work.get(node, {}):
                    self._assign(node, next(iter(self.workqueue)))  # no Chromium tests
                return
            scope = next((s for s in self.workqueue if not apart or s != self.chromium), None)
            if scope is not None:
                self._assign(node, scope)

        def _assign(self, node, scope: str) -> None:  # xdist's own, given the unit
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    if config.getvalue("dist") != "load" or config.getoption("numprocesses") in (None, 0):
        return None
    return ChromiumApart(config, log)


@pytest.fixture(scope="session", autouse=True)
def shared_stays_untouched():
    """No test writes into ../shared (CI runs as root: its missing write bits stop nothing)."""
    def written() -> list[Path]:
        return [p for root in (CORPUS, WILD) if root.exists() for p in root.rglob(".ckptview")]

    before = set(written())
    yield
    after = set(written()) - before
    assert not after, f"tests wrote into ../shared: {sorted(map(str, after))[:5]}"


def open_picker(page, timeout: float = 60_000) -> None:
    """As a visitor who wants another tree: the sidebar's "Open another tree…" button shows
    the tree picker in its place (built on that click); wait until its URL field is there."""
    from playwright.sync_api import expect

    toggle = page.locator(".ckptview-picker-toggle button")
    expect(toggle.or_(page.locator(".ckptview-url")).first).to_be_visible(timeout=timeout)
    if toggle.count():
        toggle.first.click()
    expect(page.locator(".ckptview-url input").first).to_be_visible(timeout=timeout)


def reveal(page, timeout: float = 60_000) -> None:
    """As a visitor scrolling down the Browse tab: the timeline and the variables below the
    serials table are built once their placeholder is seen (``draw_when_seen``); scroll it
    into view and wait until they replaced it (at once when the page already showed it)."""
    from playwright.sync_api import expect

    expect(page.locator(".ckptview-serials .tabulator-row").first).to_be_visible(timeout=timeout)
    later = page.locator(".ckptview-later")
    if later.count():
        try:
            later.first.scroll_into_view_if_needed(timeout=timeout)
        except Exception:  # noqa: BLE001, S110 - seen and replaced meanwhile
            pass
    expect(later).to_have_count(0, timeout=timeout)
