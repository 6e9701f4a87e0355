"""Failure injection for change operations: a filesystem whose k-th mutating call fails."""

from __future__ import annotations

from typing import Any


class InjectedFault(OSError):
    """The failure :class:`FaultyFS` raises."""


class FaultyFS:
    """Wraps an fsspec filesystem; mutating call number ``fail_at`` (1-based) fails, and with
    ``crash`` every later one too (the process is gone: nothing can be cleaned up). A failing
    write leaves half its bytes behind. ``calls`` counts the mutating calls made."""

    MUTATING = ("mv", "rm_file", "rmdir", "makedirs", "mkdir", "rm", "pipe_file", "cp_file", "link")

    def __init__(self, fs: Any, fail_at: int | None = None, crash: bool = True):
        self._fs = fs
        self.fail_at = fail_at
        self.crash = crash
        self.calls = 0
        self.failed: list[str] = []

    def _should_fail(self, what: str) -> bool:
        self.calls += 1
        hit = self.fail_at is not None and (
            self.calls == self.fail_at or (self.crash and self.calls > self.fail_at)
        )
        if hit:
            self.failed.append(what)
        return hit

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name not in self.MUTATING:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._should_fail(f"{name} {args[0] if args else ''}"):
                raise InjectedFault(f"injected failure in {name}{args}")
            return attr(*args, **kwargs)

        return call

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            return self._fs.open(path, mode, **kwargs)
        if self._should_fail(f"open {path}"):
            return _HalfFile(self._fs.open(path, mode, **kwargs))
        return self._fs.open(path, mode, **kwargs)


class _HalfFile:
    def __init__(self, f: Any):
        self._f = f

    def write(self, data: bytes) -> int:
        self._f.write(data[: len(data) // 2])
        self._f.close()
        raise InjectedFault("injected failure while writing")

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> _HalfFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()
