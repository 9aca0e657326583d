"""Figures of position designs: coordinates per token, position space, text→video kernel maps."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .._extras import require_matplotlib

require_matplotlib("ropekit's figures (ropekit.analysis.figures)")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
import torch  # noqa: E402

from ..designs.registry import get_design, positions  # noqa: E402
from ..layout import Image, Layout, Video  # noqa: E402
from .metrics import attention_bias_map  # noqa: E402

__all__ = ["plot_coordinates", "plot_rings", "rings_figure", "pair_arrangement", "plot_bias_maps", "plot_layout",
           "diagonal_view"]

# keyed by ropekit.layout's token-type codes: text 0, image 1, video 2, grid 3, audio 4
_KIND_COLOURS = {0: "#e0a100", 1: "#2a9d4b", 2: "#2a6fdb", 3: "#8a4fd0", 4: "#d64550"}
_KIND_NAMES = {0: "text", 1: "image", 2: "video", 3: "grid", 4: "audio"}


# each coordinate axis has its own marker shape, edge colour and size; the fill is the token's modality. Axes
# are drawn largest first, so where two axes share a value their markers nest (a square inside a circle, ...)
_AXIS_MARKERS = "os^vD<>p"
_AXIS_EDGES = ("#000000", "#d81b60", "#1565c0", "#6d4c41", "#00897b", "#757575", "#ff6f00", "#311b92")
# readable at the report's width (the page shows a figure about 1070 px wide)
_FONT = {"tick": 13, "label": 13, "title": 14, "legend": 13}


def _axis_names(num_axes: int) -> list[str]:
    return {1: ["index"], 2: ["h", "w"], 3: ["t", "h", "w"]}.get(num_axes, [f"axis {a}" for a in range(num_axes)])


def _axis_size(a: int) -> float:
    """Marker area (points²) of axis ``a``: each axis smaller than the one before, so coincident markers nest."""
    return 110.0 * 0.62**a


def _axis_style(a: int) -> dict:
    return {"marker": _AXIS_MARKERS[a % len(_AXIS_MARKERS)], "edgecolors": _AXIS_EDGES[a % len(_AXIS_EDGES)],
            "linewidths": 1.3, "s": _axis_size(a)}


def _draw_coordinates(ax, coords: torch.Tensor, kinds: torch.Tensor) -> None:
    """Every coordinate axis against token index: fill colour = modality; marker shape, edge colour and size =
    axis (largest first, so axes with equal values show as nested markers instead of hiding one another)."""
    from matplotlib.ticker import MaxNLocator

    idx = torch.arange(coords.shape[0])
    for a in range(coords.shape[1]):
        for kind in kinds.unique().tolist():
            m = kinds == kind
            ax.scatter(idx[m], coords[m, a], color=_KIND_COLOURS[kind], zorder=3 + a, **_axis_style(a))
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=bool((coords == coords.round()).all())))
    ax.tick_params(labelsize=_FONT["tick"])
    ax.set_xlabel("token index", fontsize=_FONT["label"])
    ax.set_ylabel("coordinate", fontsize=_FONT["label"])
    ax.grid(alpha=0.3)


def _legend_handles(kinds: torch.Tensor, max_axes: int) -> list:
    """Colour patches for the modalities, then each axis's marker (shape, edge colour, size) on a grey fill."""
    colour = [Patch(color=_KIND_COLOURS[k], label=_KIND_NAMES[k]) for k in kinds.unique().tolist()]
    names = _axis_names(max_axes) if max_axes <= 3 else [f"axis {a}" for a in range(max_axes)]
    shape = []
    for a in range(max_axes):
        st = _axis_style(a)
        shape.append(plt.Line2D([], [], ls="", marker=st["marker"], markersize=st["s"] ** 0.5,
                                markerfacecolor="#d9d9d9", markeredgecolor=st["edgecolors"],
                                markeredgewidth=st["linewidths"],
                                label=f"axis {a}" + (f" ({names[a]})" if names[a] != f"axis {a}" else "")))
    return colour + shape


def plot_coordinates(layout: "Layout | str", designs: Sequence[str], path: "str | Path", **options) -> Path:
    """One panel per design: every coordinate axis against token index, coloured by modality.

    Each axis has its own marker shape, edge colour and size (axis 0 = large black-edged circle, axis 1 =
    smaller magenta-edged square, ...; equal values nest); the legend lists both. ``options`` are passed to
    every design.
    """
    lay = Layout.coerce(layout)
    kinds = lay.token_types()
    n = len(designs)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    header = 1.25  # inches for the title and the legend, whatever the rows
    height = 3.7 * rows + header
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, height), squeeze=False)
    max_axes = 1
    for ax, name in zip(axes.flat, designs):
        c = positions(lay, name, **options)
        max_axes = max(max_axes, c.shape[1])
        _draw_coordinates(ax, c, kinds)
        ax.set_title(f"{name}  ({c.shape[1]} ax{'es' if c.shape[1] > 1 else 'is'})", fontsize=_FONT["title"])
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles = _legend_handles(kinds, max_axes)
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=_FONT["legend"],
               bbox_to_anchor=(0.5, 1 - 0.38 / height),
               title="fill colour = modality; marker shape, edge colour and size = coordinate axis",
               title_fontsize=_FONT["legend"], handletextpad=0.3, columnspacing=1.2)
    fig.suptitle(f"Coordinates of every token for layout '{lay}'", fontsize=15, y=1 - 0.05 / height)
    fig.tight_layout(rect=(0, 0, 1, 1 - header / height))
    return _save(fig, path)


def diagonal_view(coords: torch.Tensor) -> torch.Tensor:
    """Project 3-axis positions ``(L, 3)`` onto the plane orthogonal to the text diagonal (1, 1, 1): ``(L, 2)``.

    The plane's basis is ``e1 = (0, 1, -1)/√2`` (h − w) and ``e2 = (2, -1, -1)/√6`` (t against h and w),
    orthonormal and both orthogonal to (1, 1, 1); text tokens on the diagonal all land on the origin.
    """
    if coords.ndim != 2 or coords.shape[1] != 3:
        raise ValueError(f"diagonal_view needs 3-axis positions (L, 3), got shape {tuple(coords.shape)}")
    basis = torch.tensor([[0.0, 1.0, -1.0], [2.0, -1.0, -1.0]], dtype=torch.float64)
    basis = basis / basis.norm(dim=1, keepdim=True)
    return coords.to(torch.float64) @ basis.T


def _draw_diagonal_view(ax, coords: torch.Tensor, kinds: torch.Tensor) -> None:
    p = diagonal_view(coords)
    for kind in kinds.unique().tolist():
        m = kinds == kind
        ax.scatter(p[m, 0], p[m, 1], s=14, color=_KIND_COLOURS[kind], label=_KIND_NAMES[kind], zorder=3 + (kind == 0))
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("(h − w)/√2")
    ax.set_ylabel("(2t − h − w)/√6")
    ax.grid(alpha=0.3)


def _draw_3d(ax, coords: torch.Tensor, kinds: torch.Tensor) -> None:
    for kind in kinds.unique().tolist():
        m = kinds == kind
        ax.scatter(coords[m, 2], coords[m, 1], coords[m, 0], s=12, color=_KIND_COLOURS[kind], label=_KIND_NAMES[kind])
    lo, hi = float(coords.min()), float(coords.max())
    ax.plot([lo, hi], [lo, hi], [lo, hi], color="#999", lw=0.8, ls="--")
    ax.set_xlabel("w")
    ax.set_ylabel("h")
    ax.set_zlabel("t")


def rings_figure(layout: "Layout | str", designs: Sequence[str]):
    """The figure :func:`plot_rings` saves, unsaved: for each 3-axis design a 3-D scatter and, below it, the view
    down the text diagonal. Both panels of one design carry its name as ``gid`` (see :func:`pair_arrangement`)."""
    lay = Layout.coerce(layout)
    kinds = lay.token_types()
    three = [d for d in designs if positions(lay, d).shape[1] == 3]
    if not three:
        raise ValueError("plot_rings: none of `designs` has 3 axes (t, h, w); try 'mrope' or 'circle'")
    # at most four designs side by side; each design is a column pair of rows (3-D above, diagonal view below)
    cols = min(len(three), 4)
    blocks = -(-len(three) // cols)
    fig = plt.figure(figsize=(4.6 * cols, 8.8 * blocks))
    for i, name in enumerate(three):
        c = positions(lay, name)
        top = (2 * (i // cols)) * cols + i % cols + 1
        ax = fig.add_subplot(2 * blocks, cols, top, projection="3d")
        _draw_3d(ax, c, kinds)
        ax.set_title(f"{name}: (t, h, w)", fontsize=10)
        ax.set_gid(name)
        ax2 = fig.add_subplot(2 * blocks, cols, top + cols)
        _draw_diagonal_view(ax2, c, kinds)
        ax2.set_title(f"{name}: seen down the text diagonal (1, 1, 1)", fontsize=10)
        ax2.set_gid(name)
    fig.legend(*fig.axes[0].get_legend_handles_labels(), loc="upper right", fontsize=9)
    fig.suptitle(f"3-axis designs in position space, layout '{lay}' (dashed: the text diagonal t = h = w)",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.07 / blocks))
    return fig


def pair_arrangement(fig) -> str:
    """Where each design's diagonal view sits relative to its 3-D panel in a :func:`rings_figure`, read from the
    panels' grid cells: ``"below"``, ``"right"`` (or ``"above"``/``"left"``); ``"mixed"`` when designs differ."""
    cells: dict[str, dict[str, tuple[int, int]]] = {}
    for ax in fig.axes:
        spec = ax.get_subplotspec() if hasattr(ax, "get_subplotspec") else None
        if ax.get_gid() is None or spec is None:
            continue
        kind = "3d" if ax.name == "3d" else "2d"
        cells.setdefault(ax.get_gid(), {})[kind] = (spec.rowspan.start, spec.colspan.start)
    where = set()
    for c in cells.values():
        (r3, c3), (r2, c2) = c["3d"], c["2d"]
        if c3 == c2:
            where.add("below" if r2 > r3 else "above")
        elif r3 == r2:
            where.add("right" if c2 > c3 else "left")
        else:
            where.add("mixed")
    return where.pop() if len(where) == 1 else "mixed"


def plot_rings(layout: "Layout | str", designs: Sequence[str], path: "str | Path") -> Path:
    """3-axis designs (t, h, w): a 3-D scatter and, below it, the view down the text diagonal.

    In the diagonal view (:func:`diagonal_view`) text collapses to the origin and Circle-RoPE's ring,
    which lies in a plane orthogonal to the diagonal, is drawn as the circle it is.
    """
    return _save(rings_figure(layout, designs), path)


def plot_layout(layout: "Layout | str", design: str, path: "str | Path", **options) -> Path:
    """A user's layout under one design: coordinates per token and the positions in position space.

    Right panel: 2 axes → (h, w) scatter; 3 axes → the view down the text diagonal; 1 axis with images or video
    frames → each grid's positions drawn on the grid (up to four grids); otherwise omitted.
    """
    lay = Layout.coerce(layout)
    kinds = lay.token_types()
    c = positions(lay, design, **options)
    A = c.shape[1]
    grids = _image_grids(lay) if A == 1 else []
    if grids:  # the coordinates, then one small panel per grid (constrained layout fits the shared colour bar)
        fig = plt.figure(figsize=(6.5 + 3.6 * len(grids), 5.0), layout="constrained")
        outer = fig.add_gridspec(1, 2, width_ratios=[6.5, 3.6 * len(grids)])
        axes = [[fig.add_subplot(outer[0, 0])]]
        _draw_grid_positions(fig, outer[0, 1], c[:, 0], grids)
    else:
        second = A in (2, 3)
        fig, axes = plt.subplots(1, 2 if second else 1, figsize=(11 if second else 6.5, 4.6), squeeze=False)
    _draw_coordinates(axes[0][0], c, kinds)
    axes[0][0].set_title("coordinates per token", fontsize=10)
    if A == 3:
        _draw_diagonal_view(axes[0, 1], c, kinds)
        axes[0, 1].set_title("positions seen down the text diagonal (1, 1, 1)", fontsize=10)
    elif A == 2:
        ax = axes[0, 1]
        for kind in kinds.unique().tolist():
            m = kinds == kind
            ax.scatter(c[m, 1], c[m, 0], s=14, color=_KIND_COLOURS[kind])
        ax.invert_yaxis()  # h downward, as in an image
        ax.set_xlabel("w (axis 1)")
        ax.set_ylabel("h (axis 0, down)")
        ax.set_aspect("equal", adjustable="datalim")
        ax.grid(alpha=0.3)
        ax.set_title("positions in the (h, w) plane", fontsize=10)
    handles = _legend_handles(kinds, A)
    title = f"Layout '{lay}', design {get_design(design).name} ({A} ax{'es' if A > 1 else 'is'})"
    if grids:
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=9)
        fig.suptitle(title, fontsize=11)
    else:
        fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=9, bbox_to_anchor=(0.5, 0.95))
        fig.suptitle(title, fontsize=11)
        fig.tight_layout(rect=(0, 0, 1, 0.89))
    return _save(fig, path)


_MAX_GRIDS = 4  # image grids a 1-axis plot shows side by side


def _image_grids(lay: Layout) -> "list[tuple[str, int, int, int]]":
    """(label, first token, h, w) of each image or video frame of ``lay``, in order, at most ``_MAX_GRIDS``."""
    out, start = [], 0
    for seg in lay:
        if isinstance(seg, Image):
            out.append((f"image {sum(1 for g in out if g[0].startswith('image')) + 1}", start, seg.h, seg.w))
        elif isinstance(seg, Video):
            out.extend((f"frame {f + 1}", start + f * seg.h * seg.w, seg.h, seg.w) for f in range(seg.t))
        start += seg.num_tokens
    return out[:_MAX_GRIDS]


def _draw_grid_positions(fig, spec, pos: torch.Tensor, grids: "list[tuple[str, int, int, int]]") -> None:
    """A 1-axis design's position of every token of each image grid, drawn on the grid (row down, column right),
    one colour scale for all grids, each cell labelled with its value (up to 8 × 8): where a 1-D design puts a
    2-D image (PyPE's rings, ID-Align's thumbnail cells, V2PE's fractions)."""
    from matplotlib.ticker import MaxNLocator

    values = [pos[s:s + h * w].reshape(h, w) for _, s, h, w in grids]
    lo = min(float(v.min()) for v in values)
    hi = max(max(float(v.max()) for v in values), lo + 1e-6)
    inner = spec.subgridspec(1, len(grids))
    subs = []
    for i, ((label, _, h, w), v) in enumerate(zip(grids, values)):
        sub = fig.add_subplot(inner[0, i])
        im = sub.imshow(v.numpy(), cmap="viridis", vmin=lo, vmax=hi)
        if h * w <= 64:
            for r in range(h):
                for col in range(w):
                    val = float(v[r, col])
                    sub.text(col, r, f"{val:g}" if val == round(val) else f"{val:.2f}", ha="center", va="center",
                             fontsize=8, color="white" if val - lo < 0.6 * (hi - lo) else "black")
        sub.set_title(f"{label}: position", fontsize=10)
        sub.set_xlabel("column", fontsize=9)
        if i == 0:
            sub.set_ylabel("row", fontsize=9)
        sub.xaxis.set_major_locator(MaxNLocator(nbins=min(w, 6), integer=True))
        sub.yaxis.set_major_locator(MaxNLocator(nbins=min(h, 6), integer=True))
        sub.tick_params(labelsize=8)
        subs.append(sub)
    fig.colorbar(im, ax=subs, shrink=0.6, label="position")


def plot_bias_maps(
    layout: "Layout | str", designs: Sequence[str], path: "str | Path", *, head_dim: int = 128,
    base: float = 10000.0,
) -> tuple[Path, dict[str, torch.Tensor]]:
    """Rows = designs, columns = frames: the expected positional kernel from the text after the video to
    each video token (cf. VRoPE fig. 3), all rows on one colour scale. Returns the path and the maps.

    Each frame is drawn as an image: rows = h (downward), columns = w.
    """
    lay = Layout.coerce(layout)
    maps = {d: attention_bias_map(lay, d, head_dim=head_dim, base=base) for d in designs}
    vmin = min(float(m.min()) for m in maps.values())
    vmax = max(float(m.max()) for m in maps.values())
    T = next(iter(maps.values())).shape[0]
    fig, axes = plt.subplots(len(designs), T, figsize=(1.9 * T + 2.4, 1.9 * len(designs) + 0.4), squeeze=False)
    for r, (name, m) in enumerate(maps.items()):
        within = float((m.amax(dim=(1, 2)) - m.amin(dim=(1, 2))).mean())
        for f in range(T):
            ax = axes[r, f]
            im = ax.imshow(m[f].numpy(), cmap="viridis", vmin=vmin, vmax=vmax)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"frame {f}", fontsize=9)
            if r == len(designs) - 1:
                ax.set_xlabel("w →", fontsize=8)
            if f == 0:
                ax.set_ylabel(f"{name} ({get_design(name).allocation})\nwithin-frame spread {within:.3f}\n↓ h",
                              fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.025, pad=0.02,
                 label="expected positional kernel  E[q·R(Δ)q] / E[q·q]")
    fig.suptitle(f"Expected positional kernel from the text after the video to each video token\n"
                 f"layout '{lay}', head_dim {head_dim}; one colour scale for all rows; lighter = higher",
                 fontsize=10, y=1.0 + 0.15 / len(designs))
    return _save(fig, path), maps


def _save(fig, path: "str | Path") -> Path:
    """Write ``fig`` to ``path`` (``.png`` added when it has no suffix) and return the path written."""
    p = Path(path)
    if p.is_dir() or str(path).endswith(("/", "\\")):
        plt.close(fig)
        raise ValueError(f"`save_path` {str(path)!r} is a directory; give a file name, e.g. {str(p / 'figure.png')!r}")
    if not p.suffix:
        p = p.with_suffix(".png")  # what matplotlib would write; report that name, not the one given
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(p, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return p
