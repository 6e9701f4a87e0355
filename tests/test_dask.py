"""Scale-out: ``executor=`` a Dask ``Client.get_executor()`` on a LocalCluster of process
workers. Header reads (and a diff's chunked reads) run in the workers, on a local tree and on
moto's S3; the results equal a local run, and the workers' I/O counts come back.
"""

from __future__ import annotations

import uuid

import distributed
import pandas as pd
import pytest
from conftest import corpus_path
from s3server import MotoServer, s3fs_client, storage_options, upload

import ckptview as cv

TREE = "paddle/fluid_ckpt"


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(
        processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None,
        host="127.0.0.1",
    )  # fmt: skip
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def facts(cat: cv.Catalog) -> tuple[pd.DataFrame, pd.DataFrame]:
    v = cat.variables.drop(columns=["file"]).sort_values(["serial", "node", "name"])
    return cat.serials.drop(columns=["path", "timestamp"]), v.reset_index(drop=True)


def test_catalog_and_diff_on_process_workers(client):
    local = cv.open(corpus_path(TREE), cache=False)
    executor = client.get_executor()
    cat = cv.open(corpus_path(TREE), cache=False, executor=executor)
    got, want = facts(cat), facts(local)
    pd.testing.assert_frame_equal(got[0], want[0])
    pd.testing.assert_frame_equal(got[1], want[1])
    workers = {w["id"] for w in client.scheduler_info()["workers"].values()}
    assert len(workers) == 2
    # the reads happened in the workers; their counts came back with the results
    assert cat.storage.counters.requests == local.storage.counters.requests > 0
    assert cat.storage.counters.bytes_read == local.storage.counters.bytes_read

    d_local = local.diff(0, 2)
    d_dask = cat.diff(0, 2)
    pd.testing.assert_frame_equal(d_dask, d_local)
    assert (d_dask["status"] == "changed").any()


def test_s3_catalog_on_process_workers(client):
    server = MotoServer()
    try:
        bucket = f"dask-{uuid.uuid4().hex[:10]}"
        url = upload(s3fs_client(server.endpoint), corpus_path(TREE), bucket, "fluid")
        opts = storage_options(server.endpoint)
        local = cv.open(corpus_path(TREE), cache=False)
        cat = cv.open(url, storage_options=opts, cache=False, executor=client.get_executor())
        got, want = facts(cat), facts(local)
        pd.testing.assert_frame_equal(got[0], want[0])
        pd.testing.assert_frame_equal(got[1], want[1])
        # the workers read headers through the batched first reads: never more requests
        # than local disk takes (fewer: a first block fetched for a batch serves the rest)
        assert 0 < cat.storage.counters.requests <= local.storage.counters.requests
    finally:
        server.stop()
