"""``ckptview serve URL...``: the dashboard, i.e. ``panel serve app/ckptview_app.py --args URL...``
through :mod:`ckptview.widgets.shell.server` (a Host check and a Content-Security-Policy), on
127.0.0.1 unless ``--address`` says otherwise (docs/sharing.md). A directory of several runs
(an experiment) opens on its Runs page."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import ckptview as cv

from . import CLIError

APP_NAME = "ckptview_app"


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help="serve the dashboard for one or more checkpoint trees",
        epilog="Sharing the page with others: see docs/sharing.md (SSH tunnel, --basic-auth, "
               "a TLS reverse proxy).",
    )  # fmt: skip
    p.add_argument(
        "urls", nargs="+", metavar="URL", help="checkpoint trees (the only roots served)"
    )
    p.add_argument("--port", type=int, default=5006, help="port (default 5006; 0 picks a free one)")
    p.add_argument(
        "--address", default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every "
             "interface, see docs/sharing.md)",
    )  # fmt: skip
    p.add_argument("--allow-write", action="store_true", help="enable restore/retention actions")
    p.add_argument(
        "--poll",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="open pages check the trees for new serials this often (default 5; 0: off)",
    )
    p.add_argument(
        "--no-warm",
        dest="warm",
        action="store_false",
        help="start serving at once and catalogue the trees in the background (a page opened "
             "meanwhile shows how far it got, then the tree) instead of before the first page",
    )
    p.add_argument(
        "--num-procs", type=int, default=1, metavar="N",
        help="serve from N processes (panel serve's --num-procs; 0: one per core; default 1): "
             "more visitors at once on a machine with more cores, each process with its own "
             "copy of the catalogs (see docs/sharing.md)",
    )  # fmt: skip
    p.add_argument("--show", action="store_true", help="open the page in a browser")
    p.add_argument(
        "--allow-websocket-origin", action="append", default=[], metavar="HOST[:PORT]",
        help="a host name browsers use to reach the page (this machine's loopback names are "
             "always allowed); needed when browsing from another host or through a proxy",
    )  # fmt: skip
    p.add_argument(
        "--basic-auth", metavar="PASSWORD|FILE",
        help="ask for a password before the page (panel's basic auth): a password, or a JSON "
             "file of {user: password}; prefer the file (a command line is visible to others)",
    )  # fmt: skip
    p.add_argument(
        "--cookie-secret", metavar="SECRET",
        help="signs the login cookie (default with --basic-auth: $PANEL_COOKIE_SECRET, else "
             "a random secret per run, so logins end with the server)",
    )  # fmt: skip
    p.set_defaults(func=run)


def app_path() -> Path:
    """The app script: $CKPTVIEW_APP, else ``app/ckptview_app.py`` of a source checkout, else
    the same script shipped in the package (``ckptview/widgets/ckptview_app.py``)."""
    env = os.environ.get("CKPTVIEW_APP")
    if env:
        path = Path(env)
    else:
        path = Path(__file__).resolve().parents[2] / "app" / f"{APP_NAME}.py"
        if not path.is_file():
            path = Path(__file__).resolve().parents[1] / "widgets" / f"{APP_NAME}.py"
    if not path.is_file():
        raise CLIError(
            f"dashboard app not found at {path}: install ckptview with its UI "
            "(pip install 'ckptview[ui]') or set CKPTVIEW_APP to app/ckptview_app.py"
        )
    return path


def command(args, app: Path) -> list[str]:
    """The server's command line (:mod:`ckptview.widgets.shell.server`: ``panel serve`` with a Host
    check and a Content-Security-Policy) for these arguments."""
    cmd = [sys.executable, "-m", "ckptview.widgets", str(app), "--port", str(args.port),
           "--address", args.address]  # fmt: skip
    for origin in args.allow_websocket_origin:
        cmd += ["--allow-websocket-origin", origin]
    if getattr(args, "basic_auth", None):
        cmd += ["--basic-auth", args.basic_auth]
    if getattr(args, "cookie_secret", None):
        cmd += ["--cookie-secret", args.cookie_secret]
    if getattr(args, "num_procs", 1) != 1:
        cmd += ["--num-procs", str(args.num_procs)]
    if args.show:
        cmd.append("--show")
    if getattr(args, "warm", True):
        cmd.append("--warm")  # catalogue the trees once, before the first page asks
    cmd += ["--args", *args.urls]
    if args.allow_write:
        cmd.append("--allow-write")
    if getattr(args, "poll", None) is not None:
        cmd += ["--poll", str(args.poll)]
    return cmd


def login_env(args) -> dict[str, str]:
    """With ``--basic-auth`` and no cookie secret given: a random one for this run, passed in
    the environment (a command line is visible to every user of the machine)."""
    if args.basic_auth and not args.cookie_secret and not os.environ.get("PANEL_COOKIE_SECRET"):
        return {"PANEL_COOKIE_SECRET": secrets.token_urlsafe(32)}
    return {}


def warn(text: str) -> None:
    print(f"ckptview serve: warning: {text}", file=sys.stderr)


def check_sharing(args) -> None:
    """Refuse a writable page on the network without a password; warn about a read-only one."""
    if args.address in LOOPBACK:
        return
    if args.allow_write and not args.basic_auth:
        raise CLIError(
            f"refusing to serve --allow-write on {args.address} without --basic-auth: anyone "
            "who reaches the port could delete checkpoints (see docs/sharing.md)"
        )
    if not args.basic_auth:
        warn(
            f"listening on {args.address} with no password; anyone who reaches the port "
            "sees the trees (see docs/sharing.md)"
        )
    if not args.allow_websocket_origin:
        warn(
            "browsers on other hosts also need --allow-websocket-origin HOST:PORT "
            "(the name they use to reach this machine)"
        )


def runs_below(url: str) -> int:
    """How many runs an experiment at ``url`` holds (a directory whose runs are below it, as
    ``ckptview ls`` tells: DESIGN.md §3d), 0 for one tree; from one listing, nothing opened."""
    from ckptview.experiment import find_runs
    from ckptview.scan.detect import list_tree

    tree = list_tree(url)
    if tree.single is not None:
        return 0
    found, _ = find_runs(tree)
    return 0 if not found or [f.name for f in found] == ["."] else len(found)


def run(args) -> int:
    app = app_path()
    check_sharing(args)
    runs = []
    for url in args.urls:  # fail fast, with one line, on a tree that cannot be opened
        runs.append(runs_below(url))
        if not runs[-1]:
            cv.open(url)
    what = f"{len(runs)} tree(s)"
    if any(runs):
        what = (f"an experiment of {runs[0]} runs" if len(runs) == 1
                else f"{len(runs)} trees or experiments")  # fmt: skip
    host = "localhost" if args.address in ("", "0.0.0.0", "::") else args.address
    host = f"[{host}]" if ":" in host else host
    where = f"http://{host}:{args.port}/{APP_NAME}" if args.port else "a free port (see below)"
    print(f"ckptview: serving {what} at {where}  (Ctrl-C stops)", flush=True)
    cmd = command(args, app)
    os.environ.update(login_env(args))
    if os.name == "posix":  # become the server: signals (Ctrl-C, SIGTERM) reach it directly
        os.execv(cmd[0], cmd)
    return subprocess.call(cmd)  # pragma: no cover - Windows
