"""Scale: a tree of 1,000 serials x 1,000 variables (1,000,000 variable rows), safetensors files
written per the spec (8-byte little-endian header length + JSON header + data), catalogued in
a fresh process; its time and peak memory are printed and held to sane bounds, and two of its
serials are diffed.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SERIALS = 1000
VARIABLES = 1000
SHAPE = (2,)  # float32: 8 bytes of data per variable

pytestmark = pytest.mark.slow


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file per the format spec (no safetensors package needed)."""
    header, blobs, offset = {}, [], 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}  # fmt: skip
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "run"
    root.mkdir()
    names = [f"layer{i // 10}.block{i % 10}.weight" for i in range(VARIABLES)]
    base = np.arange(SERIALS * 2, dtype="<f4").reshape(SERIALS, 2)
    for s in range(1, SERIALS + 1):
        # variable i of serial s holds [s + i, s]: serials differ, values are checkable
        data = {n: np.array([s + i, base[s - 1, 0]], dtype="<f4") for i, n in enumerate(names)}
        write_safetensors(root / f"step_{s}.safetensors", data)
    return root


CATALOG = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import ckptview as cv
cat = cv.open(sys.argv[1], cache=False)
v = cat.variables
s = cat.serials
t1 = time.perf_counter()
read, requests = cat.storage.counters.bytes_read, cat.storage.counters.requests
d = cat.diff(1, 2)
t2 = time.perf_counter()
print(json.dumps({
    "layout": cat.layout, "rows": len(v), "serials": len(s), "latest": cat.latest,
    "n_variables": sorted(set(s["n_variables"].tolist())), "errors": int(v["error"].notna().sum()),
    "catalog_s": t1 - t0, "diff_s": t2 - t1, "diff_rows": len(d),
    "diff_status": d["status"].value_counts().to_dict(), "diff_max_abs": float(d["max_abs"].max()),
    "bytes_read": read, "requests": requests,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def test_catalog_of_a_million_rows(big_tree):
    files = sorted(big_tree.glob("*.safetensors"))
    assert len(files) == SERIALS
    total = sum(p.stat().st_size for p in files)
    out = subprocess.run([sys.executable, "-c", CATALOG, str(big_tree)], capture_output=True,
                         text=True, timeout=170, check=True)  # fmt: skip
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n{r['serials']} serials, {r['rows']} variable rows, {total / 2**20:.0f} MiB on disk: "
          f"catalog {r['catalog_s']:.1f} s, peak RSS {r['peak_rss_mib']:.0f} MiB, "
          f"{r['requests']} requests, {r['bytes_read'] / 2**20:.1f} MiB read; "
          f"diff of 2 serials {r['diff_s']:.1f} s")  # fmt: skip
    assert r["layout"] == "numbered" and r["serials"] == SERIALS and r["latest"] == SERIALS
    assert r["rows"] == SERIALS * VARIABLES and r["errors"] == 0
    assert r["n_variables"] == [VARIABLES]
    assert r["requests"] <= 2 * SERIALS  # header length + header, per file
    data_bytes = SERIALS * VARIABLES * 4 * int(np.prod(SHAPE))
    assert r["bytes_read"] <= total - data_bytes + 4096 * SERIALS  # headers (+ detection block)
    assert r["peak_rss_mib"] < 4096
    assert r["catalog_s"] < 120
    # serial 2 - serial 1: every value moved, by 1 (s + i) and by 2 (base[s-1, 0] = 2(s-1))
    assert r["diff_rows"] == VARIABLES and r["diff_status"] == {"changed": VARIABLES}
    assert r["diff_max_abs"] == 2.0
