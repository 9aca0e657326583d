"""Whether a stream is a terminal: progress output redraws a bar there and writes plain lines elsewhere.

Shared by the report's progress (``report/build.py``) and the experiments' training bars
(``experiments/runner.py``); it sits below both so that neither imports the other for it.
"""
from __future__ import annotations

__all__ = ["is_terminal"]


def is_terminal(stream) -> bool:
    """Whether ``stream`` is a terminal (a bar redrawn with ``\\r``), not a pipe, file or CI log (plain lines)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False
