"""Remote trees at the store's speed (DESIGN.md §5): on S3 (moto's server behind the logging
proxy, read with s3fs) a fresh catalog costs about one GET per file, its reads are in flight
together (counted at the proxy, not timed), ``ckptview_max_concurrency`` caps them, a refresh
after a new serial reads only that serial, and a Dask LocalCluster of two worker processes
reads the headers itself and gives the local catalog.
"""

from __future__ import annotations

import collections
import uuid

import pandas as pd
import pytest
from conftest import corpus_path
from s3server import (
    FaultProxy,
    MotoServer,
    s3fs_client,
    set_delay,
    storage_options,
    upload,
    write_sharded_run,
)

import ckptview as cv

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3():
    server = MotoServer()
    proxy = FaultProxy(server.port)
    fs = s3fs_client(server.endpoint)
    bucket = f"conc-{uuid.uuid4().hex[:10]}"
    fs.call_s3("create_bucket", Bucket=bucket)
    try:
        yield {"server": server, "proxy": proxy, "fs": fs, "bucket": bucket}
    finally:
        proxy.stop()
        server.stop()


@pytest.fixture
def proxy(s3):
    s3["proxy"].reset()
    yield s3["proxy"]
    s3["proxy"].reset()


def put(s3, local, name: str) -> str:
    return upload(s3["fs"], local, s3["bucket"], f"{name}-{uuid.uuid4().hex[:6]}")


def open_s3(s3, url: str, **options) -> cv.Catalog:
    opts = {**storage_options(s3["proxy"].endpoint), **options}
    return cv.open(url, storage_options=opts, cache=False)


def object_gets(proxy: FaultProxy, url: str) -> list:
    """GETs of objects under the tree at ``url`` (listings GET the bucket itself)."""
    return proxy.requests("GET", under=url.removeprefix("s3://") + "/")


def facts(cat: cv.Catalog) -> tuple[pd.DataFrame, pd.DataFrame]:
    root = cat.tree.url("").rstrip("/")
    s = cat.serials[["complete", "latest", "epoch", "step", "nbytes", "n_files", "n_variables"]]
    v = cat.variables.drop(columns=["file"]).assign(
        rel=[f[len(root) + 1 :] for f in cat.variables["file"]]
    )
    return s, v.sort_values(["serial", "node", "name"]).reset_index(drop=True)


def assert_same(cat: cv.Catalog, local: cv.Catalog) -> None:
    assert cat.layout == local.layout
    got, want = facts(cat), facts(local)
    pd.testing.assert_frame_equal(got[0], want[0])
    pd.testing.assert_frame_equal(got[1], want[1])


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """12 serials × (8 safetensors shards + index + trainer_state.json): 120 files."""
    root = tmp_path_factory.mktemp("sharded") / "run"
    write_sharded_run(root, serials=12)
    return root


def test_safetensors_tree_costs_one_get_per_file(s3, proxy, sharded):
    url = put(s3, sharded, "st")
    cat = open_s3(s3, url)
    assert_same(cat, cv.open(sharded, cache=False))
    gets = object_gets(proxy, url)
    n_files = sum(1 for p in sharded.rglob("*") if p.is_file())
    per_file = collections.Counter(e.key for e in gets)
    print(f"{len(gets)} GETs for {n_files} files, max {max(per_file.values())} per file")
    assert len(gets) <= 1.2 * n_files
    assert cat.storage.counters.requests == len(gets)


def test_caffe2_tree_costs_at_most_two_gets_per_file(s3, proxy):
    local_root = corpus_path("caffe2/ckpt")
    url = put(s3, local_root, "caffe2")
    cat = open_s3(s3, url)
    assert_same(cat, cv.open(local_root, cache=False))
    gets = object_gets(proxy, url)
    n_files = sum(1 for p in local_root.iterdir() if p.is_file())
    print(f"caffe2: {len(gets)} GETs for {n_files} files")
    assert len(gets) <= 2 * n_files


def test_header_reads_are_in_flight_together(s3, proxy, sharded):
    """With 50 ms per request, the reads of a 120-file tree overlap: many are at the proxy at
    once (a count, not a timing); capped by ``ckptview_max_concurrency``."""
    url = put(s3, sharded, "conc")
    set_delay(proxy, 0.05, ("GET", "HEAD"))
    cat = open_s3(s3, url)
    assert len(cat.variables) == 12 * 8 * 4
    wide = proxy.state.max_inflight
    set_delay(proxy, 0.05, ("GET", "HEAD"))
    capped = open_s3(s3, url, ckptview_max_concurrency=4)
    assert len(capped.variables) == 12 * 8 * 4
    narrow = proxy.state.max_inflight
    print(f"in flight: {wide} by default, {narrow} capped at 4")
    assert wide >= 8
    assert narrow <= 4


def test_refresh_after_a_new_serial_reads_only_its_files(s3, proxy, tmp_path):
    root = tmp_path / "run"
    dirs = write_sharded_run(root, serials=4)
    new = dirs.pop()
    moved = tmp_path / new.name
    new.rename(moved)
    url = put(s3, root, "live")
    cat = open_s3(s3, url)
    assert list(cat.serials.index) == [100, 200, 300]
    s3["fs"].put(f"{moved}/", f"{url.removeprefix('s3://')}/{new.name}", recursive=True)
    proxy.reset()
    before = cat.storage.counters.requests
    cat.refresh()
    assert list(cat.serials.index) == [100, 200, 300, 400] and cat.latest == 400
    assert len(cat.variables) == 4 * 8 * 4
    gets = object_gets(proxy, url)
    keys = {e.key.rsplit("/", 2)[-2] for e in gets}
    n_new = sum(1 for p in moved.iterdir())
    print(f"refresh: {len(gets)} GETs, all in {keys}, for {n_new} new files")
    assert keys == {new.name}
    assert len(gets) <= 1.2 * n_new
    assert cat.storage.counters.requests - before == len(gets)


def test_dask_workers_read_headers_concurrently(s3, proxy, tmp_path):
    """A LocalCluster of two worker processes: the workers read (their requests come back
    counted), the catalog equals the local one, and their reads overlap at the proxy."""
    distributed = pytest.importorskip("distributed")
    root = tmp_path / "big"
    write_sharded_run(root, serials=6, rows=8192)  # 512 KiB shards: headers read by workers
    url = put(s3, root, "dask")
    local = cv.open(root, cache=False)
    cluster = distributed.LocalCluster(
        processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None,
        host="127.0.0.1",
    )  # fmt: skip
    client = distributed.Client(cluster)
    try:
        proxy.reset()
        set_delay(proxy, 0.05, ("GET",))
        cat = cv.open(
            url, storage_options=storage_options(proxy.endpoint), cache=False,
            executor=client.get_executor(),
        )  # fmt: skip
        assert_same(cat, local)
        shards = 6 * 8
        counters = cat.storage.counters
        gets = object_gets(proxy, url)
        print(f"dask: {len(gets)} GETs, {counters.remote_requests} by the workers, "
              f"{proxy.state.max_inflight} in flight")  # fmt: skip
        assert counters.remote_requests >= shards  # each shard's header, read in a worker
        assert counters.requests == len(gets) <= 1.2 * (6 * 10)
        assert proxy.state.max_inflight >= 4
    finally:
        client.close()
        cluster.close()
