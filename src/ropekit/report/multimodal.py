"""Report sections for the multimodal designs: coordinates, PTD table, attention-bias maps."""
from __future__ import annotations

import html
from pathlib import Path

from ..analysis.figures import plot_bias_maps, plot_coordinates, plot_rings
from ..analysis.metrics import layout_ptd
from ..designs.registry import designs, get_design
from ._html import table as _table

IMAGE_LAYOUT = "T4 I4x4 T4"
VIDEO_LAYOUT = "T4 V3x3x3 T4"
BIAS_LAYOUT = "T4 V4x6x6 T16"
PTD_LAYOUTS = ("I3x3 T5", IMAGE_LAYOUT, VIDEO_LAYOUT, "T2 I3x3 T2 I2x4 T2")
BIAS_DESIGNS = ("vanilla", "mrope", "vrope", "circle")


def designs_section(out: Path) -> dict:
    names = designs()
    plot_coordinates(IMAGE_LAYOUT, names, out / "designs_image.png")
    plot_coordinates(VIDEO_LAYOUT, names, out / "designs_video.png")
    three = [n for n in names if n in ("mrope", "compact", "circle")]
    if three:
        plot_rings(IMAGE_LAYOUT, three, out / "designs_3d.png")
    rows = [[f"<code>{n}</code>", html.escape(get_design(n).summary), get_design(n).allocation,
             ", ".join(get_design(n).options) or "–"] for n in names]
    return {
        "title": "Position designs",
        "html": _table(["design", "what it does", "allocation", "options"], rows)
        + f"<p>Layout <code>{IMAGE_LAYOUT}</code>:</p><img src='designs_image.png'>"
        + ("<img src='designs_3d.png'>" if three else "")
        + f"<p>Layout <code>{VIDEO_LAYOUT}</code>:</p><img src='designs_video.png'>",
        "metrics": {"designs": names},
    }


def ptd_section(out: Path) -> dict:
    names = designs()
    values = {lay: {n: layout_ptd(lay, n) for n in names} for lay in PTD_LAYOUTS}
    rows = [[f"<code>{n}</code>"] + [f"{values[lay][n]:.3f}" for lay in PTD_LAYOUTS] for n in names]
    note = ("<p class='note'>Per-Token Distance (Circle-RoPE eq. 1): mean deviation of each text token's "
            "distance to the image tokens from its own mean. 0 = every text token is equidistant from all "
            "vision tokens. The paper's Table 1 uses 9 image + 5 text tokens (first column): hard 2.22, "
            "unordered 0, Circle 0; its 'spatial' 0.64 is a 2-D illustration, while <code>mrope</code> "
            "here is the 3-axis Qwen design.</p>")
    return {
        "title": "Per-Token Distance (PTD) of every design",
        "html": note + _table(["design"] + [f"<code>{lay}</code>" for lay in PTD_LAYOUTS], rows),
        "metrics": values,
    }


def bias_section(out: Path) -> dict:
    avail = [d for d in BIAS_DESIGNS if d in designs()]
    _, stats = plot_bias_maps(BIAS_LAYOUT, avail, out / "bias_maps.png")
    rows = [[f"<code>{d}</code>", f"{s['min']:.3f}", f"{s['max']:.3f}", f"{s['spread']:.3f}",
             f"{s['flip_asymmetry']:.3f}"] for d, s in stats.items()]
    note = ("<p class='note'>Expected positional kernel (isotropic q = k, SPEC §5) from the text tokens after "
            "the video to every video token, per frame (VRoPE fig. 3). A smaller spread means position biases "
            "attention less; 'flip asymmetry' compares each frame with itself rotated by 180°. Note that "
            "Circle-RoPE's PTD = 0 is a statement about Euclidean distance: under M-RoPE sections the three "
            "axes rotate at different frequencies, so the kernel still varies around the ring.</p>")
    return {
        "title": "Text → video attention bias",
        "html": note + "<img src='bias_maps.png'>"
        + _table(["design", "min", "max", "spread", "flip asymmetry"], rows),
        "metrics": stats,
    }
