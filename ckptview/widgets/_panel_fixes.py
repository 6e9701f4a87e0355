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
"""

from __future__ import annotations

import functools

_APPLIED = "_ckptview_flushes_queued"
_CACHED = "_ckptview_cached"


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
