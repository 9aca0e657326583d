"""Stage 2 — position designs: layout → float coordinates ``(L, A)``. One file per design."""
from .registry import Design, designs, get_design, positions, register

# importing a design module registers it
from . import vanilla, shared, mrope, compact, rope2d, vrope, circle  # noqa: E402,F401
from . import mrope_interleave, mhrope, ilrope, omnirope  # noqa: E402,F401
from . import videorope, hope  # noqa: E402,F401
from . import v2pe, mmrope, grape, tmrope, peer_names  # noqa: E402,F401

__all__ = ["Design", "designs", "get_design", "positions", "register"]
from . import idalign, pype, c2rope  # noqa: E402,F401
from . import canvas  # noqa: E402,F401
