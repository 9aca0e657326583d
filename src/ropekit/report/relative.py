"""Report section: which rotary families are exactly relative, and GeoPE's kernel against axial RoPE's."""
from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from ..analysis.kernel import expected_kernel  # noqa: E402
from ..analysis.relative import geope_expected_kernel, relative_table  # noqa: E402
from ..rotations.planar import frequency_matrix  # noqa: E402

HEAD_DIM = 96
RADIUS = 15  # the kernel maps cover offsets −15 … 15 on both axes
MOVE = (40.0, 40.0)  # a second query position with the same offsets around it


def kernel_maps(head_dim: int = HEAD_DIM, radius: int = RADIUS, move: tuple[float, float] = MOVE) -> dict:
    """Expected kernels (isotropic q) from a query to a ``(2r+1)²`` grid of offsets around it.

    Returns ``{name: (at_origin, moved)}``: the query at (r, r) of a grid starting at 0, and the same
    offsets with the query moved by ``move``. A relative embedding gives identical maps.
    """
    off = torch.arange(-radius, radius + 1, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(off, off, indexing="ij"), -1)  # (2r+1, 2r+1, 2) offsets (h, w)
    centre = torch.tensor([float(radius), float(radius)], dtype=torch.float64)
    moved = centre + torch.tensor(move, dtype=torch.float64)
    W = frequency_matrix("axial", head_dim, 2, base=100.0)
    axial = expected_kernel(grid, W)
    out = {"axial RoPE (base 100)": (axial, axial)}  # depends on the offset only, by construction
    for name, linear in (("GeoPE", False), ("Linear GeoPE", True)):
        out[name] = tuple(geope_expected_kernel(c, c + grid, head_dim, linear=linear) for c in (centre, moved))
    return out


def _figure(maps: dict, path: Path) -> None:
    panels = [(f"{n}", m[0]) for n, m in maps.items()] + [("GeoPE, query moved by (+40, +40)", maps["GeoPE"][1])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.8))
    fig.subplots_adjust(wspace=0.35)
    r = (panels[0][1].shape[0] - 1) // 2
    for ax, (title, m) in zip(axes, panels):
        im = ax.imshow(m.numpy(), cmap="viridis", vmin=0.2, vmax=1.0, extent=(-r - 0.5, r + 0.5, r + 0.5, -r - 0.5))
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("Δw")
        ax.set_ylabel("Δh")
    fig.colorbar(im, ax=axes, shrink=0.8, label="expected kernel")
    fig.suptitle(f"Expected kernel from a query to offsets around it (head_dim {HEAD_DIM}, λ = 100)", fontsize=10)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def section(out_dir: Path) -> dict:
    """Relative-position error table for every family plus GeoPE vs axial kernel maps."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = relative_table(HEAD_DIM, num_trials=128)
    maps = kernel_maps()
    _figure(maps, out_dir / "relative_kernels.png")
    kern = {
        name: {
            "min": float(a.min()),
            "max_off_centre": float(a[torch.arange(a.numel()).reshape(a.shape) != a.numel() // 2].max()),
            "change_when_moved": float((a - b).abs().max()),
        }
        for name, (a, b) in maps.items()
    }
    head = "".join(f"<th>{h}</th>" for h in ("embedding", "axes", "max |error|", "RMS score", "ratio", "exactly relative"))
    body = "".join(
        f"<tr><td>{html.escape(r['name'])}</td><td>{r['num_axes']}</td><td>{r['max_error']:.2e}</td>"
        f"<td>{r['score_rms']:.2f}</td><td>{r['ratio']:.1e}</td><td>{'yes' if r['exact'] else '<b>no</b>'}</td></tr>"
        for r in rows
    )
    ktab = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{v['min']:.3f}</td><td>{v['max_off_centre']:.3f}</td>"
        f"<td>{v['change_when_moved']:.2e}</td></tr>" for n, v in kern.items()
    )
    note = (
        "<p class='note'>Relative-position error (SPEC §5): max over 128 random q, k (standard normal, "
        f"head_dim {HEAD_DIM}), integer positions in [0, 32] and shifts in [−32, 32] of "
        "|⟨R<sub>m</sub>q, R<sub>n</sub>k⟩ − ⟨R<sub>m+δ</sub>q, R<sub>n+δ</sub>k⟩|, in float32. "
        "'ratio' divides by the RMS score; below 1e-4 it is float rounding. Planar families and Linear GeoPE "
        "are exactly relative; GeoPE is not (rotations about different axes do not commute) except for 1-D "
        "positions. Linear GeoPE works from position differences, so integer shifts leave it bit-identical.</p>"
    )
    knote = (
        "<p class='note'>Expected kernel for isotropic q: per GeoPE triple (1 + 2 cos Θ<sub>rel</sub>)/3, "
        "Θ<sub>rel</sub> the angle of R<sub>m</sub><sup>T</sup>R<sub>n</sub>; per planar pair cos φ. Axial RoPE "
        "gives a cross (each axis separately); Linear GeoPE depends on the distance only (a round map); GeoPE "
        "keeps keys on the line from the grid origin through the query similar (their rotations share an "
        "axis and commute), so its map depends on where the query is.</p>"
    )
    html_out = (
        note + f"<table><tr>{head}</tr>{body}</table>" + knote + "<img src='relative_kernels.png'>"
        + "<table><tr><th>embedding</th><th>min</th><th>max off centre</th><th>max change when the query moves</th></tr>"
        + ktab + "</table>"
    )
    return {
        "title": "Relative position: which embeddings depend on n − m only",
        "html": html_out,
        "metrics": {"relative_error": rows, "kernel": kern, "head_dim": HEAD_DIM},
    }
