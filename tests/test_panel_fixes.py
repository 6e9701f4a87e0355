"""Panel's queued page messages are all sent (``ckptview.widgets._panel_fixes``).

Panel's own writer, driven through its real functions with a socket type registered the way
Panel's extension point expects: messages queued while an earlier write is awaited, in the
order of events that lost an action's result on a busy server.
"""

from __future__ import annotations

import asyncio

import pytest
from bokeh.document import Document
from panel.io import document as panel_doc

import ckptview.widgets  # noqa: F401 - applies the fix
from ckptview.widgets import _panel_fixes


class Socket:
    """A websocket whose writes complete when the test says so."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.pending: list[asyncio.Future] = []

    def write(self, conn, msg=None) -> list[asyncio.Future]:
        self.sent.append(msg)
        done = asyncio.get_running_loop().create_future()
        self.pending.append(done)
        return [done]


class Protocol:
    def create(self, kind: str, events: list) -> str:
        return f"{kind}:{','.join(events)}"


class Connection:
    def __init__(self, socket: Socket) -> None:
        self._socket = socket
        self.protocol = Protocol()


@pytest.fixture
def socket(monkeypatch):
    sock = Socket()
    monkeypatch.setitem(panel_doc.extra_socket_handlers, Socket, sock.write)
    return sock


async def queued_while_writing(socket: Socket) -> list[str]:
    """Queue a message, let its write start, finish that write, queue a second one (its task
    runs after the first task resumes), and return what was sent."""
    doc, conn = Document(), Connection(socket)
    panel_doc.schedule_write_events(doc, [conn], ["loading=True"])
    for _ in range(5):
        await asyncio.sleep(0)  # the first task writes and awaits its write
    assert socket.sent == ["PATCH-DOC:loading=True"]
    socket.pending[0].set_result(None)  # the first task resumes next, before the new task
    panel_doc.schedule_write_events(doc, [conn], ["rows", "loading=False"])
    for _ in range(20):
        await asyncio.sleep(0.01)
        for f in socket.pending:
            if not f.done():
                f.set_result(None)
    return socket.sent


def test_messages_queued_during_a_write_are_sent(socket):
    assert getattr(panel_doc._dispatch_msgs, "_ckptview_flushes_queued", False)
    sent = asyncio.run(queued_while_writing(socket))
    assert sent == ["PATCH-DOC:loading=True", "PATCH-DOC:rows,loading=False"]


def test_without_the_fix_panel_strands_them(socket, monkeypatch):
    """The failure the fix is for, reproduced with Panel's unpatched writer (if a Panel
    release fixes it, this test fails and the fix can go)."""
    original = panel_doc._dispatch_msgs.__wrapped__
    monkeypatch.setattr(panel_doc, "_dispatch_msgs", original)
    sent = asyncio.run(queued_while_writing(socket))
    assert sent == ["PATCH-DOC:loading=True"]  # "rows, loading=False" never written


def test_apply_is_idempotent():
    assert _panel_fixes.apply() is False  # already applied on import
