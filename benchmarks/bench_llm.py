"""Large-model trees: GGUF header time vs gguf-py, reassembly peak memory vs the tensor size,
export throughput vs the raw copy floor. Runs in the peer environment (torch writes the
Megatron tree; gguf-py is the GGUF peer); every contender in its own process.

usage: python bench_llm.py [--gib 1.0]
"""

from __future__ import annotations

import argparse
import importlib.util
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import run_contender, table

# -- a Llama-3-70B-sized GGUF header (80 layers, 723 tensors, 128,256 tokens, 280,147 merges) -
LAYERS, HIDDEN, FFN, VOCAB, KV = 80, 8192, 28672, 128256, 1024
MERGES = 280147


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_70b_gguf(path: Path) -> int:
    """A GGUF whose header is a 70B model's (Q4_K weights), its data a sparse hole."""
    kv = [_s("general.architecture") + struct.pack("<I", 8) + _s("llama"),
          _s("general.alignment") + struct.pack("<II", 4, 32),
          _s("llama.block_count") + struct.pack("<II", 4, LAYERS),
          _s("tokenizer.ggml.model") + struct.pack("<I", 8) + _s("gpt2")]  # fmt: skip
    tokens = b"".join(_s(f"tok{i}") for i in range(VOCAB))
    kv.append(_s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, VOCAB) + tokens)
    kv.append(_s("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, VOCAB)
              + np.ones(VOCAB, "<i4").tobytes())  # fmt: skip
    merges = b"".join(_s(f"t{i} o{i}") for i in range(MERGES))
    kv.append(_s("tokenizer.ggml.merges") + struct.pack("<IIQ", 9, 8, MERGES) + merges)
    shapes = [("token_embd.weight", (HIDDEN, VOCAB), 12), ("output_norm.weight", (HIDDEN,), 0),
              ("output.weight", (HIDDEN, VOCAB), 14)]  # fmt: skip
    for i in range(LAYERS):
        b = f"blk.{i}."
        shapes += [(b + "attn_norm.weight", (HIDDEN,), 0), (b + "ffn_norm.weight", (HIDDEN,), 0),
                   (b + "attn_q.weight", (HIDDEN, HIDDEN), 12), (b + "attn_k.weight", (HIDDEN, KV), 12),
                   (b + "attn_v.weight", (HIDDEN, KV), 14), (b + "attn_output.weight", (HIDDEN, HIDDEN), 12),
                   (b + "ffn_gate.weight", (HIDDEN, FFN), 12), (b + "ffn_up.weight", (HIDDEN, FFN), 12),
                   (b + "ffn_down.weight", (FFN, HIDDEN), 14)]  # fmt: skip
    sizes = {0: (1, 4), 12: (256, 144), 14: (256, 210)}
    infos, at = b"", 0
    for name, dims, t in shapes:
        infos += _s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<IQ", t, at)
        block, size = sizes[t]
        at += -(-(int(np.prod(dims)) // block * size) // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), len(kv)) + b"".join(kv) + infos
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + at)
    return len(head)


GGUF_FLOOR = """
import sys, json
def work():
    with open(sys.argv[1], 'rb') as f:
        data = f.read(int(sys.argv[2]))
    return {"bytes": len(data)}
"""
GGUF_CKPTVIEW = """
import sys
import ckptview as cv
from ckptview.scan import cache
def work():
    cache.default_cache().clear()
    v = cv.open(sys.argv[1]).variables
    return {"tensors": int((v["kind"] == "model").sum())}
"""
GGUF_PEER = """
import sys
from gguf import GGUFReader
def work():
    r = GGUFReader(sys.argv[1])
    return {"tensors": len(r.tensors)}
"""


# -- a Megatron TP tree written by torch: reassembly memory and export throughput -------------
def write_megatron(root: Path, gib: float, tp: int = 4) -> tuple[int, int]:
    """Megatron legacy rank files (torch.save's zip format, written with the test suite's
    torch-free writer so the tree needs no torch)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_deepspeed import torch_zip

    rows = int(gib * 2**30 / 4 / 2 / 4096)  # two tensors of rows x 4096 fp32, ~gib/2 each
    rows -= rows % tp
    rng = np.random.default_rng(0)
    full_col = rng.standard_normal((rows, 4096), np.float32)
    full_row = rng.standard_normal((4096, rows), np.float32)
    it = root / "iter_0000010"
    step = rows // tp
    for r in range(tp):
        shard = {"args": {"tensor_model_parallel_size": tp}, "iteration": 10,
                 "model": {"embedding.word_embeddings.weight": full_col[r * step : (r + 1) * step],
                           "decoder.layers.0.self_attention.linear_proj.weight":
                           np.ascontiguousarray(full_row[:, r * step : (r + 1) * step])}}  # fmt: skip
        (it / f"mp_rank_{r:02d}").mkdir(parents=True)
        (it / f"mp_rank_{r:02d}" / "model_optim_rng.pt").write_bytes(torch_zip(shard))
    (root / "latest_checkpointed_iteration.txt").write_text("10")
    return full_col.nbytes, full_row.nbytes


READ = """
import sys, resource
import ckptview as cv
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cat = cv.open(sys.argv[1])
def work():
    a = cat.read(sys.argv[2], serial=10)
    return {"sum": float(a[:4].sum()), "nbytes": a.nbytes}
"""
TORCH_GATHER = """
import sys, glob, torch
def work():
    parts = [torch.load(f, weights_only=False)["model"][sys.argv[2]]
             for f in sorted(glob.glob(sys.argv[1] + "/iter_0000010/mp_rank_*/model_optim_rng.pt"))]
    a = torch.cat(parts, int(sys.argv[3]))
    return {"sum": float(a.flatten()[:4].sum()), "nbytes": a.numel() * 4}
"""
NUMPY_FLOOR = """
import sys, numpy as np
def work():
    a = np.empty((int(sys.argv[1]),), np.float32)
    a[:] = 1.0
    return {"nbytes": a.nbytes}
"""
COPY_FLOOR = """
import sys, shutil, glob, os, tempfile
def work():
    with tempfile.TemporaryDirectory(dir=sys.argv[2]) as d:
        n = 0
        for f in sorted(glob.glob(sys.argv[1] + "/iter_0000010/mp_rank_*/model_optim_rng.pt")):
            shutil.copyfile(f, os.path.join(d, os.path.basename(os.path.dirname(f))))
            n += os.path.getsize(f)
    return {"bytes": n}
"""
EXPORT = """
import sys, os, tempfile
import ckptview as cv
cat = cv.open(sys.argv[1])
def work():
    with tempfile.TemporaryDirectory(dir=sys.argv[2]) as d:
        r = cat.export(10, to=os.path.join(d, "out"))
    return {"bytes": r.nbytes}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0, help="Megatron tree size")
    ap.add_argument("--write", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        write_megatron(Path(args.write), args.gib)
        return
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        gguf = tmp / "llama-70b-q4_k.gguf"
        head = write_70b_gguf(gguf)
        rows = [{"name": "header floor (read the header bytes)",
                 **run_contender(GGUF_FLOOR, str(gguf), str(head))},
                {"name": "ckptview", **run_contender(GGUF_CKPTVIEW, str(gguf))},
                {"name": "gguf-py GGUFReader", **run_contender(GGUF_PEER, str(gguf))}]  # fmt: skip
        out.append(f"### GGUF header of a 70B-sized model ({len(rows)} contenders; header "
                   f"{head / 2**20:.1f} MiB, file {gguf.stat().st_size / 2**30:.0f} GiB sparse)\n\n"
                   + table(rows, rows[0]["name"]))  # fmt: skip
        gguf.unlink()

        root = tmp / "megatron"  # written by a child: this process stays small, so the
        # contenders it forks start from a small peak RSS (Linux keeps ru_maxrss across exec)
        subprocess.run([sys.executable, __file__, "--write", str(root), "--gib", str(args.gib)],
                       check=True)  # fmt: skip
        rows_n = int(args.gib * 2**30 / 4 / 2 / 4096)
        rows_n -= rows_n % 4
        col = row = rows_n * 4096 * 4
        for name, nbytes, dim in (("model/embedding.word_embeddings.weight", col, 0),
                                  ("model/decoder.layers.0.self_attention.linear_proj.weight", row, 1)):  # fmt: skip
            short = name.rsplit("/", 1)[1]
            rows = [{"name": "numpy floor (allocate + fill the tensor)",
                     **run_contender(NUMPY_FLOOR, str(nbytes // 4))},
                    {"name": "ckptview read (4 TP pieces)", **run_contender(READ, str(root), name)}]  # fmt: skip
            if importlib.util.find_spec("torch"):
                rows.append({"name": "torch.load every rank + cat",
                             **run_contender(TORCH_GATHER, str(root), name.split("/", 1)[1],
                                             str(dim))})  # fmt: skip
            lines = [table(rows, rows[0]["name"]), "",
                     "| contender | peak RSS / tensor size |", "|---|---:|"]  # fmt: skip
            for r in rows:
                lines.append(f"| {r['name']} | {r['peak_rss_mib'] * 2**20 / nbytes:.2f} |")
            out.append(f"### Reassembly of `{short}` ({nbytes / 2**20:.0f} MiB, split on dim "
                       f"{dim} over TP=4)\n\n" + "\n".join(lines))  # fmt: skip
        rows = [{"name": "copy floor (copy the rank files)",
                 **run_contender(COPY_FLOOR, str(root), str(tmp))},
                {"name": "ckptview export (safetensors)",
                 **run_contender(EXPORT, str(root), str(tmp))}]  # fmt: skip
        total = sum(f.stat().st_size for f in root.rglob("*.pt"))
        lines = [table(rows, rows[0]["name"]), "", "| contender | MiB/s |", "|---|---:|"]
        for r in rows:
            lines.append(f"| {r['name']} | {total / 2**20 / r['seconds']:.0f} |")
        out.append(f"### Export of a TP=4 Megatron iteration ({total / 2**20:.0f} MiB) vs copying "
                   "its files\n\n" + "\n".join(lines))  # fmt: skip
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
