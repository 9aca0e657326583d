"""Report sections for the multimodal designs: coordinates, PTD table, attention-bias maps.

Each section takes the report's output folder and, optionally, the user's own ``layout`` and a subset
of ``designs`` (``ropekit report --layout ... --designs ...``); without them it shows the default
layouts and every registered design. Sentences that state a result are written from the measured
numbers by the small ``*_sentences`` functions below, so a caption cannot contradict its table.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Sequence

import torch

from ..analysis.figures import _save as save_figure
from ..analysis.figures import pair_arrangement, plot_bias_maps, plot_coordinates, plot_layout, rings_figure
from ..analysis.metrics import block_ptd, boundary_continuity, frame_bias, layout_ptd
from ..designs.registry import designs as registered, get_design, positions
from ..layout import Image, Layout
from ._html import table as _table

IMAGE_LAYOUT = "T4 I4x4 T4"
VIDEO_LAYOUT = "T4 V3x3x3 T4"
AUDIO_LAYOUT = "T3 A4 T1 V2x2x2@2 T1 A3 T3"  # audio before and after a video, as an omni prompt has them
BIAS_LAYOUT = "T4 V4x6x6 T16"
PTD_LAYOUTS = ("I3x3 T5", IMAGE_LAYOUT, VIDEO_LAYOUT, "T2 I3x3 T2 I2x4 T2")
BIAS_DESIGNS = ("vanilla", "mrope", "vrope", "circle")
HEAD_DIM = 128
# designs whose rule shows only on a layout of their own (a thumbnail and its high-resolution view, a square image
# across layers, markers and slices): (design, layout, options)
OWN_LAYOUTS = (
    ("id-align", "T2 I2x2 I4x4 T2", {"thumbnail": (2, 2)}),
    ("pype", "T1 I6x6 T1", {"layer": 0}),
    ("pype", "T1 I6x6 T1", {"layer": 1}),
    ("canvas-mrope", "T2 I2x2 T2 I2x2 T2 I2x2 T2", {"markers": True, "slices": ["1x2"]}),
)


def own_layout_caption(layout: str, design: str, **options) -> str:
    """What the figure of ``design`` on ``layout`` shows, from its coordinates: per image, its size, how many
    distinct positions its tokens take and their range on each axis; then where the last token sits."""
    lay = Layout.coerce(layout)
    c = positions(lay, design, **options)
    parts, start, k = [], 0, 0
    for seg in lay:
        if isinstance(seg, Image):
            k += 1
            block = c[start:start + seg.num_tokens]
            names = ("t", "h", "w") if c.shape[1] == 3 else ("",) * c.shape[1]
            spans = ", ".join(f"{n} {_num(block[:, a].min())}–{_num(block[:, a].max())}".strip()
                              for a, n in enumerate(names))
            distinct = len(torch.unique(block, dim=0))
            parts.append(f"image {k} ({seg.h}×{seg.w}, {seg.num_tokens} tokens) takes {distinct} distinct "
                         f"position{'s' if distinct != 1 else ''} ({spans})")
        start += seg.num_tokens
    last = ", ".join(_num(v) for v in c[-1])
    return "; ".join(parts) + f"; the last text token is at ({last})."


def _num(x) -> str:
    v = float(x)
    return f"{v:g}" if v == round(v) else f"{v:.2f}"


def _designs(chosen: "Sequence[str] | None") -> list[str]:
    return list(chosen) if chosen else registered()


def _code(text: str) -> str:
    return f"<code>{html.escape(str(text))}</code>"


def designs_section(out: Path, *, layout: "str | None" = None, designs: "Sequence[str] | None" = None) -> dict:
    names = _designs(designs)
    layouts = [layout] if layout else [IMAGE_LAYOUT, VIDEO_LAYOUT, AUDIO_LAYOUT]
    parts = []
    for i, lay in enumerate(layouts):
        png = "designs_layout.png" if layout else ("designs_image.png", "designs_video.png", "designs_audio.png")[i]
        plot_coordinates(lay, names, out / png)
        note = (" Audio tokens (red) are placed as each design's audio rule says: a text run, one position per "
                "token (docs/designs.md, \"Audio\")." if lay == AUDIO_LAYOUT else "")
        parts.append(f"<p>Layout {_code(lay)}:{note}</p><img src='{png}'>")
    three = [n for n in names if positions(layouts[0], n).shape[1] == 3]
    if three:
        fig = rings_figure(layouts[0], three)
        caption = rings_caption(pair_arrangement(fig))
        save_figure(fig, out / "designs_3d.png")
        parts.insert(1, f"<p class='note'>{html.escape(caption)}</p><img src='designs_3d.png'>")
    shown = [(d, lay, opts) for d, lay, opts in OWN_LAYOUTS if d in names] if not layout else []
    for i, (d, lay, opts) in enumerate(shown):
        png = f"designs_own_{i}.png"
        plot_layout(lay, d, out / png, **opts)
        args = ", ".join(f"{k}={v!r}" for k, v in opts.items())
        parts.append(f"<p>{_code(d)} on {_code(lay)}{' (' + html.escape(args) + ')' if args else ''}: "
                     f"{html.escape(own_layout_caption(lay, d, **opts))}</p><img src='{png}'>")
    rows = [[_code(n), html.escape(get_design(n).summary), get_design(n).allocation,
             ", ".join(get_design(n).options) or "–"] for n in names]
    return {
        "title": "Position designs",
        "html": _table(["design", "what it does", "allocation", "options"], rows) + "".join(parts),
        "metrics": {"designs": names, "layouts": layouts},
    }


_PAIR_WORDS = {  # where the diagonal view sits -> (the 3-D panel, the diagonal view), as a reader finds them
    "below": ("Upper panel of each design", "The panel below it"),
    "above": ("Lower panel of each design", "The panel above it"),
    "right": ("Left of each pair", "Right"),
    "left": ("Right of each pair", "Left"),
}


def rings_caption(arrangement: str) -> str:
    """The caption of the 3-axis figure, naming its panels by where :func:`pair_arrangement` found them."""
    first, second = _PAIR_WORDS.get(arrangement, ("For each design, the panel titled '(t, h, w)'",
                                                  "The panel titled 'seen down the text diagonal'"))
    return (f"{first}: the 3-axis positions in (t, h, w) space. {second}: the same points seen down the text "
            "diagonal (1, 1, 1), i.e. projected onto the plane orthogonal to it; text tokens on the diagonal "
            "t = h = w land on the centre, and a design that puts an image on a ring orthogonal to the diagonal "
            "(Circle-RoPE) shows a circle.")


def ptd_sentences(whole: dict[str, dict[str, float]], blocks: dict[str, dict[str, dict[str, float]]],
                  reference: str = "vanilla") -> list[str]:
    """Sentences explaining where whole-sequence and per-block PTD differ, from the measured values.

    ``whole[layout][design]`` is the PTD over every vision token, ``blocks[layout][design][label]`` the
    PTD per image/frame. For each layout with several blocks, names the designs that are at least twice
    as balanced per block as over the sequence; then the designs whose whole-sequence PTD exceeds the
    ``reference`` design's on a layout.
    """
    out = []
    for lay, per_design in blocks.items():
        if len(next(iter(per_design.values()))) < 2:
            continue
        split = [(d, max(b.values()), whole[lay][d]) for d, b in per_design.items()
                 if whole[lay][d] > 0.01 and max(b.values()) <= 0.5 * whole[lay][d]]
        if split:
            items = ", ".join(f"{d} {b:.3f} → {w:.3f}" for d, b, w in split)
            out.append(f"On {lay!r} the whole-sequence PTD is more than twice the largest per-block PTD for "
                       f"(per block → whole): {items}. Per block, one image or frame is measured against the "
                       "text; over the whole sequence the blocks also sit at different distances from each text "
                       "token, and that difference adds to the deviation.")
    for lay, per_design in whole.items():
        if reference not in per_design:
            continue
        ref = per_design[reference]
        worse = [(d, v) for d, v in per_design.items() if d != reference and v > ref + 1e-6]
        if worse:
            items = ", ".join(f"{d} ({v:.3f})" for d, v in worse)
            out.append(f"On {lay!r} the whole-sequence PTD of {items} is larger than {reference}'s ({ref:.3f}).")
    return out


def _ptd_cell(value: float, per_block: dict[str, float]) -> list[str]:
    vals = list(per_block.values())
    if len(vals) == 1:
        return [f"{value:.3f}", "<span class='nowrap'>(one block)</span>"]
    shown = " / ".join(f"{v:.3f}" for v in vals[:4]) + (f" / … ({len(vals)} blocks)" if len(vals) > 4 else "")
    return [f"{value:.3f}", shown]


def ptd_section(out: Path, *, layout: "str | None" = None, designs: "Sequence[str] | None" = None) -> dict:
    names = _designs(designs)
    layouts = (layout,) if layout else PTD_LAYOUTS
    whole = {lay: {n: layout_ptd(lay, n) for n in names} for lay in layouts}
    blocks = {lay: {n: block_ptd(lay, n) for n in names} for lay in layouts}
    header = ["design"] + [h for lay in layouts for h in (f"{_code(lay)} whole", "per block")]
    rows = [[_code(n)] + [c for lay in layouts for c in _ptd_cell(whole[lay][n], blocks[lay][n])] for n in names]
    note = ("<p class='note'>Per-Token Distance (Circle-RoPE paper, eq. 1): the mean, over text tokens t and "
            "vision tokens i, of |d(t, i) − mean<sub>i</sub> d(t, i)| with Euclidean d. 0 = every text token "
            "is equidistant from all the vision tokens considered. <i>whole</i>: all image/video tokens of the "
            "layout at once; <i>per block</i>: each image, and each frame of a video, on its own (in layout "
            "order). The paper's Table 1 uses 9 image + 5 text tokens (first layout): hard 2.22, unordered 0, "
            "Circle 0; its 'spatial' 0.64 is a 2-D illustration, while <code>mrope</code> here is the 3-axis "
            "Qwen design.</p>")
    said = "".join(f"<p>{html.escape(s)}</p>" for s in ptd_sentences(whole, blocks))
    return {
        "title": "Per-Token Distance (PTD): per block and over the whole sequence",
        "html": note + _table(header, rows) + said,
        "metrics": {"whole": whole, "per_block": blocks},
    }


def bias_sentences(stats: dict[str, dict]) -> list[str]:
    """Verdicts on positional bias and video→text continuity, from :func:`bias_section`'s numbers.

    ``stats[design]`` holds ``within_frame``, ``across_frames`` (from :func:`frame_bias`) and
    ``index_jump``, ``jump``, ``kernel_gap``, ``kernel_step`` (from :func:`boundary_continuity`).
    """
    by_within = sorted(stats, key=lambda d: stats[d]["within_frame"])
    by_across = sorted(stats, key=lambda d: stats[d]["across_frames"])
    lo, hi = by_within[0], by_within[-1]
    out = [
        f"Bias within a frame (what the VRoPE paper calls positional attention bias): least for {lo} "
        f"({stats[lo]['within_frame']:.3f}), most for {hi} ({stats[hi]['within_frame']:.3f}); order: "
        + ", ".join(f"{d} {stats[d]['within_frame']:.3f}" for d in by_within) + ".",
        "Decay across frames (mean kernel of the nearest frame minus the farthest; ordinary distance decay, "
        "not a spatial bias): " + ", ".join(f"{d} {stats[d]['across_frames']:.3f}" for d in by_across) + ".",
    ]
    seamless = [d for d in stats if abs(stats[d]["index_jump"] - 1) < 1e-6]
    jumps = sorted((d for d in stats if d not in seamless), key=lambda d: -stats[d]["index_jump"])
    sent = "Video→text transition by position index (the paper's notion): "
    sent += (", ".join(seamless) + " continue every axis by exactly one step" if seamless else "no design continues "
             "every axis by one step")
    if jumps:
        sent += "; " + ", ".join(f"{d} jumps by {stats[d]['index_jump']:.2f}" for d in jumps) + " on some axis"
    out.append(sent + ".")
    by_gap = sorted(stats, key=lambda d: stats[d]["jump"])
    out.append(
        "In position space (what the kernel sees), the first text token is this many text steps from the "
        "nearest video token: " + ", ".join(f"{d} {stats[d]['jump']:.2f}" for d in by_gap)
        + "; expected kernel across that gap vs across one text step: "
        + ", ".join(f"{d} {stats[d]['kernel_gap']:.3f} vs {stats[d]['kernel_step']:.3f}" for d in by_gap) + "."
    )
    return out


def bias_section(out: Path, *, layout: "str | None" = None, designs: "Sequence[str] | None" = None) -> dict:
    lay = layout or BIAS_LAYOUT
    avail = list(designs) if designs else [d for d in BIAS_DESIGNS if d in registered()]
    try:
        stats = {d: {**frame_bias(lay, d, head_dim=HEAD_DIM), **boundary_continuity(lay, d, head_dim=HEAD_DIM)}
                 for d in avail}
    except ValueError as e:  # the user's layout has no image/video followed by text to measure from
        return {"title": "Text → video attention bias and the video→text transition",
                "html": f"<p>Not measured for layout {_code(lay)}: {html.escape(str(e))}.</p>", "metrics": {}}
    plot_bias_maps(lay, avail, out / "bias_maps.png", head_dim=HEAD_DIM)
    rows = [[_code(d), f"{s['within_frame']:.3f}", f"{s['flip_asymmetry']:.3f}", f"{s['across_frames']:.3f}",
             f"{s['index_jump']:.2f}",
             f"{s['jump']:.2f}", f"{s['kernel_gap']:.3f}", f"{s['kernel_step']:.3f}"] for d, s in stats.items()]
    note = (f"<p class='note'>Layout {_code(lay)}, head_dim {HEAD_DIM}, each design with its own frequency "
            "allocation. The figure shows the <i>expected positional kernel</i> E[q·R(Δ)q] / E[q·q] (isotropic "
            "q = k: what attention sees of position alone) from the text tokens after the block to every "
            "token of it, one panel per frame (as in the VRoPE paper's fig. 3), on one colour scale for all "
            "rows. The table separates the two things that figure mixes: <i>within frame</i> = max − min of "
            "the kernel over one frame, averaged over frames (the spatial bias VRoPE targets); <i>flip asymmetry</i> "
            "= largest change when each frame is rotated by 180° (VRoPE's symmetric coordinates aim at 0); <i>across "
            "frames</i> = spread of the per-frame means (distance decay from the query). Then the video→text "
            "boundary: <i>index jump</i> = largest, over axes, of the first text coordinate minus the block's "
            "largest coordinate (1 = seamless, the paper's notion); <i>gap / step</i> = Euclidean distance from "
            "the first text token to the nearest block token, in units of one text step; and the kernel across "
            "that gap and across one text step. PTD = 0 is about Euclidean distance only: with per-axis "
            "frequencies a ring still sees different kernels around it.</p>")
    said = "".join(f"<p>{html.escape(s)}</p>" for s in bias_sentences(stats))
    return {
        "title": "Text → video attention bias and the video→text transition",
        "html": note + "<img src='bias_maps.png'>"
        + _table(["design", "within frame", "flip asymmetry", "across frames", "index jump", "gap / step", "kernel across gap",
                  "kernel across a text step"], rows) + said,
        "metrics": stats,
    }
