"""Fixes for Panel's serving path (Panel 1.9.4, the newest at the time of writing).

**The message writer.**

Changes made while a page's earlier messages are still being written are queued by Panel
(``panel.io.document.schedule_write_events``) and sent by a task, ``_dispatch_msgs``. That
task lifts the document's write block after awaiting its own writes, without looking at what
was queued meanwhile; the task scheduled for those messages then finds no block and returns.
The queued messages stay unsent until some later change on the page happens to flush them: an
action's result (a diff, a verify, a plan) and the end of its loading spinner are lost with them.
Seen on a busy server (2 cores, Chromium beside it) about once in 40 actions.

:func:`apply` wraps ``_dispatch_msgs``: when it returns with messages still queued and no write
under way, it sends them.

**The resources of every page.** Each page GET lists the CSS and JS of every loaded custom
component class (``Resources.extra_resources``): for panel-material-ui's hundred-odd
classes that is a path computation per class and per resource kind, ~40 ms of a page's
~0.7 s of server CPU, the same answer every time. :func:`cache_component_resources`
remembers the answer per resource kind, mode, path prefix, CDN and set of loaded classes
(a class loaded later makes a new set, so its resources are listed).

**No module imported by a URL.** ``/components/<module>/<class>/<attr>/<path>`` (Panel's
``ComponentResourceHandler``) calls ``importlib.import_module(<module>)`` on the URL's text
before checking anything: any visitor, before any login, could import any installed module
(``this`` prints, a ``__main__`` may exit the server). :func:`refuse_module_imports` answers
``404`` unless the module is already in ``sys.modules`` (a component class of the page is
always loaded), so a request can only read resources of code the server already runs.
"""

from __future__ import annotations

import functools
import sys

_APPLIED = "_ckptview_flushes_queued"
_CACHED = "_ckptview_cached"
LOADED_ONLY = "_ckptview_loaded_modules_only"


def apply() -> bool:
    """Patch ``panel.io.document._dispatch_msgs`` (once); False when Panel has no such writer."""
    from panel.io import document

    original = getattr(document, "_dispatch_msgs", None)
    if original is None or getattr(original, _APPLIED, False):
        return False
    for name in ("_WRITE_BLOCK", "_WRITE_MSGS", "_dispatch_write_task"):
        if not hasattr(document, name):
            return False

    @functools.wraps(original)
    async def dispatch_msgs(doc) -> None:
        await original(doc)
        if doc not in document._WRITE_BLOCK and document._WRITE_MSGS.get(doc):
            document._WRITE_BLOCK[doc] = True  # as schedule_write_events does
            document._dispatch_write_task(doc, dispatch_msgs, doc)

    setattr(dispatch_msgs, _APPLIED, True)
    document._dispatch_msgs = dispatch_msgs
    return True


def cache_component_resources() -> bool:
    """Patch ``panel.io.resources.Resources.extra_resources`` (once) to answer from a cache;
    False when Panel has no such method."""
    from panel.config import config
    from panel.io import resources
    from panel.io.state import state
    from panel.reactive import ReactiveCustomBase

    original = getattr(resources.Resources, "extra_resources", None)
    descendents = getattr(resources, "_descendents", None)
    if original is None or descendents is None or getattr(original, _CACHED, False):
        return False
    answers: dict[tuple, tuple[str, ...]] = {}

    @functools.wraps(original)
    def extra_resources(self, found: list, resource_type: str) -> None:
        loaded = tuple(c for c in descendents(ReactiveCustomBase, concrete=True) if c._loaded())
        key = (resource_type, self.mode, state.rel_path, config.npm_cdn, loaded)
        answer = answers.get(key)
        if answer is None:
            listed: list = []
            original(self, listed, resource_type)
            answer = answers[key] = tuple(listed)
        for resource in answer:
            if resource not in found:
                found.append(resource)

    setattr(extra_resources, _CACHED, True)
    resources.Resources.extra_resources = extra_resources
    return True


def refuse_module_imports() -> bool:
    """Patch ``panel.io.server.ComponentResourceHandler.parse_url_path`` (once) to answer
    ``404`` for a module not already loaded; False when it was patched already."""
    from panel.io.server import ComponentResourceHandler
    from tornado.web import HTTPError

    original = ComponentResourceHandler.parse_url_path
    if getattr(original, LOADED_ONLY, False):
        return False

    @functools.wraps(original)
    def parse_url_path(self, path: str) -> str:
        if path.split("/", 1)[0] not in sys.modules:  # never import what a URL names
            raise HTTPError(404, "Module not loaded")
        return original(self, path)

    setattr(parse_url_path, LOADED_ONLY, True)
    ComponentResourceHandler.parse_url_path = parse_url_path
    return True
