"""Cost curves: how each stage's time grows with the sequence length (and the batch), next to the peers.

``python -m benchmarks.run --only curves`` sweeps

- **apply**: q/k rotation of ``(1, 4, L, 128)`` bfloat16, 1-D positions, L = 1k … 64k, and ``(B, 4, 4096, 128)``
  for B = 1 … 16: ropekit's fused eager path against transformers' Qwen2-VL ``apply_rotary_pos_emb`` and
  rotary-embedding-torch's ``apply_rotary_emb``;
- **rope_index**: batches of 1 … 32 samples of about 2k tokens with images and videos (2k … 64k tokens),
  ropekit's ``rope_index`` per design against transformers' ``get_rope_index``;
- **GeoPE**: q/k of ``(1, 4, L, 96)`` float32 on an h × w grid (L = 1k … 64k), ``apply_geope_qk`` with the
  rotation built once, against axial 2-D RoPE through ropekit's fused path and rotary-embedding-torch;
- **Linear GeoPE**: one head of dim 96, L = 256 … 2048 (quadratic: it stops where a call takes seconds),
  against SDPA after axial RoPE.

At each size the cases run round-robin (``timeit_many``); medians are kept. The slope of a least-squares
line through ``log t`` against ``log size`` is the growth exponent (≈ 1 linear, ≈ 2 quadratic); it is
fitted over the sizes from ``FIT_FROM`` on, where fixed per-call costs no longer dominate.
:func:`plot` draws the log-log curves into one PNG.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch

from .common import timeit_many

APPLY_L = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
APPLY_B = [1, 2, 4, 8, 16]
INDEX_BATCH = [1, 2, 4, 8, 16, 32]
INDEX_DESIGNS = ("mrope", "vrope", "circle")
GEOPE_GRIDS = [(32, 32), (32, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256)]
LINEAR_GRIDS = [(16, 16), (16, 32), (32, 32), (32, 64)]
FIT_FROM = {"apply_L": 4096, "apply_B": 1, "rope_index": 8000, "geope": 4096, "linear_geope": 512}


def fit_slope(sizes: list[float], times: list[float], start: float) -> float | None:
    """Least-squares slope of log(time) against log(size) over sizes >= ``start`` (None below 2 points)."""
    pts = [(math.log(s), math.log(t)) for s, t in zip(sizes, times) if s >= start]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def _apply_cases(B: int, L: int, H: int = 4, D: int = 128) -> dict:
    from rotary_embedding_torch import apply_rotary_emb
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    from ropekit.apply.fused import apply_rotary_qk_fused

    from .apply import _coords, _hf_rotary, _ret_freqs, _ropekit_cos_sin

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, H, L, D, generator=g).bfloat16() for _ in range(2))
    coords = _coords("1d", B, L)
    cos, sin = _ropekit_cos_sin("1d", coords, D)
    hf_cos, hf_sin = _hf_rotary(H, D)(q, coords.permute(2, 0, 1).long().expand(3, B, L))
    freqs = _ret_freqs("1d", L, D)
    return {
        "ropekit_fused": lambda: apply_rotary_qk_fused(q, k, cos, sin),
        "transformers": lambda: apply_rotary_pos_emb(q, k, hf_cos, hf_sin),
        "rotary_embedding_torch": lambda: (apply_rotary_emb(freqs, q), apply_rotary_emb(freqs, k)),
    }


def _index_cases(batch: int, model) -> tuple[int, dict]:
    from ropekit.index import rope_index

    from .index import MERGE, make_batch

    inputs = make_batch(batch, seed=100 + batch, min_len=1536, max_len=2560)
    cases = {"transformers": lambda: model.get_rope_index(**inputs)}
    for design in INDEX_DESIGNS:
        opts = {"continuation": "spatial"} if design == "mrope" else {}
        cases[f"ropekit_{design}"] = (
            lambda design=design, opts=opts: rope_index(**inputs, design=design, spatial_merge_size=MERGE, **opts))
    return int(inputs["attention_mask"].sum()), cases


def _geope_cases(h: int, w: int, H: int = 4, D: int = 96) -> dict:
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb

    from ropekit import apply_geope_qk
    from ropekit.apply.fused import apply_rotary_qk_fused

    from .geope import _tables, grid_positions

    L = h * w
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, H, L, D, generator=g) for _ in range(2))
    tables = _tables(grid_positions(h, w), D)
    cos, sin = tables["axial"]()
    rot = tables["geope"]()
    freqs = RotaryEmbedding(dim=D // 2, theta=100.0, cache_if_possible=False).get_axial_freqs(h, w).reshape(L, D)
    return {
        "ropekit_geope": lambda: apply_geope_qk(q, k, rot),
        "ropekit_axial_fused": lambda: apply_rotary_qk_fused(q, k, cos, sin),
        "rotary_embedding_torch_axial": lambda: (apply_rotary_emb(freqs, q), apply_rotary_emb(freqs, k)),
    }


def _linear_cases(h: int, w: int, D: int = 96) -> dict:
    import torch.nn.functional as F

    from ropekit import angles, cos_sin, frequency_matrix
    from ropekit.apply.fused import apply_rotary_qk_fused
    from ropekit.apply.linear_geope import linear_geope_attention

    from .geope import grid_positions

    pos = grid_positions(h, w)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, h * w, D, generator=g) for _ in range(3))
    cos, sin = cos_sin(angles(pos, frequency_matrix("axial", D, 2, base=100.0)))

    def sdpa():
        rq, rk = apply_rotary_qk_fused(q, k, cos, sin)
        return F.scaled_dot_product_attention(rq, rk, v)

    return {"ropekit_linear_geope": lambda: linear_geope_attention(q, k, v, pos), "sdpa_axial_rope": sdpa}


def _sweep(name: str, sizes: list, make, *, repeat: int, log) -> dict:
    points = []
    for size in sizes:
        made = make(size)
        x, cases = made if isinstance(made, tuple) else (size, made)
        with torch.no_grad():
            t = timeit_many(cases, warmup=1, repeat=repeat)
        points.append({"size": x, "cases": t})
        log(f"curves {name} {x}: " + ", ".join(f"{n} {c['median_s'] * 1e3:.1f} ms" for n, c in t.items()))
        del cases
    names = list(points[0]["cases"])
    slopes = {n: fit_slope([p["size"] for p in points], [p["cases"][n]["median_s"] for p in points], FIT_FROM[name])
              for n in names}
    return {"points": points, "slopes": slopes, "fit_from": FIT_FROM[name]}


def run(*, quick: bool = False, repeat: int = 3, log=print) -> dict:
    """Every sweep; ``quick`` stops each at a quarter of its largest size."""
    from .index import _hf_model

    cut = (lambda xs: xs[: max(2, len(xs) - 2)]) if quick else (lambda xs: xs)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["apply_L"] = _sweep("apply_L", cut(APPLY_L), lambda L: _apply_cases(1, L), repeat=repeat, log=log)
        out["apply_B"] = _sweep("apply_B", cut(APPLY_B), lambda B: _apply_cases(B, 4096), repeat=repeat, log=log)
        model = _hf_model()
        out["rope_index"] = _sweep("rope_index", cut(INDEX_BATCH), lambda b: _index_cases(b, model),
                                   repeat=repeat, log=log)
        out["geope"] = _sweep("geope", cut(GEOPE_GRIDS), lambda hw: (hw[0] * hw[1], _geope_cases(*hw)),
                              repeat=repeat, log=log)
        out["linear_geope"] = _sweep("linear_geope", cut(LINEAR_GRIDS), lambda hw: (hw[0] * hw[1], _linear_cases(*hw)),
                                     repeat=repeat, log=log)
    return out


TITLES = {
    "apply_L": ("q/k apply, (1, 4, L, 128) bf16", "sequence length L"),
    "apply_B": ("q/k apply, (B, 4, 4096, 128) bf16", "batch B"),
    "rope_index": ("rope_index, ~2k-token samples", "tokens in the batch"),
    "geope": ("GeoPE apply, (1, 4, L, 96) f32", "sequence length L"),
    "linear_geope": ("Linear GeoPE attention, 1 head", "sequence length L"),
}


def plot(results: dict, path: Path) -> None:
    """Log-log panels, one per sweep, each case's slope in its legend label."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 9))
    for ax, (name, (title, xlabel)) in zip(axes.flat, TITLES.items()):
        if name not in results:
            ax.set_visible(False)
            continue
        res = results[name]
        xs = [p["size"] for p in res["points"]]
        for case, slope in res["slopes"].items():
            ys = [p["cases"][case]["median_s"] * 1e3 for p in res["points"]]
            label = f"{case} (slope {slope:.2f})" if slope is not None else case
            ax.plot(xs, ys, marker="o", ls="-" if case.startswith("ropekit") else ":", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("median time per call (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes.flat[-1].set_visible(False)
    fig.suptitle("ropekit cost curves (log-log; slope fitted over the larger sizes)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
