"""Stage 3 — rotation families: coordinates → rotations (planar 2×2 and quaternion 3×3)."""
from .planar import ALLOCATIONS, angles, frequency_matrix, inv_freq

__all__ = ["ALLOCATIONS", "angles", "frequency_matrix", "inv_freq"]
