"""``ckptview serve`` as started from a shell: what it listens on, which hosts it answers, the
headers of its page, its password option, and what it refuses to share.

Servers are real ``ckptview serve`` processes on a free loopback port (nothing here listens
beyond 127.0.0.1); requests are plain HTTP from the test.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import json
import os
import re
import subprocess
import sys
import time
import unittest
from pathlib import Path

import psutil
import pytest

from ckptview.cli import serve as serve_cli
from ckptview.demo import write_demo

ROOT = Path(__file__).resolve().parents[1]
APP = "ckptview_app"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str = f"/{APP}", host: str | None = None,
        headers: dict | None = None) -> http.client.HTTPResponse:  # fmt: skip
    """``GET path`` from 127.0.0.1:port with the given ``Host`` header (default: its own)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path, headers={"Host": host or f"127.0.0.1:{port}", **(headers or {})})
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


class Served:
    """``ckptview serve TREE --port P [args]`` in a subprocess, stopped by its own pid; its
    output in ``log`` (a file, readable while it runs) when given, with ``env`` added."""

    def __init__(self, tree: Path, *args: str, timeout: float = 120, log: Path | None = None,
                 env: dict[str, str] | None = None, warm: bool = False):  # fmt: skip
        self.port = free_port()
        cmd = [sys.executable, "-m", "ckptview.cli", "serve", str(tree), "--port", str(self.port),
               *([] if warm else ["--no-warm"]), "--poll", "0", *args]  # fmt: skip
        self.log = log
        with open(log, "w") if log else contextlib.nullcontext(subprocess.PIPE) as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True,
                                         cwd=ROOT, env={**os.environ, **(env or {})})  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptview serve exited: {self.output()}")
            try:
                get(self.port, "/")
                return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError("ckptview serve did not answer")

    def listening(self) -> set[str]:
        """The local addresses the server's sockets listen on."""
        conns = psutil.Process(self.proc.pid).net_connections(kind="inet")
        return {c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN}

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.output()

    def output(self) -> str:
        """What the server wrote (so far, with a ``log``; else all of it, once it ended)."""
        return self.log.read_text() if self.log else self.proc.stdout.read()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_demo(tmp_path_factory.mktemp("serve") / "demo", serials=2).root


@pytest.fixture(scope="module")
def served(tree):
    server = Served(tree, "--allow-websocket-origin", "ckpt.example.org:8443")
    yield server
    server.stop()


def test_listens_on_loopback_only_by_default(served):
    assert served.listening() == {"127.0.0.1"}


def test_answers_its_own_names_and_refuses_other_hosts(served):
    port = served.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "ckpt.example.org:8443"):
        assert get(port, host=host).status == 200, host
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.evil.example:{port}",
                 "ckpt.example.org:9999"):  # fmt: skip
        response = get(port, host=host)
        assert response.status == 403, host
        assert b"does not answer the host" in response.body and b"bokeh" not in response.body
    assert get(port, "/", host="evil.example").status == 403  # every route, not only the page


def test_the_page_carries_a_content_security_policy(served):
    response = get(served.port)
    csp = response.getheader("Content-Security-Policy")
    nonce = re.search(r"'nonce-([A-Za-z0-9_-]{20,})'", csp)[1]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert directives["base-uri"] == "'self'" and directives["img-src"] == "'self' data: blob:"
    assert directives["connect-src"] == "'self' blob:"
    assert "'unsafe-inline'" not in directives["script-src"]
    scripts = re.findall(rb"<script\b[^>]*>", response.body)
    assert scripts and all(f'nonce="{nonce}"'.encode() in s for s in scripts)
    assert response.getheader("X-Content-Type-Options") == "nosniff"
    assert response.getheader("X-Frame-Options") == "DENY"
    again = get(served.port).getheader("Content-Security-Policy")
    assert nonce not in again  # a fresh nonce per page


def test_the_page_has_the_browser_load_its_modules(served):
    """es-module-shims in polyfill mode: a module is the browser's ``import()``, not a copy the
    shim lexed into a ``blob:`` URL (the Chromium side: ``test_browser_csp``)."""
    body = get(served.port).body.decode()
    options = re.findall(r'<script[^>]*type="esms-options"[^>]*>([^<]*)</script>', body)
    assert [json.loads(o) for o in options] == [{"shimMode": False}]  # Panel's: true


def test_the_pages_loading_spinner_turns_three_times(served):
    """panel-material-ui's loader ring spins while the page loads; served, the page's CSS lets
    it turn three times (an endless animation had the browser draw ~60 frames a second)."""
    from ckptview.widgets.shell.server import LOADER_CSS

    body = get(served.port).body.decode()
    assert re.search(r'<div id="loader"[^>]*>\s*<div class="spinner">', body)  # what it styles
    styles = re.findall(r"<style[^>]*>(.*?)</style>", body, re.DOTALL)
    assert any(LOADER_CSS in css for css in styles)
    assert "animation: spin 1s linear infinite" in body  # pmui's own rule, now bounded


def test_the_page_and_its_resources_are_compressed_when_asked(served):
    gz = {"Accept-Encoding": "gzip"}
    page = get(served.port, headers=gz)
    assert page.getheader("Content-Encoding") == "gzip"
    html = gzip.decompress(page.body)
    nonce = re.search(r"'nonce-([A-Za-z0-9_-]{20,})'", page.getheader("Content-Security-Policy"))[1]
    assert f'nonce="{nonce}"'.encode() in html  # the CSP nonce survives the compression
    scripts = re.findall(rb'<script[^>]* src="(static/[^"?]+)', html)
    assert any(s.endswith(b"bokeh.min.js") for s in scripts)
    for src in scripts[:4]:
        path = "/" + src.decode()
        plain, packed = get(served.port, path), get(served.port, path, headers=gz)
        assert plain.status == packed.status == 200, path
        assert plain.getheader("Content-Encoding") is None  # only to a client that asks
        assert packed.getheader("Content-Encoding") == "gzip", path
        assert gzip.decompress(packed.body) == plain.body, path
        if len(plain.body) > 100_000:
            assert len(packed.body) < len(plain.body) / 2, path
        again = get(served.port, path, headers=gz)  # compressed once, then served as stored
        assert again.body == packed.body and again.getheader("Content-Length") == str(
            len(packed.body)
        ), path
        assert gzip.decompress(again.body) == plain.body, path


def test_the_icon_stylesheet_is_served_without_its_unranged_roboto_faces(served):
    """panel-material-ui's ``material-icons.css`` declares Roboto's subsets with no
    ``unicode-range`` (a browser then fetched all 16 files): served without them, plain and
    compressed, the icon fonts kept; its main stylesheet still declares Roboto, with ranges."""
    gz = {"Accept-Encoding": "gzip"}
    path = "/static/extensions/panel-material-ui/material-icons.css?v=1"
    plain, packed = get(served.port, path), get(served.port, path, headers=gz)
    assert plain.status == packed.status == 200
    assert gzip.decompress(packed.body) == plain.body
    assert int(plain.getheader("Content-Length")) == len(plain.body)
    css = plain.body.decode()
    assert "Roboto" not in css
    assert css.count("@font-face") == 2 and '"Material Icons"' in css
    assert "Material Icons Outlined" in css
    bundle = get(served.port, "/static/extensions/panel-material-ui/panel-material-ui.bundle.css")
    faces = re.findall(r"@font-face\{[^}]*Roboto[^}]*\}", bundle.body.decode())
    assert len(faces) == 18 and all("unicode-range" in f for f in faces)


def test_the_icon_stylesheet_is_edited_once_per_content(monkeypatch):
    """``RobotoRanges`` runs its regex once per content of the file, not on every request
    (a changed file is edited again); other paths pass untouched."""
    from tornado.httputil import HTTPHeaders, HTTPServerRequest

    from ckptview.widgets.shell.server import RobotoRanges

    face = RobotoRanges.FACE
    edits = []

    class Counting:
        def sub(self, repl, text):
            edits.append(text)
            return face.sub(repl, text)

    monkeypatch.setattr(RobotoRanges, "edited", {})
    monkeypatch.setattr(RobotoRanges, "FACE", Counting())
    roboto = b'@font-face { font-family: "Roboto"; src: url(r.woff2); }\n'
    icons = b'@font-face { font-family: "Material Icons"; src: url(i.woff2); }\n'

    def send(body: bytes, path: str = RobotoRanges.PATH) -> bytes:
        request = HTTPServerRequest(method="GET", uri=path + "?v=1")
        headers = HTTPHeaders({"Content-Length": str(len(body))})
        _, headers, out = RobotoRanges(request).transform_first_chunk(200, headers, body, True)
        assert headers["Content-Length"] == str(len(out))
        return out

    assert send(roboto + icons) == icons and send(roboto + icons) == icons
    assert len(edits) == 1
    assert send(roboto + icons + b"/* v2 */") == icons + b"/* v2 */" and len(edits) == 2
    assert send(roboto, path="/static/other.css") == roboto and len(edits) == 2


def test_static_gzip_keeps_each_resource_once(tmp_path):
    """The compressed bytes are kept per URL and Etag (a changed file is compressed again),
    never for an HTML page, and the store stays within its byte budget."""
    import tornado.httpserver
    import tornado.testing
    import tornado.web

    from ckptview.widgets.shell.server import StaticGZip

    (tmp_path / "app.js").write_text("var x = 1;\n" * 5000)

    class Page(tornado.web.RequestHandler):
        def get(self):
            self.write("<html>" + "<p>hi</p>" * 500)

    app = tornado.web.Application([(r"/page", Page)], static_path=str(tmp_path),
                                  transforms=[StaticGZip])  # fmt: skip
    StaticGZip.cache.clear()

    class Client(tornado.testing.AsyncHTTPTestCase):
        def get_app(self):
            return app

        def runTest(self):
            def fetch(url):
                return self.fetch(
                    url, headers={"Accept-Encoding": "gzip"}, decompress_response=False
                )

            first, second = fetch("/static/app.js"), fetch("/static/app.js")
            assert first.headers["Content-Encoding"] == second.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(first.body) == gzip.decompress(second.body) == (
                tmp_path / "app.js").read_bytes()  # fmt: skip
            assert len(StaticGZip.cache) == 1
            (tmp_path / "app.js").write_text("var y = 2;\n" * 6000)  # a new Etag
            third = fetch("/static/app.js")
            assert gzip.decompress(third.body) == (tmp_path / "app.js").read_bytes()
            assert len(StaticGZip.cache) == 2
            page = fetch("/page")
            assert page.headers["Content-Encoding"] == "gzip" and len(StaticGZip.cache) == 2

    result = unittest.TestResult()
    Client().run(result)
    assert not result.errors and not result.failures, result.errors + result.failures


def test_basic_auth_guards_the_page(tree):
    server = Served(tree, "--basic-auth", "s3cret-pw")
    try:
        response = get(server.port)
        assert response.status == 302 and "login" in response.getheader("Location")
        cmdline = " ".join(psutil.Process(server.proc.pid).cmdline())
        assert "--cookie-secret" not in cmdline  # made for this run, passed in the environment
        assert "PANEL_COOKIE_SECRET" in psutil.Process(server.proc.pid).environ()
    finally:
        server.stop()


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    return parser.parse_args(["serve", "/tree", *argv])


def test_sharing_writable_pages_needs_a_password(capsys):
    with pytest.raises(serve_cli.CLIError, match="without --basic-auth"):
        serve_cli.check_sharing(args("--address", "0.0.0.0", "--allow-write"))
    serve_cli.check_sharing(args("--address", "0.0.0.0", "--allow-write", "--basic-auth", "f"))
    serve_cli.check_sharing(args("--address", "0.0.0.0"))
    err = capsys.readouterr().err
    assert "with no password" in err and "--allow-websocket-origin" in err
    serve_cli.check_sharing(args("--allow-write"))  # loopback: this machine only
    assert capsys.readouterr().err == ""


def test_the_command_line_passes_the_options_on():
    cmd = serve_cli.command(args("--basic-auth", "users.json", "--cookie-secret", "c",
                                 "--allow-websocket-origin", "h:1"), Path("app.py"))  # fmt: skip
    assert cmd[1:3] == ["-m", "ckptview.widgets"]
    assert cmd[cmd.index("--address") + 1] == "127.0.0.1"
    for flag, value in (("--basic-auth", "users.json"), ("--cookie-secret", "c"),
                        ("--allow-websocket-origin", "h:1")):  # fmt: skip
        assert cmd[cmd.index(flag) + 1] == value
    assert "--num-procs" not in cmd  # one process unless asked
    cmd = serve_cli.command(args("--num-procs", "4"), Path("app.py"))
    assert cmd[cmd.index("--num-procs") + 1] == "4" and cmd.index("--num-procs") < cmd.index("--args")
    assert serve_cli.login_env(args("--basic-auth", "pw"))["PANEL_COOKIE_SECRET"]
    assert serve_cli.login_env(args("--basic-auth", "pw", "--cookie-secret", "c")) == {}
    assert serve_cli.login_env(args()) == {}


def test_num_procs_serves_from_warm_processes_that_stop_with_their_parent(tree):
    """``--num-procs 2``: two forked processes answer, each catalogued the tree before its
    first page (no page shows the loading progress), and a ``kill`` of the parent stops them."""
    import asyncio

    sys.path.insert(0, str(ROOT / "tests"))
    from bokeh_client import open_document

    server = Served(tree, "--num-procs", "2", warm=True, timeout=240)
    try:
        workers = psutil.Process(server.proc.pid).children()
        assert len(workers) == 2

        async def documents(n: int) -> list[str]:
            docs = []
            for _ in range(n):
                ws, doc = await open_document(f"http://127.0.0.1:{server.port}/{APP}",
                                              timeout=120, content=True)  # fmt: skip
                ws.close()
                docs.append(doc)
            return docs

        for doc in asyncio.run(documents(6)):
            assert "ckptview-serials" in doc and "ckptview-loading" not in doc
    finally:
        server.proc.terminate()  # the parent only, as `kill PID` does
        server.proc.wait(timeout=30)
    gone, alive = psutil.wait_procs(workers, timeout=30)
    for proc in alive:
        proc.kill()
    assert not alive, "a forked server process outlived its parent"


def test_served_pages_skip_bokehs_developer_checks(monkeypatch):
    """Bokeh's checks of callback signatures and of each new document are off when serving,
    unless the environment sets them (``BOKEH_VALIDATE_DOC=true`` keeps the validation)."""
    from bokeh.settings import settings

    from ckptview.widgets.shell.server import DEVELOPER_CHECKS, production_settings

    for env in DEVELOPER_CHECKS.values():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("BOKEH_VALIDATE_DOC", "true")
    try:
        assert production_settings() == ["perform_error_diagnostics"]
        assert settings.perform_error_diagnostics() is False
        assert settings.perform_document_validation() is True
    finally:
        settings.perform_error_diagnostics.unset_value()
    assert settings.perform_error_diagnostics() is True  # Bokeh's default, outside a server
