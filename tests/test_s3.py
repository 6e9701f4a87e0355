"""Trees in S3: moto's real server (a subprocess) behind a logging, fault-injecting proxy, read
with s3fs. The S3 catalog equals the local one; reads are ranged, header-only, bounded per file
and overlap; throttling is retried; access denied lands on its serial; a failed delete part-way
through retention loses nothing it should keep; restore copies a serial within S3.
"""

from __future__ import annotations

import collections
import time
import uuid

import numpy as np
import pandas as pd
import pytest
from conftest import corpus_path
from s3server import FaultProxy, MotoServer, s3fs_client, storage_options, upload

import ckptview as cv
from ckptview.scan.cache import HeaderCache
from ckptview.scan.checks import SMALL_CHECK

pytestmark = pytest.mark.s3

TREES = [
    "paddle/fluid_ckpt",
    "caffe2/ckpt",
    "modern/hf",
    "modern/safetensors/sharded",
    "tf_orbax/tf/run1",
]
MAX_REQUESTS_PER_FILE = 16  # measured: paddle 2, caffe2 4, hf 15 (rng_state.pth), st 2, tf 1
SERIAL_FACTS = ["complete", "latest", "epoch", "step", "nbytes", "n_files", "n_variables", "nodes"]
VAR_FACTS = ["serial", "node", "name", "kind", "dtype", "shape", "numel", "nbytes", "rel", "err"]


@pytest.fixture(scope="module")
def s3():
    server = MotoServer()
    proxy = FaultProxy(server.port)
    fs = s3fs_client(server.endpoint)  # uploads go straight to moto, reads through the proxy
    bucket = f"ckptview-{uuid.uuid4().hex[:12]}"
    urls = {rel: upload(fs, corpus_path(rel), bucket, rel) for rel in TREES}
    try:
        yield {"proxy": proxy, "fs": fs, "bucket": bucket, "urls": urls}
    finally:
        proxy.stop()
        server.stop()


@pytest.fixture
def proxy(s3):
    s3["proxy"].reset()
    yield s3["proxy"]
    s3["proxy"].reset()


def open_s3(s3, url: str, **kwargs) -> cv.Catalog:
    kwargs.setdefault("cache", False)
    return cv.open(url, storage_options=storage_options(s3["proxy"].endpoint), **kwargs)


def facts(cat: cv.Catalog) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Serials and variables with URLs made relative to the tree root (comparable)."""
    root = cat.tree.url("").rstrip("/")
    s = cat.serials[SERIAL_FACTS].copy()
    s["path"] = [_rel(p, root) for p in cat.serials["path"]]
    v = cat.variables.copy()
    v["rel"] = [_rel(f, root) for f in v["file"]]
    v["err"] = v["error"].notna()
    v = v[VAR_FACTS].sort_values(["serial", "node", "name", "rel"]).reset_index(drop=True)
    return s, v


def _rel(url: str, root: str) -> str:
    assert url == root or url.startswith(root + "/"), (url, root)
    return url[len(root) + 1 :]


def object_gets(proxy: FaultProxy, bucket: str) -> list:
    """GETs of objects (listings, which GET the bucket itself, excluded)."""
    return proxy.requests("GET", under=f"{bucket}/")


@pytest.mark.parametrize("rel", TREES)
def test_s3_catalog_equals_local(s3, proxy, rel):
    local = cv.open(corpus_path(rel), cache=False)
    cat = open_s3(s3, s3["urls"][rel])
    assert cat.layout == local.layout
    cat.variables  # noqa: B018 - the listing: headers
    listed = cat.storage.counters.bytes_read
    s_local, v_local = facts(local)
    s_s3, v_s3 = facts(cat)  # the verdicts: small files whose checksums the framework checks
    checked = cat.storage.counters.bytes_read - listed
    pd.testing.assert_frame_equal(s_s3, s_local)
    pd.testing.assert_frame_equal(v_s3, v_local)

    gets = object_gets(proxy, s3["bucket"])
    assert gets and all(e.range for e in gets), "every object read is ranged"
    per_file = collections.Counter(e.key for e in gets)
    n_files = int((cat.files["role"] == "data").sum())
    print(f"{rel}: {len(gets)} GETs for {n_files} data files, max {max(per_file.values())}/file")
    assert max(per_file.values()) <= MAX_REQUESTS_PER_FILE
    assert cat.storage.counters.requests == len(gets)  # our counter agrees with the server
    sizes = s3["fs"].du(s3["urls"][rel], total=False).values()
    assert listed < sum(sizes)  # headers, not tensors (tiny corpus files)
    assert checked <= sum(n for n in sizes if n <= SMALL_CHECK)  # at most once each, whole

    latest = local.latest if local.latest is not None else int(local.serials.index.max())
    rows = v_local[(v_local["serial"] == latest) & ~v_local["err"] & (v_local["dtype"] != "object")]
    for row in rows.head(4).itertuples():
        want = local.read(row.name, serial=latest, node=row.node)
        got = cat.read(row.name, serial=latest, node=row.node)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


def test_s3_reads_overlap(s3, proxy):
    """With 100 ms added to every GET, the GETs are held together: the time at least one is
    held (the latency the scan can wait on) is a fraction of their sum (a count at the proxy,
    not the scan's wall time, which a loaded machine stretches)."""
    proxy.reset()
    delay = 0.1
    proxy.state.delay = delay
    t0 = time.perf_counter()
    cat = open_s3(s3, s3["urls"]["paddle/fluid_ckpt"])
    wall = time.perf_counter() - t0
    assert len(cat.variables) > 100
    gets = len(proxy.requests("GET"))  # listings too: every GET is held
    held, inflight = proxy.held_seconds(), proxy.state.max_inflight
    print(f"{gets} GETs of {delay * 1000:.0f} ms: held {held:.2f} s of {wall:.2f} s "
          f"(one at a time: {gets * delay:.1f} s), {inflight} in flight")  # fmt: skip
    assert inflight >= 4
    assert len(proxy.state.held) == gets
    assert held < gets * delay / 4


def test_s3_throttling_is_retried(s3, proxy):
    key = f"{s3['bucket']}/paddle/fluid_ckpt/checkpoint_1/__model__/fc_0.w_0"
    proxy.fail("GET", key, 503, "SlowDown", times=2)
    cat = open_s3(s3, s3["urls"]["paddle/fluid_ckpt"])
    assert cat.serials["error"].isna().all()
    assert cat.read("fc_0.w_0", serial=1).size > 0
    statuses = [e.status for e in proxy.requests("GET", under=key) if e.key == key]
    assert statuses[:3] == [503, 503, 206], statuses


def test_s3_access_denied_lands_on_its_serial(s3, proxy):
    key = f"{s3['bucket']}/paddle/fluid_ckpt/checkpoint_1/__model__/fc_1.w_0"
    proxy.fail("GET", key, 403, "AccessDenied")
    cache = HeaderCache()
    cat = open_s3(s3, s3["urls"]["paddle/fluid_ckpt"], cache=cache)
    local = cv.open(corpus_path("paddle/fluid_ckpt"), cache=False)
    errors = cat.serials["error"]
    assert errors.notna().tolist() == [s == 1 for s in cat.serials.index]
    assert "fc_1.w_0" in errors[1] and "PermissionError" in errors[1]
    assert cat.latest == local.latest == 2
    v, lv = cat.variables, local.variables
    for s in (0, 2, 3):
        assert len(v[v["serial"] == s]) == len(lv[lv["serial"] == s])
    bad = v[(v["serial"] == 1) & v["error"].notna()]
    assert bad["name"].tolist() == ["fc_1.w_0"]
    # an access error is not cached: once allowed, that file alone is read again
    proxy.reset()
    again = open_s3(s3, s3["urls"]["paddle/fluid_ckpt"], cache=cache)
    assert again.serials["error"].isna().all()
    assert {e.key for e in object_gets(proxy, s3["bucket"])} == {key}


def test_s3_second_open_reads_no_header(s3, proxy):
    cache = HeaderCache()
    first = open_s3(s3, s3["urls"]["modern/hf"], cache=cache)
    want = facts(first)
    assert first.storage.counters.bytes_read > 0
    proxy.reset()
    second = open_s3(s3, s3["urls"]["modern/hf"], cache=cache)
    got = facts(second)
    pd.testing.assert_frame_equal(got[0], want[0])
    pd.testing.assert_frame_equal(got[1], want[1])
    assert second.storage.counters.bytes_read == 0 and second.storage.counters.requests == 0
    assert object_gets(proxy, s3["bucket"]) == []  # only listings reached the server
    assert proxy.requests("GET")  # (the listing is redone)


def test_s3_refresh_reads_only_new_serial(s3, proxy):
    fs, bucket = s3["fs"], s3["bucket"]
    src = corpus_path("modern/hf")
    root = f"{bucket}/live-{uuid.uuid4().hex[:6]}"
    for step in (100, 200):
        fs.put(f"{src}/checkpoint-{step}/", f"{root}/checkpoint-{step}", recursive=True)
    cat = open_s3(s3, f"s3://{root}")
    assert list(cat.serials.index) == [100, 200]
    proxy.reset()
    fs.put(f"{src}/checkpoint-300/", f"{root}/checkpoint-300", recursive=True)
    before = cat.storage.counters.requests
    cat.refresh()
    assert list(cat.serials.index) == [100, 200, 300] and cat.latest == 300
    gets = object_gets(proxy, bucket)
    assert gets and all("/checkpoint-300/" in e.key for e in gets), {e.key for e in gets}
    assert cat.storage.counters.requests - before == len(gets)

    proxy.reset()  # a deleted serial disappears, nothing is read
    fs.rm(f"{root}/checkpoint-100", recursive=True)
    cat.refresh()
    assert list(cat.serials.index) == [200, 300]
    assert object_gets(proxy, bucket) == []

    proxy.reset()  # a changed file (new ETag/size) is read again, alone
    changed = f"{root}/checkpoint-200/scheduler.pt"
    fs.pipe_file(changed, (src / "checkpoint-300" / "scheduler.pt").read_bytes())
    cat.refresh()
    assert len(cat.variables)  # (tables are built lazily)
    assert {e.key for e in object_gets(proxy, bucket)} == {changed}
    assert len(cat.variables[cat.variables["serial"] == 200]) > 0


def test_s3_retention_failure_part_way_and_restore(s3, proxy):
    fs, bucket = s3["fs"], s3["bucket"]
    root = f"{bucket}/ret-{uuid.uuid4().hex[:6]}"
    fs.put(f"{corpus_path('modern/hf')}/", root, recursive=True)
    cat = open_s3(s3, f"s3://{root}")
    before = {k: v["ETag"] for k, v in fs.find(root, detail=True).items()}
    plan = cat.plan_retention(keep_last=1)
    doomed = sorted(int(s) for s in plan.index[plan["action"] == "delete"])
    assert doomed == [100, 200] and cat.latest == 300
    stuck = f"{root}/checkpoint-200/model.safetensors"
    proxy.fail("DELETE", stuck, 403, "AccessDenied")
    with pytest.raises(PermissionError):
        cat.apply_retention(plan)
    fs.invalidate_cache()
    after = {k: v["ETag"] for k, v in fs.find(root, detail=True).items()}
    kept = f"{root}/checkpoint-300/"  # the latest complete serial is untouched
    assert {k: v for k, v in after.items() if k.startswith(kept)} == {
        k: v for k, v in before.items() if k.startswith(kept)
    }
    assert not any(k.startswith(f"{root}/checkpoint-100/") for k in after)
    assert stuck in after and f"{root}/checkpoint-200/trainer_state.json" not in after
    cat.refresh()
    assert cat.latest == 300 and not cat.serials.loc[200, "complete"]  # marker went first

    proxy.reset()  # retry: plan again, the rest of serial 200 goes
    done = cat.apply_retention(cat.plan_retention(keep_last=1)).deleted
    assert list(done.index) == [200] and list(cat.serials.index) == [300]

    target = f"s3://{bucket}/restored-{uuid.uuid4().hex[:6]}"
    cat.restore(300, to=target, storage_options=storage_options(proxy.endpoint))
    copy = open_s3(s3, target)
    assert copy.layout == "hf-trainer" and copy.latest == 300
    facts_a, facts_b = facts(cat), facts(copy)
    pd.testing.assert_frame_equal(facts_a[1], facts_b[1])
    name = facts_a[1][facts_a[1]["dtype"] == "float32"]["name"].iloc[0]
    np.testing.assert_array_equal(copy.read(name), cat.read(name, serial=300))


def test_a_tree_that_cannot_be_checked_shows_the_error_on_that_tree(s3, proxy):
    """The dashboard's poll: a tree whose listing is refused (403 on LIST) keeps its last
    catalog and shows why on its Browse tab; once the listing works again the error goes."""
    from ckptview.widgets import Workspace
    from ckptview.widgets.shell.app import Dashboard

    cat = open_s3(s3, s3["urls"]["modern/hf"])
    serials = list(cat.serials.index)
    dash = Dashboard(Workspace([cat]), poll_seconds=0)
    label = dash.run

    def error_notes() -> list[str]:
        return [p.object for p in dash.browse_area.objects
                if "ckptview-tree-error" in getattr(p, "css_classes", [])]  # fmt: skip

    assert dash.poll() == [] and error_notes() == []
    proxy.fail("GET", s3["bucket"], 403, "AccessDenied")  # every listing of the bucket
    assert dash.poll() == []
    assert list(dash.workspace.failures) == [label]
    assert len(error_notes()) == 1 and "PermissionError" in error_notes()[0]
    assert list(dash.workspace.runs[label].serials.index) == serials  # the last catalog stays
    proxy.reset()
    assert dash.poll() == [] and error_notes() == [] and not dash.workspace.failures


def test_s3_experiment_equals_each_local_run(s3, proxy):
    """The bucket holding the five trees is an experiment: each run as its local catalog,
    runs opened several at once on the pool (a remote store), headers ranged."""
    from s3server import set_delay

    prefix = f"exp-{uuid.uuid4().hex[:8]}"  # its own prefix: other tests add trees beside
    for rel in TREES:
        upload(s3["fs"], corpus_path(rel), s3["bucket"], f"{prefix}/{rel}")
    set_delay(proxy, 0.05, ("GET", "HEAD"))
    exp = cv.open_experiment(f"s3://{s3['bucket']}/{prefix}", cache=False,
                             storage_options=storage_options(proxy.endpoint))  # fmt: skip
    runs = exp.runs
    assert sorted(runs.index) == sorted(TREES)
    assert runs["error"].isna().all()
    for rel in TREES:
        local = cv.open(corpus_path(rel), cache=False)
        row = runs.loc[rel]
        assert row["layout"] == local.layout
        assert row["n_serials"] == len(local.serials)
        assert row["latest"] == local.latest
        assert row["nbytes"] == int(local.serials["nbytes"].sum())
        s_s3, _ = facts(exp[rel])
        s_local, _ = facts(local)
        pd.testing.assert_frame_equal(s_s3, s_local)
    gets = object_gets(proxy, s3["bucket"])
    assert gets and all(e.range for e in gets)
    assert proxy.state.max_inflight > 1  # runs and their headers overlap
