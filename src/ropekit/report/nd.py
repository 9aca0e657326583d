"""Report section for the N-D rotary families: directions of the N-D generator and 2-D kernels of
axial, mixed (RoPE-Mixed at initialisation) and directional RoPE."""
from __future__ import annotations

import html
import math
from pathlib import Path

import torch

from ..analysis.kernel import expected_kernel
from ..rotations.directional import METHODS, directional_matrix, nd_directions
from ..rotations.mixed import mixed_init
from ..rotations.planar import frequency_matrix
from ..analysis.nd import max_angular_gap
from ..analysis.nd_figures import COL_LABEL, ROW_LABEL, plot_kernel_maps, plot_projections
from ._html import table as _table  # noqa: E402

ROTARY_DIM = 64  # a typical ViT head
HEADS = 6
GRID = 33
NUM_DIRECTIONS = 64
RADII = (1.0, 4.0, 16.0)
SHOWN = "sobol"  # the direction method drawn in both figures: the one the directional kernels below use
SEED = 0


def _ring_stats(W: torch.Tensor, radius: float, points: int = 720) -> dict[str, float]:
    """Exact kernel on a ring of offsets of the given radius: mean, anisotropy (max − min) and axis bias
    (mean on the four axis directions minus mean on the four diagonals; > 0 = a cross-shaped kernel)."""
    t = torch.arange(points, dtype=torch.float64) * (2 * math.pi / points)
    delta = radius * torch.stack((torch.cos(t), torch.sin(t)), dim=-1)
    Wd = W.to(torch.float64)
    k = expected_kernel(delta, Wd) if Wd.ndim == 2 else torch.stack([expected_kernel(delta, w) for w in Wd]).mean(0)
    quarter = points // 4
    axes = k[::quarter][:4].mean()
    diagonals = k[quarter // 2 :: quarter][:4].mean()
    return {"mean": float(k.mean()), "anisotropy": float(k.max() - k.min()), "axis_bias": float(axes - diagonals)}


def ring_sentences(kernel: dict[str, dict[str, dict[str, float]]], radius: float,
                   cross_at: float = 0.1) -> list[str]:
    """One sentence per family from its ring statistics at ``radius``: a cross or not, and how uneven."""
    out = []
    for name, rings in kernel.items():
        v = rings[f"r={radius:g}"]
        shape = (f"a cross (axis bias {v['axis_bias']:+.3f}): keys in the query's row or column stay more "
                 "similar than keys on the diagonals" if v["axis_bias"] > cross_at
                 else f"no cross (axis bias {v['axis_bias']:+.3f})")
        out.append(f"{name}: at distance {radius:g}, {shape}; the kernel varies by {v['anisotropy']:.3f} "
                   f"around the ring (mean {v['mean']:.3f}).")
    return out


def direction_sentences(gaps: dict[str, float], balance: dict[str, float], shown: str = SHOWN,
                        reference: str = "random") -> list[str]:
    """What the two direction figures and the table say, from the table's own numbers: the figures show
    ``shown`` beside ``reference`` (the normalised-Gaussian row), and which method does best on each measure."""
    best_gap = min(gaps, key=gaps.get)
    best_bal = min(balance, key=balance.get)
    out = [f"Both figures show {shown} (the method of the directional kernels below) beside the table's "
           f"{reference} row, normalised Gaussian directions: largest 2-D gap {gaps[shown]:.2f} against "
           f"{gaps[reference]:.2f}, |mean| of the 3-D directions {balance[shown]:.3f} against "
           f"{balance[reference]:.3f}."]
    out.append(f"Smallest largest gap in the table: {best_gap} ({gaps[best_gap]:.2f}); most balanced in 3-D: "
               f"{best_bal} ({balance[best_bal]:.3f}).")
    return out


def _families() -> dict[str, torch.Tensor]:
    return {
        "axial (base 100)": frequency_matrix("axial", ROTARY_DIM, 2, base=100.0),
        f"mixed at init (θ = 10, mean of {HEADS} heads)": mixed_init(ROTARY_DIM, HEADS, 2, seed=0),
        "directional sobol (base 100)": directional_matrix(ROTARY_DIM, 2, "sobol", base=100.0, seed=0),
        "directional sobol (base 10000)": directional_matrix(ROTARY_DIM, 2, "sobol", seed=0),
    }


def section(out_dir: Path, **_) -> dict:
    """Direction figures and gap table, kernel maps and ring statistics; writes three PNGs."""
    out = Path(out_dir)
    plot_projections(2, NUM_DIRECTIONS, SHOWN, out / "nd_directions_2d.png", seed=SEED)
    plot_projections(3, 256, SHOWN, out / "nd_directions_3d.png", seed=SEED)

    gaps, balance = {}, {}
    for m in METHODS:
        gaps[m] = max_angular_gap(nd_directions(NUM_DIRECTIONS, 2, m, seed=SEED))
        if m != "golden":
            balance[m] = float(nd_directions(256, 3, m, seed=SEED).mean(0).norm())
    dir_rows = [[f"<code>{m}</code>", f"{gaps[m]:.2f}", f"{balance[m]:.3f}" if m in balance else "–"]
                for m in METHODS]

    fams = _families()
    plot_kernel_maps(fams, GRID, out / "nd_kernels.png",
                     title=f"Exact expected kernel from the centre token, rotary_dim {ROTARY_DIM}")
    kernel = {}
    for name, W in fams.items():
        kernel[name] = {f"r={r:g}": _ring_stats(W, r) for r in RADII}
    ker_rows = [[html.escape(n)] + ["{mean:.3f} / {anisotropy:.3f} / {axis_bias:+.3f}".format(**v[f"r={r:g}"])
                                    for r in RADII] for n, v in kernel.items()]
    note_dir = (
        "<p class='note'>Directions from the N-D paper's generator (low-discrepancy samples → inverse normal "
        "CDF → continued-fraction convergents of √p → sphere). <i>Largest gap</i>: the widest empty arc among "
        f"{NUM_DIRECTIONS} 2-D directions, in units of the even spacing 2π/N (1 is perfect; i.i.d. directions "
        f"give about ln N + 0.58 ≈ {math.log(NUM_DIRECTIONS) + 0.58:.1f}). <i>|mean|</i>: length of the mean of 256 3-D directions (0 = balanced). "
        f"Every method at seed {SEED}. " + " ".join(html.escape(t) for t in direction_sentences(gaps, balance))
        + "</p>"
    )
    note_ker = (
        "<p class='note'>Expected kernel E[q·R(Δ)q]/E[q·q] for isotropic q, from the centre token; rows = "
        f"{ROW_LABEL}, columns = {COL_LABEL}, as in every kernel map of this report. Per cell of the table, "
        "over a ring of offsets of radius r: mean / anisotropy (max − min) / axis bias (mean on the axes "
        "minus mean on the diagonals; above 0.1 the kernel is a cross, tokens in the same row or column "
        "staying similar). Base 100 and θ = 10 are rope-vit's defaults; base 10000 is the N-D paper's.</p>"
        + "<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in ring_sentences(kernel, RADII[-1])) + "</ul>"
    )
    body = (
        note_dir + "<img src='nd_directions_2d.png'><img src='nd_directions_3d.png'>"
        + _table(["method", "largest gap (2-D)", "|mean| (3-D)"], dir_rows)
        + note_ker + "<img src='nd_kernels.png'>"
        + _table(["family"] + [f"r = {r:g}" for r in RADII], ker_rows)
    )
    return {
        "title": "N-D rotary families: directional and mixed RoPE",
        "html": body,
        "metrics": {"largest_gap_2d": gaps, "mean_norm_3d": balance, "kernel_rings": kernel,
                    "rotary_dim": ROTARY_DIM, "grid": GRID},
    }
