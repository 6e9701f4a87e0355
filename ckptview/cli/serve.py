"""``ckptview serve URL...``: the dashboard, i.e. ``panel serve app/ckptview_app.py --args URL...``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ckptview as cv

from . import CLIError

APP_NAME = "ckptview_app"


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve the dashboard for one or more checkpoint trees")
    p.add_argument(
        "urls", nargs="+", metavar="URL", help="checkpoint trees (the only roots served)"
    )
    p.add_argument("--port", type=int, default=5006, help="port (default 5006; 0 picks a free one)")
    p.add_argument("--address", help="address to listen on (default: all interfaces)")
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
        help="catalogue the trees on the first page instead of at startup",
    )
    p.add_argument("--show", action="store_true", help="open the page in a browser")
    p.add_argument(
        "--allow-websocket-origin", action="append", default=[], metavar="HOST[:PORT]",
        help="extra origins allowed to connect (needed when browsing from another host)",
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
    """The ``python -m panel serve`` command line for these arguments."""
    cmd = [sys.executable, "-m", "panel", "serve", str(app), "--port", str(args.port)]
    if args.address:
        cmd += ["--address", args.address]
    for origin in args.allow_websocket_origin:
        cmd += ["--allow-websocket-origin", origin]
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


def run(args) -> int:
    app = app_path()
    for url in args.urls:  # fail fast, with one line, on a tree that cannot be opened
        cv.open(url)
    host = args.address if args.address not in (None, "", "0.0.0.0") else "localhost"
    where = f"http://{host}:{args.port}/{APP_NAME}" if args.port else "a free port (see below)"
    print(f"ckptview: serving {len(args.urls)} tree(s) at {where}  (Ctrl-C stops)", flush=True)
    cmd = command(args, app)
    if os.name == "posix":  # become the server: signals (Ctrl-C, SIGTERM) reach it directly
        os.execv(cmd[0], cmd)
    return subprocess.call(cmd)  # pragma: no cover - Windows
