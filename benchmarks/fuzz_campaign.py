"""A budgeted, coverage-guided fuzz campaign per parser (atheris/libFuzzer), outside CI.

    benchmarks/.venv/bin/python benchmarks/fuzz_campaign.py [--seconds 60] [--parsers a,b]

Each parser runs in its own libFuzzer process, instrumented, for ``--seconds``, with
``-rss_limit_mb=2048`` and a 10 s per-input timeout, seeded with (a) the real corpus files of
its format and (b) the structured payloads of ``tests/structured.py`` scaled down (deep
nesting, copies, floods, repeated blocks, growing keys, overlapping members). A finding is
what libFuzzer reports: a crash (signal or an exception other than a clean refusal), a
timeout or an out-of-memory. The report (executions, coverage, findings) goes to stdout and
to ``benchmarks/fuzz_report.json``; RESULTS.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = Path(os.environ.get("CKPTVIEW_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "tests"))

#: parser -> (codec name, file name the input is stored under, corpus globs)
PARSERS = {
    "pickle": ("torch", "data.pt", ["corpus/modern/torch/**/*.pt", "corpus/modern/hf/**/*.pt"]),
    "safetensors": ("safetensors", "model.safetensors", ["corpus/**/*.safetensors"]),
    "tf-index": ("tf", "ckpt-1.index", ["corpus/**/*.index"]),
    "minidb": ("caffe2", "model.minidb", ["corpus/caffe2/**/*.minidb"]),
    "npz": ("npz", "arrays.npz", ["corpus/**/*.npz"]),
    "gguf": ("gguf", "model.gguf", ["tests/data/gguf/*.gguf"]),
}

TARGET = r"""
import pickle, sys, atheris
with atheris.instrument_imports(include=["ckptview"]):
    import ckptview.codecs  # noqa: F401
    from ckptview import registry
    from ckptview.io import Storage
    from ckptview.codecs.base import PartialRead
    from ckptview.formats.pickle import RestrictedUnpicklingError
import fsspec

CODEC, NAME = sys.argv[1], sys.argv[2]
codec = registry.get_codec(CODEC)
fs = fsspec.filesystem("memory")
storage = Storage(fs)
CLEAN = (ValueError, EOFError, OSError, KeyError, LookupError, RestrictedUnpicklingError,
         NotImplementedError, PartialRead, pickle.UnpicklingError)


def one(data: bytes) -> None:
    path = "/fuzz/" + NAME
    fs.pipe_file(path, data)
    try:
        for var in codec.list_variables(storage.blob(path, len(data)), {}):
            if var.error is None and var.nbytes and var.nbytes < (1 << 20) and var.span is not None:
                try:
                    codec.read(storage.blob(path, len(data)), var)
                except CLEAN:
                    pass
    except CLEAN:
        pass


atheris.Setup(sys.argv[:1] + sys.argv[3:], one)
atheris.Fuzz()
"""


def seeds(parser: str, out: Path) -> int:
    """The parser's seed corpus: real files (up to 1 MiB each) and structured payloads."""
    import structured

    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for pattern in PARSERS[parser][2]:
        base = ROOT if pattern.startswith("tests/") else SHARED  # the project's own test data
        for path in sorted(base.glob(pattern))[:40]:
            if path.stat().st_size <= 1 << 20:
                shutil.copyfile(path, out / f"real-{n}")
                n += 1
    small = {
        "pickle": [structured.as_torch(structured.deep_tuple_key(2000)),
                   structured.as_torch(structured.deep_frozenset(1500)),
                   structured.as_torch(structured.list_copies(2000, 50)),
                   structured.as_torch(structured.tuple_copies(2000, 50)),
                   structured.as_torch(structured.memo_flood(20000))],
        "safetensors": [structured.safetensors_duplicate_keys(),
                        structured.safetensors_overlapping()],
        "tf-index": [structured.tf_index_repeated_block(200, 100),
                     structured.tf_index_growing_keys(2000)],
        "minidb": [structured.minidb_many_records(500), structured.minidb_many_chunks(300)],
        "npz": [structured.npz_inflating(64 << 20), structured.zip_overlapping()],
        "gguf": [],
    }[parser]  # fmt: skip
    for i, payload in enumerate(small):
        (out / f"structured-{i}").write_bytes(payload)
        n += 1
    return n


def campaign(parser: str, seconds: int, work: Path) -> dict:
    """libFuzzer stops at a finding: it is restarted on the grown corpus until the budget is
    spent, so one campaign collects every finding within it."""
    codec, name, _ = PARSERS[parser]
    corpus, crashes = work / parser / "corpus", work / parser / "crashes"
    crashes.mkdir(parents=True, exist_ok=True)
    n_seeds = seeds(parser, corpus)
    script = work / "target.py"
    script.write_text(TARGET)
    t0 = time.perf_counter()
    execs, runs, cov, kinds, tails = 0, 0, None, set(), []
    while (left := seconds - (time.perf_counter() - t0)) > 3:
        cmd = [sys.executable, str(script), codec, name, str(corpus),
               f"-max_total_time={int(left)}", "-rss_limit_mb=2048", "-timeout=10",
               "-max_len=4194304", f"-artifact_prefix={crashes}/",
               "-print_final_stats=1"]  # fmt: skip
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300)
        log = p.stdout + p.stderr
        runs += 1
        stats = dict(re.findall(r"stat::(\w+):\s+(\d+)", log))
        execs += int(stats.get("number_of_executed_units", 0))
        found = re.findall(r"cov: (\d+) ft: (\d+)", log)
        if found:
            cov = max(cov or 0, int(found[-1][0]))
        new = re.findall(r"ERROR: libFuzzer: ([\w-]+)|Uncaught Python exception: (\w+)", log)
        kinds |= {a or b for a, b in new}
        if p.returncode == 0:
            break
        tails.append(log[-800:])
        if runs >= 50:
            break
    findings = sorted(f.name for f in crashes.iterdir())
    return {
        "parser": parser,
        "codec": codec,
        "seconds": round(time.perf_counter() - t0, 1),
        "seeds": n_seeds,
        "executions": execs,
        "restarts": runs - 1,
        "coverage": cov,
        "findings": findings,
        "finding_kinds": sorted(kinds),
        "log_tails": tails[:5],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=60, help="budget per parser")
    ap.add_argument("--parsers", default=",".join(PARSERS), help="comma-separated")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptview-fuzz-"))
    report = []
    for parser in args.parsers.split(","):
        r = campaign(parser, args.seconds, work)
        report.append(r)
        print(f"{parser:12s} {r['executions']:>9,} execs  cov {r['coverage']}  "
              f"findings {len(r['findings'])} {r['finding_kinds']}", flush=True)  # fmt: skip
    (HERE / "fuzz_report.json").write_text(json.dumps(report, indent=1))
    print(f"work dir (crash inputs): {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
