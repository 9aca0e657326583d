"""GeoPE and N-D RoPE against planar RoPE: q/k rotation, rotation build, and Linear GeoPE attention.

Apply: every case rotates q and k of the same shape, head_dim 96 (GeoPE rotates channel triples, so
D divisible by 3 rotates every channel; planar RoPE uses the same D), 2-D positions of an h × w grid
(64 × 64 for L = 4096, 32 × 64 for L = 2048):

- ``planar_eager`` / ``planar_fused`` / ``planar_compiled``: axial 2-D RoPE (``frequency_matrix("axial")``,
  base 100) with ``ropekit.apply_rotary_qk``, ``apply_rotary_qk_fused``, and the latter compiled;
- ``directional_fused``: directional N-D RoPE (dense ``W`` from ``directional_matrix``) — the same apply
  path, only the angles differ, so it is timed to show that and its angle build is timed separately;
- ``geope_eager``: ``ropekit.apply_geope_qk`` with the rotation built once (blocked eager path);
- ``geope_functional``: the autograd path on the same inputs (the implementation before the blocked one);
- ``geope_compiled``: ``torch.compile(apply_geope_qk, fullgraph=True, dynamic=True)``.

Linear GeoPE: ``linear_geope_attention`` against ``scaled_dot_product_attention`` after axial RoPE on
q/k, one head of dim 96 (and 4 heads at L = 1024); each case runs in a fresh process that reports its
time and the peak extra resident memory of the first call (Linux: the high-water mark ``VmHWM`` reset
just before the call, minus the resident size then).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

import torch

from ropekit import angles, apply_rotary_qk, cos_sin, directional_matrix, frequency_matrix
from ropekit.apply import geope as geope_apply
from ropekit.apply.fused import apply_rotary_qk_fused
from ropekit.apply.geope import apply_geope_qk
from ropekit.rotations.geope import geope_rotation

from .common import timeit_many

SHAPES = [(1, 16, 4096, 96), (8, 32, 2048, 96)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GRIDS = {4096: (64, 64), 2048: (32, 64), 1024: (32, 32)}
BASE = 100.0  # rope-vit's axial base; GeoPE's λ is 100 too
LINEAR_CASES = [(32, 1), (32, 4), (64, 1)]  # (grid side, heads); --quick keeps the first


def grid_positions(h: int, w: int) -> torch.Tensor:
    """Row-major ``(h·w, 2)`` float32 (row, col) positions."""
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack((ys.flatten(), xs.flatten()), -1).float()


def _tables(pos: torch.Tensor, D: int) -> dict:
    W_axial = frequency_matrix("axial", D, 2, base=BASE)
    W_dir = directional_matrix(D, 2, "weyl", base=BASE)
    return {
        "axial": lambda: cos_sin(angles(pos, W_axial)),
        "directional": lambda: cos_sin(angles(pos, W_dir)),
        "geope": lambda: geope_rotation(pos, D, lam=BASE),
    }


def bench_apply(shape, dtype_name: str, *, repeat: int, compiled: dict | None) -> dict:
    B, H, L, D = shape
    dtype = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=g).to(dtype)
    k = torch.randn(shape, generator=g).to(dtype)
    pos = grid_positions(*GRIDS[L])
    build = _tables(pos, D)
    cos, sin = build["axial"]()
    dcos, dsin = build["directional"]()
    rot = build["geope"]()
    n = D // 3

    def functional():
        return tuple(geope_apply._rotate_functional(x, rot, n, -2) for x in (q, k))

    cases = {
        "planar_eager": lambda: apply_rotary_qk(q, k, cos, sin),
        "planar_fused": lambda: apply_rotary_qk_fused(q, k, cos, sin),
        "directional_fused": lambda: apply_rotary_qk_fused(q, k, dcos, dsin),
        "geope_eager": lambda: apply_geope_qk(q, k, rot),
        "geope_functional": functional,
    }
    result = {"shape": list(shape), "dtype": dtype_name, "grid": list(GRIDS[L]), "cases": {}, "compile_s": {}}
    if compiled is not None:
        for name, fn, args in (("planar_compiled", compiled["planar"], (q, k, cos, sin)),
                               ("geope_compiled", compiled["geope"], (q, k, rot))):
            t0 = time.perf_counter()
            fn(*args)
            result["compile_s"][name] = time.perf_counter() - t0
            cases[name] = lambda fn=fn, args=args: fn(*args)
    result["cases"] = timeit_many(cases, warmup=1, repeat=repeat)
    # sanity: the fast GeoPE paths give the autograd path's rotation
    ref = functional()[0].float()
    result["max_abs_diff_vs_geope_functional"] = {
        n_: (cases[n_]()[0].float() - ref).abs().max().item() for n_ in ("geope_eager", "geope_compiled") if n_ in cases
    }
    fused = result["cases"]["planar_fused"]["median_s"]
    eager = result["cases"]["planar_eager"]["median_s"]
    result["ratio_vs_planar_fused"] = {n_: c["median_s"] / fused for n_, c in result["cases"].items()}
    result["ratio_vs_planar_eager"] = {n_: c["median_s"] / eager for n_, c in result["cases"].items()}
    if "planar_compiled" in result["cases"]:
        result["geope_compiled_vs_planar_compiled"] = (
            result["cases"]["geope_compiled"]["median_s"] / result["cases"]["planar_compiled"]["median_s"])
    return result


def bench_build(L: int, D: int, *, repeat: int) -> dict:
    """Once-per-forward cost of the rotation tables: axial and directional cos/sin, GeoPE rotation."""
    res = timeit_many(_tables(grid_positions(*GRIDS[L]), D), warmup=1, repeat=repeat)
    return {"L": L, "head_dim": D, "cases": res}


CHILD = r"""
import json, statistics, sys, time, torch
import torch.nn.functional as F
from ropekit import angles, cos_sin, frequency_matrix
from ropekit.apply.fused import apply_rotary_qk_fused
from ropekit.apply.linear_geope import linear_geope_attention
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
side, H, D, mode = cfg["side"], cfg["heads"], cfg["head_dim"], cfg["mode"]
def inputs(side):
    L = side * side
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    pos = torch.stack((ys.flatten(), xs.flatten()), -1).float()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, L, D, generator=g) for _ in range(3))
    cos, sin = cos_sin(angles(pos, frequency_matrix("axial", D, 2, base=100.0)))
    return q, k, v, pos, cos, sin
def run(q, k, v, pos, cos, sin):
    if mode == "linear_geope":
        return linear_geope_attention(q, k, v, pos, block_size=cfg["block"])
    rq, rk = apply_rotary_qk_fused(q, k, cos, sin)
    return F.scaled_dot_product_attention(rq, rk, v)
with torch.no_grad():
    run(*inputs(4))  # load the kernels' code pages before measuring
args = inputs(side)
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) / 1024.0 for l in f if l.startswith(key))
times = []
with torch.no_grad():
    base = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # reset the resident high-water mark (Linux)
    for i in range(cfg["calls"]):
        t0 = time.perf_counter()
        run(*args)
        times.append(time.perf_counter() - t0)
        if i == 0:
            peak = status("VmHWM")
print(json.dumps({"baseline_mib": round(base, 1), "peak_extra_mib": round(peak - base, 1),
                  "first_s": times[0], "median_s": statistics.median(times[1:] or times), "calls": len(times)}))
"""


def _child(cfg: dict) -> dict:
    # a fixed mmap threshold hands large freed buffers back at once, so the resident peak follows live tensors
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": str(cfg["threads"])}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {**cfg, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return {**cfg, **json.loads(proc.stdout.strip().splitlines()[-1])}


def bench_linear(side: int, heads: int, *, repeat: int, block: int = 128, log=print) -> dict:
    """Linear GeoPE attention vs SDPA after axial RoPE: seconds and peak extra memory (fresh processes)."""
    threads = torch.get_num_threads()
    L = side * side
    long = L >= 4096  # tens of seconds per call: time one call only (two elsewhere: first and second)
    out = {"side": side, "L": L, "heads": heads, "head_dim": 96, "block": block, "threads": threads}
    for mode in ("sdpa_rope", "linear_geope"):
        calls = (1 if long else 2) if mode == "linear_geope" else repeat + 1
        out[mode] = _child({"mode": mode, "side": side, "heads": heads, "head_dim": 96, "block": block,
                            "threads": threads, "calls": calls})
    a, b = out["linear_geope"], out["sdpa_rope"]
    if "error" not in a and "error" not in b:
        out["time_ratio"] = a["median_s"] / b["median_s"]
    return out


def run(*, quick: bool = False, repeat: int = 3, compile_: bool = True, log=print) -> dict:
    """All GeoPE cases; ``quick`` keeps the first shape, skips compilation and runs the smallest attention."""
    shapes = SHAPES[:1] if quick else SHAPES
    compiled = None
    if compile_ and not quick:
        compiled = {"planar": torch.compile(apply_rotary_qk_fused, fullgraph=True, dynamic=True),
                    "geope": torch.compile(apply_geope_qk, fullgraph=True, dynamic=True)}
    res: dict = {"apply": [], "build": [], "linear": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shape in shapes:
            for dtype_name in DTYPES:
                r = bench_apply(shape, dtype_name, repeat=repeat, compiled=compiled)
                log(_line(r))
                res["apply"].append(r)
            res["build"].append(bench_build(shape[2], shape[3], repeat=repeat))
            log(f"geope build L={shape[2]}: " + ", ".join(
                f"{n} {c['median_s'] * 1e3:.2f} ms" for n, c in res["build"][-1]["cases"].items()))
        for side, heads in LINEAR_CASES[:1] if quick else LINEAR_CASES:
            r = bench_linear(side, heads, repeat=repeat, log=log)
            log(f"linear geope L={r['L']} H={heads}: " + ", ".join(
                f"{m} {r[m].get('median_s', float('nan')):.3f} s / {r[m].get('peak_extra_mib', float('nan'))} MiB"
                for m in ("sdpa_rope", "linear_geope")))
            res["linear"].append(r)
    return res


def _line(r: dict) -> str:
    ratio = r["ratio_vs_planar_fused"]
    return (f"geope apply {tuple(r['shape'])} {r['dtype']}: " + ", ".join(
        f"{n} {c['median_s'] * 1e3:.1f} ms (x{ratio[n]:.2f})" for n, c in r["cases"].items()) + " [x = / planar_fused]")
