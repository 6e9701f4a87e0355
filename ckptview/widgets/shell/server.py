"""The dashboard's server: ``panel serve`` plus the headers and checks a shared page needs.

``python -m ckptview.widgets APP [panel serve options] --args URL...`` is what
``ckptview serve`` runs. On top of ``panel serve`` it

- answers only the hosts a browser may open the page from (the loopback names of the port it
  listens on, and each ``--allow-websocket-origin``): a page fetched through another name (DNS
  rebinding, a forgotten proxy) gets ``403``;
- compresses what it sends (gzip, to a browser that accepts it): the page and the ~5 MB of
  JavaScript and CSS it loads travel as a fraction of that (each resource compressed once);
- sends a Content-Security-Policy with every HTML page: a script runs only if it carries the
  page's nonce (fresh per page: the server's own ``<script>`` tags and the module scripts
  es-module-shims creates with it), so HTML that reached the page from a checkpoint cannot run,
  not even the ``<script>`` Panel re-creates from an HTML or Markdown pane; images, connections
  and forms stay on this server; no framing, plugins or ``<base>``; ``nosniff``, ``no-referrer``;
- with a login (``--basic-auth``, an OAuth provider): puts it in front of every route the server
  answers, not only the pages Bokeh guards: static files, component resources, the favicon,
  the websocket (:func:`require_login`; only the login and logout pages stay open);
- imports no module a URL names: Panel's ``/components/<module>/...`` route serves only
  resources of modules already loaded (:func:`ckptview.widgets._panel_fixes.refuse_module_imports`);
- serves panel-material-ui's icon stylesheet without the Roboto faces it declares with no
  ``unicode-range`` (:class:`RobotoRanges`): a fresh page fetches 2 font files, not 16;
- has the browser load the pages' ES modules itself (es-module-shims in polyfill mode:
  :func:`ckptview.widgets._panel_fixes.load_modules_natively`), not through the shim's
  lexer and ``blob:`` copies (~0.16 s of a fresh page's ~1.9 s of renderer CPU here);
- has the page's tables wait for the page to settle a frame at a time
  (:func:`ckptview.widgets._panel_fixes.pace_table_resizes`), not by the 13,000–26,000
  message-channel turns per load that spun the browser's main thread while stylesheets came;
- lets the page's loading spinner turn three times, not until the page is drawn
  (:data:`LOADER_CSS`): under a burst of visitors a page loads for tens of seconds, and the
  spinning ring had the browser draw ~60 frames a second all along;
- turns off Bokeh's developer checks that run on every page (:func:`production_settings`:
  callback signatures checked on each model's ``on_change``, the document validated; a tenth
  of a page's server time) unless their ``BOKEH_*`` variables are set;
- with ``--num-procs N`` and ``--warm``: each of the N processes runs the app once before it
  takes its first page (Panel, on Python < 3.12, warms only the parent before it forks, without
  running the app: each process then catalogued the trees on its first page), and a process
  whose parent went away (the server stopped with ``kill PID``) stops too.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import secrets
import sys
from collections.abc import Iterator
from urllib.parse import urlencode, urlsplit

from bokeh.server.util import check_allowlist
from bokeh.server.views.auth_request_handler import AuthRequestHandler
from panel.command.serve import Serve
from panel.io.server import ComponentResourceHandler
from tornado import httputil
from tornado.process import task_id
from tornado.routing import Matcher, Rule, RuleRouter
from tornado.web import Application, GZipContentEncoding, OutputTransform, RequestHandler
from tornado.websocket import WebSocketHandler

from .. import _panel_fixes

#: the policy of every HTML page; ``{nonce}`` is fresh for each response
CSP = "; ".join([
    "default-src 'self'",
    # only scripts that carry the nonce: the page's own <script> tags, and the ESM bundles
    # Panel's components import() from them (an import inherits the nonce; es-module-shims
    # runs in polyfill mode: load_modules_natively). No 'strict-dynamic': it trusts every <script>
    # page code inserts, and Panel re-creates each <script> of an HTML or Markdown pane. No
    # 'self': a re-created <script src> of this server would run. No inline handler.
    # 'unsafe-eval': Bokeh's template cell formatters and Panel's JSCode are compiled with
    # new Function (no name from a tree ever becomes code: see SerialsTable._field)
    "script-src 'nonce-{nonce}' 'unsafe-eval'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self' blob:",  # es-module-shims' shim mode (Panel's default) reads blob:
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


class RobotoRanges(OutputTransform):
    """panel-material-ui's ``material-icons.css`` without its ``Roboto`` faces.

    It declares Roboto's nine subsets per weight without a ``unicode-range`` (its main
    stylesheet declares the same files with theirs), so a browser took each for the whole
    font and fetched all of them: 16 font files per fresh page where two (Latin, 400 and 700)
    draw it, 14 requests for the server to answer per visitor. Served without them, the
    main stylesheet's faces (with their ranges) stand; the icon fonts are kept. Each content
    of the file is edited once per server process (:attr:`edited`), not on every request."""

    PATH = "/static/extensions/panel-material-ui/material-icons.css"
    FACE = re.compile(rb"@font-face\s*\{[^}]*font-family:\s*\"?Roboto\"?\s*;[^}]*\}\s*")
    #: the file as served -> as sent (one entry per version of the file: a handful at most)
    edited: dict[bytes, bytes] = {}

    def __init__(self, request: httputil.HTTPServerRequest) -> None:
        self._css = request.method == "GET" and request.path.endswith(self.PATH)

    def transform_first_chunk(self, status_code: int, headers: httputil.HTTPHeaders,
                              chunk: bytes, finishing: bool):  # fmt: skip
        whole = finishing or headers.get("Content-Length") == str(len(chunk))
        if self._css and status_code == 200 and chunk and whole:  # the file is 4.6 kB
            edited = self.edited.get(chunk)
            if edited is None:
                edited = self.FACE.sub(b"", chunk)
                if len(self.edited) < 8:
                    self.edited[chunk] = edited
            chunk = edited
            if "Content-Length" in headers:
                headers["Content-Length"] = str(len(chunk))
        return status_code, headers, chunk


class StaticGZip(GZipContentEncoding):
    """gzip, compressing each static resource once per server rather than once per request.

    A page loads ~5 MB of JavaScript and CSS; compressed afresh for every visitor that was a
    third of the server's time per page. A response that carries an ``Etag`` (the static files
    of Bokeh, Panel and their extensions; never an HTML page) is compressed the first time and
    its compressed bytes are reused for the same URL, ``Etag``, modification time and length.
    """

    #: (url, etag, last-modified, length) -> the gzip-compressed body; at most CACHE_BYTES
    cache: dict[tuple[str, ...], bytes] = {}
    CACHE_BYTES = 64 * 2**20

    def __init__(self, request: httputil.HTTPServerRequest) -> None:
        super().__init__(request)
        self._uri = request.uri if request.method == "GET" else None
        self._key: tuple[str, ...] | None = None
        self._parts: list[bytes] | None = None
        self._served = False

    def transform_first_chunk(self, status_code: int, headers: httputil.HTTPHeaders,
                              chunk: bytes, finishing: bool):  # fmt: skip
        etag = headers.get("Etag")
        cacheable = (self._gzipping and self._uri is not None and status_code == 200 and etag
                     and not headers.get("Content-Type", "").startswith("text/html"))  # fmt: skip
        if cacheable:
            self._key = (self._uri, etag, headers.get("Last-Modified", ""),
                         headers.get("Content-Length", ""))  # fmt: skip
            body = self.cache.get(self._key)
            if body is not None:  # the whole compressed body now; the file's chunks dropped
                headers["Vary"] = "Accept-Encoding"
                headers["Content-Encoding"] = "gzip"
                headers["Content-Length"] = str(len(body))
                self._served = True
                self._gzipping = False
                return status_code, headers, body
        status_code, headers, chunk = super().transform_first_chunk(
            status_code, headers, chunk, finishing
        )
        if cacheable and self._gzipping:
            self._parts = [chunk]
            if finishing:
                self._keep()
        return status_code, headers, chunk

    def transform_chunk(self, chunk: bytes, finishing: bool) -> bytes:
        if self._served:
            return b""
        chunk = super().transform_chunk(chunk, finishing)
        if self._parts is not None:
            self._parts.append(chunk)
            if finishing:
                self._keep()
        return chunk

    def _keep(self) -> None:
        body = b"".join(self._parts or [])
        self._parts = None
        if self._key and sum(map(len, self.cache.values())) + len(body) <= self.CACHE_BYTES:
            self.cache[self._key] = body


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


async def _done(result) -> None:
    if inspect.isawaitable(result):
        await result


class ProviderUser(RequestHandler):
    """The auth provider's user, for a handler that does not ask for one (static files,
    component resources, the favicon), as Bokeh's ``AuthRequestHandler`` finds it."""

    def get_current_user(self):
        provider = self.application.auth_provider
        return provider.get_user(self) if provider.get_user is not None else None

    async def prepare(self) -> None:
        await _done(super().prepare())
        provider = self.application.auth_provider
        if provider.get_user_async is not None:
            self.current_user = await provider.get_user_async(self)


class LoginRequired(RequestHandler):
    """Before the route's own handler runs: a visitor with no user is sent to the login page
    (a ``GET`` of a page) or gets ``403`` (anything else: a resource, the websocket)."""

    async def prepare(self) -> None:
        await _done(super().prepare())
        if self._finished or self.current_user:
            return
        page = isinstance(self, AuthRequestHandler) and not isinstance(self, WebSocketHandler)
        if page and self.request.method in ("GET", "HEAD"):
            url = self.get_login_url()  # as tornado.web.authenticated does
            if "?" not in url:
                after = self.request.full_url() if urlsplit(url).scheme else self.request.uri
                url += "?" + urlencode({"next": after})
            self.redirect(url)
            return
        self.set_status(403)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish("403: log in first\n")


_GATED: dict[type, type] = {}


def login_required(handler: type[RequestHandler]) -> type[RequestHandler]:
    """``handler`` behind :class:`LoginRequired` (one subclass per handler class)."""
    if handler not in _GATED:
        bases = (LoginRequired, handler) if issubclass(handler, AuthRequestHandler) else (
            LoginRequired, ProviderUser, handler)  # fmt: skip
        _GATED[handler] = type(f"LoginRequired{handler.__name__}", bases, {})
    return _GATED[handler]


def handler_rules(router: RuleRouter) -> Iterator[Rule]:
    """Every rule of ``router`` and the routers below it that names a handler class."""
    for rule in router.rules:
        if isinstance(rule.target, RuleRouter):
            yield from handler_rules(rule.target)
        elif isinstance(rule.target, type) and issubclass(rule.target, RequestHandler):
            yield rule
        else:
            raise RuntimeError(f"cannot check who may use the route {rule}")


def require_login(app: Application) -> None:
    """With a login configured (Bokeh's auth provider has a user hook), put every route of
    ``app`` but the login and logout pages behind it (:class:`LoginRequired`)."""
    provider = app.auth_provider
    if provider.get_user is None and provider.get_user_async is None:
        return
    open_routes = {handler for _, handler in provider.endpoints}
    for rule in handler_rules(app.default_router):
        if not (rule.target in open_routes or rule.target is RefuseHost
                or issubclass(rule.target, LoginRequired)):  # fmt: skip
            rule.target = login_required(rule.target)


def refuse_module_imports(app: Application) -> None:
    """Make sure the component-resource route imports no module a URL names."""
    _panel_fixes.refuse_module_imports()
    for rule in handler_rules(app.default_router):
        if issubclass(rule.target, ComponentResourceHandler) and not getattr(
            rule.target.parse_url_path, _panel_fixes.LOADED_ONLY, False
        ):
            raise RuntimeError(f"{rule.target} may import modules named by a URL")


def follow_parent(server, period_ms: int = 2000) -> None:
    """Stop this forked process once the process that forked it is gone.

    With ``--num-procs N`` tornado forks N processes and the parent only waits on them: a
    ``kill`` of the parent (what a service manager or a script does) left the N serving,
    holding the port. The loop is stopped directly, not through ``SIGTERM``: Bokeh's handler
    prints before it stops, and a process whose output went to its parent's pipe never got
    past the print. Ctrl-C reaches them all (the terminal signals the whole group)."""
    from tornado.ioloop import PeriodicCallback

    parent = os.getppid()

    def check() -> None:
        if os.getppid() != parent:  # adopted by init: the parent died
            server.io_loop.stop()  # Bokeh's run_until_shutdown then stops the server

    PeriodicCallback(check, period_ms).start()


class HardenedServe(Serve):
    """``panel serve`` whose server checks the Host header, sends :data:`CSP`, puts a login
    in front of every route and imports no module a URL names."""

    #: ``--warm`` with several processes: what to warm in each, once it has been forked
    _warm_each: tuple | None = None

    def warm_applications(self, applications, reuse_sessions, error=True,
                          initialize_session=True, index=None):  # fmt: skip
        if not initialize_session:  # several processes, forked after this: each warms itself
            self._warm_each = (applications, reuse_sessions, error, index)
            return
        super().warm_applications(applications, reuse_sessions, error=error,
                                  initialize_session=initialize_session, index=index)  # fmt: skip

    def customize_server(self, server):
        if self._warm_each is not None:  # in each forked process, before it takes a page
            applications, reuse_sessions, error, index = self._warm_each
            super().warm_applications(applications, reuse_sessions, error=error,
                                      initialize_session=True, index=index)  # fmt: skip
        if task_id() is not None:  # a forked process (--num-procs): ends with its parent
            follow_parent(server)
        app = server._tornado  # the tornado Application (bokeh's BokehTornado)
        refuse_module_imports(app)
        require_login(app)
        hosts = allowed_hosts(app.websocket_origins, server.port)
        app.websocket_origins.update(hosts)  # a page from a loopback name may connect
        refuse = app.default_router.process_rule(Rule(ForeignHost(hosts), RefuseHost))
        app.default_router.rules.insert(0, refuse)  # checked before any page or socket
        app.transforms.insert(0, SecurityHeaders)  # before any compression: sees the HTML
        app.transforms.insert(1, RobotoRanges)  # before compression: sees the CSS
        app.transforms = [t for t in app.transforms if t is not GZipContentEncoding]
        app.transforms.append(StaticGZip)  # compress_response, static files compressed once
        return super().customize_server(server)


#: Bokeh's developer checks, off when serving unless their environment variable is set:
#: ``on_change`` checks each callback's signature (Panel registers one per synced property of
#: every model of every page) and each new page's document is validated (warnings in the log)
DEVELOPER_CHECKS = {"perform_error_diagnostics": "BOKEH_PERFORM_ERROR_DIAGNOSTICS",
                    "perform_document_validation": "BOKEH_VALIDATE_DOC"}  # fmt: skip


#: panel-material-ui's page shows a ring spinning (a CSS animation) until the page is drawn.
#: An animation has the browser composite and draw a frame ~60 times a second: with 20 pages
#: opening at once on 2 cores (each loading for 20-40 s) that was a fifth of the browsers' CPU,
#: the GPU process's twice the one-table page's. Three turns say "loading"; then it rests.
LOADER_CSS = "#loader .spinner { animation-iteration-count: 3; }"


def calm_loader() -> bool:
    """Add :data:`LOADER_CSS` to the CSS of every page (``pn.config.raw_css``); False when it
    is there already."""
    import panel as pn

    if LOADER_CSS in pn.config.raw_css:
        return False
    pn.config.raw_css = [*pn.config.raw_css, LOADER_CSS]
    return True


def production_settings() -> list[str]:
    """Turn off :data:`DEVELOPER_CHECKS` whose variable the environment does not set; the
    settings turned off. ``BOKEH_VALIDATE_DOC=true`` brings the layout warnings back."""
    from bokeh.settings import settings

    off = [name for name, env in DEVELOPER_CHECKS.items() if env not in os.environ]
    for name in off:
        getattr(settings, name).set_value(False)
    return off


def main(argv: list[str] | None = None) -> None:
    """``panel serve`` with :class:`HardenedServe` (same arguments)."""
    production_settings()
    _panel_fixes.load_modules_natively()
    _panel_fixes.pace_table_resizes()
    calm_loader()
    parser = argparse.ArgumentParser(prog="ckptview-server")
    command = HardenedServe(parser=parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if command.invoke(args) is False:
        sys.exit(1)
