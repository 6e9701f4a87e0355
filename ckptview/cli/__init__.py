"""The ``ckptview`` command. Each subcommand is a module here defining ``register(sub)``,
which adds an argparse parser whose ``func(args) -> int`` runs it.

Errors are one line on stderr naming the command (exit 2 for bad usage, 1 for a failure);
messages from the API are worded for the command line (``force=True`` -> ``--force``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import sys


class CLIError(Exception):
    """Bad input: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckptview", description="Browse, compare, restore and retain training checkpoints."
    )
    parser.add_argument("--version", action="version", version=f"ckptview {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "register"):
            module.register(sub)
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
    return parser


def _version() -> str:
    """The installed version (the package's own when run from a source tree)."""
    from ckptview import __version__

    return __version__


def as_flags(message: str, parser: argparse.ArgumentParser | None) -> str:
    """An API message worded for the command line: a keyword argument of the API that is a
    flag of this command (``force=True``, ``pass node=``, ``to=URL``, ``keep_last``) is
    named as the flag (``--force``, ``pass --node``, ``--to URL``, ``--keep-last``)."""
    if parser is None:
        return message
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs:
            continue
        flag, dest = longs[0], re.escape(action.dest)
        message = re.sub(rf"(?<![\w.'\"-]){dest}=True\b", flag, message)
        message = re.sub(rf"(?<![\w.'\"-]){dest}=(?=[A-Z]+\b)", flag + " ", message)
        message = re.sub(rf"(?<![\w.'\"-]){dest}=(?![\w'\"])", flag, message)
        if "_" in action.dest:
            message = re.sub(rf"(?<![\w.'\"-]){dest}\b(?!=)", flag, message)
    return message


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = getattr(args, "command_parser", None)

    def fail(e: BaseException, code: int) -> int:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        line = " ".join(as_flags(str(msg), command).split())  # one line, always
        print(f"ckptview {args.command}: {line}", file=sys.stderr)
        return code

    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the try
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except CLIError as e:
        return fail(e, 2)
    except ImportError as e:  # a missing optional dependency: say what to install
        return fail(e, 1)
    except (FileNotFoundError, ValueError, KeyError, PermissionError, OSError) as e:
        return fail(e, 1)
    except KeyboardInterrupt:
        return 130


def _closed_pipe() -> int:
    """``ckptview … | head``: the reader left. Quiet, as Unix tools are; 141 = 128 + SIGPIPE.
    stdout is pointed at /dev/null so Python's flush at exit does not complain again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (tests capture it)
        pass
    return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
