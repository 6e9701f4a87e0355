"""GGUF codec: header and metadata with bounded reads, every listed ggml type dequantized as
gguf-py does. ``data/gguf/every-type.gguf`` and its expected values were written by gguf-py
0.19 in a throw-away environment (gguf-py quantizers; K-quant super-blocks of random bytes
with finite scales, dequantized by gguf-py); the corpus file by the corpus generator."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import corpus_path, ground_truth

import ckptview as cv

DATA = Path(__file__).parent / "data" / "gguf"
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]  # fmt: skip


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(DATA / "every-type.expected.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("ggml", TYPES)
def test_every_type_reads_bit_exact(expected, ggml):
    cat = cv.open(DATA / "every-type.gguf")
    row = cat.variables.set_index("name").loc[f"t.{ggml}"]
    assert row["shape"] == (4, 256)
    plain = ggml in ("F32", "F16", "BF16")
    assert row["quant"] == (None if plain else f"gguf-{ggml}")
    assert row["dtype"] == {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(
        ggml, "float32"
    )
    got = cat.read(f"t.{ggml}")
    np.testing.assert_array_equal(got.astype(np.float32), expected[ggml])
    chunks = np.concatenate(
        [c.astype(np.float32) for c in cat.iter_chunks(f"t.{ggml}", max_bytes=1024)]
    )
    np.testing.assert_array_equal(chunks, expected[ggml].reshape(-1))


def test_stored_blocks_and_metadata(expected):
    cat = cv.open(DATA / "every-type.gguf")
    blocks = cat.read("t.Q4_K", dequantize=False)
    assert blocks.dtype == np.uint8 and blocks.shape == (4, 144)  # one 144-byte super-block a row
    meta = cat.variable("t.F32").attrs["metadata"]
    assert meta["general.architecture"] == "llama" and meta["llama.context_length"] == 64
    tokens = cat.read("tokenizer.ggml.tokens")
    assert tokens.shape == (43,) and list(tokens[-3:]) == ["é", "日本", "<|end|>"]
    assert cat.read("tokenizer.ggml.scores")[:3].tolist() == [0.0, -1.0, -2.0]
    assert cat.variables.set_index("name").loc["tokenizer.ggml.merges", "kind"] == "tokenizer"


def test_the_corpus_file_matches_gguf_py():
    gt = ground_truth("llm/gguf/ground_truth.json")
    cat = cv.open(corpus_path("llm/gguf"))
    for e in gt["logical"]["none"]:
        got = float(cat.read(e["name"]).astype(np.float64).sum())
        assert abs(got - e["sum"]) <= 1e-4 * max(1.0, abs(e["sum"])), e["name"]


def _header(n_tensors: int, kv: bytes, n_kv: int, infos: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kv + infos


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def test_listing_reads_the_head_only(tmp_path):
    """A 64 MiB tensor behind a small header: listing reads one head request, not the data."""
    kv = _string("general.alignment") + struct.pack("<II", 4, 32)
    info = _string("big") + struct.pack("<I", 1) + struct.pack("<Q", 16 << 20)
    info += struct.pack("<IQ", 0, 0)
    head = _header(1, kv, 1, info)
    head += b"\0" * (-len(head) % 32)
    path = tmp_path / "big.gguf"
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + (64 << 20))
    cat = cv.open(path)
    assert cat.variables.set_index("name").loc["big", "shape"] == (16 << 20,)
    assert cat.storage.counters.requests == 1  # the head block holds the whole header
    assert cat.storage.counters.bytes_read == 4096


def test_long_vocabulary_needs_a_second_read(tmp_path):
    """Metadata longer than the first request: parsed after one more, larger read."""
    n = 600_000  # ~ 10 MB of strings, past the 4 MiB first read
    kv = _string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, n)
    kv += b"".join(_string(f"token{i:07d}") for i in range(n))
    head = _header(0, kv, 1)
    with open(tmp_path / "v.gguf", "wb") as f:  # a 1 GiB model file (sparse)
        f.write(head)
        f.truncate(1 << 30)
    cat = cv.open(tmp_path / "v.gguf")
    row = cat.variables.set_index("name").loc["tokenizer.ggml.tokens"]
    assert row["shape"] == (n,)
    assert cat.storage.counters.requests == 2  # the head block, then the rest of the header
    assert cat.storage.counters.bytes_read <= (16 << 20) + 4096
    tokens = cat.read("tokenizer.ggml.tokens")
    assert tokens[0] == "token0000000" and tokens[-1] == f"token{n - 1:07d}"


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"GGUF" + struct.pack("<IQQ", 7, 0, 0), "version 7"),
        (b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 0), "exceeds"),
        (_header(0, _string("k") + struct.pack("<IQ", 8, 1 << 50), 1), "exceeds"),
        (
            _header(0, _string("k") + struct.pack("<IIQ", 9, 8, 3) + struct.pack("<Q", 1 << 40), 1),
            "exceeds",
        ),
        (
            _header(
                0, _string("k") + struct.pack("<IIQ", 9, 8, 30) + struct.pack("<Q", 1 << 40), 1
            ),
            "past the end",
        ),
        (_header(1, b"", 0, _string("t") + struct.pack("<I", 99)), "dims exceed"),
        (_header(0, _string("k") + struct.pack("<I", 77), 1), "unknown metadata value type"),
    ],
)
def test_hostile_headers_are_error_rows(tmp_path, payload, message):
    (tmp_path / "bad.gguf").write_bytes(payload)
    cat = cv.open(tmp_path)
    files = cat.files
    row = files[files["path"].str.endswith("bad.gguf")].iloc[0]
    assert row["error"] is not None and message in row["error"], row["error"]


def test_a_tensor_past_the_end_of_the_file_is_an_error(tmp_path):
    info = _string("w") + struct.pack("<IQ", 1, 32) + struct.pack("<IQ", 0, 0)
    head = _header(1, b"", 0, info)
    head += b"\0" * (-len(head) % 32) + b"\0" * 64  # 64 of the 128 bytes
    (tmp_path / "short.gguf").write_bytes(head)
    row = cv.open(tmp_path / "short.gguf").variables.iloc[0]
    assert "beyond" in row["error"]


def test_unsupported_types_are_listed_with_an_error(tmp_path):
    info = _string("iq") + struct.pack("<IQ", 1, 256) + struct.pack("<IQ", 16, 0)
    head = _header(1, b"", 0, info)
    head += b"\0" * (-len(head) % 32) + b"\0" * 66
    (tmp_path / "iq.gguf").write_bytes(head)
    row = cv.open(tmp_path / "iq.gguf").variables.iloc[0]
    assert row["quant"] == "gguf-IQ2_XXS" and "not supported" in row["error"]
