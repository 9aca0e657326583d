"""``ropekit report``: a self-contained HTML page (PNG figures beside it) plus ``metrics.json``.

A section is one function ``section(out_dir) -> {"title", "html", "metrics"}`` that writes its
figures into ``out_dir`` and references them by file name; :data:`SECTIONS` lists them in order.
"""
from .build import SECTIONS, build_report

__all__ = ["SECTIONS", "build_report"]
