"""What a served page answers before anyone logs in, and that no request imports a module.

Panel's ``/components/<module>/<class>/<attr>/<path>`` route imported whatever module the URL
named, before any login: ``/components/this/...`` printed the Zen of Python into the server's
log, ``/components/ckptview.cli.__main__/...`` made the server exit. Here the servers are real
``ckptview serve`` processes on a free loopback port; the routes checked are the ones the
server's tornado application was built with (Bokeh logs them at debug level), so a route
added by a new Panel or Bokeh is checked too.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import pytest
from bokeh_client import message, send
from test_serve import APP, ROOT, Served, get

from ckptview.demo import write_demo

PASSWORD = "pre-login-pw"
ZEN = "Beautiful is better than ugly"
#: URLs that name a module no page uses: importing one prints, exits or starts a server
IMPORTING = ("/components/this/x.js", "/components/this/Zen/__css__/x.js",
             "/components/ckptview.cli.__main__/X/__css__/x.js",
             "/components/ckptview.widgets.__main__/X/__css__/x.js")  # fmt: skip


def component_resource() -> tuple[str, bytes]:
    """A component resource of a class every page has loaded (Panel's BootstrapTemplate CSS):
    its URL path and its bytes."""
    from panel.io.resources import component_resource_path
    from panel.template import BootstrapTemplate

    css = BootstrapTemplate._css[0]
    url = component_resource_path(BootstrapTemplate, "_css", css)
    assert url.startswith("components/"), url
    return "/" + url, Path(css).read_bytes()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_demo(tmp_path_factory.mktemp("prelogin") / "demo", serials=2).root


@pytest.fixture(scope="module")
def locked(tree, tmp_path_factory):
    """``ckptview serve --basic-auth``, logging at debug level (the route table) to a file."""
    log = tmp_path_factory.mktemp("locked") / "server.log"
    server = Served(tree, "--basic-auth", PASSWORD, log=log, env={"BOKEH_PY_LOG_LEVEL": "debug"})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def unlocked(tree, tmp_path_factory):
    """``ckptview serve`` with no login."""
    server = Served(tree, log=tmp_path_factory.mktemp("unlocked") / "server.log")
    yield server
    server.stop()


def routes(log: str) -> list[str]:
    """The URL patterns of the server's tornado application, from Bokeh's debug log."""
    table = log[log.index("Patterns are:") :]
    return re.findall(r"^\S+ \S+\s+\[?\('(/[^']*)'", table, re.MULTILINE)


def concrete(pattern: str, component: str) -> str:
    """A URL path ``pattern`` matches, naming a real file where it takes one."""
    fill = (component.removeprefix("/components/") if pattern.startswith("/components/")
            else "panel/css/loading.css" if "/extensions/" in pattern
            else "js/bokeh.min.js")  # fmt: skip
    path = re.sub(r"\(\?![^)]*\)", "", pattern).replace("(.*)", fill).replace("/?", "")
    path = path.rstrip("$") or "/"
    assert not re.search(r"[()\[\]*+?^$|\\]", path), f"no concrete URL for {pattern!r}"
    return path


def request(port: int, path: str, cookie: str = "") -> http.client.HTTPResponse:
    """``GET path`` as a browser sends it (a websocket upgrade for ``.../ws``)."""
    headers = {"Cookie": cookie} if cookie else {}
    if path.endswith("/ws"):
        headers |= {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
                    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                    "Origin": f"http://127.0.0.1:{port}"}  # fmt: skip
    return get(port, path, headers=headers)


def login(port: int) -> str:
    """Log in through the login form; the ``Cookie`` header the browser then sends."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/login", body=urlencode({"username": "ana", "password": PASSWORD}),
                 headers={"Host": f"127.0.0.1:{port}",
                          "Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    response = conn.getresponse()
    response.read()
    conn.close()
    cookies = [c.split(";", 1)[0] for c in response.msg.get_all("Set-Cookie") or []]
    assert response.status == 302 and any(c.startswith("user=") for c in cookies), cookies
    return "; ".join(cookies)


def alive(server: Served) -> bool:
    return server.proc.poll() is None and get(server.port, "/").status in (200, 302)


def refused(response: http.client.HTTPResponse) -> bool:
    """``401``/``403``, or a redirect to the login page."""
    location = response.getheader("Location") or ""
    return response.status in (401, 403) or (response.status in (302, 303) and "login" in location)


def test_before_login_every_route_is_closed(locked):
    table = routes(locked.output())
    for expected in ("/favicon.ico", f"/{APP}/ws", f"/{APP}/?", "/components/(.*)",
                     "/static/(.*)", "/login", "/logout"):  # fmt: skip
        assert expected in table, (expected, table)
    component, _ = component_resource()
    for pattern in table:
        path = concrete(pattern, component)
        response = request(locked.port, path)
        if pattern in ("/login", "/logout"):
            assert response.status == 200, path  # the login form itself
        else:
            assert refused(response), (path, response.status, response.body[:200])
            assert b"bokeh" not in response.body.lower(), path
    for path in IMPORTING:
        assert refused(get(locked.port, path)), path
    assert alive(locked) and ZEN not in locked.output()


def test_after_login_the_page_and_its_resources_load(locked):
    cookie = login(locked.port)
    page = get(locked.port, f"/{APP}", headers={"Cookie": cookie})
    assert page.status == 200 and b"<script" in page.body
    scripts = re.findall(rb'<script[^>]* src="(static/[^"?]+)', page.body)
    assert scripts
    for src in scripts[:4]:
        path = "/" + src.decode()
        assert get(locked.port, path, headers={"Cookie": cookie}).status == 200, path
        assert refused(get(locked.port, path)), path  # the same file, without the login
    component, body = component_resource()
    served = get(locked.port, component, headers={"Cookie": cookie})
    assert served.status == 200 and served.body == body, component
    assert refused(get(locked.port, component))
    assert pull_document(locked.port, page.body, cookie)["doc"]["roots"]


def test_no_url_imports_a_module_after_login(locked):
    cookie = login(locked.port)
    for path in IMPORTING:
        assert get(locked.port, path, headers={"Cookie": cookie}).status != 200, path
        assert alive(locked), path
    assert ZEN not in locked.output()


def test_no_url_imports_a_module_without_a_login(unlocked):
    for path in IMPORTING:
        assert get(unlocked.port, path).status != 200, path
        assert alive(unlocked), path
    assert ZEN not in unlocked.output()
    component, body = component_resource()  # a loaded component class's resource still loads
    served = get(unlocked.port, component)
    assert served.status == 200 and served.body == body


def pull_document(port: int, page: bytes, cookie: str) -> dict:
    """Connect the page's websocket with the login cookie; the document it sends."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    token = re.search(r'"token":"([^"]+)"', page.decode())[1]

    async def pull() -> dict:
        url = HTTPRequest(f"ws://127.0.0.1:{port}/{APP}/ws", headers={"Cookie": cookie})
        ws = await websocket_connect(url, subprotocols=["bokeh", token])
        try:
            await message(ws)  # ACK
            await send(ws, "PULL-DOC-REQ", {})
            while True:
                header, content = await message(ws)
                if header["msgtype"] == "PULL-DOC-REPLY":
                    return json.loads(content)
        finally:
            ws.close()

    return asyncio.run(asyncio.wait_for(pull(), 120))


IMPORT_ALL = """
import importlib, pkgutil, sys
import ckptview
sys.argv = ["import-check", "--help"]  # what a module that parses arguments on import sees
names = sorted(m.name for m in pkgutil.walk_packages(ckptview.__path__, "ckptview."))
for name in names:
    importlib.import_module(name)
sys.stderr.write(f"imported {len(names)} modules\\n")
"""


def test_no_ckptview_module_does_work_on_import():
    """Importing any ``ckptview.*`` module prints nothing, exits nothing, serves nothing."""
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)  # fmt: skip
    assert done.returncode == 0 and done.stdout == "", (done.returncode, done.stdout[-2000:])
    assert re.fullmatch(r"imported \d+ modules\n", done.stderr), done.stderr[-2000:]
