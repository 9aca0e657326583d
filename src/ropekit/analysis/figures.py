"""Figures of position designs: coordinates per token and text→video attention-bias maps."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from ..designs.registry import get_design, positions  # noqa: E402
from ..layout import Layout  # noqa: E402
from .metrics import attention_bias_map  # noqa: E402

__all__ = ["plot_coordinates", "plot_rings", "plot_bias_maps"]

_KIND_COLOURS = {0: "#e0a100", 1: "#2a9d4b", 2: "#2a6fdb", 3: "#8a4fd0"}
_KIND_NAMES = {0: "text", 1: "image", 2: "video", 3: "grid"}


def plot_coordinates(layout: "Layout | str", designs: Sequence[str], path: "str | Path") -> Path:
    """One panel per design: every coordinate axis against token index, coloured by modality."""
    lay = Layout.coerce(layout)
    kinds = lay.token_types()
    n = len(designs)
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    idx = torch.arange(lay.num_tokens)
    for ax, name in zip(axes.flat, designs):
        c = positions(lay, name)
        markers = "os^vD<>p"
        for a in range(c.shape[1]):
            for kind in kinds.unique().tolist():
                m = kinds == kind
                ax.scatter(idx[m], c[m, a], s=9, marker=markers[a % len(markers)], color=_KIND_COLOURS[kind],
                           alpha=0.75, label=f"axis {a}" if kind == kinds[0].item() else None)
        ax.set_title(f"{name}  ({c.shape[1]} ax{'es' if c.shape[1] > 1 else 'is'})", fontsize=10)
        ax.set_xlabel("token index")
        ax.set_ylabel("coordinate")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles = [plt.Line2D([], [], marker="o", ls="", color=_KIND_COLOURS[k], label=_KIND_NAMES[k])
               for k in kinds.unique().tolist()]
    fig.legend(handles=handles, loc="upper right", ncol=len(handles), fontsize=9)
    fig.suptitle(f"Coordinates of every token for layout '{lay}' (marker shape = axis)", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return _save(fig, path)


def plot_rings(layout: "Layout | str", designs: Sequence[str], path: "str | Path") -> Path:
    """3-D scatter of 3-axis designs (t, h, w): Circle-RoPE's ring orthogonal to the text diagonal."""
    lay = Layout.coerce(layout)
    kinds = lay.token_types()
    three = [d for d in designs if positions(lay, d).shape[1] == 3]
    if not three:
        raise ValueError("plot_rings: none of `designs` has 3 axes (t, h, w); try 'mrope' or 'circle'")
    fig = plt.figure(figsize=(4.4 * max(1, len(three)), 4.2))
    for i, name in enumerate(three):
        c = positions(lay, name)
        ax = fig.add_subplot(1, len(three), i + 1, projection="3d")
        for kind in kinds.unique().tolist():
            m = kinds == kind
            ax.scatter(c[m, 2], c[m, 1], c[m, 0], s=12, color=_KIND_COLOURS[kind], label=_KIND_NAMES[kind])
        lo, hi = float(c.min()), float(c.max())
        ax.plot([lo, hi], [lo, hi], [lo, hi], color="#999", lw=0.8, ls="--")
        ax.set_xlabel("w")
        ax.set_ylabel("h")
        ax.set_zlabel("t")
        ax.set_title(name, fontsize=10)
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="upper right", fontsize=9)
    fig.suptitle(f"3-axis designs in position space, layout '{lay}' (dashed: text diagonal)", fontsize=11)
    return _save(fig, path)


def plot_bias_maps(
    layout: "Layout | str", designs: Sequence[str], path: "str | Path", *, head_dim: int = 128,
    base: float = 10000.0,
) -> tuple[Path, dict]:
    """Rows = designs, columns = frames: expected kernel from the text after the video (VRoPE fig. 3)."""
    lay = Layout.coerce(layout)
    maps = {d: attention_bias_map(lay, d, head_dim=head_dim, base=base) for d in designs}
    T = next(iter(maps.values())).shape[0]
    fig, axes = plt.subplots(len(designs), T, figsize=(1.9 * T + 1.2, 1.9 * len(designs)), squeeze=False)
    for r, (name, m) in enumerate(maps.items()):
        vmin, vmax = float(m.min()), float(m.max())
        for f in range(T):
            ax = axes[r, f]
            im = ax.imshow(m[f].numpy(), cmap="viridis", vmin=vmin, vmax=vmax)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"frame {f}", fontsize=9)
            if f == 0:
                ax.set_ylabel(f"{name}\n({get_design(name).allocation})", fontsize=9)
        fig.colorbar(im, ax=axes[r, :].tolist(), fraction=0.02, pad=0.01)
    fig.suptitle(f"Expected attention from text after the video to each video token ('{lay}', "
                 f"head_dim {head_dim}); lighter = more", fontsize=10, y=1.01 + 0.03 / len(designs))
    stats = {d: {"min": float(m.min()), "max": float(m.max()),
                 "spread": float(m.max() - m.min()),
                 "flip_asymmetry": float((m - m.flip(-1).flip(-2)).abs().max())} for d, m in maps.items()}
    return _save(fig, path), stats


def _save(fig, path: "str | Path") -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return p
