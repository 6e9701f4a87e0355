"""Remote trees at real latency (DESIGN.md §5): moto's S3 server on loopback behind a proxy that
holds every request D ms, a Trainer-shaped tree (N/10 serials × 8 safetensors shards + index +
trainer_state.json), and in the same run the s3fs concurrent floor: ``find`` then every file's
first 64 KiB with ``cat_ranges`` (64 connections). Prints wall time, requests per file and
ckptview / floor.

``--deep``: also ``verify(deep=True)`` of the catalog (opened and listed before the timed
region) against its floor in the same run: every data file (the safetensors shards) fetched
whole with ``cat_ranges`` on 64 connections (listed, and its connections opened by a first
pass over the files, before the timed region too).

usage: .venv/bin/python benchmarks/bench_remote.py [--files 250,2000] [--delays 0,50,100,200]
                                                   [--repeat 1] [--deep]
(default: a quick run, 250 files at 0 and 100 ms; the full table: --files 250,2000,10000
--delays 0,50,100,200)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from s3server import (  # noqa: E402
    FaultProxy,
    MotoServer,
    s3fs_client,
    set_delay,
    storage_options,
    upload,
    write_sharded_run,
)

import ckptview as cv  # noqa: E402

FLOOR_BLOCK = 64 << 10
FLOOR_CONNECTIONS = 64


def floor(url: str, opts: dict) -> int:
    """What a script does: list the tree, fetch every file's first 64 KiB concurrently."""
    import s3fs

    fs = s3fs.S3FileSystem(**opts, config_kwargs={"max_pool_connections": FLOOR_CONNECTIONS})
    found = fs.find(url, detail=True)
    paths = [p for p, inf in found.items() if inf["type"] == "file"]
    got = fs.cat_ranges(paths, [0] * len(paths),
                        [min(FLOOR_BLOCK, found[p]["size"]) for p in paths],
                        batch_size=FLOOR_CONNECTIONS)  # fmt: skip
    assert all(isinstance(g, bytes) for g in got)
    return len(paths)


def data_files(url: str, opts: dict) -> tuple[list[str], list[int]]:
    """The tree's safetensors shards and their sizes (what a deep check reads whole)."""
    import s3fs

    found = s3fs.S3FileSystem(**opts).find(url, detail=True)
    paths = sorted(p for p, inf in found.items() if p.endswith(".safetensors"))
    return paths, [int(found[p]["size"]) for p in paths]


def floor_fs(opts: dict):
    import s3fs

    return s3fs.S3FileSystem(**opts, config_kwargs={"max_pool_connections": FLOOR_CONNECTIONS})


def floor_deep(fs, paths: list[str], sizes: list[int]) -> int:
    """What a script checking every byte does: every data file fetched whole, concurrently
    (on a filesystem whose connections are open, as the catalog's are)."""
    got = fs.cat_ranges(paths, [0] * len(paths), sizes, batch_size=FLOOR_CONNECTIONS)
    assert all(isinstance(g, bytes) and len(g) == n for g, n in zip(got, sizes))
    return len(paths)


def deep_verify(cat: cv.Catalog) -> int:
    found = cat.verify(deep=True)
    assert found.empty, found
    return len(cat.serials)


def catalog(url: str, opts: dict) -> int:
    cat = cv.open(url, storage_options=opts, cache=False)
    assert len(cat.variables) and len(cat.serials)
    return len(cat.serials)


def measure(proxy: FaultProxy, fn, *args) -> tuple[float, int, int]:
    """Best wall time; requests at the proxy and the most in flight (of the last run)."""
    with proxy.state.lock:
        proxy.state.log.clear()
        proxy.state.max_inflight = 0
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0, len(proxy.state.log), proxy.state.max_inflight


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", default="250", help="tree sizes (files), comma-separated")
    ap.add_argument("--delays", default="0,100", help="ms per request, comma-separated")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell (the best is kept)")
    ap.add_argument("--deep", action="store_true", help="also verify(deep=True) vs its floor")
    args = ap.parse_args()
    sizes = [int(x) for x in args.files.split(",")]
    delays = [int(x) for x in args.delays.split(",")]
    server = MotoServer()
    proxy = FaultProxy(server.port)
    rows, deep_rows = [], []
    try:
        fs = s3fs_client(server.endpoint)  # uploads straight to moto
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        opts = storage_options(proxy.endpoint)
        for n in sizes:
            with tempfile.TemporaryDirectory() as tmp:
                root = Path(tmp) / "run"
                write_sharded_run(root, serials=max(1, n // 10))
                n_files = sum(1 for p in root.rglob("*") if p.is_file())
                url = upload(fs, root, bucket, f"run{n}")
            for d in delays:
                set_delay(proxy, d / 1000, ("GET", "HEAD"))
                best: dict[str, tuple[float, int, int]] = {}
                for _ in range(args.repeat):
                    for name, fn in (("floor", floor), ("ckptview", catalog)):
                        got = measure(proxy, fn, url, opts)
                        if name not in best or got[0] < best[name][0]:
                            best[name] = got
                f, c = best["floor"], best["ckptview"]
                rows.append((n_files, d, f, c))
                print(f"{n_files} files, {d} ms: floor {f[0]:.2f} s ({f[1]} req), ckptview "
                      f"{c[0]:.2f} s ({c[1]} req, {c[2]} in flight): {c[0] / f[0]:.2f}×",
                      flush=True)  # fmt: skip
                if args.deep:
                    deep_rows.append((n_files, d, *measure_deep(proxy, url, opts, args.repeat)))
                    _n, _d, f, c, n_data = deep_rows[-1]
                    print(f"  verify --deep ({n_data} data files): floor {f[0]:.2f} s ({f[1]} "
                          f"req), ckptview {c[0]:.2f} s ({c[1]} req, {c[2]} in flight): "
                          f"{c[0] / f[0]:.2f}×", flush=True)  # fmt: skip
    finally:
        proxy.stop()
        server.stop()
    print("\n### Remote catalog at latency: moto S3 behind a delaying proxy (loopback)\n")
    print("| files | delay ms | floor s | floor req/file | ckptview s | ckptview req/file | "
          "max in flight | ckptview / floor |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, d, f, c in rows:
        print(f"| {n} | {d} | {f[0]:.2f} | {f[1] / n:.2f} | {c[0]:.2f} | {c[1] / n:.2f} | "
              f"{c[2]} | {c[0] / f[0]:.2f}× |")  # fmt: skip
    if deep_rows:
        print("\n### verify --deep at latency (catalog open; floor: every data file whole, "
              "64 connections)\n")
        print("| files | data files | delay ms | floor s | ckptview s | ckptview req/data file "
              "| max in flight | ckptview / floor |")  # fmt: skip
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n, d, f, c, n_data in deep_rows:
            print(f"| {n} | {n_data} | {d} | {f[0]:.2f} | {c[0]:.2f} | {c[1] / n_data:.2f} | "
                  f"{c[2]} | {c[0] / f[0]:.2f}× |")  # fmt: skip


def measure_deep(proxy: FaultProxy, url: str, opts: dict, repeat: int
                 ) -> tuple[tuple[float, int, int], tuple[float, int, int], int]:  # fmt: skip
    """verify(deep=True) of an open catalog and its floor, in the same run (best of repeat)."""
    paths, sizes = data_files(url, opts)
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(repeat):
        cat = cv.open(url, storage_options=opts, cache=False)
        assert len(cat.variables) and len(cat.serials)  # listed and headers read: not timed
        fs = floor_fs(opts)  # its connections opened by a first pass (the catalog's were)
        fs.cat_ranges(paths, [0] * len(paths), [1] * len(paths), batch_size=FLOOR_CONNECTIONS)
        for name, fn, args in (("floor", floor_deep, (fs, paths, sizes)),
                               ("ckptview", deep_verify, (cat,))):  # fmt: skip
            got = measure(proxy, fn, *args)
            if name not in best or got[0] < best[name][0]:
                best[name] = got
    return best["floor"], best["ckptview"], len(paths)


if __name__ == "__main__":
    main()
