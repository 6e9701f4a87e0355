"""A fix for Panel's server-side message writer (Panel 1.9.4, the newest at the time of writing).

Changes made while a page's earlier messages are still being written are queued by Panel
(``panel.io.document.schedule_write_events``) and sent by a task, ``_dispatch_msgs``. That
task lifts the document's write block after awaiting its own writes, without looking at what
was queued meanwhile; the task scheduled for those messages then finds no block and returns.
The queued messages stay unsent until some later change on the page happens to flush them: an
action's result (a diff, a verify, a plan) and the end of its loading spinner are lost with them.
Seen on a busy server (2 cores, Chromium beside it) about once in 40 actions.

:func:`apply` wraps ``_dispatch_msgs``: when it returns with messages still queued and no write
under way, it sends them.
"""

from __future__ import annotations

import functools

_APPLIED = "_ckptview_flushes_queued"


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
