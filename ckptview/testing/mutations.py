"""Bad copies of a good file: truncations, flipped bytes, garbage of the same name."""

from __future__ import annotations

import random
from collections.abc import Iterator


def truncation_points(
    size: int, every_below: int = 4096, others: int = 48, seed: int = 0
) -> list[int]:
    """Offsets to cut a file at: every one below ``every_below`` (headers live there), then
    ``others`` more spread over the rest, and the last byte."""
    rng = random.Random(seed)
    low = list(range(min(size, every_below)))
    rest = range(every_below, size)
    high = sorted(rng.sample(rest, min(others, len(rest)))) if len(rest) else []
    return sorted({*low, *high, max(size - 1, 0)})


def flipped(data: bytes, n: int = 16, seed: int = 0) -> Iterator[bytes]:
    """``n`` copies with one byte of the first 4 KiB inverted (where headers live)."""
    rng = random.Random(seed)
    head = min(len(data), 4096)
    for _ in range(n if head else 0):
        i = rng.randrange(head)
        yield data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
