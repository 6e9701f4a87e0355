"""The fast paths of TF bundle listing against the general decoders they stand in for: the
numpy crc32c, the block walk that returns spans, BundleEntryProto and object-graph decoding.

Every TF ``.index`` of the corpus and of ../shared/wild is decoded both ways, as is each
with bytes flipped and cut: where the fast path answers, the general one must agree."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from conftest import CORPUS, WILD

from ckptview.codecs import tf as tfc
from ckptview.formats import protobuf as pb
from ckptview.formats import sstable, tf_bundle
from ckptview.formats.crc32c import NUMPY_FROM, crc32c, crc32c_py
from ckptview.io import Storage


def _indexes() -> list[Path]:
    found = sorted(p for root in (CORPUS, WILD) for p in root.rglob("*.index") if p.is_file())
    bundles = [p for p in found if p.read_bytes()[:2] == b"\0\0" or _snappy_table(p)]
    assert len(bundles) >= 12, bundles  # 6 corpus bundles, 8 from the wild (not vacuous)
    return bundles


def _snappy_table(path: Path) -> bool:  # TF Serving's indexes: a compressed first block
    data = path.read_bytes()
    return len(data) >= 48 and int.from_bytes(data[-8:], "little") == sstable.TABLE_MAGIC


INDEXES = _indexes()


# -- crc32c -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0),
        (b"123456789", 0xE3069283),  # the CRC catalogue's check value for CRC-32C
        (bytes(32), 0x8A9136AA),  # RFC 3720 (iSCSI) B.4: 32 bytes of zeros
        (b"\xff" * 32, 0x62A8AB43),  # 32 bytes of ones
        (bytes(range(32)), 0x46DD794E),  # incrementing
        (bytes(range(31, -1, -1)), 0x113FDB5C),  # decrementing
    ],
)
def test_crc32c_known_vectors(data, expected):
    assert crc32c_py(data) == expected
    assert crc32c(data) == expected
    # the numpy path: the same bytes after a run of them computed on their own, chained
    long = os.urandom(5000)
    assert crc32c(long + data) == crc32c(data, crc32c(long)) == crc32c_py(long + data)


@pytest.mark.parametrize(
    "n", [NUMPY_FROM - 1, NUMPY_FROM, NUMPY_FROM + 1, 1000, 4095, 4096, 4097, 70001, 1 << 18]
)
def test_crc32c_numpy_path_matches_the_byte_table(n):
    rng = random.Random(n)
    data = rng.randbytes(n)
    for start in (0, 0xFFFFFFFF, 0x12345678):
        assert crc32c(data, start) == crc32c_py(data, start)
    assert crc32c(bytearray(data)) == crc32c(memoryview(data)) == crc32c_py(data)


def test_crc32c_of_real_blocks():
    """Every block trailer of every index checks out (the tables TF wrote, as TF checks them)."""
    storage, _ = Storage.from_url("/")
    for path in INDEXES:
        table = sstable.TableFile(storage.blob(str(path)))
        table.verify = True
        assert sum(len(spans) for _block, spans in table.blocks()) > 0


# -- the block walk -------------------------------------------------------------------------------
def _outcome(fn):
    try:
        return "ok", fn()
    except (ValueError, IndexError) as e:
        return type(e).__name__, str(e)


def _walk_lazy(block: bytes):
    budget = [1 << 30]
    out = [(k, bytes(v)) for k, v in sstable.block_entries(block, budget)]
    return out, budget[0]


def _walk_spans(block: bytes):
    budget = [1 << 30]
    out = [(k, block[a:b]) for k, a, b in sstable.block_spans(block, budget)]
    return out, budget[0]


def _blocks(path: Path) -> list[bytes]:
    storage, _ = Storage.from_url("/")
    return [block for block, _spans in sstable.TableFile(storage.blob(str(path))).blocks()]


def _mutations(data: bytes, seed: int, count: int = 40) -> list[bytes]:
    rng = random.Random(seed)
    out = [data[:cut] for cut in range(0, len(data), max(1, len(data) // 15))]
    for _ in range(count):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b))
            b[i] = rng.choice([0, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        out.append(bytes(b))
    return out


@pytest.mark.parametrize(
    "path", INDEXES, ids=lambda p: p.name if p.is_relative_to(CORPUS) else str(p.relative_to(WILD))
)
def test_block_spans_walk_like_block_entries(path):
    for i, block in enumerate(_blocks(path)):
        assert _walk_spans(block) == _walk_lazy(block)
        for j, bad in enumerate(_mutations(block, seed=i)):
            lazy, spans = (
                _outcome(lambda b=bad: _walk_lazy(b)),
                _outcome(lambda b=bad: _walk_spans(b)),
            )
            assert spans == lazy, (i, j)


def test_block_spans_budgets():
    # a key may not outgrow its block, nor the keys the file's budget
    entry = pb.encode_varint(0) + pb.encode_varint(3) + pb.encode_varint(0) + b"abc"
    block = entry * 4 + bytes(4) + (1).to_bytes(4, "little")
    assert [k for k, _a, _b in sstable.block_spans(block)] == [b"abc"] * 4
    with pytest.raises(sstable.FormatError, match="more than the file"):
        sstable.block_spans(block, [10])
    with pytest.raises(sstable.FormatError, match="runs past"):
        sstable.block_spans(pb.encode_varint(5) + entry[1:] + bytes(4) + (1).to_bytes(4, "little"))


# -- BundleEntryProto --------------------------------------------------------------------------------
def _decoded(value: bytes):
    try:
        e = tf_bundle.decode_entry(value)
    except (pb.DecodeError, sstable.FormatError) as err:
        return err
    return e


def _check_entry(value: bytes) -> bool:
    """plain_entry agrees with decode_entry (or declines); True when it answered."""
    plain = tf_bundle.plain_entry(value, 0, len(value), {})
    if plain is None:
        return False
    full = _decoded(value)
    assert not isinstance(full, Exception), (value, full)
    assert not full.slices
    assert plain == (full.dtype, full.shape, full.shard_id, full.offset, full.size, full.crc32c)
    return True


@pytest.mark.parametrize(
    "path", INDEXES, ids=lambda p: p.name if p.is_relative_to(CORPUS) else str(p.relative_to(WILD))
)
def test_plain_entry_matches_decode_entry(path):
    answered = 0
    for block in _blocks(path):
        for key, a, b in sstable.block_spans(block):
            if not key:
                continue
            value = block[a:b]
            if key[0] != 0:
                answered += _check_entry(value)
            for bad in _mutations(value, seed=a, count=10):
                _check_entry(bad)
    assert answered > 0  # not vacuous: TF's own entries take the fast path


def test_plain_entry_declines_what_it_does_not_know():
    shape = b"\x12\x04\x08\x02\x08\x03"  # a dim with two sizes: the last wins in decode_entry
    value = b"\x08\x01\x12" + bytes([len(shape)]) + shape + b"\x28\x18"
    assert tf_bundle.plain_entry(value, 0, len(value), {}) is None
    assert tf_bundle.decode_entry(value).shape == (3,)
    named = b"\x12\x05\x08\x02\x12\x01x"  # a named dim
    value = b"\x08\x01\x12" + bytes([len(named)]) + named
    assert tf_bundle.plain_entry(value, 0, len(value), {}) is None
    unknown = b"\x12\x0b\x08" + pb.encode_varint(-1)  # size -1: decode_entry raises
    value = b"\x08\x01\x12" + bytes([len(unknown)]) + unknown
    assert tf_bundle.plain_entry(value, 0, len(value), {}) is None
    with pytest.raises(sstable.FormatError):
        tf_bundle.decode_entry(value)
    # an entry inside a longer buffer: the fields end where the entry does
    value = b"\x08\x01\x20\x05\x28\x08"
    assert tf_bundle.plain_entry(value + b"\x35", 0, len(value), {}) == (1, (), 0, 5, 8, None)
    assert tf_bundle.plain_entry(value + b"\x80", 0, len(value) + 1, {}) is None
    negative = b"\x20" + pb.encode_varint(-3)
    assert tf_bundle.plain_entry(negative, 0, len(negative), {})[3] == -3


# -- the object graph ---------------------------------------------------------------------------------
def _graphs() -> list[bytes]:
    storage, _ = Storage.from_url("/")
    out = []
    for path in INDEXES:
        try:
            variables = tfc.TFBundleCodec().list_variables(storage.blob(str(path)), {})
        except (ValueError, OSError):
            continue
        for v in variables:
            if v.name == tf_bundle.OBJECT_GRAPH_KEY and not v.error:
                out.append(bytes(tf_bundle.read_strings(storage, v.locator.span, ()).item()))
    assert len(out) >= 10
    return out


def test_object_graph_fast_matches_general():
    named = 0
    for i, graph in enumerate(_graphs()):
        fast = tf_bundle._object_graph_fast(graph)
        assert fast == tf_bundle.object_graph_names_general(graph)
        named += len(fast)
        assert tf_bundle.object_graph_names(graph) == fast
        for bad in _mutations(graph, seed=i, count=60):
            try:
                got = tf_bundle._object_graph_fast(bad)
            except (ValueError, IndexError):
                continue  # declined: the general decoder decides
            assert got == tf_bundle.object_graph_names_general(bad)
    assert named > 100  # not vacuous: the real graphs name their variables


# -- torch: tensor_var's views (its 1-D shortcut and the general contiguity test) -------------
@pytest.mark.parametrize(
    ("size", "stride", "offset", "expect"),
    [
        ((6,), (1,), 0, ("C", 0)),  # the common case
        ((1,), (7,), 2, ("C", 8)),  # one element: any stride
        ((3,), (2,), 0, "strided"),
        ((0,), (5,), 0, "strided"),  # empty: no bounds check; stride 5 is not C order
        ((2, 3), (3, 1), 0, ("C", 0)),
        ((3, 2), (1, 3), 0, ("F", 0)),  # a transposed view
        ((2, 2), (4, 1), 0, "strided"),  # every other row... fits 8 of 12 elements
        ((1, 4), (9, 1), 4, ("C", 16)),
        ((4,), (1,), 9, "beyond"),  # reaches element 12 of 12
        ((2, 3), (3, 1), 7, "beyond"),
        ((3,), (-1,), 2, "invalid"),
        ((2,), (1, 1), 0, "invalid"),
    ],
)
def test_tensor_var_views(size, stride, offset, expect):
    from ckptview.formats.pickle import StorageRef, TensorRef
    from ckptview.formats.pickle_vars import tensor_var
    from ckptview.formats.torch_pickle import ZipRecord

    storage = StorageRef("0", "float32", 12)
    var = tensor_var(
        "t", TensorRef(storage, offset, size, stride, "float32"), ZipRecord(64, 48), "f"
    )
    n = 1
    for d in size:
        n *= d
    assert var.nbytes == 4 * n
    if expect == "strided":
        assert var.span is None and not var.error
        assert var.locator == ("strided", 64, offset, size, stride, False)
    elif expect == "beyond":
        assert "beyond storage" in var.error
    elif expect == "invalid":
        assert "invalid stride" in var.error
    else:
        order, at = expect
        assert not var.error and var.locator is None
        assert (var.span.order, var.span.offset, var.span.length) == (order, 64 + at, 4 * n)


# -- columns (issue 13): per-row kinds, aliases, shard paths and attrs --------------------------
def _listed(path: Path, hints: dict, general: bool, monkeypatch) -> list:
    storage, _ = Storage.from_url(str(path.parent))
    with monkeypatch.context() as m:
        if general:
            m.setattr(tfc._Context, "columns", lambda self, entries: None)
        try:
            got = tfc.TFBundleCodec().list_variables(storage.blob(str(path)), hints)
        except Exception as e:  # noqa: BLE001 - both paths must fail alike
            return [type(e).__name__, str(e)]
    return got


@pytest.mark.parametrize("path", INDEXES, ids=lambda p: str(p.relative_to(p.parents[2])))
@pytest.mark.parametrize("graph", [False, True])
def test_columns_give_the_records_of_the_general_path(path, graph, monkeypatch):
    hints = {"object_graph": graph}
    cols = _listed(path, hints, False, monkeypatch)
    want = _listed(path, hints, True, monkeypatch)
    if isinstance(cols, tfc.VarColumns):
        assert cols.materialized is None
        assert list(cols) == want
    else:
        assert cols == want


def test_columns_are_taken_for_plain_bundles(monkeypatch):
    taken = [p for p in INDEXES
             if isinstance(_listed(p, {"object_graph": True}, False, monkeypatch), tfc.VarColumns)]  # fmt: skip
    assert len(taken) >= 6, taken  # not vacuous: most bundles are plain


@pytest.mark.parametrize("seed", range(6))
def test_columns_on_damaged_indexes_agree(seed, tmp_path, monkeypatch):
    """Flipped and cut copies of each index (the data shards linked beside them): the columns,
    where taken, hold the records the general path gives; otherwise both give the same."""
    rng = random.Random(seed)
    for path in INDEXES:
        data = bytearray(path.read_bytes())
        if seed % 2:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(3):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        where = tmp_path / f"{path.parent.name}-{seed}-{INDEXES.index(path)}"
        where.mkdir()
        for shard in path.parent.glob(path.name[: -len(".index")] + ".data-*"):
            os.symlink(shard, where / shard.name)
        copy = where / path.name
        copy.write_bytes(bytes(data))
        cols = _listed(copy, {"object_graph": True}, False, monkeypatch)
        want = _listed(copy, {"object_graph": True}, True, monkeypatch)
        assert (list(cols) if isinstance(cols, tfc.VarColumns) else cols) == want


def test_catalog_tables_from_tf_columns_match_records():
    """Every TF tree of the corpus and the wild: the variables and shards tables built from the columns
    equal those built from the records (kinds, aliases, sizes, shards)."""
    import pandas as pd

    import ckptview as cv
    from ckptview.scan.tables import shards_table, variables_table

    roots = sorted({p.parent for p in INDEXES})
    checked = 0
    for root in roots:
        try:
            cat = cv.open(str(root), cache=False)
        except cv.UnknownTreeError:
            continue
        v, sh = cat.variables, cat.shards
        logical = cat._scan.logical()
        cols = [r for r in logical.results if isinstance(r.variables, tfc.VarColumns)]
        if not cols:
            continue
        assert all(r.variables.materialized is None for r in cols)  # the tables made none
        for r in cols:
            r.variables.records()
        pd.testing.assert_frame_equal(v, variables_table(cat.tree, logical.results))
        pd.testing.assert_frame_equal(sh, shards_table(cat.tree, logical))
        checked += 1
    assert checked >= 3, roots
