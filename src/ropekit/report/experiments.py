"""Report section for trained-model experiments: heat maps, curves with interval bands, verdicts.

Reads every ``<dir>/<experiment>/aggregate.json`` written by ``ropekit experiment``, and every stored
aggregate ``<dir>/experiments-<name>-<preset>.json`` (as kept in ``docs/results/``); nothing is run here,
and a folder holding neither is an error (:func:`find_results`).
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..experiments.stats import verdict_text  # noqa: E402
from ._html import table  # noqa: E402

__all__ = ["experiments_section", "find_results", "plot_heatmaps", "plot_curve", "plot_polar", "plot_bars",
           "plot_lambda_sweep", "lambda_series", "plot_forest", "claims_table", "scope", "PANEL_ABOVE",
           "VERDICT_COLOURS", "scope_label", "scope_note", "forest_label"]


def plot_heatmaps(agg: dict, key: str, path: Path) -> str:
    """One panel per design (mean over seeds), one shared 0–1 colour bar; returns a caption from the numbers."""
    maps = {d: m[key]["mean"] for d, m in agg["metrics"].items() if key in m}
    n = len(maps)
    cols = min(5, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(2.9 * cols + 1.2, 3.0 * rows), squeeze=False)
    im = None
    for i, (ax, (d, grid)) in enumerate(zip(axes.flat, maps.items())):
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
        spread = agg["metrics"][d]["cell_spread"]["mean"]
        ax.set_title(f"{d}\nspread {spread:.3f}", fontsize=9)
        ax.set_xlabel("column")
        ax.set_ylabel("row")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.subplots_adjust(hspace=0.55, wspace=0.3)
    fig.colorbar(im, ax=axes, label=f"accuracy (mean of {agg['seeds']} seeds)", shrink=0.8)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    spreads = {d: agg["metrics"][d]["cell_spread"]["mean"] for d in maps}
    lo, hi = min(spreads, key=spreads.get), max(spreads, key=spreads.get)
    return (f"Accuracy per target cell. Flattest map: {lo} (std over cells {spreads[lo]:.3f}); "
            f"most location-dependent: {hi} ({spreads[hi]:.3f}).")


PANEL_ABOVE = 5  # more designs than this: one small panel per design, the reference drawn in every panel


def _reference(agg: dict, designs: list) -> "str | None":
    """The baseline most claims compare against (drawn in every panel of small multiples), if it was run."""
    bases = [c["baseline"] for c in agg.get("claims", []) if c["baseline"] in designs]
    return max(bases, key=bases.count) if bases else None


def _panels(n: int, polar: bool = False):
    cols = min(4, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, (3.3 if polar else 2.6) * rows), squeeze=False,
                             sharex=not polar, sharey=not polar, subplot_kw={"projection": "polar"} if polar else None)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    if not polar:  # a panel whose neighbour below is empty still needs its x labels
        for ax in list(axes.flat)[:n]:
            ax.tick_params(labelbottom=True)
    return fig, list(axes.flat)[:n]


def _curve(ax, m: dict, key: str, label: str, **style) -> None:
    xs = list(m[key])
    pos = range(len(xs))
    (line,) = ax.plot(pos, [m[key][x]["mean"] for x in xs], marker="o", ms=3, label=label, **style)
    ax.fill_between(pos, [m[key][x]["lo"] for x in xs], [m[key][x]["hi"] for x in xs], alpha=0.15,
                    color=line.get_color())
    step = -(-len(xs) // 8)  # at most 8 labels, so that 16 angle bins stay readable
    ax.set_xticks(list(pos), [x if i % step == 0 else "" for i, x in enumerate(xs)])


def plot_curve(agg: dict, key: str, xlabel: str, path: Path) -> str:
    """Accuracy against a condition with 95 % interval bands: one line per design, or (more than
    ``PANEL_ABOVE`` designs) one panel per design with the reference design dashed in each; a caption."""
    designs = [d for d, m in agg["metrics"].items() if key in m]
    ref = _reference(agg, designs) if len(designs) > PANEL_ABOVE else None
    if ref is None:
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for d in designs:
            _curve(ax, agg["metrics"][d], key, d)
        ax.legend(fontsize=7, ncol=2)
        axes = [ax]
    else:
        fig, axes = _panels(len(designs))
        for ax, d in zip(axes, designs):
            if d != ref:
                _curve(ax, agg["metrics"][ref], key, ref, color="0.5", ls="--")
            _curve(ax, agg["metrics"][d], key, d, color="C0" if d != ref else "C3")
            ax.set_title(d, fontsize=9)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{xlabel}; each panel one design, dashed: {ref}", fontsize=9)
    import textwrap

    for ax in axes:  # every panel labels both its axes: a reader looking at one panel needs no other
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.set_xlabel(xlabel if ref is None else textwrap.fill(xlabel, 42), fontsize=None if ref is None else 8)
        ax.set_ylabel("accuracy", fontsize=None if ref is None else 8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    last = {d: (list(agg["metrics"][d][key])[-1], agg["metrics"][d][key][list(agg["metrics"][d][key])[-1]]["mean"])
            for d in designs}
    best = max(last, key=lambda d: last[d][1])
    worst = min(last, key=lambda d: last[d][1])
    x = last[best][0]
    return (f"Accuracy vs {xlabel}; bands are 95 % t-intervals over {agg['seeds']} seeds. At {x}: best {best} "
            f"({last[best][1]:.3f}), worst {worst} ({last[worst][1]:.3f}).")


def plot_polar(agg: dict, key: str, path: Path) -> str:
    """Accuracy against direction angle on polar axes (radius 0–1): one closed line per design, or one
    panel per design with the reference design dashed in each when there are many; returns a caption."""
    import math

    designs = [d for d, m in agg["metrics"].items() if key in m]
    ref = _reference(agg, designs) if len(designs) > PANEL_ABOVE else None

    def ring(ax, d, **style):
        xs = list(agg["metrics"][d][key])
        th = [math.radians(float(x) + 180 / len(xs)) for x in xs]  # bin centres
        vals = [agg["metrics"][d][key][x]["mean"] for x in xs]
        ax.plot(th + th[:1], vals + vals[:1], label=d, lw=1.2, **style)

    if ref is None:
        fig = plt.figure(figsize=(6.4, 5.2))
        axes = [fig.add_subplot(projection="polar")]
        for d in designs:
            ring(axes[0], d)
        axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.05, 1.0))
    else:
        fig, axes = _panels(len(designs), polar=True)
        for ax, d in zip(axes, designs):
            if d != ref:
                ring(ax, ref, color="0.5", ls="--")
            ring(ax, d, color="C0" if d != ref else "C3")
            spread = agg["metrics"][d].get("angle_spread", {}).get("mean", float("nan"))
            ax.set_title(f"{d} (spread {spread:.3f})", fontsize=9)
            ax.tick_params(labelsize=6)
        fig.suptitle(f"accuracy by direction, mean of {agg['seeds']} seeds; dashed: {ref}", fontsize=9)
    for ax in axes:
        ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    spreads = {d: agg["metrics"][d].get("angle_spread", {}).get("mean", float("nan")) for d in designs}
    lo, hi = min(spreads, key=spreads.get), max(spreads, key=spreads.get)
    return (f"Accuracy by direction (radius 0–1, mean of {agg['seeds']} seeds). Most isotropic: {lo} (std over "
            f"angles {spreads[lo]:.3f}); least: {hi} ({spreads[hi]:.3f}).")


def plot_bars(agg: dict, keys: list, path: Path) -> str:
    """Grouped bars (one group per design, one bar per metric) with 95 % interval whiskers; a caption."""
    # a design with no finite value of a metric (every run NaN) has no bar to draw; the section's note names it
    designs = [d for d, m in agg["metrics"].items() if all(k in m and m[k].get("n", 1) for k in keys)]
    fig, ax = plt.subplots(figsize=(max(6.4, 0.7 * len(designs) * len(keys)), 3.8))
    width = 0.8 / len(keys)
    for j, k in enumerate(keys):
        means = [agg["metrics"][d][k]["mean"] for d in designs]
        err = [[mu - agg["metrics"][d][k]["lo"] for d, mu in zip(designs, means)],
               [agg["metrics"][d][k]["hi"] - mu for d, mu in zip(designs, means)]]
        ax.bar([i + j * width for i in range(len(designs))], means, width, yerr=err, capsize=2, label=k)
    ax.set_xticks([i + width * (len(keys) - 1) / 2 for i in range(len(designs))], designs, rotation=30, ha="right",
                  fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("design")
    ax.set_ylabel(", ".join(keys) + " (mean over seeds)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    first = {d: agg["metrics"][d][keys[0]]["mean"] for d in designs}
    if not first:
        return f"{', '.join(keys)}: no design has a finite value of every one of them (see the note on NaN runs)."
    best = max(first, key=first.get)
    return (f"{', '.join(keys)} per design, whiskers 95 % t-intervals over {agg['seeds']} seeds. Highest "
            f"{keys[0]}: {best} ({first[best]:.3f}).")


def lambda_series(agg: dict, metric: str) -> list[tuple[float, dict]]:
    """``[(λ, interval), …]`` of every GeoPE family in ``agg`` that has ``metric``, sorted by λ."""
    from ..experiments.geope_sweep import geope_lambda

    pts = [(geope_lambda(d), m[metric]) for d, m in agg["metrics"].items() if metric in m and "lo" in m[metric]
           and m[metric].get("n", 1)]
    return sorted((lam, iv) for lam, iv in pts if lam is not None)


def plot_lambda_sweep(agg: dict, metrics: list, path: Path, reference: str = "axial") -> str | None:
    """GeoPE's metric against λ (log axis, 95 % band), ``reference`` as a horizontal line with its band; one
    panel per metric. None (and no file) when fewer than two λ values were run."""
    from ..experiments.geope_sweep import DEFAULT_LAMBDA

    series = {k: lambda_series(agg, k) for k in metrics}
    series = {k: v for k, v in series.items() if len(v) >= 2}
    if not series:
        return None
    fig, axes = plt.subplots(1, len(series), figsize=(4.6 * len(series), 3.6), squeeze=False)
    notes = []
    for ax, (k, pts) in zip(axes.flat, series.items()):
        lams = [lam for lam, _ in pts]
        ax.plot(lams, [iv["mean"] for _, iv in pts], marker="o", label="GeoPE")
        ax.fill_between(lams, [iv["lo"] for _, iv in pts], [iv["hi"] for _, iv in pts], alpha=0.2)
        ref = agg["metrics"].get(reference, {}).get(k)
        if ref is not None and "lo" in ref:
            ax.axhline(ref["mean"], color="k", ls="--", lw=1, label=f"{reference} RoPE")
            ax.axhspan(ref["lo"], ref["hi"], color="k", alpha=0.07)
        ax.axvline(DEFAULT_LAMBDA, color="grey", ls=":", lw=1, label=f"default λ = {DEFAULT_LAMBDA:g}")
        ax.set_xscale("log")
        ax.set_xlabel("GeoPE λ (frequencies λ^(−i/n))")
        ax.set_ylabel(k)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        best = max(pts, key=lambda p: p[1]["mean"])
        notes.append(f"{k}: highest at λ={best[0]:g} ({best[1]['mean']:.3f})"
                     + (f", {reference} {ref['mean']:.3f}" if ref is not None and "lo" in ref else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return (f"GeoPE's λ swept ({', '.join(f'{lam:g}' for lam in lams)}); bands are 95 % t-intervals over "
            f"{agg['seeds']} seeds, the dashed line and grey band {reference} RoPE. " + "; ".join(notes) + ".")


def _costs(agg: dict) -> str:
    """Training seconds per step per design and, when the run had a reference design, the ratio to it (empty
    without costs). Without a reference there is nothing to divide by: the ratio columns are left out."""
    cost = agg.get("cost") or {}
    if not cost.get("designs"):
        return ""
    ref = cost.get("reference")
    ratio = lambda x: "–" if x is None else f"{x:.2f}×"  # noqa: E731
    rows = [[_esc(d), f"{c['step_s'] * 1e3:.1f}", f"{c['step_cpu_s'] * 1e3:.1f}"]
            + ([ratio(c.get("cpu_ratio")), ratio(c.get("wall_ratio"))] if ref else [])
            for d, c in cost["designs"].items()]
    header = ["design", "ms / step (wall)", "ms / step (CPU)"]
    if ref:
        header += [f"CPU × {_esc(ref)}", f"wall × {_esc(ref)}"]
    missing = [d for d, c in cost["designs"].items() if ref and (c.get("cpu_ratio") is None
                                                                  or c.get("wall_ratio") is None)]
    note = (f"<p class='note'>Cost of one training step (forward, backward, optimiser; mean over seeds, each run's "
            f"first step left out as it carries one-off compilation), measured in this run"
            + (f", and as a multiple of {_esc(ref)} RoPE's in the same run (CPU ×, wall ×)" if ref else
               "; no reference design was run, so no ratios are shown")
            + (f" (– : no ratio recorded for {_esc(', '.join(missing))})" if missing else "") + ".</p>")
    return note + table(header, rows)


VERDICT_COLOURS = {"reproduced": "#1a9850", "contradicted": "#d73027", "no effect": "#4575b4",
                   "inconclusive": "#878787", "not informative": "#b8860b"}

def _esc(value) -> str:
    """``value`` as HTML text: every string read from an aggregate is data, never markup (a received aggregate
    must not put a script into the report)."""
    return html.escape(str(value))


def _why(c: dict) -> str:
    """The reason of a ``not informative`` verdict and the seeds left out for NaN or infinite values, as HTML."""
    out = f"<br><small>{_esc(c['reason'])}</small>" if c.get("reason") else ""
    if c.get("nonfinite_seeds"):
        out += ("<br><small>left out (NaN or infinite): " + _esc("; ".join(
            f"{d} seed(s) {', '.join(map(str, ss))}" for d, ss in c["nonfinite_seeds"].items())) + "</small>")
    return out


def adjusted(agg: dict) -> bool:
    """Whether ``agg`` carries family-wise adjusted verdicts and a δ per claim (aggregates written before
    these existed, such as the first stored quick runs, do not)."""
    return bool(agg.get("claims")) and "verdict_unadjusted" in agg["claims"][0]


def scope(agg: dict) -> str:
    """How to read this aggregate's verdicts, in a few words."""
    preset = agg["preset"]
    if not adjusted(agg):
        return f"{preset}, unadjusted"
    if preset in ("micro", "quick"):
        return f"{preset}: a look, not sized to decide"
    return f"{preset}: sized to decide"


def scope_label(agg: dict) -> str:
    """The short name of :func:`scope`'s reading: the preset, and ``, unadjusted`` for old aggregates."""
    return agg["preset"] if adjusted(agg) else f"{agg['preset']}, unadjusted"


_SCOPE_MEANS = {"unadjusted": "stored before family-wise adjustment existed; read their verdicts as unadjusted"}


def scope_note(entries: list[tuple[str, dict]]) -> str:
    """One sentence saying once how each kind of run in ``entries`` is to be read (its :func:`scope`), naming the
    runs of each kind; the table then only names the kind."""
    kinds: dict[str, list[str]] = {}
    presets: dict[str, str] = {}
    for run, agg in entries:
        if not agg.get("claims"):
            continue
        kinds.setdefault(scope(agg), []).append(run)
        presets[scope(agg)] = agg["preset"]
    parts = []
    for s, runs in kinds.items():
        label, _, meaning = s.partition(": ")
        if not meaning:  # "<preset>, unadjusted"
            look = scope({"preset": presets[s], "claims": [{"verdict_unadjusted": ""}]}).partition(": ")[2]
            meaning = (f"{look}; " if look.startswith("a look") else "") + _SCOPE_MEANS["unadjusted"]
        parts.append(f"<b>{_esc(label)}</b>: {_esc(meaning)} ({_esc(', '.join(runs))})")
    return "<p class='note'>Scope of each run (the <i>seeds</i> column names it): " + "; ".join(parts) + ".</p>"


FOREST_LABEL_CHARS = 50  # a claim label's line length in the forest plot; longer claims wrap, never cut
_FOREST_FONT = 8.5  # points, labels and verdicts
_LINE_IN = 1.25 * _FOREST_FONT / 72  # one text line, inches


def forest_label(text: str, width: int = FOREST_LABEL_CHARS) -> str:
    """``text`` whole, wrapped onto lines of at most ``width`` characters (a word longer than that is split)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def plot_forest(agg: dict, path: Path, title: str) -> str:
    """Each claim's advantage (positive favours the claim) with its intervals, the ±δ band shaded, the verdict
    marked at the right; the replication (if run) drawn under the discovery. Returns a caption."""
    claims = agg["claims"]
    adj = adjusted(agg)
    rep = adj and any(c.get("replication") for c in claims)
    rows = len(claims) * (2 if rep else 1)
    lines = max([forest_label(f"{c['id']}: {c['claim']}").count("\n") + 1 for c in claims] or [1])
    row_in = max(0.36, _LINE_IN * lines + 0.1)  # every row tall enough for the longest wrapped label
    height = 1.5 + row_in * rows
    # fixed margins (inches): the claim labels on the left (FOREST_LABEL_CHARS wide), the verdicts on the right
    label_in = 0.55 * _FOREST_FONT / 72 * FOREST_LABEL_CHARS + 0.6  # + the y-axis label and tick padding
    width = label_in + 4.6 + 2.6
    fig, ax = plt.subplots(figsize=(width, height))
    labels, ticks = [], []
    y = rows - 1
    spans = []
    for c in claims:
        sets = [("discovery", c)] + ([("replication", c["replication"])] if rep and c.get("replication") else [])
        if rep and not c.get("replication"):
            sets.append(("replication", None))
        top = y
        for which, r in sets:
            if r is not None:
                a = r["advantage"]
                colour = VERDICT_COLOURS.get(r["verdict"], "k")
                if adj:  # the adjusted (Bonferroni) interval: thin and wide; the claim's own 95 %: thick
                    b = r["advantage_adjusted"]
                    ax.plot([b["lo"], b["hi"]], [y, y], color=colour, lw=1.2, solid_capstyle="butt")
                ax.plot([a["lo"], a["hi"]], [y, y], color=colour, lw=4.5, alpha=0.55, solid_capstyle="butt")
                ax.plot([a["mean"]], [y], marker="o" if which == "discovery" else "s", color=colour, ms=5)
                tag = verdict_text({**r, "delta": c.get("delta")}) if adj else f"{r['verdict']} (unadjusted)"
                if which == "discovery" and rep:
                    tag += f"; {c['confirmation']}" if c.get("confirmation") else ""
                spans.append((y, tag, colour))
            labels.append(forest_label(f"{c['id']}: {c['claim']}") if which == "discovery"
                          else f"{c['id']} replication")
            ticks.append(y)
            y -= 1
        delta = c.get("delta")
        if delta:
            ax.fill_between([-delta, delta], y + 0.58, top + 0.42, color="0.85", zorder=0, lw=0)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(ticks, labels, fontsize=_FOREST_FONT)
    ax.set_ylim(-0.7, rows - 0.3)
    for yy, tag, colour in spans:
        ax.annotate(tag, (1.01, yy), xycoords=("axes fraction", "data"), va="center", fontsize=_FOREST_FONT,
                    color=colour,
                    annotation_clip=False)
    ax.set_xlabel("advantage of design over baseline, in the metric's units (> 0 favours the claim)")
    ax.set_ylabel("claim")
    unit = "seeds" if agg["seeds"] != 1 else "seed"
    sub = (f"{agg['seeds']} {unit}; thick: 95 % interval, thin: Holm/Bonferroni-adjusted over {len(claims)} claims; "
           "grey band: ±δ" if adj else f"{agg['seeds']} {unit}; bar: 95 % interval (no adjustment, no δ recorded)")
    if rep:
        sub += f"; squares: replication ({agg['replication']['seeds']} other seeds)"
    ax.set_title(f"{title} ({scope(agg)})\n{sub}", fontsize=8.5)
    ax.grid(alpha=0.3, axis="x")
    # the label and verdict margins chosen above; title above, x label below
    fig.subplots_adjust(left=label_in / width, right=1 - 2.6 / width, bottom=0.62 / height, top=1 - 0.62 / height)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    counts = {}
    for c in claims:
        counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
    return (f"Forest plot of {len(claims)} claims ({scope(agg)}): " + ", ".join(
        f"{n} {v}" for v, n in sorted(counts.items())) + (" (unadjusted 95 % verdicts)." if not adj else
                                                         " (family-wise adjusted verdicts)."))


def _interval(iv: dict) -> str:
    return f"{iv['mean']:+.3f} [{iv['lo']:+.3f}, {iv['hi']:+.3f}]"


def claims_table(entries: list[tuple[str, dict]]) -> str:
    """One HTML table of every claim of every aggregate: experiment, claim, paper and section, metric, effect
    and 95 % interval, adjusted interval and verdict, seeds, replication."""
    rows = []
    for run, agg in entries:
        adj = adjusted(agg)
        seeds = agg.get("seed_list")
        seed_text = f"{agg['seeds']}" + (f" ({seeds[0]}–{seeds[-1]})" if seeds and len(seeds) > 1 else "")
        for c in agg["claims"]:
            a = c["advantage"]
            if adj:
                b = c["advantage_adjusted"]
                adj_cell = f"[{b['lo']:+.3f}, {b['hi']:+.3f}] ({100 * c['adjusted_level']:.1f} %), Holm p {c['p_holm']:.3g}"
                verdict = f"<b>{_esc(verdict_text(c))}</b> (unadjusted: {_esc(c['verdict_unadjusted'])})"
                if c.get("seeds_to_decide"):
                    verdict += f"; ≈{c['seeds_to_decide']} seeds to decide"
            else:
                adj_cell = "—"
                verdict = f"{_esc(c['verdict'])} (unadjusted)"
            verdict += _why(c)
            r = c.get("replication")
            rep_cell = (f"{_esc(r['verdict'])}, {_interval(r['advantage'])}: <b>{_esc(c['confirmation'])}</b>" if r
                        else "not run")
            rows.append([_esc(run), f"{_esc(c['id'])}: {_esc(c['claim'])}", _esc(c["source"]),
                         f"<code>{_esc(c['metric'])}</code> ({_esc(c['better'])} is better)"
                         + (f", δ = {c['delta']:g}" if c.get("delta") else ""),
                         f"{a['mean']:+.3f}", f"[{a['lo']:+.3f}, {a['hi']:+.3f}]", adj_cell, verdict,
                         f"{_esc(seed_text)}; {_esc(scope_label(agg))}", rep_cell])
    return scope_note(entries) + table(["experiment", "claim", "paper, section", "metric", "effect",
                                        "95 % interval", "adjusted interval", "verdict (adjusted)", "seeds",
                                        "replication"], rows)


def _verdicts(agg: dict) -> str:
    rows = []
    for c in agg["claims"]:
        a = c["advantage"]
        rows.append([_esc(c["id"]), _esc(c["claim"]), _esc(c["source"]), f"<code>{_esc(c['metric'])}</code> "
                     f"({_esc(c['better'])} is better)",
                     f"{_esc(c['design'])} {c['design_mean']:.3f} vs {_esc(c['baseline'])} "
                     f"{c['baseline_mean']:.3f}", f"{a['mean']:+.3f} [{a['lo']:+.3f}, {a['hi']:+.3f}]",
                     f"<b>{_esc(verdict_text(c))}</b>" + ("" if adjusted(agg) else " (unadjusted)") + _why(c)])
    return table(["id", "claim", "paper", "metric", "means", "advantage (95 % CI)", "verdict"], rows)


def _nonfinite(agg: dict) -> str:
    """A note naming the runs whose values were NaN or infinite (left out of the means), or nothing."""
    bad = agg.get("nonfinite_runs") or {}
    if not bad:
        return ""
    return ("<p class='note'>Runs with NaN or infinite values (a diverged run, or a metric undefined for it), left "
            "out of the means and intervals of those metrics: " + _esc("; ".join(
                f"{d} seed {r['seed']} ({', '.join(map(str, r['metrics']))})" for d, rs in bad.items() for r in rs))
            + ".</p>")


_VALID = ("give the folder that `ropekit experiment NAME --out DIR` wrote, i.e. DIR, which holds "
          "NAME/aggregate.json (or a folder of stored experiments-NAME-PRESET.json aggregates, such as docs/results)")


def find_results(experiments_dir: "str | Path", what: str = "experiments folder") -> list[Path]:
    """The aggregates under ``experiments_dir``: ``*/aggregate.json``, then ``experiments-*.json``.

    A ``ValueError`` naming ``what`` and the path when that is no folder or holds no results, saying what a
    valid folder looks like (and, for a finished run's own folder or an unfinished run, what to give instead).
    """
    if not str(experiments_dir).strip():
        raise ValueError(f"{what} is empty; {_VALID}")
    folder = Path(experiments_dir)
    if not folder.is_dir():
        problem = "does not exist" if not folder.exists() else "is not a folder"
        raise ValueError(f"{what} '{folder}' {problem}; {_VALID}")
    found = sorted(folder.glob("*/aggregate.json")) + sorted(folder.glob("experiments-*.json"))
    if found:
        return found
    if (folder / "aggregate.json").is_file():
        hint = f"it is one experiment's own folder (it holds aggregate.json): give its parent '{folder.parent}'"
    elif any(folder.glob("*/runs.jsonl")):
        names = ", ".join(sorted(f.parent.name for f in folder.glob("*/runs.jsonl")))
        hint = (f"it holds runs.jsonl of unfinished experiments ({names}) but no aggregate.json: rerun "
                f"`ropekit experiment NAME --out {folder}` with the options it was started with to finish them")
    else:
        hint = _VALID
    raise ValueError(f"{what} '{folder}' holds no experiment results; {hint}")


def _read_aggregate(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except ValueError as error:  # JSONDecodeError, or bytes that are not text
        raise ValueError(f"'{path}' is not a readable aggregate ({error}); rerunning the `ropekit experiment` "
                         "that wrote it (same options and --out) writes it anew without training finished runs "
                         "again") from None


def experiments_section(out: Path, experiments_dir: "str | Path") -> dict:
    """The HTML of every experiment found under ``experiments_dir`` (figures written into ``out``); a
    ``ValueError`` when it holds none (see :func:`find_results`)."""
    from ..experiments.registry import get

    parts, metrics, entries = [], {}, []
    found = [(f, _read_aggregate(f)) for f in find_results(experiments_dir)]
    # two aggregates of one experiment (a default run and a sweep, or the quick and the standard preset) must
    # not share figure files or a metrics entry: a run is named by its experiment unless another would be too,
    # and then by its file
    tags = [f.parent.name if f.name == "aggregate.json" else f.stem.removeprefix("experiments-") for f, _ in found]
    plain = [agg["experiment"] if tag in (agg["experiment"], f"{agg['experiment']}-{agg['preset']}") else tag
             for tag, (_, agg) in zip(tags, found)]
    for (f, agg), tag, run in zip(found, tags, plain):
        name = agg["experiment"]
        figs = get(name).figures
        if plain.count(run) > 1:
            run = tag
        parts.append(f"<h3>{html.escape(run)}</h3><p class='note'>preset <code>{_esc(agg['preset'])}</code>, "
                     f"{_esc(agg['seeds'])} seed(s), run {_esc(agg['date'])}, ropekit "
                     f"{_esc(agg['versions']['ropekit'])}, torch {_esc(agg['versions']['torch'])}. "
                     f"Hyper-parameters {html.escape(agg['hyperparameters'])}: "
                     f"<code>{html.escape(json.dumps(agg['config']['model']))}</code>, "
                     f"<code>{html.escape(json.dumps(agg['config']['train']))}</code>.</p>")
        if figs.get("heatmap"):
            png = f"exp_{run}_{figs['heatmap']}.png"
            cap = plot_heatmaps(agg, figs["heatmap"], out / png)
            parts.append(f"<img src='{_esc(png)}'><p class='note'>{html.escape(cap)}</p>")
        if figs.get("polar"):
            png = f"exp_{run}_{figs['polar']}_polar.png"
            cap = plot_polar(agg, figs["polar"], out / png)
            parts.append(f"<img src='{_esc(png)}'><p class='note'>{html.escape(cap)}</p>")
        if figs.get("bars"):
            png = f"exp_{run}_bars.png"
            cap = plot_bars(agg, figs["bars"], out / png)
            parts.append(f"<img src='{_esc(png)}'><p class='note'>{html.escape(cap)}</p>")
        for key, label in figs.get("curves", {}).items():
            png = f"exp_{run}_{key}.png"
            cap = plot_curve(agg, key, label, out / png)
            parts.append(f"<img src='{_esc(png)}'><p class='note'>{html.escape(cap)}</p>")
        if figs.get("lambda"):
            png = f"exp_{run}_lambda.png"
            cap = plot_lambda_sweep(agg, figs["lambda"], out / png)
            if cap is not None:
                parts.append(f"<img src='{_esc(png)}'><p class='note'>{html.escape(cap)}</p>")
        parts.append(_costs(agg))
        if agg["claims"]:
            png = f"exp_{run}_forest.png"
            cap = plot_forest(agg, out / png, run)
            parts.append(f"<img src='{_esc(png)}'><p class='note'>{html.escape(cap)}</p>")
        parts.append(_nonfinite(agg))
        parts.append(_verdicts(agg))
        entries.append((run, agg))
        metrics[run] = {"claims": {c["id"]: c["verdict"] for c in agg["claims"]}, "date": agg["date"],
                        "scope": scope(agg),
                        "cost_cpu_ratio": {d: c["cpu_ratio"] for d, c in agg.get("cost", {}).get("designs", {}).items()}}
    overview = ("<h3>Every claim at a glance</h3><p class='note'>Effect = mean paired advantage of the design over "
                "its baseline (positive favours the claim). Verdicts: reproduced / contradicted (interval on one "
                "side of 0), no effect (inside ±δ, the claim's declared smallest effect of interest), inconclusive. "
                "The adjusted verdict holds the family-wise error of an experiment's claims at 5 % (Holm on the "
                "paired t-tests; Bonferroni interval for no effect); aggregates stored before adjustment existed "
                "show their unadjusted verdict only.</p>" + claims_table(entries)) if entries else ""
    return {"title": "Experiments: trained small models against the papers' claims",
            "html": overview + "\n".join(parts), "metrics": metrics}
