"""Stage 4 — apply rotations to q/k. Same maths in every backend; backends differ only in speed."""
from .planar import CHANNEL_LAYOUTS, apply_rotary, apply_rotary_qk, cos_sin

__all__ = ["CHANNEL_LAYOUTS", "apply_rotary", "apply_rotary_qk", "cos_sin"]
