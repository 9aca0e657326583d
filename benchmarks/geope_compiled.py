"""Compiled GeoPE against compiled planar RoPE, side by side, at one and two torch threads.

For each thread count a fresh process compiles, with ``torch.compile(..., fullgraph=True, dynamic=True)``:
``planar_compiled`` (``apply_rotary_qk_fused``, axial 2-D RoPE, base 100), ``geope_compiled`` (``apply_geope_qk``
in the paper's interleaved layout, which on CPU calls the compiled kernel of ``ropekit.apply._cpu_kernel``),
``thirds_compiled`` (the same with ``channels="thirds"`` and a rotation built for it), and ``geope_traced``
(the interleaved layout's in-triple form as Inductor traced it before the kernel, for context). Then
``rounds`` interleaved rounds (every case once per round, in turn, so load from other jobs falls on all
alike) on the same q/k. Reported per case: median wall time, and the median over rounds of the ratio to
``planar_compiled`` in the same round, in wall time and in process CPU time. Each process also checks that
compiled GeoPE equals the blocked eager path (``ROPEKIT_COMPILE=0``) bit for bit.

``python -m benchmarks.geope_compiled [--rounds N] [--threads 1 2] [--shapes small|all]`` writes
``benchmarks/results/geope_compiled.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

SHAPES = {"small": [(1, 16, 4096, 96)], "all": [(1, 16, 4096, 96), (8, 32, 2048, 96)]}
DTYPES = ("float32", "bfloat16")


def _measure(shape, dtype_name: str, rounds: int, fns: dict) -> dict:
    import torch

    from ropekit.apply import geope as geo
    from ropekit.apply.geope import apply_geope_qk

    from .geope import GRIDS, _tables, grid_positions

    dtype = getattr(torch, dtype_name)
    B, H, L, D = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=g).to(dtype)
    k = torch.randn(shape, generator=g).to(dtype)
    tables = _tables(grid_positions(*GRIDS[L]), D)
    cos, sin = tables["axial"]()
    rot, rot3 = tables["geope"](), tables["geope_thirds"]()
    cases = {
        "planar_compiled": lambda: fns["planar"](q, k, cos, sin),
        "geope_compiled": lambda: fns["geope"](q, k, rot),
        "thirds_compiled": lambda: fns["geope"](q, k, rot3, channels="thirds"),
        "geope_traced": lambda: fns["traced"](q, k, rot.triples),
    }
    compile_s = {}
    for name, fn in cases.items():  # compile (first call) and warm up
        t0 = time.perf_counter()
        fn()
        compile_s[name] = time.perf_counter() - t0
        fn()
    wall = {n: [] for n in cases}
    cpu = {n: [] for n in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    os.environ["ROPEKIT_COMPILE"] = "0"  # the blocked eager path, not the kernel
    try:
        ref = apply_geope_qk(q, k, rot)
    finally:
        os.environ["ROPEKIT_COMPILE"] = "1"
    out = cases["geope_compiled"]()
    base_w, base_c = wall["planar_compiled"], cpu["planar_compiled"]
    res = {"shape": list(shape), "dtype": dtype_name, "rounds": rounds, "compile_s": compile_s, "cases": {},
           "geope_compiled_equals_eager": all(torch.equal(a, b) for a, b in zip(out, ref)),
           "geope_compiled_max_abs_diff_vs_eager": max((a.float() - b.float()).abs().max().item()
                                                      for a, b in zip(out, ref))}
    for name in cases:
        res["cases"][name] = {
            "median_s": statistics.median(wall[name]),
            "ratio_wall": statistics.median(a / b for a, b in zip(wall[name], base_w)),
            "ratio_cpu": statistics.median(a / b for a, b in zip(cpu[name], base_c)),
            "ratio_wall_p10_p90": [statistics.quantiles([a / b for a, b in zip(wall[name], base_w)], n=10)[i]
                                   for i in (0, -1)] if rounds >= 2 else None,
        }
    return res


def child(cfg: dict) -> dict:
    import torch

    from .common import pin_allocator

    allocator = pin_allocator("steady")  # as the other suites: large blocks reused, not mapped afresh per call
    torch.set_num_threads(cfg["threads"])
    from ropekit.apply import geope as geo
    from ropekit.apply.fused import apply_rotary_qk_fused
    from ropekit.apply.geope import apply_geope_qk

    def traced(q, k, triples):
        n = triples.shape[-2]
        return geo._rotate_coeff_functional(q, triples, n, -2), geo._rotate_coeff_functional(k, triples, n, -2)

    fns = {"planar": torch.compile(apply_rotary_qk_fused, fullgraph=True, dynamic=True),
           "geope": torch.compile(apply_geope_qk, fullgraph=True, dynamic=True),
           "traced": torch.compile(traced, fullgraph=True, dynamic=True)}
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shape in cfg["shapes"]:
            for dtype_name in DTYPES:
                rounds = cfg["rounds"] if shape[0] * shape[1] * shape[2] <= 1 << 16 else max(3, cfg["rounds"] // 4)
                out.append(_measure(tuple(shape), dtype_name, rounds, fns))
    return {"threads": cfg["threads"], "torch_threads": torch.get_num_threads(), "allocator": allocator,
            "results": out}


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def run(*, threads=(1, 2), rounds: int = 31, shapes: str = "small", log=print) -> dict:
    root = Path(__file__).resolve().parent.parent
    runs = []
    for t in threads:
        cfg = {"threads": t, "rounds": rounds, "shapes": SHAPES[shapes]}
        env = {**os.environ, "OMP_NUM_THREADS": str(t),
               "PYTHONPATH": os.pathsep.join([str(root), str(root / "src"), os.environ.get("PYTHONPATH", "")])}
        load0 = _load()
        proc = subprocess.run([sys.executable, "-m", "benchmarks.geope_compiled", "--child", json.dumps(cfg)],
                              capture_output=True, text=True, env=env, cwd=root)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-3000:])
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["load_before_after"] = [load0, _load()]
        runs.append(r)
        for x in r["results"]:
            log(f"{t} thread(s) {tuple(x['shape'])} {x['dtype']}: " + ", ".join(
                f"{n} {c['median_s'] * 1e3:.2f} ms x{c['ratio_wall']:.2f} (cpu x{c['ratio_cpu']:.2f})"
                for n, c in x["cases"].items()) + f"; equals eager: {x['geope_compiled_equals_eager']}"
                + f"; load {r['load_before_after'][0]:.1f}-{r['load_before_after'][1]:.1f}")
    return {"runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child")
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--shapes", choices=sorted(SHAPES), default="small")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "geope_compiled.json")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    from .common import machine

    res = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
           **run(threads=args.threads, rounds=args.rounds, shapes=args.shapes)}
    args.out.write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
