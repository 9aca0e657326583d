"""Stage 2 — position designs: layout → float coordinates ``(L, A)``. One file per design."""
from .registry import Design, designs, get_design, positions, register

# importing a design module registers it
from . import vanilla, shared  # noqa: E402,F401

__all__ = ["Design", "designs", "get_design", "positions", "register"]
from . import mrope, compact  # noqa: E402,F401
from . import vrope, rope2d  # noqa: E402,F401
from . import circle  # noqa: E402,F401
