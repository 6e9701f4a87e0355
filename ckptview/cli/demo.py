"""``ckptview demo DIR``: write the bundled demo tree (a Paddle 2018 fluid run)."""

from __future__ import annotations

from pathlib import Path

from ..demo import SEED, write_demo, write_sweep
from . import CLIError


def register(sub) -> None:
    p = sub.add_parser(
        "demo", help="write a demo checkpoint tree (Paddle 2018 fluid layout) into DIR"
    )
    p.add_argument("dir", metavar="DIR", help="directory to create (must be absent or empty)")
    p.add_argument("--serials", type=int, default=8, help="serials, the crashed last one included")
    p.add_argument("--scale", type=int, default=1, help="make the big tensors SCALE times bigger")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fixed)")
    p.add_argument("--complete", action="store_true", help="no crashed serial at the end")
    p.add_argument("--experiment", action="store_true",
                   help="write a small sweep instead: runs of several formats and lengths, one "
                   "diverged (NaNs), one crashed (its last serial incomplete)")  # fmt: skip
    p.set_defaults(func=run)


def run(args) -> int:
    if args.serials < 1 or args.scale < 1:
        raise CLIError("--serials and --scale must be at least 1")
    target = Path(args.dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise CLIError(f"{target} exists and is not an empty directory")
    seed = SEED if args.seed is None else args.seed
    if args.experiment:
        runs = write_sweep(target, seed)
        print(f"wrote {target}: an experiment of {len(runs)} runs "
              f"({', '.join(r.name for r in runs)}); try: ckptview ls {target}")  # fmt: skip
        return 0
    tree = write_demo(target, args.serials, args.scale, seed, incomplete=not args.complete)
    done = sum(s.complete for s in tree.serials)
    print(
        f"wrote {target}: {len(tree.serials)} serials ({done} complete, latest {tree.latest}), "
        f"{tree.nbytes / 1e6:.1f} MB"
    )
    return 0
