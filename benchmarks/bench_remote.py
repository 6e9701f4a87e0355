"""Remote trees at real latency (DESIGN.md §5): moto's S3 server on loopback behind a proxy that
holds every request D ms, a Trainer-shaped tree (N/10 serials × 8 safetensors shards + index +
trainer_state.json), and in the same run the s3fs concurrent floor: ``find`` then every file's
first 64 KiB with ``cat_ranges`` (64 connections). Prints wall time, requests per file and
ckptview / floor.

usage: .venv/bin/python benchmarks/bench_remote.py [--files 250,2000] [--delays 0,50,100,200]
                                                   [--repeat 1]
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
    args = ap.parse_args()
    sizes = [int(x) for x in args.files.split(",")]
    delays = [int(x) for x in args.delays.split(",")]
    server = MotoServer()
    proxy = FaultProxy(server.port)
    rows = []
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


if __name__ == "__main__":
    main()
