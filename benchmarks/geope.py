"""GeoPE and N-D RoPE against planar RoPE: q/k rotation, rotation build, and Linear GeoPE attention.

Apply: every case rotates q and k of the same shape, head_dim 96 (GeoPE rotates channel triples, so
D divisible by 3 rotates every channel; planar RoPE uses the same D), 2-D positions of an h × w grid
(64 × 64 for L = 4096, 32 × 64 for L = 2048):

- ``planar_eager`` / ``planar_fused`` / ``planar_compiled``: axial 2-D RoPE (``frequency_matrix("axial")``,
  base 100) with ``ropekit.apply_rotary_qk``, ``apply_rotary_qk_fused(..., compiled=False)`` (its eager
  blocks, the counterpart of GeoPE's eager path), and ``apply_rotary_qk_fused`` under ``torch.compile``;
- ``directional_fused``: directional N-D RoPE (dense ``W`` from ``directional_matrix``) — the same apply
  path, only the angles differ, so it is timed to show that and its angle build is timed separately;
- ``geope_eager``: ``ropekit.apply_geope_qk`` with the rotation built once (blocked eager path);
- ``geope_functional``: the autograd path on the same inputs (the implementation before the blocked one);
- ``geope_compiled``: ``torch.compile(apply_geope_qk, fullgraph=True, dynamic=True)``;
- ``thirds_eager`` / ``thirds_compiled``: the same two paths with ``channels="thirds"`` (triple i =
  channels i, n+i, 2n+i) and a rotation built for that layout; the same rotation on permuted channels.

Linear GeoPE: ``linear_geope_attention`` against ``scaled_dot_product_attention`` after axial RoPE on
q/k, one head of dim 96 (and 4 heads at L = 1024), forward and forward + backward; each case runs in a
fresh process: one warm-up call of each (Linear GeoPE compiles its fused kernel there, ``first_s``), then
interleaved calls, reporting median times, the median per-pair ratio and the peak extra resident memory
of the first measured call (Linux: the high-water mark ``VmHWM`` reset just before the call, minus the
resident size then).
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
LINEAR_CASES = [(32, 1, False), (32, 4, False), (64, 1, False), (32, 1, True), (64, 1, True)]  # (side, heads, backward)


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
        "geope_thirds": lambda: geope_rotation(pos, D, lam=BASE, channels="thirds"),
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
    rot3 = build["geope_thirds"]()
    n = D // 3

    def functional():
        return tuple(geope_apply._rotate_functional(x, rot, n, -2) for x in (q, k))

    cases = {
        "planar_eager": lambda: apply_rotary_qk(q, k, cos, sin),
        # the fused path's eager blocks (large calls would otherwise take its compiled kernel)
        "planar_fused": lambda: apply_rotary_qk_fused(q, k, cos, sin, compiled=False),
        "directional_fused": lambda: apply_rotary_qk_fused(q, k, dcos, dsin, compiled=False),
        "geope_eager": lambda: apply_geope_qk(q, k, rot),
        "geope_functional": functional,
        "thirds_eager": lambda: apply_geope_qk(q, k, rot3, channels="thirds"),
    }
    result = {"shape": list(shape), "dtype": dtype_name, "grid": list(GRIDS[L]), "cases": {}, "compile_s": {}}
    if compiled is not None:
        for name, fn, args, kw in (("planar_compiled", compiled["planar"], (q, k, cos, sin), {}),
                                   ("geope_compiled", compiled["geope"], (q, k, rot), {}),
                                   ("thirds_compiled", compiled["geope"], (q, k, rot3), {"channels": "thirds"})):
            t0 = time.perf_counter()
            fn(*args, **kw)
            result["compile_s"][name] = time.perf_counter() - t0
            cases[name] = lambda fn=fn, args=args, kw=kw: fn(*args, **kw)
    result["cases"] = timeit_many(cases, warmup=1, repeat=repeat)
    # sanity: the fast GeoPE paths give the autograd path's rotation
    ref = functional()[0].float()
    result["max_abs_diff_vs_geope_functional"] = {
        n_: (cases[n_]()[0].float() - ref).abs().max().item() for n_ in ("geope_eager", "geope_compiled") if n_ in cases
    }
    ref3 = geope_apply._rotate_functional(q, rot3, n, -2, "thirds").float()
    result["max_abs_diff_vs_geope_functional"].update({
        n_: (cases[n_]()[0].float() - ref3).abs().max().item() for n_ in ("thirds_eager", "thirds_compiled") if n_ in cases
    })
    fused = result["cases"]["planar_fused"]["median_s"]
    eager = result["cases"]["planar_eager"]["median_s"]
    result["ratio_vs_planar_fused"] = {n_: c["median_s"] / fused for n_, c in result["cases"].items()}
    result["ratio_vs_planar_eager"] = {n_: c["median_s"] / eager for n_, c in result["cases"].items()}
    if "planar_compiled" in result["cases"]:
        for name in ("geope_compiled", "thirds_compiled"):
            result[f"{name}_vs_planar_compiled"] = (
                result["cases"][name]["median_s"] / result["cases"]["planar_compiled"]["median_s"])
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
side, H, D, grad = cfg["side"], cfg["heads"], cfg["head_dim"], cfg["grad"]
def inputs(side):
    L = side * side
    ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    pos = torch.stack((ys.flatten(), xs.flatten()), -1).float()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, L, D, generator=g).requires_grad_(grad) for _ in range(3))
    cos, sin = cos_sin(angles(pos, frequency_matrix("axial", D, 2, base=100.0)))
    return q, k, v, pos, cos, sin
def run(mode, q, k, v, pos, cos, sin):
    with torch.set_grad_enabled(grad):
        if mode == "linear_geope":
            out = linear_geope_attention(q, k, v, pos, block_size=cfg["block"])
        else:
            rq, rk = apply_rotary_qk_fused(q, k, cos, sin)
            out = F.scaled_dot_product_attention(rq, rk, v)
        if grad:
            torch.autograd.grad(out.sum(), (q, k, v))
args = inputs(side)
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) / 1024.0 for l in f if l.startswith(key))
modes = ("sdpa_rope", "linear_geope")
res = {m: {"times": []} for m in modes}
for m in modes:  # warm-up at the measured shapes: loads code pages and compiles Linear GeoPE's kernel
    t0 = time.perf_counter()
    run(m, *args)
    res[m]["first_s"] = time.perf_counter() - t0
for i in range(cfg["calls"]):  # interleaved, so load from other jobs hits both modes alike
    for m in modes:
        base = status("VmRSS")
        open("/proc/self/clear_refs", "w").write("5")  # reset the resident high-water mark (Linux)
        t0 = time.perf_counter()
        run(m, *args)
        res[m]["times"].append(time.perf_counter() - t0)
        if i == 0:
            res[m]["baseline_mib"], res[m]["peak_extra_mib"] = round(base, 1), round(status("VmHWM") - base, 1)
for m in modes:
    res[m]["median_s"] = statistics.median(res[m]["times"])
    res[m]["calls"] = cfg["calls"]
pairs = [a / b for a, b in zip(res["linear_geope"]["times"], res["sdpa_rope"]["times"])]
print(json.dumps({**res, "pair_ratios": pairs, "time_ratio": statistics.median(pairs)}))
"""


def _child(cfg: dict) -> dict:
    # a fixed mmap threshold hands large freed buffers back at once, so the resident peak follows live tensors
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": str(cfg["threads"])}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        err = {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
        return {**cfg, "sdpa_rope": err, "linear_geope": err}
    return {**cfg, **json.loads(proc.stdout.strip().splitlines()[-1])}


def bench_linear(side: int, heads: int, *, grad: bool = False, calls: int = 3, block: int = 128, threads=None) -> dict:
    """Linear GeoPE attention vs SDPA after axial RoPE in one fresh process: after a warm-up call of each
    (Linear GeoPE compiles its kernel there), ``calls`` interleaved calls; the time ratio is the median of
    the per-pair ratios, the peak extra memory that of the first measured call. ``grad``: forward and
    backward (gradients of q, k, v)."""
    threads = torch.get_num_threads() if threads is None else threads
    cfg = {"side": side, "L": side * side, "heads": heads, "head_dim": 96, "block": block, "threads": threads,
           "grad": grad, "calls": calls}
    return _child(cfg)


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
        for side, heads, grad in LINEAR_CASES[:1] if quick else LINEAR_CASES:
            r = bench_linear(side, heads, grad=grad, calls=repeat)
            log(f"linear geope L={r['L']} H={heads}{' fwd+bwd' if grad else ''}: " + ", ".join(
                f"{m} {r[m].get('median_s', float('nan')):.3f} s / {r[m].get('peak_extra_mib', float('nan'))} MiB"
                for m in ("sdpa_rope", "linear_geope")) + f", ratio {r.get('time_ratio', float('nan')):.1f}")
            res["linear"].append(r)
    return res


def _line(r: dict) -> str:
    ratio = r["ratio_vs_planar_fused"]
    return (f"geope apply {tuple(r['shape'])} {r['dtype']}: " + ", ".join(
        f"{n} {c['median_s'] * 1e3:.1f} ms (x{ratio[n]:.2f})" for n, c in r["cases"].items()) + " [x = / planar_fused]")
