"""Run the benchmarks side by side with the peers and write JSON: ``python -m benchmarks.run [--quick]``.

Run from the repository root. Each suite writes ``benchmarks/results/<suite>.json`` holding the
machine description (CPU, torch threads, versions), the copy bandwidth measured in the same process,
and per case the shape, dtype and median/min/max seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from . import apply as apply_bench
from . import curves as curves_bench
from . import experiments as experiments_bench
from . import geope as geope_bench
from . import hf_e2e as hf_bench
from . import index as index_bench
from . import learned as learned_bench
from . import packing as packing_bench
from . import pointcloud as pointcloud_bench
from . import variants as variants_bench
from .common import ALLOCATOR_MODES, copy_bandwidth, machine, pin_allocator

SUITES = ("apply", "index", "geope", "variants", "learned", "experiments", "curves", "hf", "pointcloud", "packing")
RESULTS = Path(__file__).resolve().parent / "results"


def _ratio_table(results: list[dict], bw: float) -> list[str]:
    lines = []
    for r in results:
        c = r["cases"]
        hf = c["transformers_qwen2vl"]["median_s"]
        parts = [f"{n} {hf / v['median_s']:.2f}x ({v['bytes_per_s'] / bw:.0%} copy bw)" for n, v in c.items()]
        lines.append(f"  {tuple(r['shape'])} {r['dtype']} {r['positions']}: speed vs transformers: " + ", ".join(parts))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="first shape and smallest batch only")
    p.add_argument("--only", choices=SUITES, action="append", help="run only this suite (repeatable)")
    p.add_argument("--repeat", type=int, default=None, help="timed repeats per case (default 3)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile'd fused path")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON results")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads before running")
    p.add_argument("--allocator", choices=ALLOCATOR_MODES, default="steady",
                   help="steady (default): fix glibc malloc's mmap threshold so no case pays page faults "
                        "that another escapes; default: leave malloc alone")
    args = p.parse_args(argv)
    if args.repeat is not None and args.repeat < 1:
        p.error("--repeat must be >= 1")
    if args.threads is not None:
        if args.threads < 1:
            p.error("--threads must be >= 1")
        import torch

        torch.set_num_threads(args.threads)
    repeat = args.repeat or 3
    suites = args.only or list(SUITES)
    args.out.mkdir(parents=True, exist_ok=True)

    info = machine()
    info["allocator"] = pin_allocator(args.allocator)
    print(f"machine: {info['cpu']}, {info['cpu_count']} cores, torch {info['torch']} "
          f"with {info['torch_threads']} threads; malloc: {info['allocator']}", flush=True)
    bw = copy_bandwidth(repeat=repeat)
    print(f"copy bandwidth: {bw['bytes_per_s'] / 1e9:.2f} GB/s (read + write)", flush=True)
    header = {"machine": info, "copy_bandwidth": bw, "quick": args.quick, "repeat": repeat,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}

    log = lambda s: print(s, flush=True)
    if "apply" in suites:
        res = apply_bench.run(quick=args.quick, repeat=repeat, compile_fused=not args.no_compile, log=log)
        for line in _ratio_table(res, bw["bytes_per_s"]):
            print(line)
        _write(args.out / "apply.json", {**header, "results": res})
    compile_ = not args.no_compile
    plain = {  # suites that only run and write their JSON
        "index": lambda: index_bench.run(quick=args.quick, repeat=repeat, log=log),
        "geope": lambda: geope_bench.run(quick=args.quick, repeat=repeat, compile_=compile_, log=log),
        "variants": lambda: variants_bench.run(quick=args.quick, repeat=repeat, log=log),
        "learned": lambda: learned_bench.run(quick=args.quick, repeat=repeat, log=log),
        "experiments": lambda: experiments_bench.run(quick=args.quick, repeat=repeat, log=log),
        "curves": lambda: curves_bench.run(quick=args.quick, repeat=repeat, log=log),
        "hf": lambda: hf_bench.run(quick=args.quick, repeat=repeat, log=log),
        "pointcloud": lambda: pointcloud_bench.run(quick=args.quick, repeat=repeat, log=log),
        "packing": lambda: packing_bench.run(quick=args.quick, repeat=repeat, log=log),
    }
    for name, run in plain.items():
        if name not in suites:
            continue
        res = run()
        _write(args.out / f"{name}.json", {**header, "results": res})
        if name == "curves":
            curves_bench.plot(res, args.out / "curves.png")
            print(f"wrote {args.out / 'curves.png'}", flush=True)
    return 0


def _write(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
