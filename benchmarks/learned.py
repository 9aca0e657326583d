"""Learned rotary families (LieRE, ComRoPE, GRAPE) against axial RoPE on a ViT-sized attention input.

Every case rotates q and k ``(B, H, L, D)`` at the 2-D patch grid, building its rotation from the
coordinates as a training step does (the learned families recompute it from their weights on every
forward). ``forward`` times the rotation alone; ``forward_backward`` adds the backward pass of
``(q_rot · k_rot).sum()`` into the weights and q/k. Ratios are against axial 2-D RoPE (base 100) in the
same run: ``python -m benchmarks.run --only learned``.
"""
from __future__ import annotations

import torch

import ropekit

from .common import timeit_many

SHAPES = [(8, 12, 196, 64), (2, 12, 1024, 64)]  # ViT-B/16 at 224² and at 512², one layer's q/k


def _families(D: int) -> dict:
    return {
        "axial_rope": ropekit.RoPE("rope2d", head_dim=D, allocation="axial", base=100.0),
        "liere_dense": ropekit.LieRE(D, seed=0),
        "liere_block8": ropekit.LieRE(D, block_size=8, seed=0),
        "comrope_ap": ropekit.ComRoPE(D, variant="ap", seed=0),
        "comrope_ld": ropekit.ComRoPE(D, variant="ld", seed=0),
        "grape_learned": ropekit.GRAPE(D, 2, mode="interleaved", init_scale=0.5, seed=0),
    }


def _cases(shape) -> dict:
    B, H, L, D = shape
    side = int(L ** 0.5)
    grid = ropekit.positions(f"G{side}x{side}", "rope2d")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    cases = {}
    for name, fam in _families(D).items():
        def fwd(fam=fam):
            with torch.no_grad():
                return fam.rotate(q, k, grid)

        def fwd_bwd(fam=fam):
            rq, rk = fam.rotate(qg, kg, grid)
            (rq * rk).sum().backward()

        cases[f"{name}/forward"] = fwd
        cases[f"{name}/forward_backward"] = fwd_bwd
    return cases


def run(*, quick: bool = False, repeat: int = 3, log=print) -> list[dict]:
    out = []
    for shape in SHAPES[:1] if quick else SHAPES:
        times = timeit_many(_cases(shape), repeat=repeat)
        for mode in ("forward", "forward_backward"):
            ref = times[f"axial_rope/{mode}"]["median_s"]
            row = {n.split("/")[0]: {**t, "vs_axial_rope": t["median_s"] / ref}
                   for n, t in times.items() if n.endswith("/" + mode)}
            out.append({"shape": list(shape), "mode": mode, "dtype": "float32", "cases": row})
            log(f"  {tuple(shape)} {mode}: " + ", ".join(
                f"{n} {v['median_s'] * 1e3:.1f} ms ({v['vs_axial_rope']:.1f}x axial)" for n, v in row.items()))
    return out
