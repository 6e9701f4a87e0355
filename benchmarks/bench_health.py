"""Health over serials: read speed as a ratio of numpy reading the same bytes, and peak RSS.

    .venv/bin/python benchmarks/bench_health.py [--mb 64] [--serials 4] [--repeat 3]
    .venv/bin/python benchmarks/bench_health.py --mb 256     # largest tensor 256 MB

A numbered run (``step_N.npz``, uncompressed) whose largest tensor is ``--mb`` MB is written to
a scratch directory. ``health`` reads each serial's values once (``update_rel`` pairs each
serial with its predecessor block by block, in the same pass). The baseline is numpy loading
every array of every file once (``np.load``) and reducing it, so a ratio of 1 is "as fast as
numpy". Each case runs in a fresh subprocess, ``--repeat`` times (the best time is kept, the
highest peak):

- the timed region starts after the imports (``import numpy``; ``import ckptview, pandas``)
  and, for health, covers ``cv.open``, the headers and ``cat.health()``; it runs twice in the
  process (``again``: ckptview's lazy imports of its codecs, ~0.1 s, are paid by the first);
- ``cpu`` is the process's user + system time over that region (all threads): on a shared,
  busy machine wall time swings with the load, CPU time much less;
- ``peak`` is the process's ``VmHWM`` (the high-water resident set of its own address space;
  ``ru_maxrss`` is not used: Linux carries the parent's over ``exec``); ``baseline`` is the
  peak of a process that only imports ``ckptview`` and ``pandas``, so ``peak - baseline`` is
  what the case held in values and buffers.

**Incremental** (``--no-incremental`` skips it): the health of the ``--serials`` serials is
cached on disk (``cv.open(url, cache=DIR)``), then serial ``--serials + 1`` is added; a fresh
process times ``cv.open`` + headers + ``health()`` on the grown tree (after a throwaway
``health`` of a tiny run, so the lazy imports are not counted), and ``cat.storage.counters``
gives the bytes it read. The baselines: numpy loading and summing the new serial's file alone
(the goal: health <= 1.2x that), and the new file plus its predecessor's (``update_rel`` reads
the predecessor's values again: its statistics are cached, its values are not). Each repeat
starts from a copy of the cache as it was before the serial was added.

**Live** (a dashboard or notebook on a run that is training): one process computes the health
of ``--serials`` serials (untimed, from an empty cache), the next serial lands, and ``refresh()`` + headers +
``health()`` are timed. The last call kept the newest serial's values in memory
(:mod:`ckptview.health.kept`, up to ``KEEP_BYTES``), so only the new serial is read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def write(root: Path, mb: int, serials: int, extra: Path | None = None) -> int:
    """``serials`` numbered files in ``root`` (bytes returned); with ``extra``, serial
    ``serials + 1`` is written there (the one the incremental case adds)."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = mb * (1 << 20) // 4
    small = {"b": rng.normal(size=4096).astype(np.float32),
             "w2": rng.normal(size=(512, 512)).astype(np.float32)}  # fmt: skip
    big = rng.normal(size=n).astype(np.float32)
    root.mkdir(parents=True)
    total = 0
    for s in range(1, serials + 1 + (extra is not None)):
        big += np.float32(0.01)
        path = (root if s <= serials else extra) / f"step_{s}.npz"
        np.savez(path, big=big.reshape(-1, 1024), **small)
        t = time.time() - 600  # older than the cache's 2 s "racily clean" window
        os.utime(path, (t, t))
        total += path.stat().st_size if s <= serials else 0
    return total


def peak_rss() -> int:
    """This process's high-water resident set, bytes (``VmHWM``; ``ru_maxrss`` elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def case(kind: str, root: str) -> dict:
    import numpy as np

    if kind != "numpy":
        import pandas  # noqa: F401 - ckptview's own import, in the baseline too

        import ckptview as cv
    if kind == "baseline":
        return {"seconds": 0.0, "cpu": 0.0, "again": 0.0, "cpu_again": 0.0, "rss": peak_rss()}

    def work() -> None:
        if kind == "numpy":
            for p in sorted(Path(root).glob("*.npz")):
                with np.load(p) as z:
                    for k in z.files:
                        z[k].sum()  # touch the values once (health reduces them too)
        else:
            cat = cv.open(root, cache=False)
            cat.variables  # noqa: B018 - headers, not timed apart
            cat.health()

    out = {}
    for run in ("", "_again"):  # the first call pays ckptview's lazy imports (codecs: ~0.1 s)
        t0, c0 = time.perf_counter(), cpu_seconds()
        work()
        out["seconds" if not run else "again"] = time.perf_counter() - t0
        out["cpu" + run] = cpu_seconds() - c0
    return {**out, "rss": peak_rss()}


def incremental_case(kind: str, root: str, cache: str, new: str) -> dict:
    """One timed region in this process: ``health`` of the grown tree from the cache
    (``incremental``), or numpy loading and summing ``new`` (comma-separated files)."""
    import numpy as np

    if kind == "live":
        import pandas  # noqa: F401 - ckptview's own import

        import ckptview as cv

        landed = Path(root) / Path(new).name
        cat = cv.open(root, cache=cache)
        cat.health()  # the run so far, untimed (the newest serial's values are kept)
        kept = __import__("ckptview.health.kept", fromlist=["KEPT"]).KEPT.nbytes
        shutil.move(new, landed)  # the next serial lands
        try:
            t0, c0 = time.perf_counter(), cpu_seconds()
            cat.refresh()
            cat.variables  # noqa: B018
            headers = cat.storage.counters.bytes_read
            h = cat.health()
            seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        finally:
            shutil.move(landed, new)
        c = cat.storage.counters
        return {"seconds": seconds, "cpu": cpu, "bytes": c.bytes_read - headers,
                "requests": c.requests, "header_bytes": 0, "kept": kept, "rows": len(h),
                "rss": peak_rss()}  # fmt: skip
    if kind == "incremental":
        import pandas  # noqa: F401 - ckptview's own import

        import ckptview as cv

        with tempfile.TemporaryDirectory() as tiny:  # pay the lazy imports (codecs) untimed
            np.savez(Path(tiny) / "step_1.npz", w=np.ones((64, 64), np.float32))
            np.savez(Path(tiny) / "step_2.npz", w=np.ones((64, 64), np.float32))
            cv.open(tiny, cache=False).health()
        t0, c0 = time.perf_counter(), cpu_seconds()
        cat = cv.open(root, cache=cache)
        cat.variables  # noqa: B018 - headers: only the new file's are read
        headers = cat.storage.counters.bytes_read
        h = cat.health()
        seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        c = cat.storage.counters
        return {"seconds": seconds, "cpu": cpu, "bytes": c.bytes_read, "requests": c.requests,
                "header_bytes": headers, "rows": len(h), "rss": peak_rss()}  # fmt: skip
    t0, c0 = time.perf_counter(), cpu_seconds()
    for p in new.split(","):
        with np.load(p) as z:
            for k in z.files:
                z[k].sum()
    return {"seconds": time.perf_counter() - t0, "cpu": cpu_seconds() - c0, "rss": peak_rss()}


def run_incremental(root: Path, extra: Path, serials: int, repeat: int) -> dict:
    """The incremental case and its numpy baselines, best of ``repeat`` (fresh processes)."""
    base = root.parent
    warm = base / "cache-warm"
    subprocess.run([sys.executable, "-c", "import ckptview as cv, sys; "
                    "cv.open(sys.argv[1], cache=sys.argv[2]).health()", str(root), str(warm)],
                   check=True)  # fmt: skip
    added = root / f"step_{serials + 1}.npz"
    pred = root / f"step_{serials}.npz"
    got: dict = {}
    for _ in range(repeat):  # live first: the new serial is outside the tree until it lands
        cache = base / "cache"  # empty: the session computes the run's health itself
        shutil.rmtree(cache, ignore_errors=True)
        out = subprocess.run([sys.executable, __file__, "--case", "live", "--root", str(root),
                              "--cache", str(cache), "--new", str(extra / added.name)],
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
        r = json.loads(out)
        best = got.setdefault("live", r)
        for k in ("seconds", "cpu"):
            best[k] = min(best[k], r[k])
        best["bytes"] = max(best["bytes"], r["bytes"])
    shutil.move(extra / added.name, added)
    jobs = {"incremental": "", "numpy_new": str(added), "numpy_pair": f"{pred},{added}"}
    for _ in range(repeat):
        for kind, new in jobs.items():
            cache = base / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            shutil.copytree(warm, cache)
            out = subprocess.run([sys.executable, __file__, "--case", kind, "--root", str(root),
                                  "--cache", str(cache), "--new", new],
                                 check=True, capture_output=True, text=True).stdout  # fmt: skip
            r = json.loads(out)
            best = got.setdefault(kind, r)
            for k in ("seconds", "cpu"):
                best[k] = min(best[k], r[k])
            for k in ("rss", "bytes", "requests", "header_bytes"):
                if k in r:
                    best[k] = max(best[k], r[k])
    got["new_bytes"] = added.stat().st_size
    got["pair_bytes"] = added.stat().st_size + pred.stat().st_size
    return got


def report_incremental(got: dict, serials: int) -> None:
    inc, one, two = got["incremental"], got["numpy_new"], got["numpy_pair"]
    mb = 1e6
    print(f"incremental: {serials} serials' health cached on disk, serial {serials + 1} added "
          f"({got['new_bytes'] / mb:.0f} MB; with its predecessor {got['pair_bytes'] / mb:.0f} MB)")  # fmt: skip
    print(f"  numpy, the new file       {one['seconds']:6.3f} s  cpu {one['cpu']:5.3f} s")
    print(f"  numpy, new + predecessor  {two['seconds']:6.3f} s  cpu {two['cpu']:5.3f} s")
    print(f"  health (open + headers + health) {inc['seconds']:6.3f} s  cpu {inc['cpu']:5.3f} s | "
          f"read {inc['bytes'] / mb:.1f} MB in {inc['requests']} requests "
          f"({inc['bytes'] / got['new_bytes']:.2f}x the new file; headers "
          f"{inc['header_bytes'] / mb:.2f} MB) | peak RSS {inc['rss'] / mb:.0f} MB")  # fmt: skip
    print(f"health / numpy(new file): time {inc['seconds'] / one['seconds']:.2f}x, cpu "
          f"{inc['cpu'] / max(one['cpu'], 1e-9):.2f}x (goal: <= 1.2x); / numpy(new + "
          f"predecessor): time {inc['seconds'] / two['seconds']:.2f}x, cpu "
          f"{inc['cpu'] / max(two['cpu'], 1e-9):.2f}x")  # fmt: skip
    live = got.get("live")
    if live is not None:
        print(f"live: the run's health computed in the process, serial {serials + 1} lands; "
              f"refresh + headers + health {live['seconds']:6.3f} s  cpu {live['cpu']:5.3f} s | "
              f"values read {live['bytes'] / mb:.1f} MB ({live['bytes'] / got['new_bytes']:.2f}x "
              f"the new file; {live['kept'] / mb:.0f} MB kept in memory) | peak RSS "
              f"{live['rss'] / mb:.0f} MB")  # fmt: skip
        print(f"live / numpy(new file): time {live['seconds'] / one['seconds']:.2f}x, cpu "
              f"{live['cpu'] / max(one['cpu'], 1e-9):.2f}x (goal: <= 1.2x)")


def run(kind: str, root: Path, repeat: int) -> dict:
    best: dict = {}
    for _ in range(repeat):
        out = subprocess.run([sys.executable, __file__, "--case", kind, "--root", str(root)],
                             check=True, capture_output=True, text=True).stdout  # fmt: skip
        r = json.loads(out)
        best = {k: min(r[k], best.get(k, r[k])) for k in ("seconds", "cpu", "again", "cpu_again")}
        best["rss"] = max(r["rss"], best.get("rss", 0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64, help="the largest tensor, MB")
    ap.add_argument("--serials", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (best time kept)")
    ap.add_argument("--no-incremental", action="store_true",
                    help="skip the case of one serial added to a cached run")  # fmt: skip
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    ap.add_argument("--new", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case in ("incremental", "live", "numpy_new", "numpy_pair"):
        print(json.dumps(incremental_case(args.case, args.root, args.cache, args.new)))
        return
    if args.case:
        print(json.dumps(case(args.case, args.root)))
        return
    inc = None
    with tempfile.TemporaryDirectory() as tmp:
        root, extra = Path(tmp) / "run", Path(tmp) / "next"
        extra.mkdir()
        total = write(root, args.mb, args.serials, extra)
        got = {kind: run(kind, root, args.repeat) for kind in ("baseline", "numpy", "health")}
        if not args.no_incremental:
            inc = run_incremental(root, extra, args.serials, args.repeat)
    tensor = args.mb << 20
    base = got["baseline"]["rss"]
    print(f"run: {args.serials} serials, {total / 1e6:.0f} MB, largest tensor {args.mb} MB "
          f"(best of {args.repeat}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores)")  # fmt: skip
    print(f"  baseline (import ckptview, pandas)             peak RSS {base / 1e6:6.0f} MB")
    for kind in ("numpy", "health"):
        r = got[kind]
        print(f"  {kind:7s} {r['seconds']:6.2f} s {total / r['seconds'] / 1e6:6.0f} MB/s  "
              f"cpu {r['cpu']:5.2f} s | again {r['again']:6.2f} s  cpu {r['cpu_again']:5.2f} s | "
              f"peak RSS {r['rss'] / 1e6:4.0f} MB"
              + (f" (baseline + {(r['rss'] - base) / 1e6:.0f} MB)" if kind == "health" else ""))  # fmt: skip
    h, n = got["health"], got["numpy"]
    print(f"health / numpy: time {h['seconds'] / n['seconds']:.2f}x, cpu "
          f"{h['cpu'] / max(n['cpu'], 1e-9):.2f}x; again: time {h['again'] / n['again']:.2f}x, "
          f"cpu {h['cpu_again'] / max(n['cpu_again'], 1e-9):.2f}x (goal: time <= 2x)")  # fmt: skip
    print(f"health peak RSS {got['health']['rss'] / 1e6:.0f} MB (goal <= 300 MB at --mb 256); "
          f"above the import baseline {(got['health']['rss'] - base) / tensor:.2f}x the largest "
          f"tensor (numpy holds one array: {got['numpy']['rss'] / tensor:.2f}x in all)")
    if inc is not None:
        report_incremental(inc, args.serials)


if __name__ == "__main__":
    main()
