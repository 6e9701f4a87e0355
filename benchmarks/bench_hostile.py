"""Each structured attack of the red-team report, catalogued by a child process: wall time,
peak RSS and what the catalog says. Run it against this checkout, and against an older one
(``--code DIR``, e.g. a ``git worktree`` of an earlier commit) for the before/after table.

    python benchmarks/bench_hostile.py [--code DIR] [--timeout 90] [--cases a,b]

Issue 25 items 5-6 are reported too: the GGUF extremes and a DCP ``.metadata`` of 200 k
chunks (time, peak RSS), and ``cat.stats`` of a 128 MiB FP8 block-scaled weight (peak traced
allocations against its stored size; ``--cases fp8`` for that row alone).

Every child runs with a 4 GiB address-space limit and is killed at ``--timeout`` seconds, so
the "before" of a case that never finishes or that blows up memory is measured too. Nothing
here is a test: tests/test_budgets.py asserts the outcomes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = Path(os.environ.get("CKPTVIEW_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "tests"))

import extremes  # noqa: E402
import structured  # noqa: E402

GIB = 1 << 30
CHILD = r"""
import json, sys
root, fname, read = sys.argv[1], sys.argv[2], sys.argv[3]
if fname.endswith("+hook"):  # the formats/dcp_budget calls around the DCP codec's unpickling
    fname = fname[: -len("+hook")]
    import ckptview.codecs.torch_dcp as td
    from ckptview.formats.dcp_budget import check_entries, check_metadata_bytes
    if "dcp_budget" not in open(td.__file__).read():
        _load = td.load_pickle
        def _hooked(blob, **kw):
            check_metadata_bytes(blob.name, blob.read, blob.size)
            meta = _load(blob, **kw)
            check_entries(blob.name, meta.fields())
            return meta
        td.load_pickle = _hooked
import ckptview as cv
try:
    cat = cv.open(root, cache=False)
    if read:
        a = cat.read(read)
        out = {"outcome": f"read {a.nbytes >> 20} MiB"}
    else:
        out = None
    df = cat.variables
    rows = df[df["file"].astype(str).str.endswith(fname)]
    errors = sorted(set(rows["error"].dropna()))
    serr = sorted(set(cat.serials["error"].dropna()))
    text = errors[0] if errors else (serr[0] if serr else None)
    outcome = (f"error: {text[:90]}" if text else f"{len(rows)} rows, no error")
    print(json.dumps(out or {"outcome": outcome, "latest": None if cat.latest is None
                             else int(cat.latest), "rows_elsewhere": int(len(df) - len(rows))}))
except BaseException as e:  # what an unbudgeted parser lets out
    print(json.dumps({"outcome": f"raised {type(e).__name__}: {str(e)[:80]}"}))
"""


def _copy(src: str, dst: Path) -> Path:
    shutil.copytree(SHARED / "corpus" / src, dst)
    return dst


def _torch_run(work: Path, payload: bytes) -> tuple[Path, str]:
    root = work / "run"
    root.mkdir()
    for n in ("step_100.pt", "step_200.pt"):
        shutil.copyfile(SHARED / "corpus/modern/torch/run_A/step_100.pt", root / n)
    (root / "step_300.pt").write_bytes(payload)
    return root, "step_300.pt"


def _plant(src: str, rel: str, payload: bytes):
    def make(work: Path) -> tuple[Path, str]:
        root = _copy(src, work / "t")
        (root / rel).write_bytes(payload)
        return root, rel

    return make


def _alone(name: str, payload_fn):
    def make(work: Path) -> tuple[Path, str]:
        root = work / "t"
        root.mkdir()
        (root / name).write_bytes(payload_fn())
        return root, name

    return make


def cases() -> dict:
    s = structured
    return {
        "torch: tuple 200,000 deep as a dict key": lambda w: _torch_run(
            w, s.as_torch(s.deep_tuple_key())),
        "torch: tuple 200,000 deep in a frozenset": lambda w: _torch_run(
            w, s.as_torch(s.deep_frozenset())),
        "torch: builtins.list copies 1 M x 2,000": lambda w: _torch_run(
            w, s.as_torch(s.list_copies())),
        "HF training_args.bin: the same copies": lambda w: _plant(
            "modern/hf", "checkpoint-300/training_args.bin", s.as_torch(s.list_copies()))(w),
        "torch: 4.5 M memo entries (31 MB)": lambda w: _torch_run(
            w, s.as_torch(s.memo_flood())),
        "trainer_state.json nested 100,000 deep": _plant(
            "modern/hf", "checkpoint-300/trainer_state.json", s.deep_json()),
        "Orbax _CHECKPOINT_METADATA nested": _plant(
            "tf_orbax/orbax/run2_policy", "ckpt_000010/_CHECKPOINT_METADATA", s.deep_json()),
        "TF .index: 100,000 entries naming one block": _plant(
            "modern/tf/run_ckpt", "ckpt-400.index", s.tf_index_repeated_block()),
        "TF .index: keys growing a byte per entry": _plant(
            "modern/tf/run_ckpt", "ckpt-400.index", s.tf_index_growing_keys()),
        "Caffe2 minidb: 1 M tiny records": _alone(
            "model.minidb", lambda: s.minidb_many_records(1_000_000)),
        "Caffe2 minidb: 300 k chunks of one blob": _alone(
            "model.minidb", lambda: s.minidb_many_chunks(300_000)),
        "safetensors: duplicate keys": _alone("d.safetensors", s.safetensors_duplicate_keys),
        "safetensors: overlapping spans": _alone("o.safetensors", s.safetensors_overlapping),
        "zip: members sharing one local header": _alone("bomb.npz", s.zip_overlapping),
    }


def _dcp(n: int, hook: bool):
    def make(work: Path) -> tuple[Path, str]:
        meta, item = extremes.dcp_many_chunks(n)
        d = work / "run" / "step_1"
        d.mkdir(parents=True)
        (d / ".metadata").write_bytes(meta)
        (d / "__0_0.distcp").write_bytes(item)
        return work / "run", ".metadata" + ("+hook" if hook else "")

    return make


def extreme_cases() -> dict:
    """Issue 25 item 5: GGUF dims and entry counts, a DCP metadata of 200 k chunks."""
    e = extremes
    return {
        "GGUF: 8 dims of 2^64-1": _alone("huge.gguf", e.gguf_huge_dims),
        "GGUF: 1.5 M tensor infos (60 MB)": _alone("many.gguf", e.gguf_many_tensors),
        "GGUF: 65,536 tensor infos (at the budget)": _alone(
            "at.gguf", lambda: e.gguf_many_tensors(1 << 16)),
        "DCP .metadata: 200 k chunks (codec as is)": _dcp(200_000, False),
        "DCP .metadata: 200 k chunks (dcp_budget calls applied)": _dcp(200_000, True),
    }


STATS_CHILD = r"""
import json, sys, tracemalloc, os
import ckptview as cv
cat = cv.open(sys.argv[1], cache=False)
cat.variables
tracemalloc.start()
st = cat.stats()
import resource
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1], "error": st["error"].iloc[0],
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10}))
"""


def fp8_stats(code: Path, timeout: float) -> dict:
    """Issue 25 item 6: ``cat.stats`` of a 128 MiB FP8 block-scaled weight: peak traced
    allocations and peak RSS of the child, against the stored size."""
    import test_lowbit_memory as lm

    with tempfile.TemporaryDirectory(prefix="ckptview-hostile-") as tmp:
        path = Path(tmp) / "model.safetensors"
        lm.write_fp8_block(path, 8192, 16384)
        stored = path.stat().st_size
        env = dict(os.environ, PYTHONPATH=str(code))
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", STATS_CHILD, str(path)], env=env,
                             cwd=tempfile.gettempdir(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)  # fmt: skip
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        seconds = time.perf_counter() - t0
    lines = out.decode(errors="replace").strip().splitlines()
    if not lines:
        return {"seconds": round(seconds, 2), "outcome": err.decode(errors="replace")[-200:]}
    child = json.loads(lines[-1])
    peak = child["peak"]
    return {"seconds": round(seconds, 2), "stored_mib": stored >> 20, "peak_mib": peak >> 20,
            "ratio": round(peak / stored, 2), "rss_mib": child["rss"], "error": child["error"]}


READS = {"npz member 1.5 MB -> 1.5 GiB, read": ("w.npz", "w")}


def run_child(code: Path, root: Path, fname: str, read: str, timeout: float) -> dict:
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (4 * GIB, 4 * GIB))

    env = dict(os.environ, PYTHONPATH=str(code))
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(root), fname, read], env=env,
                         cwd=tempfile.gettempdir(),  # not a checkout: PYTHONPATH decides
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limit)
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - t0 > timeout:
            p.send_signal(signal.SIGKILL)
            pid, status, usage = os.wait4(p.pid, 0)
            return {"seconds": timeout, "rss_mib": usage.ru_maxrss >> 10,
                    "outcome": f"killed after {timeout:.0f} s (did not finish)"}
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    out = p.stdout.read().decode(errors="replace").strip().splitlines()
    err = p.stderr.read().decode(errors="replace").strip().splitlines()
    if os.WIFSIGNALED(status):
        outcome = f"process killed by {signal.Signals(os.WTERMSIG(status)).name}"
    elif out:
        child = json.loads(out[-1])
        return {"seconds": round(seconds, 2), "rss_mib": usage.ru_maxrss >> 10, **child}
    else:
        outcome = f"exit {os.WEXITSTATUS(status)}: {(err or [''])[-1][:90]}"
    return {"seconds": round(seconds, 2), "rss_mib": usage.ru_maxrss >> 10, "outcome": outcome}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose ckptview to run")
    ap.add_argument("--timeout", type=float, default=90)
    ap.add_argument("--cases", default="", help="substrings of case names, comma-separated")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    wanted = [c for c in args.cases.split(",") if c]
    rows = []
    print(f"ckptview from {args.code}\n")
    print("| case | seconds | peak RSS MiB | latest | outcome |\n|---|---:|---:|---:|---|")
    todo = list(cases().items()) + list(extreme_cases().items()) + [(k, None) for k in READS]
    for name, make in todo:
        if wanted and not any(w in name for w in wanted):
            continue
        with tempfile.TemporaryDirectory(prefix="ckptview-hostile-") as tmp:
            work = Path(tmp)
            if make is None:
                fname, var = READS[name]
                root = work / fname
                root.write_bytes(structured.npz_inflating())
                r = run_child(args.code, root, fname, var, args.timeout)
            else:
                root, fname = make(work)
                r = run_child(args.code, root, fname, "", args.timeout)
        rows.append({"case": name, **r})
        print(f"| {name} | {r['seconds']} | {r['rss_mib']} | {r.get('latest', '')} | "
              f"{r['outcome']} |", flush=True)  # fmt: skip
    if not wanted or any(w in "fp8 stats" for w in wanted):
        r = fp8_stats(args.code, args.timeout)
        rows.append({"case": "fp8 stats", **r})
        print("\nFP8 block-scaled weight, cat.stats(): stored "
              f"{r.get('stored_mib')} MiB, peak traced {r.get('peak_mib')} MiB "
              f"(x{r.get('ratio')} the stored size), peak RSS of the child "
              f"{r.get('rss_mib')} MiB, {r['seconds']} s, error {r.get('error')}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
