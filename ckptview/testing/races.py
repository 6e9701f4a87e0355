"""Processes racing for a tree's lock (``tests/test_lock_race.py``): what each contender runs,
importable so that a ``forkserver`` can preload it, and the count of overlapping holders.

A contender waits on a barrier with the others, then takes the lock ``rounds`` times
(retrying while refused), holding it ``hold`` seconds each time and recording when it entered
and left (``time.monotonic_ns``: one clock for every process of the machine).
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

from ..changes.lock import TreeLock, TreeLockedError

HOLD = 0.003  # seconds a holder keeps the lock


def filesystem(options: dict | None) -> Any:
    """The local filesystem (``options`` None) or a fresh s3fs one with these options."""
    if options is None:
        import fsspec

        return fsspec.filesystem("file")
    import s3fs

    return s3fs.S3FileSystem(**options)


def contend(fs: Any, root: str, rounds: int, backoff: float,
            rng: random.Random) -> tuple[list[tuple[int, int]], list[str]]:  # fmt: skip
    """Take the lock ``rounds`` times; (the held intervals, the crashes: any exception other
    than a refusal)."""
    held: list[tuple[int, int]] = []
    crashes: list[str] = []
    deadline = time.monotonic() + 30
    while len(held) < rounds and time.monotonic() < deadline:
        lock = TreeLock(fs, root, "race")
        try:
            lock.acquire()
        except TreeLockedError:
            time.sleep(rng.uniform(0, backoff))
            continue
        except Exception as e:  # noqa: BLE001 - counted: any other failure is a crash
            crashes.append(repr(e)[:200])
            time.sleep(rng.uniform(0, backoff))
            continue
        start = time.monotonic_ns()
        time.sleep(HOLD)
        held.append((start, time.monotonic_ns()))
        try:
            lock.release()
        except Exception as e:  # noqa: BLE001
            crashes.append(repr(e)[:200])
    return held, crashes


def contender(root: str, options: dict | None, trials: int, rounds: int, barrier: Any,
              results: Any) -> None:  # fmt: skip
    """A long-lived contender: per trial, wait on ``barrier``, contend, put the outcome."""
    fs, rng = filesystem(options), random.Random(os.getpid())
    backoff = 0.003 if options is None else 0.02  # S3: a request takes milliseconds
    for _ in range(trials):
        barrier.wait()
        results.put(contend(fs, root, rounds, backoff, rng))


def killed_holder(root: str, options: dict | None) -> None:
    """Take the lock, then die by SIGKILL while holding it (a stale lock)."""
    TreeLock(filesystem(options), root, "killed").acquire()
    os.kill(os.getpid(), signal.SIGKILL)


def max_holders(intervals: list[tuple[int, int]]) -> int:
    """The most holders at any one moment."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = now = 0
    for _, step in events:  # at equal times a leave (-1) sorts before an enter
        now += step
        most = max(most, now)
    return most
