"""What the dashboard may touch: the roots it was started with, and whether it may write.

A URL typed into the page is checked for what fsspec will really open, not by its text: no
``::`` chains, no relative paths, only storage options known to be safe for the URL's
filesystem, and then the filesystem and path fsspec resolves must be those of a root (or below
one), resolved the same way. A filesystem of another kind is never even created (creating
one can already fetch or write: ``reference`` reads its ``fo``, caches make directories).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field

from fsspec.core import split_protocol, url_to_fs
from fsspec.registry import get_filesystem_class


class AccessRefused(PermissionError):
    """A URL outside the served roots, or a change asked of a read-only dashboard."""


#: storage options a page may pass, per filesystem protocol: credentials and flags, never a
#: place (``endpoint_url``, ``client_kwargs``), a cache directory or another filesystem
#: (``protocol``, ``target_protocol``, ``fo``); every other protocol takes none
SAFE_OPTIONS: dict[str, frozenset[str]] = {
    "s3": frozenset({"anon", "key", "secret", "token", "requester_pays"}),
    "gcs": frozenset({"project", "requester_pays"}),
}
OPTION_TYPES = (str, bool, int, float, type(None))


def _safe_options(cls: type) -> frozenset[str]:
    protocols = cls.protocol if isinstance(cls.protocol, tuple) else (cls.protocol,)
    return frozenset().union(*(SAFE_OPTIONS.get(p, frozenset()) for p in protocols))


def _is_local(cls: type) -> bool:
    protocols = cls.protocol if isinstance(cls.protocol, tuple) else (cls.protocol,)
    return "file" in protocols or "local" in protocols


def location(fs, path: str) -> tuple[type, str]:
    """``(filesystem class, normalized path)``: local paths absolute with links resolved."""
    if _is_local(type(fs)):
        return type(fs), os.path.realpath(path)
    return type(fs), posixpath.normpath("/" + path.lstrip("/"))


def resolve(url: str | os.PathLike, storage_options: dict | None = None) -> tuple[type, str]:
    """Where fsspec opens ``url``: :func:`location` of ``url_to_fs(url, **options)``."""
    return location(*url_to_fs(os.fspath(url), **(storage_options or {})))


@dataclass
class Guard:
    """The served roots and the write switch; every action checks here, server-side.

    ``restrict=False`` (a notebook: its user is the operator) opens anything as given.
    """

    roots: list[str] = field(default_factory=list)
    allow_write: bool = False
    restrict: bool = True

    def __post_init__(self) -> None:
        self._resolved: list[tuple[type, str]] | None = None

    def resolved_roots(self) -> list[tuple[type, str]]:
        """The roots as fsspec opens them (resolved once, relative to the server's directory)."""
        if self._resolved is None:
            self._resolved = [resolve(r) for r in self.roots]
        return self._resolved

    def _refuse(self, url, why: str = "") -> AccessRefused:
        return AccessRefused(
            f"refused: {url} {why or 'is outside the roots this dashboard serves'} "
            f"({', '.join(map(str, self.roots)) or 'none'})"
        )

    def contains(self, cls: type, path: str) -> bool:
        """True when ``(cls, path)`` (see :func:`location`) is a root or below one."""
        return any(
            cls is root_cls and (path == root or path.startswith(root.rstrip("/") + "/"))
            for root_cls, root in self.resolved_roots()
        )

    def inside(self, url: str | os.PathLike, storage_options: dict | None = None) -> bool:
        """True when ``url`` passes :meth:`check_url`."""
        try:
            self.check_url(url, storage_options)
        except AccessRefused:
            return False
        return True

    def check_options(self, cls: type, storage_options: dict | None) -> dict:
        """``storage_options`` when each key is safe for ``cls`` and each value a scalar."""
        options = dict(storage_options or {})
        allowed = _safe_options(cls)
        for key, value in options.items():
            if key not in allowed or not isinstance(value, OPTION_TYPES):
                raise AccessRefused(
                    f"refused: storage option {key!r} is not accepted from the page "
                    f"(allowed here: {', '.join(sorted(allowed)) or 'none'})"
                )
        return options

    def check_url(self, url: str | os.PathLike, storage_options: dict | None = None) -> str:
        """``url`` when what fsspec opens for it (with ``storage_options``) is inside the
        roots, else :class:`AccessRefused`."""
        text = os.fspath(url).strip()
        if not text:
            raise AccessRefused("no URL given")
        if not self.restrict:
            return os.fspath(url)
        if "::" in text:
            raise self._refuse(text, "is a chained URL (::), which the dashboard does not open")
        protocol, path = split_protocol(text)
        try:
            cls = get_filesystem_class(protocol or "file")
        except (ValueError, ImportError):
            raise self._refuse(text, f"names an unknown filesystem {protocol!r}") from None
        if not any(cls is root_cls for root_cls, _ in self.resolved_roots()):
            raise self._refuse(text)
        options = self.check_options(cls, storage_options)
        if _is_local(cls) and not path.startswith("/"):
            raise self._refuse(text, "is not an absolute path")
        fs, opened = url_to_fs(text, **options)
        if not self.contains(*location(fs, opened)):
            raise self._refuse(text)
        return text

    def check_catalog(self, catalog) -> None:
        """:class:`AccessRefused` unless the catalog's tree (as opened) is inside the roots."""
        tree = catalog.tree
        if self.restrict and not self.contains(*location(tree.storage.fs,
                                                         tree.abs(tree.single or ""))):  # fmt: skip
            raise self._refuse(catalog.url)

    def require_write(self, action: str) -> None:
        """Raise :class:`AccessRefused` unless write access was granted."""
        if not self.allow_write:
            raise AccessRefused(
                f"refused: {action} needs write access (start with `ckptview serve --allow-write`)"
            )
