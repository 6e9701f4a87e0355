"""The core imports no framework and no UI: catalogue the whole corpus in a clean subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

FORBIDDEN = ["torch", "tensorflow", "paddle", "jax", "caffe2", "keras", "flax", "orbax",
             "transformers", "lightning", "panel", "bokeh"]  # fmt: skip

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import ckptview as cv

    corpus = Path(sys.argv[1])
    index = json.loads((corpus / "INDEX.json").read_text())
    report = {"trees": [], "failures": {}}
    for tree in index["trees"]:
        root = corpus / tree["root"]
        try:
            cat = cv.open(root)
            n_vars = len(cat.variables)
            n_serials = len(cat.serials)
            report["trees"].append([tree["root"], cat.layout, n_serials, n_vars])
        except Exception as e:
            report["failures"][tree["root"]] = f"{type(e).__name__}: {e}"[:300]
    forbidden = json.loads(sys.argv[2])
    report["imported"] = sorted(
        m for m in sys.modules if m.split(".")[0] in forbidden
    )
    print(json.dumps(report))
    """
)


def test_corpus_catalogued_without_frameworks(corpus, corpus_index):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(corpus), json.dumps(FORBIDDEN)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for root, layout, n_serials, n_vars in report["trees"]:
        print(f"ok   {root}: {layout}, {n_serials} serials, {n_vars} variable rows")
    for root, error in report["failures"].items():
        print(f"FAIL {root}: {error}")
    assert not report["failures"], f"{len(report['failures'])} trees raised (see output)"
    assert len(report["trees"]) == len(corpus_index["trees"])
    assert report["imported"] == [], f"the core imported {report['imported']}"
