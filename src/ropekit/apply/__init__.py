"""Stage 4 — apply rotations to q/k. Same maths in every backend; backends differ only in speed."""
from .planar import CHANNEL_LAYOUTS, apply_rotary, apply_rotary_qk, cos_sin
from .fused import apply_rotary_fused, apply_rotary_qk_fused

__all__ = ["CHANNEL_LAYOUTS", "apply_rotary", "apply_rotary_qk", "apply_rotary_fused", "apply_rotary_qk_fused", "cos_sin"]
