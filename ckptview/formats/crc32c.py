"""CRC-32C (Castagnoli), as LevelDB tables and TF bundles store it, without a C extension.

Short inputs go byte by byte through a 256-entry table (:func:`crc32c_py`, the reference).
Longer ones use that the CRC register is linear over GF(2): processing byte ``b`` on state
``s`` gives ``Z(s) ^ T[b]``, where ``Z`` advances the state over one zero byte. So the state
after ``n`` bytes is ``Z^n(init) ^ XOR_i Z^(n-1-i)(T[data[i]])``, and numpy folds that sum in
``log2(n)`` passes: adjacent runs of ``2^t`` bytes combine as ``Z^(2^t)(left) ^ right``, each
``Z^(2^t)`` being four 256-entry tables (one per state byte) built once by squaring.
"""

from __future__ import annotations

import numpy as np

POLY = 0x82F63B78  # reflected Castagnoli polynomial
NUMPY_FROM = 512  # inputs at least this long take the numpy path


def _byte_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ POLY if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = _byte_table()
_U32 = np.dtype("<u4")  # states are viewed as their little-endian bytes
_T = np.array(TABLE, dtype=_U32)
#: _POWERS[t]: Z^(2^t) as a (4, 256) table: entry [k, b] is Z^(2^t)(b << 8k)
_POWERS: list[np.ndarray] = []
_POWERS_PY: list[list[list[int]]] = []  # the same tables as lists (for single states)


def crc32c_py(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """The CRC-32C of ``data`` continuing from ``crc``, a byte at a time (the reference)."""
    crc ^= 0xFFFFFFFF
    table = TABLE
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _apply(table: np.ndarray, states: np.ndarray) -> np.ndarray:
    """A linear map given as a (4, 256) table, applied to each state (a contiguous array)."""
    b = states.view(np.uint8).reshape(-1, 4)  # little-endian state bytes
    return table[0][b[:, 0]] ^ table[1][b[:, 1]] ^ table[2][b[:, 2]] ^ table[3][b[:, 3]]


def _power(t: int) -> np.ndarray:
    """Z^(2^t) as a (4, 256) table (made by squaring, kept)."""
    while len(_POWERS) <= t:
        if not _POWERS:
            byte = np.arange(256, dtype=_U32)
            basis = np.stack([byte << (8 * k) for k in range(4)])
            _POWERS.append(_T[basis & 0xFF] ^ (basis >> 8))  # one zero byte
        else:
            last = _POWERS[-1]
            _POWERS.append(_apply(last, last.reshape(-1)).reshape(4, 256))  # Z^2^t twice
        _POWERS_PY.append(_POWERS[-1].tolist())
    return _POWERS[t]


def _apply_py(t: int, state: int) -> int:
    """``Z^(2^t)(state)`` for one state."""
    if len(_POWERS_PY) <= t:
        _power(t)
    a, b, c, d = _POWERS_PY[t]
    return a[state & 0xFF] ^ b[(state >> 8) & 0xFF] ^ c[(state >> 16) & 0xFF] ^ d[state >> 24]


def _word_tables() -> np.ndarray:
    """(8, 256): row k maps byte b to its contribution ``Z^k(T[b])`` from k bytes before
    the end of an 8-byte word."""
    rows = [_T]
    for _ in range(7):
        last = rows[-1]
        rows.append(_T[last & 0xFF] ^ (last >> 8))
    return np.stack(rows)


_WORD = _word_tables()


def _shift(state: int, n: int) -> int:
    """``Z^n(state)``: the state after ``n`` zero bytes."""
    t = 0
    while n:
        if n & 1:
            state = _apply_py(t, state)
        n >>= 1
        t += 1
    return state


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """The CRC-32C of ``data`` continuing from ``crc`` (0 for a fresh one)."""
    n = len(data)
    if n < NUMPY_FROM:
        return crc32c_py(data, crc)
    words = 1 << max((n - 1).bit_length() - 3, 0)  # 8-byte words, a power of two of them
    buf = np.zeros(words * 8, dtype=np.uint8)  # leading zero bytes add nothing from state 0
    buf[words * 8 - n :] = np.frombuffer(data, dtype=np.uint8)
    cols = buf.reshape(-1, 8)
    word = _WORD
    states = word[7][cols[:, 0]]
    for k in range(1, 8):
        states ^= word[7 - k][cols[:, k]]
    t = 3  # each state now stands for 2^3 bytes
    while states.size > 16:
        pairs = states.reshape(-1, 2)
        states = _apply(_power(t), np.ascontiguousarray(pairs[:, 0])) ^ pairs[:, 1]
        t += 1
    rest = states.tolist()  # the last few levels in Python
    while len(rest) > 1:
        rest = [_apply_py(t, a) ^ b for a, b in zip(rest[0::2], rest[1::2])]
        t += 1
    return (rest[0] ^ _shift(crc ^ 0xFFFFFFFF, n)) ^ 0xFFFFFFFF
