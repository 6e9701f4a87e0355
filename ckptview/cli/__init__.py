"""The ``ckptview`` command. Each subcommand is a module here defining ``register(sub)``,
which adds an argparse parser whose ``func(args) -> int`` runs it.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


class CLIError(Exception):
    """Bad input: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckptview", description="Browse, compare, restore and retain training checkpoints."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CLIError as e:
        print(f"ckptview {args.command}: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError, KeyError, PermissionError, OSError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"ckptview {args.command}: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
