"""rope_index of this checkout against an older ropekit, per design, in one process: ``python -m
benchmarks.index_compare OLD_PARENT [--threads N] [--repeat R] [--out FILE] [design ...]``.

``OLD_PARENT`` is a folder holding an older ``src/ropekit`` copied under the package name ``ropekit_base``
(``git archive <commit> src/ropekit | tar -x -C /tmp/old && mv /tmp/old/src/ropekit /tmp/old/ropekit_base``;
the package imports itself relatively, so it works under any name). On the :data:`benchmarks.index.TARGET`
batch, each design is timed in three round-robin pairs with transformers' ``get_rope_index``: the older
ropekit, this one (blocks kept from the warm-up call, see :mod:`ropekit.block_cache`), and this one with
nothing kept (the cache emptied before every call). Both versions' results are asserted identical first.
Ratios are of medians of CPU time (``time.process_time``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import torch

from .common import machine, pin_allocator, timeit_many


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.index_compare", description=__doc__.splitlines()[0])
    p.add_argument("old_parent", help="folder holding the older package as ropekit_base/")
    p.add_argument("designs", nargs="*", help="designs to time (default: every design with a block rule)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=11)
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.abspath(args.old_parent))
    import ropekit
    import ropekit_base
    from ropekit import block_cache

    from . import index as ib

    warnings.simplefilter("ignore")
    info = machine()
    info["allocator"] = pin_allocator("steady")
    model = ib._hf_model()
    inputs = ib.make_batch(ib.TARGET["batch"], seed=ib.TARGET["seed"], min_len=ib.TARGET["min_len"],
                           max_len=ib.TARGET["max_len"])
    theirs = lambda: model.get_rope_index(**inputs)  # noqa: E731
    names = args.designs or [n for n in ropekit.designs() if ropekit.get_design(n).block_rule is not None]
    out = {"machine": info, "old": ropekit_base.__file__, "repeat": args.repeat, "designs": {}}
    print(f"threads {args.threads}, load {os.getloadavg()}", flush=True)
    with torch.no_grad():
        for name in names:
            opts = {"continuation": "spatial"} if name == "mrope" else {}
            new = lambda name=name, opts=opts: ropekit.rope_index(**inputs, design=name, **opts)  # noqa: E731
            pairs = {}
            if name in ropekit_base.designs():
                old = lambda name=name, opts=opts: ropekit_base.rope_index(**inputs, design=name, **opts)  # noqa: E731
                a, b = old(), new()
                if not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])):
                    raise AssertionError(f"{name}: the two versions differ")
                pairs["before"] = old
            pairs["kept"] = new
            pairs["nothing_kept"] = lambda new=new: (block_cache.clear(), new())
            row = {}
            for label, fn in pairs.items():
                t = timeit_many({"transformers": theirs, "ropekit": fn}, warmup=1, repeat=args.repeat)
                row[label] = {**t, "speedup_cpu": t["transformers"]["cpu_median_s"] / t["ropekit"]["cpu_median_s"]}
            out["designs"][name] = row
            print(f"{name:<10} " + "  ".join(f"{k} ×{v['speedup_cpu']:.1f} ({v['ropekit']['cpu_median_s'] * 1e3:.2f} ms)"
                                             for k, v in row.items()), flush=True)
    out["load_after"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
