"""The dashboard's server: ``panel serve`` plus the headers and checks a shared page needs.

``python -m ckptview.widgets APP [panel serve options] --args URL...`` is what
``ckptview serve`` runs. On top of ``panel serve`` it

- answers only the hosts a browser may open the page from (the loopback names of the port it
  listens on, and each ``--allow-websocket-origin``): a page fetched through another name (DNS
  rebinding, a forgotten proxy) gets ``403``;
- compresses what it sends (gzip, to a browser that accepts it): the page and the ~5 MB of
  JavaScript and CSS it loads travel as a fraction of that;
- sends a Content-Security-Policy with every HTML page: scripts run only when the server wrote
  them (a fresh nonce per page, trust passed on to the scripts they load), so HTML that reached
  the page from a checkpoint cannot run; images, connections and forms stay on this server; no
  framing, plugins or ``<base>``; and ``nosniff``, ``no-referrer``.
"""

from __future__ import annotations

import argparse
import re
import secrets
import sys

from bokeh.server.util import check_allowlist
from panel.command.serve import Serve
from tornado import httputil
from tornado.routing import Matcher, Rule
from tornado.web import GZipContentEncoding, OutputTransform, RequestHandler

#: the policy of every HTML page; ``{nonce}`` is fresh for each response
CSP = "; ".join([
    "default-src 'self'",
    # the server's own scripts (nonce) and what they load; no inline handler, no injected
    # <script>. 'unsafe-eval': Bokeh's template cell formatters and Panel's JSCode are compiled
    # with new Function (no name from a tree ever becomes code: see SerialsTable._field)
    "script-src 'nonce-{nonce}' 'strict-dynamic' 'unsafe-eval' 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self' blob:",  # es-module-shims reads the page's modules from blob: URLs
    "worker-src 'self' blob:",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])  # fmt: skip
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY"}  # fmt: skip
_SCRIPT_TAG = re.compile(rb"<script(?=[\s>])", re.IGNORECASE)
LOOPBACK = ("localhost", "127.0.0.1", "[::1]")


class SecurityHeaders(OutputTransform):
    """Every response: ``HEADERS``; an HTML page: the CSP, its nonce on each ``<script>``."""

    def __init__(self, request: httputil.HTTPServerRequest) -> None:
        self.nonce: bytes | None = None

    def _tag(self, chunk: bytes) -> bytes:
        if not self.nonce:
            return chunk
        return _SCRIPT_TAG.sub(b'<script nonce="' + self.nonce + b'"', chunk)

    def transform_first_chunk(self, status_code: int, headers: httputil.HTTPHeaders,
                              chunk: bytes, finishing: bool):  # fmt: skip
        for name, value in HEADERS.items():
            headers.setdefault(name, value)
        if headers.get("Content-Type", "").startswith("text/html"):
            self.nonce = secrets.token_urlsafe(18).encode()
            headers["Content-Security-Policy"] = CSP.format(nonce=self.nonce.decode())
            chunk = self._tag(chunk)
            if "Content-Length" in headers:
                headers["Content-Length"] = str(len(chunk))
        return status_code, headers, chunk

    def transform_chunk(self, chunk: bytes, finishing: bool) -> bytes:
        return self._tag(chunk)


class ForeignHost(Matcher):
    """Matches the requests whose ``Host`` is not one this server answers."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed

    def match(self, request: httputil.HTTPServerRequest) -> dict | None:
        return None if check_allowlist(request.host.lower(), list(self.allowed)) else {}


class RefuseHost(RequestHandler):
    """``403`` for a page asked for through a name this server was not told to answer."""

    def prepare(self) -> None:
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"403: this server does not answer the host {self.request.host!r}; "
                    "start it with --allow-websocket-origin HOST:PORT to allow it\n")  # fmt: skip


def allowed_hosts(origins: set[str], port: int) -> set[str]:
    """The ``--allow-websocket-origin`` entries and the loopback names of ``port``."""
    return {o.lower() for o in origins} | {f"{name}:{port}" for name in LOOPBACK}


class HardenedServe(Serve):
    """``panel serve`` whose server checks the Host header and sends :data:`CSP`."""

    def customize_server(self, server):
        app = server._tornado  # the tornado Application (bokeh's BokehTornado)
        hosts = allowed_hosts(app.websocket_origins, server.port)
        app.websocket_origins.update(hosts)  # a page from a loopback name may connect
        refuse = app.default_router.process_rule(Rule(ForeignHost(hosts), RefuseHost))
        app.default_router.rules.insert(0, refuse)  # checked before any page or socket
        app.transforms.insert(0, SecurityHeaders)  # before any compression: sees the HTML
        if GZipContentEncoding not in app.transforms:  # tornado's compress_response=True
            app.settings["compress_response"] = True
            app.transforms.append(GZipContentEncoding)
        return super().customize_server(server)


def main(argv: list[str] | None = None) -> None:
    """``panel serve`` with :class:`HardenedServe` (same arguments)."""
    parser = argparse.ArgumentParser(prog="ckptview-server")
    command = HardenedServe(parser=parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if command.invoke(args) is False:
        sys.exit(1)
