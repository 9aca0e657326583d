"""Optional dependencies, named by the extra that installs them.

ropekit's core (layouts, designs, rotations, apply, index, hf, metrics) needs torch and numpy only. Plotting
(``analysis/figures.py``, ``analysis/nd_figures.py``), the HTML report (``report/``) and the commands built on
them need matplotlib, the ``report`` extra: ``pip install 'ropekit[report]'`` (``make demo`` installs it).
"""
from __future__ import annotations

__all__ = ["MissingExtraError", "REPORT_INSTALL", "require_matplotlib"]

REPORT_INSTALL = "pip install 'ropekit[report]'"


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it."""


def require_matplotlib(what: str) -> None:
    """Import matplotlib with its file-only backend (Agg), or raise :class:`MissingExtraError` naming the
    ``report`` extra. ``what``: the feature that needs it, for the message (e.g. ``"the report"``)."""
    try:
        import matplotlib
    except ImportError as error:
        raise MissingExtraError(
            f"{what} needs matplotlib, which ropekit's core does not install: {REPORT_INSTALL} "
            f"(or pip install matplotlib; make demo installs it)",
            name="matplotlib",
        ) from error
    matplotlib.use("Agg")  # figures are written to files, never shown
