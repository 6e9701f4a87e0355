"""Values of remote trees at the store's speed (DESIGN.md §5): on S3 (moto's server behind the
logging proxy, read with s3fs) ``verify(deep=True)``, ``stats``, ``diff`` and the read of a
tensor made of many pieces give the local catalog's results, their reads are in flight
together (counted at the proxy while it holds each request 50 ms, not timed), a small file
costs one GET however many variables it holds, ``ckptview_max_concurrency`` caps the reads
and the read budget bounds the bytes in flight.
"""

from __future__ import annotations

import collections
import uuid

import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path
from s3server import FaultProxy, MotoServer, s3fs_client, set_delay, storage_options, upload
from test_deepspeed import torch_zip

import ckptview as cv
from ckptview.io import Storage

pytestmark = pytest.mark.s3

TREES = ["paddle/fluid_ckpt", "modern/hf", "llm/megatron_legacy", "llm/megatron_dist"]
DELAY = 0.05


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = MotoServer()
    proxy = FaultProxy(server.port)
    fs = s3fs_client(server.endpoint)  # uploads go straight to moto, reads through the proxy
    bucket = f"reads-{uuid.uuid4().hex[:10]}"
    local = {rel: corpus_path(rel) for rel in TREES}
    local["damaged"] = damaged_run(tmp_path_factory.mktemp("damaged") / "run")
    urls = {rel: upload(fs, root, bucket, rel) for rel, root in local.items()}
    try:
        yield {"proxy": proxy, "fs": fs, "bucket": bucket, "urls": urls, "local": local}
    finally:
        proxy.stop()
        server.stop()


def damaged_run(root):
    """``step_N.pt`` torch zips of 3 tensors (64 KiB each): one with a flipped byte in a
    tensor (a CRC-32 finding), one holding NaN and inf (a values finding)."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for step in range(1, 9):
        sd = {f"layer{i}.weight": rng.standard_normal(1 << 14).astype(np.float32)
              for i in range(3)}  # fmt: skip
        if step == 5:
            sd["layer1.weight"][:3] = [np.nan, np.inf, -np.inf]
        raw = bytearray(torch_zip(sd))
        if step == 3:
            at = raw.find(sd["layer2.weight"][100:102].tobytes())
            raw[at] ^= 0xFF
        (root / f"step_{step}.pt").write_bytes(bytes(raw))
    return root


@pytest.fixture
def proxy(s3):
    s3["proxy"].reset()
    yield s3["proxy"]
    s3["proxy"].reset()


def both(s3, rel: str, **options) -> tuple[cv.Catalog, cv.Catalog]:
    """The S3 catalog (listed and headers read) and the local one."""
    opts = {**storage_options(s3["proxy"].endpoint), **options}
    cat = cv.open(s3["urls"][rel], storage_options=opts, cache=False)
    cat.variables, cat.serials  # noqa: B018 - the scan, before the reads counted
    return cat, cv.open(s3["local"][rel], cache=False)


class Reads:
    """The object GETs (and any HEAD) at the proxy while a block runs, 50 ms each."""

    def __init__(self, s3) -> None:
        self.proxy: FaultProxy = s3["proxy"]
        self.bucket = s3["bucket"]

    def __enter__(self) -> Reads:
        self.proxy.reset()
        set_delay(self.proxy, DELAY, ("GET", "HEAD"))
        return self

    def __exit__(self, *exc) -> None:
        log = self.proxy.requests(under=f"{self.bucket}/")
        self.gets = [e for e in log if e.method == "GET"]
        self.heads = [e for e in log if e.method == "HEAD"]
        self.per_file = collections.Counter(e.key for e in self.gets)
        self.in_flight = self.proxy.state.max_inflight
        set_delay(self.proxy, 0.0)

    def __str__(self) -> str:
        most = max(self.per_file.values(), default=0)
        return (f"{len(self.gets)} GETs over {len(self.per_file)} files (at most {most} per "
                f"file), {len(self.heads)} HEADs, {self.in_flight} in flight")  # fmt: skip


def relative(df: pd.DataFrame, cat: cv.Catalog) -> pd.DataFrame:
    root = cat.tree.url("").rstrip("/")
    return df.assign(file=[f.removeprefix(root) for f in df["file"]])


@pytest.mark.parametrize("rel", ["paddle/fluid_ckpt", "llm/megatron_dist", "damaged"])
def test_deep_verify_on_s3_equals_local(s3, proxy, rel):
    """Every value and CRC-32 checked; each file comes whole in one GET, many at once."""
    cat, local = both(s3, rel)
    with Reads(s3) as reads:
        got = cat.verify(deep=True)
    want = local.verify(deep=True)
    print(f"{rel}: {len(got)} findings; {reads}")
    pd.testing.assert_frame_equal(relative(got, cat), relative(want, local))
    pd.testing.assert_series_equal(cat.serials["error"], local.serials["error"])
    if rel == "damaged":
        assert sorted(want["check"]) == ["crc32", "values"]
    assert reads.in_flight >= 4
    assert max(reads.per_file.values()) == 1 and not reads.heads
    assert cat.storage.counters.requests >= len(reads.gets)


def test_deep_verify_streams_large_files_with_reads_ahead(s3, proxy, monkeypatch):
    """Files over the whole-file limit stream in chunks: the next chunks are read while one
    is checked, and files are checked several at once; the findings are the same."""
    monkeypatch.setattr("ckptview.io.WHOLE_FILE", 4 << 10)
    monkeypatch.setattr("ckptview.engine.verify.WHOLE_FILE", 4 << 10)
    monkeypatch.setattr("ckptview.engine.verify.CRC_CHUNK", 16 << 10)
    cat, local = both(s3, "damaged")
    with Reads(s3) as reads:
        got = cat.verify(deep=True)
    print(f"streamed: {reads}")
    pd.testing.assert_frame_equal(relative(got, cat), relative(local.verify(deep=True), local))
    assert reads.in_flight >= 4
    # each 64 KiB tensor: 4 chunks for its CRC-32 and 4 for its values; the zip directory,
    # local headers and small members a few more
    assert max(reads.per_file.values()) <= 3 * 8 + 10


def test_deep_verify_in_flight_capped(s3, proxy):
    cat, local = both(s3, "paddle/fluid_ckpt", ckptview_max_concurrency=4)
    with Reads(s3) as reads:
        got = cat.verify(deep=True)
    print(f"capped at 4: {reads}")
    pd.testing.assert_frame_equal(relative(got, cat), relative(local.verify(deep=True), local))
    assert 2 <= reads.in_flight <= 4


@pytest.mark.parametrize("rel", ["paddle/fluid_ckpt", "llm/megatron_legacy", "llm/megatron_dist"])
def test_stats_on_s3_equals_local(s3, proxy, rel):
    """A serial's statistics: small files come whole, one GET each, many at once."""
    cat, local = both(s3, rel)
    serial = int(local.serials.index.max())
    with Reads(s3) as reads:
        got = cat.stats(serial)
    print(f"{rel}: {len(got)} rows; {reads}")
    pd.testing.assert_frame_equal(got, local.stats(serial))
    n_files = int((cat.files["serial"] == serial).sum())
    assert len(reads.gets) <= n_files and not reads.heads
    assert max(reads.per_file.values()) <= 4
    assert reads.in_flight >= 2


@pytest.mark.parametrize("rel", ["paddle/fluid_ckpt", "modern/hf", "llm/megatron_dist"])
def test_diff_on_s3_equals_local(s3, proxy, rel):
    cat, local = both(s3, rel)
    a, b = int(local.serials.index.min()), int(local.serials.index.max())
    with Reads(s3) as reads:
        got = cat.diff(a, b)
    print(f"{rel}: {a} vs {b}, {len(got)} rows; {reads}")
    pd.testing.assert_frame_equal(got, local.diff(a, b))
    assert max(reads.per_file.values()) <= 4 and not reads.heads
    assert reads.in_flight >= 2


def test_diff_across_trees_s3_against_local(s3, proxy):
    """One side on S3, the other on disk: the remote side's reads overlap."""
    cat, local = both(s3, "modern/hf")
    with Reads(s3) as reads:
        got = local.diff(100, 300, other=cat)
    pd.testing.assert_frame_equal(got, local.diff(100, 300))
    assert reads.in_flight >= 2


def test_many_piece_tensors_read_concurrently(s3, proxy):
    """A tensor of 4 tensor-parallel pieces (Megatron) and one of 4 DCP chunks in 4 rank
    files: the pieces are read at once, each once; the values are the local ones."""
    for rel in ("llm/megatron_legacy", "llm/megatron_dist"):
        cat, local = both(s3, rel)
        serial = int(local.serials.index.max())
        shards = local.shards
        counts = shards[shards["serial"] == serial].groupby("name").size()
        if rel == "llm/megatron_dist":  # DCP chunks: one variable, a chunk per rank file
            scan = local._scan
            four = [v.name for r in scan.file_results() if r.serial == serial
                    for v in r.variables if v.locator and len(v.locator) == 4]  # fmt: skip
        else:
            four = list(counts[counts == 4].index)
        assert four, rel
        name = four[0]
        with Reads(s3) as reads:
            got = cat.read(name, serial=serial)
        want = local.read(name, serial=serial)
        print(f"{rel}: {name} {got.shape} from 4 pieces; {reads}")
        assert got.dtype == want.dtype and np.array_equal(got, want)
        assert reads.in_flight >= 2 and not reads.heads
        assert len(reads.gets) <= 4 * 4  # a DCP chunk: its record's header, pickle and bytes
        for name in four[:6]:  # and stats/values of several equal the local ones
            assert np.array_equal(cat.read(name, serial=serial), local.read(name, serial=serial))
        pd.testing.assert_frame_equal(cat.stats(serial, names=four), local.stats(serial, names=four))


def test_read_many_in_order_within_count_and_bytes(s3, proxy):
    """``Storage.read_many``: results in order; in flight at most the concurrency, and at
    most the read budget's bytes (32 ranges of 64 KiB: 4 fit in 256 KiB)."""
    data = np.random.default_rng(1).integers(0, 256, 2 << 20, dtype=np.uint8).tobytes()
    key = f"{s3['bucket']}/blobs/two-mib"
    s3["fs"].pipe(key, data)
    ranges = [(key, at, at + (64 << 10)) for at in range(0, 2 << 20, 64 << 10)]

    def run(options: dict, budget: int | None = None) -> int:
        storage, _ = Storage.from_url(f"s3://{key}", {**storage_options(proxy.endpoint), **options})
        if budget is not None:
            storage.gate.nbytes = budget
        with Reads(s3) as reads:
            got = list(storage.read_many(ranges[::-1]))
        assert got == [data[a:b] for _k, a, b in ranges[::-1]]
        assert len(reads.gets) == len(ranges)
        assert storage.counters.requests == len(ranges)
        return reads.in_flight

    wide, capped, small = run({}), run({"ckptview_max_concurrency": 3}), run({}, 256 << 10)
    print(f"in flight: {wide} by default, {capped} capped at 3, {small} within 256 KiB")
    assert wide >= 8
    assert 2 <= capped <= 3
    assert 2 <= small <= 4
