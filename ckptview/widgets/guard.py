"""What the dashboard may touch: the roots it was started with, and whether it may write."""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field

from fsspec.core import split_protocol


class AccessRefused(PermissionError):
    """A URL outside the served roots, or a change asked of a read-only dashboard."""


def normalize(url: str | os.PathLike) -> tuple[str, str]:
    """``(protocol, normalized path)``; local paths are made absolute with links resolved."""
    protocol, path = split_protocol(os.fspath(url))
    if protocol in (None, "file", "local"):
        return "file", os.path.realpath(os.path.expanduser(path))
    return protocol, posixpath.normpath("/" + path.lstrip("/"))


@dataclass
class Guard:
    """The served roots and the write switch; every action checks here, server-side."""

    roots: list[str] = field(default_factory=list)
    allow_write: bool = False
    restrict: bool = True

    def inside(self, url: str | os.PathLike) -> bool:
        """True when ``url`` is one of the roots or below one."""
        if not self.restrict:
            return True
        protocol, path = normalize(url)
        for root in self.roots:
            rp, rpath = normalize(root)
            if rp == protocol and (path == rpath or path.startswith(rpath.rstrip("/") + "/")):
                return True
        return False

    def check_url(self, url: str | os.PathLike) -> str:
        """``url`` itself when inside the roots, else :class:`AccessRefused`."""
        if not str(url).strip():
            raise AccessRefused("no URL given")
        if not self.inside(url):
            raise AccessRefused(
                f"refused: {url} is outside the roots this dashboard serves "
                f"({', '.join(self.roots) or 'none'})"
            )
        return os.fspath(url)

    def require_write(self, action: str) -> None:
        """Raise :class:`AccessRefused` unless write access was granted."""
        if not self.allow_write:
            raise AccessRefused(
                f"refused: {action} needs write access (start with `ckptview serve --allow-write`)"
            )
