"""Report section: which rotary families are exactly relative, and GeoPE's kernel against axial RoPE's."""
from __future__ import annotations

import html
from pathlib import Path

import torch

from ..analysis.nd import LINES, kernel_along_lines
from ..analysis.nd_figures import COL_LABEL, ROW_LABEL, plot_relative_kernels
from ..analysis.relative import kernel_maps, relative_table

HEAD_DIM = 96
RADIUS = 15  # the kernel maps cover offsets −15 … 15 on both axes
MOVE = (40.0, 40.0)  # a second query position with the same offsets around it
PROBE = 5  # the caption reads the maps 5√2 ≈ 7.1 tokens from the query (cells (±5, ±5) on the diagonals)
QUERY_LINE = "diagonal Δh = Δw"  # the line from the grid origin through the query (r, r) and (r+40, r+40)


def kernel_sentences(lines: dict[str, dict[str, float]], moved_change: dict[str, float], distance: int,
                     query_line: str = QUERY_LINE) -> list[str]:
    """Caption sentences for the kernel maps, written from the measured values only.

    ``lines[name]`` is :func:`kernel_along_lines` of a map at ``distance``; ``moved_change[name]`` the
    largest change of the map when the query moves. One sentence per map (highest and lowest line, and
    "round" or "a cross" when the numbers say so), one on the line through the query for embeddings
    that depend on where the query is, and one on which maps are unchanged by the move.
    """
    out, far = [], f"{distance * 2 ** 0.5:.1f} tokens from the query"
    for name, v in lines.items():
        best, worst = max(v, key=v.get), min(v, key=v.get)
        top = " and ".join(line for line in LINES if v[best] - v[line] < 0.005)
        bottom = " and ".join(line for line in LINES if v[line] - v[worst] < 0.005)
        if v[best] - v[worst] < 0.02:
            out.append(f"{name}: {far} the kernel is about the same on every line ({v[worst]:.2f}–{v[best]:.2f}), "
                       "a round map.")
            continue
        sent = f"{name}: {far} the kernel is highest along the {top} ({v[best]:.2f}) and lowest along the {bottom} " \
               f"({v[worst]:.2f})"
        axes, diagonals = (v[LINES[0]], v[LINES[1]]), (v[LINES[2]], v[LINES[3]])
        if min(axes) > max(diagonals) + 0.02:
            sent += "; a cross: keys in the query's row or column stay more similar than keys on the diagonals"
        out.append(sent + ".")
        if moved_change.get(name, 0.0) > 1e-6 and query_line in v:
            across = next(line for line in LINES[2:] if line != query_line)
            more = ("across that line more similar than keys along it" if v[across] > v[query_line]
                    else "along that line more similar than keys across it")
            out.append(f"{name} depends on where the query is: on the line from the grid origin through the "
                       f"query ({query_line}) the kernel is {v[query_line]:.2f}, on the line across it "
                       f"({across}) {v[across]:.2f}, so {name} keeps keys {more}.")
    fixed = [n for n, c in moved_change.items() if c <= 1e-6]
    moving = [f"{n} (up to {c:.3f})" for n, c in moved_change.items() if c > 1e-6]
    if moving:
        out.append("Moving the query with the offsets kept changes the map of " + ", ".join(moving)
                   + (f"; {', '.join(fixed)} do not change (exactly relative)." if fixed else "."))
    return out


def section(out_dir: Path, **_) -> dict:
    """Relative-position error table for every family plus GeoPE vs axial kernel maps."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = relative_table(HEAD_DIM, num_trials=128)
    maps = kernel_maps(HEAD_DIM, RADIUS, MOVE)
    offsets = torch.arange(-RADIUS, RADIUS + 1, dtype=torch.float64)
    panels = {n: m[0] for n, m in maps.items()}
    panels[f"GeoPE, query moved by (+{MOVE[0]:g}, +{MOVE[1]:g})"] = maps["GeoPE"][1]
    plot_relative_kernels(panels, offsets, out_dir / "relative_kernels.png",
                          title=f"Expected kernel from a query at ({RADIUS}, {RADIUS}) to offsets around it "
                                f"(head_dim {HEAD_DIM}, λ = 100)")
    lines = {n: kernel_along_lines(m, offsets, PROBE) for n, m in panels.items()}
    moved = {n: float((a - b).abs().max()) for n, (a, b) in maps.items()}
    kern = {
        name: {
            "min": float(a.min()),
            "max_off_centre": float(a[torch.arange(a.numel()).reshape(a.shape) != a.numel() // 2].max()),
            "change_when_moved": moved[name],
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
        "<p class='note'>Relative-position error: max over 128 random q, k (standard normal, "
        f"head_dim {HEAD_DIM}), integer positions in [0, 32] and shifts in [−32, 32] of "
        "|⟨R<sub>m</sub>q, R<sub>n</sub>k⟩ − ⟨R<sub>m+δ</sub>q, R<sub>n+δ</sub>k⟩|, in float32. "
        "'ratio' divides by the RMS score; below 1e-4 it is float rounding. Planar families and Linear GeoPE "
        "are exactly relative; GeoPE is not (rotations about different axes do not commute) except for 1-D "
        "positions. Linear GeoPE works from position differences, so integer shifts leave it bit-identical.</p>"
    )
    knote = (
        "<p class='note'>Expected kernel for isotropic q: per GeoPE triple (1 + 2 cos Θ<sub>rel</sub>)/3, "
        "Θ<sub>rel</sub> the angle of R<sub>m</sub><sup>T</sup>R<sub>n</sub>; per planar pair cos φ. The query "
        f"sits at position (h, w) = ({RADIUS}, {RADIUS}) of a grid starting at 0 (last panel: moved by "
        f"(+{MOVE[0]:g}, +{MOVE[1]:g})). Axes as in every kernel map of this report: rows = {ROW_LABEL}, "
        f"columns = {COL_LABEL}. Read from the maps:</p><ul>"
        + "".join(f"<li>{html.escape(t)}</li>" for t in kernel_sentences(lines, moved, PROBE)) + "</ul>"
    )
    html_out = (
        note + f"<table><tr>{head}</tr>{body}</table>" + knote + "<img src='relative_kernels.png'>"
        + "<table><tr><th>embedding</th><th>min</th><th>max off centre</th><th>max change when the query moves</th></tr>"
        + ktab + "</table>"
    )
    return {
        "title": "Relative position: which embeddings depend on n − m only",
        "html": html_out,
        "metrics": {"relative_error": rows, "kernel": kern, "kernel_along_lines": lines, "probe_distance": PROBE,
                    "head_dim": HEAD_DIM},
    }
