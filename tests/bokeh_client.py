"""A visitor that asks a served page what a browser asks, drawing nothing: the page, over its
WebSocket the document, then ``document_ready`` (what BokehJS sends once it has rendered, after
which a page draws its late parts). Used by ``test_sessions.py`` and ``bench_load.py``."""

from __future__ import annotations

import json
import re
import uuid

#: the PATCH-DOC content BokehJS sends once a page has rendered
READY = {"events": [{"kind": "MessageSent", "msg_type": "bokeh_event", "msg_data": {
    "type": "event", "name": "document_ready", "values": {"type": "map"}}}]}  # fmt: skip


async def message(ws) -> tuple[dict, str]:
    """One Bokeh protocol message: header, metadata, content, then (header, bytes) per buffer."""
    header = json.loads(await ws.read_message())
    await ws.read_message()
    content = await ws.read_message()
    for _ in range(header.get("num_buffers", 0) * 2):
        await ws.read_message()
    return header, content


async def send(ws, msgtype: str, content: dict) -> None:
    await ws.write_message(json.dumps({"msgid": uuid.uuid4().hex, "msgtype": msgtype}))
    await ws.write_message("{}")
    await ws.write_message(json.dumps(content))


async def open_document(url: str, timeout: float = 600, content: bool = False):
    """GET the page at ``url``, connect its WebSocket and pull its document; the socket
    (``content``: and the document, as the JSON text of the server's reply)."""
    from tornado.httpclient import AsyncHTTPClient
    from tornado.websocket import websocket_connect

    page = await AsyncHTTPClient().fetch(url, request_timeout=timeout)
    token = re.search(r'"token":"([^"]+)"', page.body.decode()).group(1)
    ws = await websocket_connect(url.replace("http", "ws", 1) + "/ws", connect_timeout=timeout,
                                 subprotocols=["bokeh", token])  # fmt: skip
    try:
        await message(ws)  # ACK
        await send(ws, "PULL-DOC-REQ", {})
        while True:
            header, doc = await message(ws)
            if header["msgtype"] == "PULL-DOC-REPLY":
                break
    except BaseException:
        ws.close()
        raise
    return (ws, doc) if content else ws


def seen(doc: str) -> dict:
    """The PATCH-DOC content a browser sends once the visitor sees the page's placeholder of
    the parts built when seen (``ckptview.widgets._base.SeenMarker``), given the document."""

    def models(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "id" in node:
                yield node
            for value in node.values():
                yield from models(value)
        elif isinstance(node, list):
            for value in node:
                yield from models(value)

    for model in models(json.loads(doc)):
        attributes = model.get("attributes", {})
        if "ckptview-later" in str(attributes.get("html", "")):  # the marker; its data model:
            return {"events": [{"kind": "ModelChanged", "model": {"id": attributes["data"]["id"]},
                                "attr": "seen", "new": True}]}  # fmt: skip
    raise LookupError("no placeholder waiting to be seen in the document")
