"""Assemble report sections into ``index.html`` and ``metrics.json``, with progress on stderr (a bar on a
terminal, one line per section otherwise)."""
from __future__ import annotations

import html
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Callable

from .._terminal import is_terminal

# (module, function) pairs; each is called as fn(out_dir, layout=..., designs=...) (None = the defaults)
# and returns {"title": str, "html": str, "metrics": dict}
SECTIONS: list[tuple[str, str]] = [
    ("ropekit.report.multimodal", "designs_section"),
    ("ropekit.report.multimodal", "ptd_section"),
    ("ropekit.report.multimodal", "bias_section"),
    ("ropekit.report.nd", "section"),
    ("ropekit.report.relative", "section"),
]

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:0}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .7em;text-align:left}td.num{text-align:right}
th{background:#f3f3f3}img{max-width:100%;margin:.5em 0}
.note{color:#555;font-size:.92em}
.nowrap{white-space:nowrap}
"""


def _progress(i: int, n: int, label: str, t0: float, stream=None) -> None:
    """Step ``i`` of ``n`` on stderr: a bar redrawn in place on a terminal, else one plain line per step."""
    stream = sys.stderr if stream is None else stream  # looked up per call: sys.stderr may be replaced
    if not is_terminal(stream):
        stream.write(f"[{i}/{n}] {label} {time.time() - t0:.1f}s\n")
        stream.flush()
        return
    width = 28
    done = int(width * i / n)
    bar = "#" * done + "-" * (width - done)
    stream.write(f"\r[{bar}] {i}/{n} {label[:40]:<40} {time.time() - t0:5.1f}s")
    if i == n:
        stream.write("\n")
    stream.flush()


def _load(module: str, func: str) -> Callable:
    return getattr(importlib.import_module(module), func)


def build_report(out_dir: "str | Path" = "report", *, progress: bool = True, layout: "str | None" = None,
                 designs: "list[str] | None" = None, experiments: "str | Path | None" = None) -> dict:
    """Write ``out_dir/index.html`` and ``out_dir/metrics.json``; return the metrics dict.

    ``layout`` (a layout string) replaces the default layouts of the multimodal sections and
    ``designs`` (registered names) restricts them to those designs; the N-D and relative-position
    sections do not depend on either. ``experiments``: a folder of ``ropekit experiment`` results,
    added as a last section.
    """
    if experiments is not None:  # a wrong folder fails now, not after every other section has run
        from .experiments import find_results

        find_results(experiments)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    parts, metrics = [], {}
    steps = len(SECTIONS) + (experiments is not None)
    for i, (mod, fn) in enumerate(SECTIONS):
        if progress:
            _progress(i, steps, f"{mod.rsplit('.', 1)[-1]}.{fn}", t0)
        sec = _load(mod, fn)(out, layout=layout, designs=designs)
        key = f"{mod.rsplit('.', 1)[-1]}.{fn}".replace(".section", "")
        metrics[key] = sec.get("metrics", {})
        parts.append(f"<h2>{html.escape(sec['title'])}</h2>\n{sec['html']}")
    if experiments is not None:
        if progress:
            _progress(len(SECTIONS), steps, "experiments.experiments_section", t0)
        sec = _load("ropekit.report.experiments", "experiments_section")(out, experiments)
        metrics["experiments"] = sec["metrics"]
        parts.append(f"<h2>{html.escape(sec['title'])}</h2>\n{sec['html']}")
    if progress:
        _progress(steps, steps, "done", t0)
    from .. import __version__
    import torch

    metrics["_meta"] = {"ropekit": __version__, "torch": torch.__version__, "seconds": round(time.time() - t0, 2)}
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>ropekit report</title>"
        f"<style>{_CSS}</style></head><body><h1>ropekit report</h1>"
        f"<p class='note'>ropekit {__version__}, torch {torch.__version__}. Every figure is a PNG beside this "
        "file; every number is also in <code>metrics.json</code>.</p>" + "\n".join(parts) + "</body></html>"
    )
    (out / "index.html").write_text(page, encoding="utf-8")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, default=float), encoding="utf-8")
    return metrics
