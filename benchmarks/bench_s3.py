"""Catalog scan on S3 (moto's server on loopback, read with s3fs) against the same tree on local
disk, per corpus format: time, requests per data file (counted by ckptview and at the server
through the test proxy), bytes read. Prints a Markdown table.

usage: .venv/bin/python benchmarks/bench_s3.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from s3server import FaultProxy, MotoServer, s3fs_client, storage_options, upload  # noqa: E402

import ckptview as cv  # noqa: E402

CORPUS = HERE.parent.parent / "shared" / "corpus"
TREES = {
    "paddle fluid": "paddle/fluid_ckpt",
    "caffe2": "caffe2/ckpt",
    "hf trainer (torch zip + safetensors)": "modern/hf",
    "safetensors sharded": "modern/safetensors/sharded",
    "tf bundle": "tf_orbax/tf/run1",
}


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, out = None, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best, out


def scan(url: str, **kw) -> cv.Catalog:
    cat = cv.open(url, cache=False, **kw)
    assert len(cat.variables) and len(cat.serials)
    return cat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    server = MotoServer()
    proxy = FaultProxy(server.port)
    try:
        fs = s3fs_client(server.endpoint)
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        opts = storage_options(proxy.endpoint)
        rows = []
        for label, rel in TREES.items():
            url = upload(fs, CORPUS / rel, bucket, rel)
            t_local, local = best_of(args.repeat, lambda rel=rel: scan(str(CORPUS / rel)))
            t_s3, cat = best_of(args.repeat, lambda url=url: scan(url, storage_options=opts))
            proxy.reset()
            cat = scan(url, storage_options=opts)
            gets = proxy.requests("GET", under=f"{bucket}/")
            listings = len(proxy.requests("GET")) - len(gets)
            per_file = collections.Counter(e.key for e in gets)
            n_files = int((cat.files["role"] == "data").sum())
            rows.append((label, n_files, len(cat.variables), t_local, t_s3, len(gets),
                         len(gets) / max(1, n_files), max(per_file.values(), default=0),
                         listings, cat.storage.counters.bytes_read))  # fmt: skip
        print("\n### Catalog scan: moto S3 (loopback) vs local disk\n")
        print("| format | data files | variables | local s | S3 s | S3/local | object GETs | "
              "GETs/file | max GETs/file | listing calls | bytes read |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[4] / r[3]:.1f} | "
                  f"{r[5]} | {r[6]:.1f} | {r[7]} | {r[8]} | {r[9]} |")  # fmt: skip
    finally:
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    main()
