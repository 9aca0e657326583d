"""The N-D paper's three figure views (SPEC §5) and the ``ropekit viz`` command.

- ``proj``: the direction distribution on S¹ / S² beside a normalised-Gaussian reference;
- ``sim2d``: the 2-D similarity kernel of the centre token against every position of a grid;
- ``sim3d``: slices through the 3-D kernel at chosen offsets along the third axis.

Kernels are the exact expectation ``E[q·R(Δ)q] / E[q·q]`` for isotropic q (``expected_kernel``);
``num_samples=N`` switches to the Monte-Carlo average over N random q, the estimator the paper's
script plots. Unlike that script, the grid here is the integer token grid centred on token
``grid_size // 2`` (relative offsets ``−⌊G/2⌋ … G−1−⌊G/2⌋``), i.e. what a ViT with that grid sees.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from .analysis.figures import _save  # noqa: E402
import torch  # noqa: E402

from .analysis.kernel import expected_kernel, monte_carlo_kernel  # noqa: E402
from .rotations.directional import METHODS, directional_matrix, nd_directions  # noqa: E402

__all__ = [
    "grid_offsets",
    "similarity_grid",
    "max_angular_gap",
    "plot_projections",
    "plot_sim2d",
    "plot_sim3d",
    "plot_kernel_maps",
    "add_viz_parser",
]

_KERNEL_LABEL = "expected kernel  E[q·R(Δ)q] / E[q·q]"
_MC_LABEL = "Monte-Carlo mean of q·R(Δ)q / E[q·q]"
# Monte-Carlo chunks keep num_samples × positions × rotary_dim below this many float64 numbers
_MC_CHUNK = 1 << 22


def _check_int(value: int, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"`{name}` must be >= {low}, got {value}")
    return value


def grid_offsets(grid_size: int) -> torch.Tensor:
    """Offsets of the integer grid positions from the centre token ``grid_size // 2`` (float64)."""
    _check_int(grid_size, "grid_size")
    return torch.arange(grid_size, dtype=torch.float64) - grid_size // 2


def _kernel(delta: torch.Tensor, W: torch.Tensor, num_samples: int | None, seed: int) -> torch.Tensor:
    """Kernel for ``delta (P, A)``; a per-head ``W (H, A, R/2)`` is averaged over its heads."""
    if W.ndim == 3:
        return torch.stack([_kernel(delta, w, num_samples, seed) for w in W]).mean(0)
    if num_samples is None:
        return expected_kernel(delta, W)
    chunk = max(1, _MC_CHUNK // (num_samples * 2 * W.shape[-1]))
    parts = [monte_carlo_kernel(delta[i : i + chunk], W, num_samples=num_samples, seed=seed)
             for i in range(0, delta.shape[0], chunk)]
    return torch.cat(parts)


def similarity_grid(
    W: torch.Tensor,
    grid_size: int,
    *,
    extra: Sequence[float] = (),
    num_samples: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """Kernel between the centre token and every position of a ``grid_size²`` grid: ``(G, G)`` float64.

    Entry ``[row, col]`` is the offset ``(x, y) = (col, row) − centre`` (x = axis 0, y = axis 1); axes
    beyond the second are held at the offsets in ``extra`` (one per extra axis of ``W``).
    """
    if not isinstance(W, torch.Tensor) or W.ndim not in (2, 3):
        raise TypeError("similarity_grid: `W` must be a frequency matrix (A, R/2) or per-head (H, A, R/2)")
    A = W.shape[-2]
    if A < 2 or len(extra) != A - 2:
        raise ValueError(
            f"similarity_grid: W has {A} axes; a 2-D grid needs A >= 2 and one `extra` offset per axis "
            f"beyond the second (got {len(extra)})"
        )
    if num_samples is not None:
        _check_int(num_samples, "num_samples")
    r = grid_offsets(grid_size)
    y, x = torch.meshgrid(r, r, indexing="ij")
    cols = [x.reshape(-1), y.reshape(-1)] + [torch.full_like(x.reshape(-1), float(z)) for z in extra]
    delta = torch.stack(cols, dim=-1)
    return _kernel(delta, W.to(torch.float64), num_samples, seed).reshape(grid_size, grid_size)


def max_angular_gap(directions: torch.Tensor) -> float:
    """Largest gap between consecutive 2-D directions, in units of the even spacing ``2π/N`` (1 = ideal)."""
    if directions.ndim != 2 or directions.shape[1] != 2:
        raise ValueError(f"max_angular_gap needs 2-D directions (N, 2), got shape {tuple(directions.shape)}")
    a = torch.sort(torch.atan2(directions[:, 1], directions[:, 0])).values
    gaps = torch.diff(torch.cat([a, a[:1] + 2 * math.pi]))
    return float(gaps.max() / (2 * math.pi / directions.shape[0]))


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown sampling method {method!r}; choose one of {', '.join(METHODS)}")
    return method


def plot_projections(
    n_dims: int, num_vectors: int, sampling_method: str, save_path: "str | Path", *, seed: int = 0
) -> Path:
    """Directions of ``sampling_method`` on S¹ (n_dims 2) or S² (n_dims 3) beside normalised Gaussians."""
    if n_dims not in (2, 3):
        raise ValueError(f"`n_dims` must be 2 or 3 (a circle or a sphere can be drawn), got {n_dims!r}")
    _check_int(num_vectors, "num_vectors")
    _check_method(sampling_method)
    ours = nd_directions(num_vectors, n_dims, sampling_method, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    ref = torch.randn(num_vectors, n_dims, generator=g, dtype=torch.float64)
    ref = ref / ref.norm(dim=-1, keepdim=True)
    panels = [(ours, f"{sampling_method}", "#1f77b4"), (ref, "reference: normalised Gaussian", "#e8743b")]
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
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("$u_1$")
            ax.set_ylabel("$u_2$")
            ax.set_zlabel("$u_3$")
            for setter in (ax.set_xlim, ax.set_ylim, ax.set_zlim):
                setter(-1, 1)
            ax.set_box_aspect((1, 1, 1))
    fig.suptitle(title, fontsize=12)
    return _save(fig, save_path)


def _kernel_title(d_head: int, method: str, num_samples: int | None) -> str:
    how = "exact expectation" if num_samples is None else f"Monte-Carlo, {num_samples} random q"
    return f"$d_{{head}}$ = {d_head}, directions: {method}, {how}"


def _imshow(ax, k: torch.Tensor, r: torch.Tensor, vmin: float, vmax: float):
    lo, hi = float(r[0]) - 0.5, float(r[-1]) + 0.5
    im = ax.imshow(k.numpy(), origin="lower", extent=(lo, hi, lo, hi), cmap="viridis", vmin=vmin, vmax=vmax)
    ax.set_xlabel("Δx (axis 0, tokens)")
    return im


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
    W = directional_matrix(d_head, 2, sampling_method, base=base, seed=seed, dtype=torch.float64)
    k = similarity_grid(W, grid_size, num_samples=num_samples, seed=seed)
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    im = _imshow(ax, k, grid_offsets(grid_size), float(k.min()), float(k.max()))
    ax.set_ylabel("Δy (axis 1, tokens)")
    fig.colorbar(im, ax=ax, label=_KERNEL_LABEL if num_samples is None else _MC_LABEL, fraction=0.046, pad=0.04)
    ax.set_title("2-D RoPE similarity to the centre token\n" + _kernel_title(d_head, sampling_method, num_samples),
                 fontsize=10)
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
    """Slices ``Δz = c`` (c in ``slice_coords``) of the 3-D directional-RoPE kernel, one colour scale."""
    _check_method(sampling_method)
    zs = list(slice_coords) if not isinstance(slice_coords, (int, float)) else [slice_coords]
    if not zs or not all(isinstance(z, (int, float)) and math.isfinite(z) for z in zs):
        raise ValueError(f"`slice_coords` must be a non-empty list of finite Δz offsets, e.g. [-10, 0, 10]; got {slice_coords!r}")
    W = directional_matrix(d_head, 3, sampling_method, base=base, seed=seed, dtype=torch.float64)
    maps = [similarity_grid(W, grid_size, extra=(z,), num_samples=num_samples, seed=seed) for z in zs]
    vmin = min(float(m.min()) for m in maps)
    vmax = max(float(m.max()) for m in maps)
    r = grid_offsets(grid_size)
    fig, axes = plt.subplots(1, len(zs), figsize=(4.2 * len(zs) + 1.0, 4.4), squeeze=False)
    for ax, z, m in zip(axes[0], zs, maps):
        im = _imshow(ax, m, r, vmin, vmax)
        ax.set_title(f"slice Δz = {z:g}", fontsize=10)
    axes[0, 0].set_ylabel("Δy (axis 1, tokens)")
    fig.colorbar(im, ax=axes[0].tolist(), label=_KERNEL_LABEL if num_samples is None else _MC_LABEL,
                 fraction=0.03, pad=0.03)
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
    vmin = min(float(m.min()) for m in maps.values())
    vmax = max(float(m.max()) for m in maps.values())
    r = grid_offsets(grid_size)
    n = len(maps)
    fig, axes = plt.subplots(1, n, figsize=(4.0 * n + 1.0, 4.3), squeeze=False)
    for ax, (name, m) in zip(axes[0], maps.items()):
        im = _imshow(ax, m, r, vmin, vmax)
        ax.set_title(name, fontsize=10)
    axes[0, 0].set_ylabel("Δy (axis 1, tokens)")
    fig.colorbar(im, ax=axes[0].tolist(), label=_KERNEL_LABEL, fraction=0.03, pad=0.03)
    if title:
        fig.suptitle(title, fontsize=11, y=1.03)
    return _save(fig, save_path), maps


# ---------------------------------------------------------------------------------------------- CLI


def _cmd_proj(args: argparse.Namespace) -> int:
    path = args.save_path or f"rope_proj_{args.n_dims}d_{args.sampling_method}.png"
    out = plot_projections(args.n_dims, args.num_vectors, args.sampling_method, path, seed=args.seed)
    print(f"projection figure written to {out}")
    return 0


def _cmd_sim2d(args: argparse.Namespace) -> int:
    path = args.save_path or f"rope_sim2d_{args.sampling_method}.png"
    out = plot_sim2d(args.d_head, args.grid_size, args.sampling_method, path, args.num_samples,
                     base=args.base, seed=args.seed)
    print(f"2-D similarity kernel written to {out}")
    return 0


def _cmd_sim3d(args: argparse.Namespace) -> int:
    path = args.save_path or f"rope_sim3d_{args.sampling_method}.png"
    out = plot_sim3d(args.d_head, args.grid_size, args.slice_coords, args.sampling_method, path,
                     args.num_samples, base=args.base, seed=args.seed)
    print(f"3-D similarity kernel slices written to {out}")
    return 0


def add_viz_parser(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add ``viz {proj, sim2d, sim3d}`` to a CLI; each sub-command sets ``func`` to its handler."""
    viz = subparsers.add_parser("viz", help="N-D RoPE figures: directions, 2-D kernel, 3-D kernel slices")
    sub = viz.add_subparsers(dest="viz_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--sampling-method", choices=METHODS, default="sobol",
                       help="direction generator (default: sobol)")
        p.add_argument("--seed", type=int, default=0, help="seed for sobol/uniform/random (default: 0)")
        p.add_argument("--save-path", default=None,
                       help="PNG file to write, folders created (default: rope_<view>_<method>.png here)")

    p = sub.add_parser("proj", help="direction distribution on S^1 / S^2 vs a normalised-Gaussian reference")
    p.add_argument("--n-dims", type=int, choices=(2, 3), default=2, help="2: circle S^1, 3: sphere S^2")
    p.add_argument("--num-vectors", type=int, default=256, help="directions to draw")
    common(p)
    p.set_defaults(func=_cmd_proj)

    for name, dims, grid in (("sim2d", 2, 64), ("sim3d", 3, 32)):
        s = sub.add_parser(name, help=f"{dims}-D similarity kernel of the centre token vs the grid")
        s.add_argument("--d-head", type=int, default=1024, help="rotary head dimension (default: 1024)")
        s.add_argument("--grid-size", type=int, default=grid, help=f"tokens per axis (default: {grid})")
        s.add_argument("--num-samples", type=int, default=None,
                       help="Monte-Carlo over N random q instead of the exact expectation")
        s.add_argument("--base", type=float, default=10000.0, help="RoPE base of the magnitudes (default: 10000)")
        if dims == 3:
            s.add_argument("--slice-coords", type=float, nargs="+", default=[-10.0, 0.0, 10.0],
                           help="Δz offsets of the slices (default: -10 0 10)")
        common(s)
        s.set_defaults(func=_cmd_sim2d if dims == 2 else _cmd_sim3d)
    return viz
