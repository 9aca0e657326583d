"""ropekit — geometric rotary position embeddings for PyTorch.

Four stages, one direction of flow (SPEC §1)::

    Layout ──► position design ──► rotation family ──► apply
    layout.py   designs/            rotations/           apply/
"""
from .layout import Grid, Image, Layout, Text, Video
from .designs import Design, designs, get_design, positions, register
from .rotations import ALLOCATIONS, angles, frequency_matrix, inv_freq
from .apply import apply_rotary, apply_rotary_fused, apply_rotary_qk, apply_rotary_qk_fused, cos_sin
from .rope import RoPE, design_frequencies
from .age import age_schedule
from .analysis.metrics import ptd, layout_ptd, attention_bias_map
from .analysis.kernel import expected_kernel
from .index import decode_positions, rope_index
from .rotations.directional import directional_matrix, nd_directions
from .rotations.mixed import MixedFrequencies, mixed_init
from .rotations.geope import GeoPERotation, geope_frequencies, geope_rotation
from .apply.geope import GeoPE, apply_geope, apply_geope_qk
from .apply.linear_geope import linear_geope_attention
from .analysis.relative import geope_expected_kernel, relative_error, relative_table

__version__ = "0.1.0"

__all__ = [
    "Layout", "Text", "Image", "Video", "Grid",
    "positions", "designs", "get_design", "register", "Design",
    "frequency_matrix", "inv_freq", "angles", "ALLOCATIONS",
    "apply_rotary", "apply_rotary_qk", "apply_rotary_fused", "apply_rotary_qk_fused", "cos_sin",
    "RoPE", "design_frequencies", "age_schedule", "ptd", "layout_ptd", "attention_bias_map", "expected_kernel",
    "rope_index", "decode_positions",
    "nd_directions", "directional_matrix", "MixedFrequencies", "mixed_init",
    "GeoPE", "GeoPERotation", "geope_frequencies", "geope_rotation", "apply_geope", "apply_geope_qk",
    "linear_geope_attention", "relative_error", "relative_table", "geope_expected_kernel",
]
