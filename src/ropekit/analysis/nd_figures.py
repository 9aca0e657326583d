"""Figures of the N-D rotary families and of 2-D kernels (the N-D paper's three views, GeoPE's maps).

Every kernel map is drawn by :func:`draw_kernel`, so all of them share one axis convention: rows are
offsets along axis 0 (Δh), increasing downward as in an image; columns are offsets along axis 1 (Δw),
increasing to the right. The numbers come from :mod:`ropekit.analysis.nd` and
:mod:`ropekit.analysis.relative`; this module only draws.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from .._extras import require_matplotlib

require_matplotlib("ropekit's N-D figures (ropekit.analysis.nd_figures, ropekit viz)")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from ..rotations.directional import METHODS, directional_matrix, nd_directions  # noqa: E402
from .figures import _save  # noqa: E402
from .nd import check_int, grid_offsets, max_angular_gap, similarity_grid  # noqa: E402

__all__ = ["draw_kernel", "plot_projections", "plot_sim2d", "plot_sim3d", "plot_kernel_maps",
           "plot_relative_kernels", "KERNEL_LABEL", "ROW_LABEL", "COL_LABEL", "check_kernel_work",
           "MAX_EXACT_WORK", "MAX_SAMPLED_WORK", "MAX_SLICES", "MAX_VECTORS", "check_slices_in_grid"]

#: Sizes the figures refuse before allocating (raise them on purpose for bigger figures). The exact kernel
#: holds one float64 angle per grid position and frequency pair: 2**26 of them are 512 MiB. The Monte-Carlo
#: kernel works in bounded chunks, so its limit bounds the time (positions × d_head × num_samples terms).
MAX_EXACT_WORK = 2**26
MAX_SAMPLED_WORK = 2**31
MAX_SLICES = 12  # panels of one sim3d figure
MAX_VECTORS = 2**16  # directions drawn by plot_projections

KERNEL_LABEL = "expected kernel  E[q·R(Δ)q] / E[q·q]"
_MC_LABEL = "Monte-Carlo mean of q·R(Δ)q / E[q·q]"
ROW_LABEL = "Δh (axis 0, tokens; down = +)"
COL_LABEL = "Δw (axis 1, tokens)"


def draw_kernel(ax, k: torch.Tensor, offsets: torch.Tensor, vmin: float, vmax: float, *, ylabel: bool = True):
    """Draw a kernel map ``k[i, j]`` = offset ``(offsets[i], offsets[j])`` on ``ax`` (rows = Δh, downward)."""
    lo, hi = float(offsets[0]) - 0.5, float(offsets[-1]) + 0.5
    im = ax.imshow(k.numpy(), origin="upper", extent=(lo, hi, hi, lo), cmap="viridis", vmin=vmin, vmax=vmax)
    ax.set_xlabel(COL_LABEL)
    if ylabel:
        ax.set_ylabel(ROW_LABEL)
    return im


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown sampling method {method!r}; choose one of {', '.join(METHODS)}")
    return method


def check_kernel_work(d_head: int, grid_size: int, num_samples: "int | None", slices: int = 1) -> int:
    """Refuse kernel figures whose work is absurd before anything is allocated; returns the work.

    The exact kernel builds ``slices × grid_size² × (d_head/2 + 3)`` float64 numbers (angles and offsets),
    at most :data:`MAX_EXACT_WORK`; the Monte-Carlo one does ``slices × grid_size² × d_head × num_samples``
    terms, at most :data:`MAX_SAMPLED_WORK`.
    """
    check_int(d_head, "d_head", 2)
    check_int(grid_size, "grid_size")
    if not 1 <= slices <= MAX_SLICES:
        raise ValueError(f"`slice_coords`: {slices} slices is more than one figure can show (at most {MAX_SLICES})")
    positions = slices * grid_size**2
    if num_samples is None:
        work, limit, what = positions * (d_head // 2 + 3), MAX_EXACT_WORK, f"(`d_head`/2 + 3 = {d_head // 2 + 3})"
    else:
        check_int(num_samples, "num_samples")
        work, limit, what = positions * d_head * num_samples, MAX_SAMPLED_WORK, \
            f"`d_head` ({d_head}) × `num_samples` ({num_samples})"
    if work > limit:
        name = "MAX_EXACT_WORK" if num_samples is None else "MAX_SAMPLED_WORK"
        raise ValueError(
            f"kernel figure too large: {slices} slice(s) × `grid_size`² ({grid_size}²) × {what} = {work} numbers, "
            f"more than the limit of {limit} (ropekit.analysis.nd_figures.{name}); use a smaller grid_size, "
            f"d_head or num_samples"
        )
    return work


def check_slices_in_grid(slice_coords: Sequence[float], grid_size: int, *, option: str = "`slice_coords`",
                         grid_option: str = "`grid_size`") -> None:
    """Refuse slice offsets outside the grid: a ``grid_size``³ grid holds no token there, so the slice would show
    the kernel at offsets the grid does not have. The message names the offsets allowed and the grid size that
    would hold every slice (``option``/``grid_option``: how the caller names the two arguments)."""
    offsets = grid_offsets(grid_size)
    lo, hi = int(offsets[0]), int(offsets[-1])
    outside = [z for z in slice_coords if not lo <= z <= hi]
    if outside:
        # offset z >= 0 needs ceil(G/2) - 1 >= z, z < 0 needs floor(G/2) >= -z
        need = max(2 * math.ceil(z) + 1 if z >= 0 else 2 * math.ceil(-z) for z in slice_coords)
        raise ValueError(
            f"{option}: {', '.join(f'{z:g}' for z in outside)} {'is' if len(outside) == 1 else 'are'} outside the "
            f"grid: a {grid_option} of {grid_size} "
            f"holds Δ(axis 2) offsets from {lo} to {hi} around the centre token; give {option} in that range, "
            f"or a {grid_option} of at least {need}"
        )


def plot_projections(
    n_dims: int, num_vectors: int, sampling_method: str, save_path: "str | Path", *, seed: int = 0
) -> Path:
    """Directions of ``sampling_method`` on S¹ (n_dims 2) or S² (n_dims 3) beside normalised Gaussians.

    The reference is ``nd_directions(num_vectors, n_dims, "random", seed=seed)``, the same directions as the
    ``random`` method with this seed (so a table of methods at that seed shows the reference's numbers); when
    ``sampling_method`` is ``random`` itself, the reference takes ``seed + 1`` so that the panels differ.
    """
    if n_dims not in (2, 3):
        raise ValueError(f"`n_dims` must be 2 or 3 (a circle or a sphere can be drawn), got {n_dims!r}")
    check_int(num_vectors, "num_vectors")
    if num_vectors > MAX_VECTORS:
        raise ValueError(f"`num_vectors` = {num_vectors} directions are too many to draw (at most {MAX_VECTORS}, "
                         f"ropekit.analysis.nd_figures.MAX_VECTORS)")
    _check_method(sampling_method)
    ours = nd_directions(num_vectors, n_dims, sampling_method, seed=seed)
    ref_seed = seed + 1 if sampling_method == "random" else seed
    ref = nd_directions(num_vectors, n_dims, "random", seed=ref_seed)
    panels = [(ours, f"{sampling_method}", "#1f77b4"),
              (ref, f"reference: random (normalised Gaussian, seed {ref_seed})", "#e8743b")]
    title = f"{num_vectors} projection directions on $S^{{{n_dims - 1}}}$"
    if n_dims == 2:
        fig, axes = plt.subplots(1, 2, figsize=(10, 5))
        t = torch.linspace(0, 2 * math.pi, 400)
        for ax, (v, name, colour) in zip(axes, panels):
            ax.plot(torch.cos(t), torch.sin(t), color="#999", lw=0.8, ls="--")
            for vx, vy in v.tolist():
                ax.plot([0, vx], [0, vy], color=colour, lw=0.4, alpha=0.35)
            ax.scatter(v[:, 0], v[:, 1], s=12, color=colour, edgecolors="k", linewidths=0.3, zorder=3)
            ax.set_title(f"{name}\nlargest gap = {max_angular_gap(v):.2f} × even spacing", fontsize=10)
            ax.set_xlabel("$u_1$")
            ax.set_ylabel("$u_2$")
            ax.set_aspect("equal")
            ax.set_xlim(-1.15, 1.15)
            ax.set_ylim(-1.15, 1.15)
            ax.grid(alpha=0.3)
    else:
        fig = plt.figure(figsize=(11, 5.2))
        for i, (v, name, colour) in enumerate(panels):
            ax = fig.add_subplot(1, 2, i + 1, projection="3d")
            ax.scatter(v[:, 0], v[:, 1], v[:, 2], s=8, color=colour, alpha=0.8)
            ax.set_title(f"{name}\n|mean direction| = {float(v.mean(0).norm()):.3f} (0 = balanced)", fontsize=10)
            ax.set_xlabel("$u_1$")
            ax.set_ylabel("$u_2$")
            ax.set_zlabel("$u_3$")
            for setter in (ax.set_xlim, ax.set_ylim, ax.set_zlim):
                setter(-1, 1)
            for ticks in (ax.set_xticks, ax.set_yticks, ax.set_zticks):
                ticks([-1, 0, 1])
            ax.set_box_aspect((1, 1, 1))
    fig.suptitle(title, fontsize=12, y=1.02)
    return _save(fig, save_path)


def _kernel_title(d_head: int, method: str, num_samples: int | None) -> str:
    how = "exact expectation" if num_samples is None else f"Monte-Carlo, {num_samples} random q"
    return f"$d_{{head}}$ = {d_head}, directions: {method}, {how}"


def _kernel_row(maps: dict[str, torch.Tensor], offsets: torch.Tensor, label: str, *, panel_width: float = 4.0,
                vmin: float | None = None, vmax: float | None = None):
    """One row of kernel panels on one colour scale (the maps' own range unless given); returns the figure."""
    vmin = min(float(m.min()) for m in maps.values()) if vmin is None else vmin
    vmax = max(float(m.max()) for m in maps.values()) if vmax is None else vmax
    n = len(maps)
    fig, axes = plt.subplots(1, n, figsize=(panel_width * n + 1.2, 4.4), squeeze=False)
    for i, (ax, (name, m)) in enumerate(zip(axes[0], maps.items())):
        im = draw_kernel(ax, m, offsets, vmin, vmax, ylabel=i == 0)
        ax.set_title(name, fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), label=label, fraction=0.03, pad=0.03)
    return fig


def plot_sim2d(
    d_head: int,
    grid_size: int,
    sampling_method: str,
    save_path: "str | Path",
    num_samples: int | None = None,
    *,
    base: float = 10000.0,
    seed: int = 0,
) -> Path:
    """Heat map of the 2-D directional-RoPE kernel from the centre token to every grid position."""
    _check_method(sampling_method)
    check_kernel_work(d_head, grid_size, num_samples)
    W = directional_matrix(d_head, 2, sampling_method, base=base, seed=seed, dtype=torch.float64)
    k = similarity_grid(W, grid_size, num_samples=num_samples, seed=seed)
    fig = _kernel_row({"": k}, grid_offsets(grid_size), KERNEL_LABEL if num_samples is None else _MC_LABEL,
                      panel_width=5.4)
    fig.suptitle("2-D RoPE similarity to the centre token\n" + _kernel_title(d_head, sampling_method, num_samples),
                 fontsize=10, y=1.02)
    return _save(fig, save_path)


def plot_sim3d(
    d_head: int,
    grid_size: int,
    slice_coords: Sequence[float],
    sampling_method: str,
    save_path: "str | Path",
    num_samples: int | None = None,
    *,
    base: float = 10000.0,
    seed: int = 0,
) -> Path:
    """Slices ``Δ axis 2 = c`` (c in ``slice_coords``) of the 3-D directional-RoPE kernel, one colour scale."""
    _check_method(sampling_method)
    zs = list(slice_coords) if not isinstance(slice_coords, (int, float)) else [slice_coords]
    if not zs or not all(isinstance(z, (int, float)) and math.isfinite(z) for z in zs):
        raise ValueError(f"`slice_coords` must be a non-empty list of finite Δz offsets, e.g. [-10, 0, 10]; "
                         f"got {slice_coords!r}")
    check_kernel_work(d_head, grid_size, num_samples, len(zs))
    check_slices_in_grid(zs, grid_size)
    W = directional_matrix(d_head, 3, sampling_method, base=base, seed=seed, dtype=torch.float64)
    maps = {f"slice Δ(axis 2) = {z:g}": similarity_grid(W, grid_size, extra=(z,), num_samples=num_samples,
                                                         seed=seed) for z in zs}
    fig = _kernel_row(maps, grid_offsets(grid_size), KERNEL_LABEL if num_samples is None else _MC_LABEL,
                      panel_width=4.2)
    fig.suptitle("3-D RoPE similarity to the centre token, slices along axis 2\n"
                 + _kernel_title(d_head, sampling_method, num_samples), fontsize=10, y=1.04)
    return _save(fig, save_path)


def plot_kernel_maps(
    frequency_matrices: dict[str, torch.Tensor], grid_size: int, save_path: "str | Path", *, title: str = ""
) -> tuple[Path, dict[str, torch.Tensor]]:
    """Side-by-side exact 2-D kernels of several frequency matrices (each ``(2, R/2)`` or ``(H, 2, R/2)``)."""
    if not frequency_matrices:
        raise ValueError("plot_kernel_maps: `frequency_matrices` is empty; pass {name: W, ...}")
    maps = {name: similarity_grid(W, grid_size) for name, W in frequency_matrices.items()}
    fig = _kernel_row(maps, grid_offsets(grid_size), KERNEL_LABEL)
    if title:
        fig.suptitle(title, fontsize=11, y=1.03)
    return _save(fig, save_path), maps


def plot_relative_kernels(maps: dict[str, torch.Tensor], offsets: torch.Tensor, save_path: "str | Path", *,
                          title: str = "") -> Path:
    """Kernel maps ``{panel title: (G, G)}`` over the same offsets, on one colour scale from 0.2 to 1."""
    if not maps:
        raise ValueError("plot_relative_kernels: `maps` is empty; pass {title: map, ...}")
    fig = _kernel_row(maps, offsets, KERNEL_LABEL, vmin=0.2, vmax=1.0)
    if title:
        fig.suptitle(title, fontsize=10, y=1.03)
    return _save(fig, save_path)
