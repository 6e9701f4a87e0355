"""Health over serials (DESIGN.md §3e): statistics against numpy, the rules, the rollback
point, spectra, and the cache (reopening or growing a run reads only new files)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import ckptview as cv
from ckptview import health as H
from ckptview.engine import sums
from ckptview.engine.stats import CHUNK_BYTES
from ckptview.health import kept as K
from ckptview.health import measure, spectral
from ckptview.health.kept import KEPT
from ckptview.scan.cache import HeaderCache

SHAPES = {"fc1.weight": (48, 24), "fc1.bias": (24,), "fc2.weight": (12, 48), "out.weight": (8, 12)}


def write_run(root: Path, n: int = 8, spike: int | None = None, nan_at: int | None = None,
              frozen_from: int | None = None, still: bool = False, seed: int = 0,
              broken: int | None = None) -> dict[int, dict[str, np.ndarray]]:  # fmt: skip
    """A numbered run ``step_{100 s}.npz``, s = 1..n, of small weights taking small steps;
    ``spike``: fc1.weight blown up x50 at that serial (and back after); ``nan_at``: a NaN in
    fc2.weight from that serial on; ``frozen_from``: out.weight stops changing from that
    serial; ``still``: fc1.bias never changes; ``broken``: that serial's file is truncated.
    Returns what each serial holds (serial 100 s)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
    written = {}
    for s in range(1, n + 1):
        for k in w:
            if (k == "out.weight" and frozen_from is not None and s >= frozen_from) or (
                k == "fc1.bias" and still
            ):
                continue
            if s > 1:
                w[k] = w[k] + np.float32(0.01) * rng.normal(size=w[k].shape).astype(np.float32)
        out = {k: v.copy() for k, v in w.items()}
        if spike is not None and s == spike:
            out["fc1.weight"] = out["fc1.weight"] * np.float32(50)
        if nan_at is not None and s >= nan_at:
            out["fc2.weight"][0, 0] = np.nan
        write_serial(root, 100 * s, out)
        written[100 * s] = out
    if broken is not None:
        path = root / f"step_{broken}.npz"
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        age(path)
    return written


def write_serial(root: Path, serial: int, arrays: dict[str, np.ndarray]) -> Path:
    path = root / f"step_{serial}.npz"
    np.savez(path, **arrays)
    age(path)
    return path


def age(path: Path, seconds: float = 600) -> None:
    """Files written just now are not cached (racy mtimes): make them older."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


# -- statistics --------------------------------------------------------------------------------
def test_stats_equal_numpy(tmp_path):
    written = write_run(tmp_path / "run", n=5, nan_at=4)
    cat = cv.open(tmp_path / "run", cache=False)
    h = cat.health()
    assert len(h) == 5 * len(SHAPES)
    assert list(h.columns[:6]) == ["serial", "node", "name", "kind", "dtype", "shape"]
    for r in h.itertuples():
        x = f64(written[r.serial][r.name])
        fin = x[np.isfinite(x)]
        assert r.l2 == pytest.approx(np.linalg.norm(fin), rel=1e-12)
        assert r.rms == pytest.approx(np.sqrt(np.mean(fin**2)), rel=1e-12)
        assert r.max_abs == pytest.approx(np.abs(fin).max(), rel=1e-12)
        assert r.n_nan == int(np.isnan(x).sum()) and r.n_inf == int(np.isinf(x).sum())
        if r.serial == 100:
            assert math.isnan(r.update_rel) and pd.isna(r.prev_serial)
            continue
        prev = f64(written[r.serial - 100][r.name])
        want = np.linalg.norm(x - prev) / np.linalg.norm(prev)
        assert r.prev_serial == r.serial - 100
        if np.isnan(want):
            assert math.isnan(r.update_rel)
        else:
            assert r.update_rel == pytest.approx(want, rel=1e-9)
    assert (h.query("name == 'fc2.weight' and serial >= 400")["n_nan"] == 1).all()


def test_small_chunks_match(tmp_path):
    """update_rel streams both serials in lockstep, whatever the chunk boundaries."""
    write_run(tmp_path / "run", n=3)
    cat = cv.open(tmp_path / "run", cache=False)
    whole = cat.health()
    scan = cv.open(tmp_path / "run", cache=False)._scan
    small = H.health(scan, chunk_bytes=100)
    cols = ["l2", "rms", "max_abs", "update_rel"]
    np.testing.assert_allclose(small[cols].to_numpy(), whole[cols].to_numpy(), rtol=1e-12)


def test_large_tensors_span_pieces_and_rows(tmp_path):
    """Tensors larger than a widened piece, of lengths that are no multiple of a row, with
    NaN and infinities in some rows, read in chunks that cut rows anywhere: the statistics and
    update_rel equal numpy's."""
    n = 2 * sums.PIECE + 3 * sums.ROW + 17
    rng = np.random.default_rng(7)
    base = rng.normal(size=n).astype(np.float32)
    written = {}
    (tmp_path / "run").mkdir()
    for s in (1, 2, 3):
        big = base + np.float32(0.001 * s) * rng.normal(size=n).astype(np.float32)
        if s == 3:
            big[sums.PIECE + 5] = np.inf  # a later piece's row: the masked path
            big[n - 3] = np.nan  # the short last row
        written[s] = {"big": big, "odd": big[: sums.ROW + 1].astype(np.float64)}
        write_serial(tmp_path / "run", s, written[s])
    scan = cv.open(tmp_path / "run", cache=False)._scan
    for chunk_bytes in (CHUNK_BYTES, 40_000):  # whole rows and pieces; rows cut anywhere
        h = H.health(scan, chunk_bytes=chunk_bytes)
        for r in h.itertuples():
            x = f64(written[r.serial][r.name])
            fin = x[np.isfinite(x)]
            assert r.l2 == pytest.approx(np.linalg.norm(fin), rel=1e-12)
            assert r.max_abs == pytest.approx(np.abs(fin).max(), rel=1e-12)
            assert (r.n_nan, r.n_inf) == (int(np.isnan(x).sum()), int(np.isinf(x).sum()))
            if r.serial == 2:
                prev = f64(written[1][r.name])
                want = np.linalg.norm(x - prev) / np.linalg.norm(prev)
                assert r.update_rel == pytest.approx(want, rel=1e-9)
            elif r.serial == 3 and r.name == "big":
                assert math.isnan(r.update_rel)  # a one-sided NaN: unknown change


def test_row_squares_equal_dots():
    rng = np.random.default_rng(1)
    for n in (0, 1, sums.ROW - 1, sums.ROW, sums.ROW + 1, 3 * sums.ROW + 5):
        v = rng.normal(size=n)
        rows = sums.row_squares(v)
        want = [float(v[i : i + sums.ROW].dot(v[i : i + sums.ROW])) for i in range(0, n, sums.ROW)]
        np.testing.assert_allclose(rows, want, rtol=1e-13)
        assert sums.sum_squares(v) == pytest.approx(float(v.dot(v)), rel=1e-13)


def test_a_tree_without_variables_has_an_empty_table(tmp_path):
    (tmp_path / "run").mkdir()
    write_serial(tmp_path / "run", 1, {})  # a serial holding no arrays
    cat = cv.open(tmp_path / "run", cache=False)
    assert len(cat.serials) == 1 and cat.variables.empty
    h = cat.health()
    assert h.empty and list(h.columns) == H.HEALTH_COLUMNS


def test_filters_and_unknown_names(tmp_path):
    write_run(tmp_path / "run", n=3)
    cat = cv.open(tmp_path / "run", cache=False)
    h = cat.health(serials=[300], names=["fc1.weight"])
    assert list(h["serial"]) == [300] and list(h["name"]) == ["fc1.weight"]
    assert h["prev_serial"].iloc[0] == 200 and h["update_rel"].notna().all()
    with pytest.raises(KeyError, match="nope"):
        cat.health(names=["nope"])
    with pytest.raises(KeyError, match="999"):
        cat.health(serials=[999])


@pytest.mark.parametrize("chunk_bytes", [CHUNK_BYTES, 1000])
def test_each_serial_is_read_once(tmp_path, chunk_bytes):
    """update_rel pairs each serial with its predecessor in the same pass: every file's
    tensor bytes are read at most once (the old lockstep read each serial's twice)."""
    root = tmp_path / "run"
    written = write_run(root, n=4)
    scan = cv.open(root, cache=False)._scan
    assert len(scan.variables)  # headers read
    counters = scan.storage.counters
    counters.reset()
    h = H.health(scan, chunk_bytes=chunk_bytes)
    values = sum(a.nbytes for arrays in written.values() for a in arrays.values())
    headers = 1024 * len(written) * len(SHAPES)  # the .npy and zip headers, at most
    assert h["update_rel"].notna().sum() == 3 * len(SHAPES) and h["error"].isna().all()
    assert values <= counters.bytes_read <= values + headers, (counters.bytes_read, values)


# -- rules and rollback ------------------------------------------------------------------------
def test_healthy_run(tmp_path):
    write_run(tmp_path / "run", n=6, still=True)  # a weight frozen from the start: no finding
    cat = cv.open(tmp_path / "run", cache=False)
    s = cat.health_summary()
    assert (s["status"] == "ok").all() and s["findings"].isna().all()
    assert s.attrs["divergence"] is None
    assert cat.rollback_point == cat.latest == 600


def test_spike(tmp_path):
    write_run(tmp_path / "run", n=8, spike=6)
    cat = cv.open(tmp_path / "run", cache=False)
    s = cat.health_summary()
    assert s.loc[600, "status"] == "spike" and "fc1.weight" in s.loc[600, "findings"]
    assert (s.loc[[100, 200, 300, 400, 500], "status"] == "ok").all()
    assert s.attrs["first"]["update_spike"] == 600 and s.attrs["first"]["l2_jump"] == 600
    assert s.attrs["divergence"] == 600 and cat.rollback_point == 500
    assert s.attrs["top"][0]["name"] == "fc1.weight" and s.attrs["top"][0]["serial"] == 600
    assert "update_spike" in s.loc[600, "onset"]
    # a higher factor than the jump (x50 in l2, ~5000x the median update) finds nothing
    assert cat.health_summary(spike_factor=1e5).attrs["divergence"] is None


def test_nan_onset_and_frozen_layer(tmp_path):
    write_run(tmp_path / "run", n=8, nan_at=5, frozen_from=3)
    cat = cv.open(tmp_path / "run", cache=False)
    s = cat.health_summary()
    assert list(s.loc[[500, 600, 700, 800], "status"]) == ["nonfinite"] * 4
    assert s.attrs["first"]["nonfinite"] == 500
    # frozen: update_rel == 0 at 300 and 400, after it had moved at 200; reported only
    assert list(s.loc[[300, 400], "status"]) == ["frozen", "frozen"]
    assert s.attrs["first"]["frozen"] == 300 and "out.weight" in s.loc[300, "findings"]
    assert s.attrs["divergence"] == 500 and cat.rollback_point == 400
    assert s.loc[500, "n_nonfinite"] == 1


def test_rollback_skips_unloadable(tmp_path):
    write_run(tmp_path / "run", n=6, nan_at=6, broken=500)
    cat = cv.open(tmp_path / "run", cache=False)
    s = cat.health_summary()
    assert s.loc[500, "status"] == "not_loadable" and not s.loc[500, "loadable"]
    assert s.attrs["first"]["not_loadable"] == 500 and s.attrs["divergence"] == 600
    assert cat.rollback_point == 400


def test_loss_spike_moves_rollback(tmp_path):
    write_run(tmp_path / "run", n=6)
    cat = cv.open(tmp_path / "run", cache=False)
    metrics = pd.DataFrame({"serial": [100, 200, 300, 350, 400, 500, 600],
                            "name": ["train/loss"] * 7,
                            "value": [2.0, 1.5, 1.2, 9.0, 1.1, 1.0, 0.9]})  # fmt: skip
    h = cat.health(kinds=["model"])
    s = H.summarize(h, cat.serials, metrics, cat.latest)
    assert s.attrs["first"]["loss_spike"] == 400  # the first serial saved after step 350
    assert s.loc[400, "status"] == "spike" and "train/loss = 9" in s.loc[400, "findings"]
    assert s.attrs["rollback_point"] == 300
    nan_loss = metrics.assign(value=[2.0, 1.5, 1.2, 1.1, 1.0, float("nan"), 0.9])
    assert H.summarize(h, cat.serials, nan_loss, cat.latest).attrs["rollback_point"] == 400


# -- spectra -----------------------------------------------------------------------------------
def independent_alpha(w: np.ndarray) -> float:
    """WeightWatcher's fit, written out plainly: eigenvalues of WᵀW, each as xmin in turn,
    the continuous MLE and the KS distance, the smallest distance wins."""
    evals = np.linalg.eigvalsh(f64(w).T @ f64(w))
    evals = np.sort(evals[evals > 1e-10 * evals.max()])[-min(w.shape) :]
    best_d, best_alpha = math.inf, math.nan
    n = len(evals)
    for i in range(n - 1):
        tail = evals[i:]
        alpha = 1 + len(tail) / sum(math.log(x / evals[i]) for x in tail)
        d = max(abs(1 - (x / evals[i]) ** (1 - alpha) - j / len(tail)) for j, x in enumerate(tail))
        if d < best_d:
            best_d, best_alpha = d, alpha
    return best_alpha


def test_spectral_matches_svd_and_fit(tmp_path):
    written = write_run(tmp_path / "run", n=2)
    cat = cv.open(tmp_path / "run", cache=False)
    h = cat.health(spectral=True)
    for r in h.itertuples():
        w = written[r.serial][r.name]
        if w.ndim != 2:
            assert math.isnan(r.sigma_max) and math.isnan(r.alpha)
            continue
        assert r.sigma_max == pytest.approx(np.linalg.svd(f64(w), compute_uv=False)[0], rel=1e-9)
        if min(w.shape) < spectral.MIN_EVALS:  # out.weight: 8 eigenvalues, too few to fit
            assert math.isnan(r.alpha), r.name
        else:
            assert r.alpha == pytest.approx(independent_alpha(w), rel=1e-6), r.name
    assert h.query("name == 'fc1.weight'")["alpha"].notna().all()


def test_alpha_recovers_a_power_law():
    rng = np.random.default_rng(1)
    evals = (1 - rng.random(4000)) ** (-1 / (3.0 - 1))  # Pareto, alpha = 3, xmin = 1
    alpha, xmin, d = spectral.fit_alpha(evals)
    assert alpha == pytest.approx(3.0, abs=0.15) and d < 0.05


def test_spectral_cap_is_a_note(tmp_path):
    write_run(tmp_path / "run", n=1)
    scan = cv.open(tmp_path / "run", cache=False)._scan
    h = H.health(scan, spectral=True, spectral_max_numel=1000)
    big = h[h["name"] == "fc1.weight"].iloc[0]  # 48 x 24 = 1152 values
    assert math.isnan(big["sigma_max"]) and "skipped" in big["note"]
    assert np.isfinite(h[h["name"] == "out.weight"]["sigma_max"]).all()


# -- the cache ---------------------------------------------------------------------------------
def test_reopen_reads_no_values_and_growth_reads_new_files(tmp_path):
    root = tmp_path / "run"
    written = write_run(root, n=4)
    cache_dir = tmp_path / "cache"
    first = cv.open(root, cache=HeaderCache(cache_dir))
    h1 = first.health(spectral=True)
    assert first.storage.counters.bytes_read > sum(f.stat().st_size for f in root.iterdir()) / 2

    again = cv.open(root, cache=HeaderCache(cache_dir))  # a fresh process's view: disk only
    assert len(again.variables) and len(again.serials)
    before = again.storage.counters.bytes_read
    h2 = again.health(spectral=True)
    assert again.storage.counters.bytes_read == before  # no tensor byte read
    pd.testing.assert_frame_equal(h1, h2)

    last = written[400]
    grown = {k: v + np.float32(0.01) for k, v in last.items()}
    new_file = write_serial(root, 500, grown)
    KEPT.clear()  # a fresh process: no values kept in memory either
    third = cv.open(root, cache=HeaderCache(cache_dir))
    assert 500 in third.serials.index
    before = third.storage.counters.bytes_read
    h3 = third.health(spectral=True)
    read = third.storage.counters.bytes_read - before
    # the new serial's values, and its predecessor's for update_rel: no other file
    assert 0 < read <= new_file.stat().st_size + (root / "step_400.npz").stat().st_size
    values = sum(v.nbytes for v in grown.values())
    assert read >= 2 * values
    row = h3.query("serial == 500 and name == 'fc1.weight'").iloc[0]
    want = np.linalg.norm(f64(grown["fc1.weight"]) - f64(last["fc1.weight"])) / np.linalg.norm(
        f64(last["fc1.weight"])
    )
    assert row["update_rel"] == pytest.approx(want, rel=1e-9)
    pd.testing.assert_frame_equal(h3[h3["serial"] < 500].reset_index(drop=True), h1)


def test_a_process_that_exits_right_after_health_leaves_its_results_on_disk(tmp_path):
    """Health results are written to the disk cache in the background: a process exiting as
    soon as ``health()`` returns (``ckptview health``) still leaves every one of them."""
    import subprocess
    import sys

    root = tmp_path / "run"
    write_run(root, n=3)
    cache_dir = tmp_path / "cache"
    code = ("import sys, ckptview as cv; from ckptview.scan.cache import HeaderCache; "
            "cv.open(sys.argv[1], cache=HeaderCache(sys.argv[2])).health()")  # fmt: skip
    subprocess.run([sys.executable, "-c", code, str(root), str(cache_dir)], check=True)
    again = cv.open(root, cache=HeaderCache(cache_dir))
    again.variables  # noqa: B018 - headers
    before = again.storage.counters.bytes_read
    h = again.health()
    assert again.storage.counters.bytes_read == before  # every value came from the disk cache
    assert h["l2"].notna().all() and h["update_rel"].notna().sum() == 2 * len(SHAPES)


def _update(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(f64(b) - f64(a)) / np.linalg.norm(f64(a)))


def test_live_run_reads_only_the_new_serial(tmp_path):
    """A live run (refresh, then health): the newest serial's values were kept in memory by
    the last call, so the serial that lands is read alone, and update_rel is still exact."""
    root = tmp_path / "run"
    written = write_run(root, n=3)
    cat = cv.open(root, cache=HeaderCache(tmp_path / "cache"))
    h1 = cat.health()
    assert KEPT.nbytes >= sum(v.nbytes for v in written[300].values())
    grown = {k: v + np.float32(0.02) for k, v in written[300].items()}
    new_file = write_serial(root, 400, grown)
    cat.refresh()
    assert 400 in cat.variables["serial"].values  # headers read (the new file's), not counted
    before = cat.storage.counters.bytes_read
    h2 = cat.health()
    read = cat.storage.counters.bytes_read - before
    values = sum(v.nbytes for v in grown.values())
    assert read == values < new_file.stat().st_size  # the new serial's values, nothing else
    for name in SHAPES:
        row = h2.query("serial == 400 and name == @name").iloc[0]
        assert row["update_rel"] == pytest.approx(_update(written[300][name], grown[name]), rel=1e-9)
    pd.testing.assert_frame_equal(h2[h2["serial"] < 400].reset_index(drop=True), h1)


@pytest.mark.parametrize("live", [True, False], ids=["live", "reopened"])
def test_a_cached_predecessor_is_not_summed_again(tmp_path, monkeypatch, live):
    """A new serial's update_rel takes its predecessor's Σx² from the cached statistics when
    they cover every value (no NaN/inf): the predecessor's values are read (or kept) for the
    difference only, not measured again. update_rel equals numpy's over pieces and rows, and
    the full computation's (from an empty cache) when the new side holds a NaN or the
    predecessor an infinity (its Σx² then not taken from the cache)."""
    n = 2 * sums.PIECE + 3 * sums.ROW + 17
    rng = np.random.default_rng(3)
    root = tmp_path / "run"
    root.mkdir()
    old = {k: rng.normal(size=n).astype(np.float32) for k in ("clean", "nan", "inf")}
    old["inf"][sums.PIECE + 9] = np.inf
    write_serial(root, 1, old)
    cat = cv.open(root, cache=HeaderCache(tmp_path / "cache"))
    cat.health()
    new = {k: v + np.float32(0.003) * rng.normal(size=n).astype(np.float32) for k, v in old.items()}
    new["nan"][sums.PIECE + 3 * sums.ROW + 1] = np.nan  # a row of a later piece
    new["inf"][sums.PIECE + 9] = np.inf
    write_serial(root, 2, new)
    measured: list[int] = []  # entries whose statistics are formed
    real = measure.NormAccumulator.__init__

    def spy(self):
        measured.append(1)
        real(self)

    monkeypatch.setattr(measure.NormAccumulator, "__init__", spy)
    if live:
        cat.refresh()
    else:
        KEPT.clear()
        cat = cv.open(root, cache=HeaderCache(tmp_path / "cache"))
    h = cat.health().set_index(["serial", "name"])
    # serial 2 of each variable, and serial 1 of "inf" only (its cached l2 leaves the inf out)
    assert len(measured) == 4
    assert h.loc[(2, "clean"), "update_rel"] == pytest.approx(_update(old["clean"], new["clean"]),
                                                              rel=1e-9)  # fmt: skip
    assert math.isnan(h.loc[(2, "nan"), "update_rel"])  # a one-sided NaN: unknown change
    full = cv.open(root, cache=False).health().set_index(["serial", "name"])
    for name in old:
        assert h.loc[(2, name), "update_rel"] == pytest.approx(
            full.loc[(2, name), "update_rel"], rel=1e-12, nan_ok=True)  # fmt: skip


def test_kept_values_recut_to_other_chunks(tmp_path):
    """Values kept in one call's pieces serve a call that streams other chunk sizes."""
    root = tmp_path / "run"
    written = write_run(root, n=2)
    cat = cv.open(root, cache=False)
    H.health(cat._scan, chunk_bytes=1000)  # kept in pieces of 250 values (and the last)
    grown = {k: v * np.float32(1.01) for k, v in written[200].items()}
    write_serial(root, 300, grown)
    cat.refresh()
    assert 300 in cat.variables["serial"].values
    before = cat.storage.counters.bytes_read
    h = H.health(cat._scan, chunk_bytes=1 << 12)
    assert cat.storage.counters.bytes_read - before == sum(v.nbytes for v in grown.values())
    for name in SHAPES:
        row = h.query("serial == 300 and name == @name").iloc[0]
        assert row["update_rel"] == pytest.approx(_update(written[200][name], grown[name]), rel=1e-9)


def test_kept_values_off_or_stale_are_not_used(tmp_path, monkeypatch):
    root = tmp_path / "run"
    written = write_run(root, n=2)
    cat = cv.open(root, cache=HeaderCache(tmp_path / "cache"))
    cat.health()
    # the kept serial 200 is rewritten (another identity): its new values are read
    rng = np.random.default_rng(9)
    changed = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
    write_serial(root, 200, changed)
    age(root / "step_200.npz", 300)
    nxt = {k: v + np.float32(0.01) for k, v in changed.items()}
    write_serial(root, 300, nxt)
    cat.refresh()
    h = cat.health()
    row = h.query("serial == 300 and name == 'fc1.weight'").iloc[0]
    assert row["update_rel"] == pytest.approx(_update(changed["fc1.weight"], nxt["fc1.weight"]), rel=1e-9)
    assert written[200]["fc1.weight"][0, 0] != changed["fc1.weight"][0, 0]
    # KEEP_BYTES = 0: nothing kept, the predecessor is read again
    monkeypatch.setattr(K, "KEEP_BYTES", 0)
    KEPT.clear()
    last = write_serial(root, 400, {k: v + np.float32(0.01) for k, v in nxt.items()})
    cat.refresh()
    assert 400 in cat.variables["serial"].values
    before = cat.storage.counters.bytes_read
    cat.health()
    assert KEPT.nbytes == 0
    read = cat.storage.counters.bytes_read - before
    assert read == 2 * sum(v.nbytes for v in nxt.values())  # the new serial and serial 300
    assert read <= last.stat().st_size + (root / "step_300.npz").stat().st_size


def test_kept_store_is_bounded():
    store = K.KeptValues(budget=1000)
    a, b = [np.zeros(100, np.float32)], [np.zeros(100, np.float32)]  # 400 bytes each
    c = [np.zeros(60, np.float32), np.zeros(40, np.float32)]  # 400 bytes in two pieces
    assert store.put("x", "x1", a) and store.put("y", "y1", b)
    assert store.put("x", "x2", c)  # x's older entry goes first
    assert store.get("x1") is None and store.get("x2") is c and store.nbytes == 800
    assert store.put("z", "z1", [np.zeros(100, np.float32)])  # over budget: y (least recent) goes
    assert store.get("y1") is None and store.nbytes == 800
    assert not store.put("w", "w1", [np.zeros(1000, np.float32)])  # larger than the budget
    assert not any(v.flags.writeable for v in c)
    store.release("x")
    assert store.get("x2") is None and store.nbytes == 400


def test_changed_file_is_measured_again(tmp_path):
    root = tmp_path / "run"
    write_run(root, n=3)
    cache = HeaderCache(tmp_path / "cache")
    cv.open(root, cache=cache).health()
    rng = np.random.default_rng(5)
    changed = {k: rng.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
    write_serial(root, 200, changed)
    age(root / "step_200.npz", 300)  # another mtime than before
    h = cv.open(root, cache=cache).health()
    row = h.query("serial == 200 and name == 'fc1.weight'").iloc[0]
    assert row["l2"] == pytest.approx(np.linalg.norm(f64(changed["fc1.weight"])), rel=1e-12)


def test_large_first_updates_that_decay_are_not_a_spike(tmp_path):
    """Training's first updates are the largest: a decaying start is healthy, and a later jump
    above every earlier update is still a spike."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    steps = [4.0, 0.3, 0.25, 0.2, 0.2, 0.2]  # relative size of each update
    write_serial(tmp_path, 0, {"w": w})
    for s, size in enumerate(steps, start=1):
        d = rng.standard_normal(w.shape).astype(np.float32)
        w = w + d * np.float32(size * np.linalg.norm(w) / np.linalg.norm(d))
        write_serial(tmp_path, s, {"w": w})
    cat = cv.open(tmp_path, cache=False)
    summary = cat.health_summary()
    assert (summary["status"] == "ok").all(), summary[["status", "findings"]]
    assert cat.rollback_point == cat.latest
    d = rng.standard_normal(w.shape).astype(np.float32)
    write_serial(tmp_path, len(steps) + 1, {"w": w + d * np.float32(8 * np.linalg.norm(w) /
                                                                    np.linalg.norm(d))})
    cat = cv.open(tmp_path, cache=False)
    assert cat.health_summary().loc[len(steps) + 1, "status"] == "spike"
    assert cat.rollback_point == len(steps)


def test_a_variable_over_the_budget_is_never_collected(tmp_path, monkeypatch):
    """Only variables that fit the kept-values budget are held as they stream (a larger one
    is not held up to the budget and dropped: that would cost its memory for nothing)."""
    root = tmp_path / "run"
    write_run(root, n=2)
    monkeypatch.setattr(K, "KEEP_BYTES", 24 * 4)  # fc1.bias (24 float32) and nothing larger
    KEPT.clear()
    collected = []
    real = measure._Lane._collect

    def spy(self, x):
        collected.append(x.size)
        return real(self, x)

    monkeypatch.setattr(measure._Lane, "_collect", spy)
    cv.open(root, cache=False).health()
    assert sum(collected) == 24  # fc1.bias of the newest serial only
    assert KEPT.nbytes == 24 * 4
    KEPT.clear()
