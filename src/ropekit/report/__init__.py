"""``ropekit report``: a self-contained HTML page (PNG figures beside it) plus ``metrics.json``.

A section is one function ``section(out_dir) -> {"title", "html", "metrics"}`` that writes its
figures into ``out_dir`` and references them by file name; :data:`SECTIONS` lists them in order.
"""
from .._extras import require_matplotlib

require_matplotlib("the report (ropekit report, ropekit.report)")  # every section draws figures

from .build import SECTIONS, build_report  # noqa: E402

__all__ = ["SECTIONS", "build_report"]
