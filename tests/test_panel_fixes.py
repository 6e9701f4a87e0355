"""Panel's queued page messages are all sent, and the resources every page lists come from a
cache that answers as Panel would (``ckptview.widgets._panel_fixes``).

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


# -- the resources every page lists --------------------------------------------------------------
def _bundle() -> tuple:
    from panel.io.resources import Resources

    r = Resources(mode="server")
    return r.css_files, r.js_files, r.js_modules, r.css_raw


def test_page_resources_come_from_the_cache_and_equal_panels_own(monkeypatch):
    import panel as pn
    from panel.io import resources
    from panel.io.resources import Resources

    pn.extension("tabulator")
    import ckptview.widgets.shell.app  # noqa: F401 - every component class the dashboard loads

    patched = Resources.extra_resources
    assert getattr(patched, _panel_fixes._CACHED, False)
    paths = []  # each class's resource paths, computed by Panel's own listing
    real = resources.component_resource_path
    monkeypatch.setattr(resources, "component_resource_path",
                        lambda *a: paths.append(a) or real(*a))  # fmt: skip
    cached = _bundle()
    paths.clear()
    again = _bundle()
    assert paths == []  # a page after the first: nothing computed again
    monkeypatch.setattr(Resources, "extra_resources", patched.__wrapped__)  # Panel's own
    own = _bundle()
    assert len(paths) > 50  # … which Panel's own listing does for every page
    assert cached == again == own
    assert any("material" in f for f in own[0])  # not vacuous: panel-material-ui's CSS listed


def test_a_component_class_made_later_gets_its_resources_listed():
    from panel.custom import ReactiveHTML

    before = _bundle()[0]

    class LateComponent(ReactiveHTML):  # a component module imported after the first page
        __css__ = ["https://example.invalid/late-component.css"]  # noqa: RUF012
        _template = "<div></div>"

    after = _bundle()[0]
    assert "https://example.invalid/late-component.css" not in before
    assert "https://example.invalid/late-component.css" in after
    del LateComponent


def test_the_resource_cache_is_applied_once():
    assert _panel_fixes.cache_component_resources() is False  # already applied at import
