"""ropekit — geometric rotary position embeddings for PyTorch.

Four stages, one direction of flow (their conventions: docs/conventions.md)::

    Layout ──► position design ──► rotation family ──► apply
    layout.py   designs/            rotations/           apply/
"""
# 1. layouts
from .layout import Audio, Grid, Image, Layout, Text, Video, VideoAudio

# 2. position designs (+ the batched Hugging Face-compatible index, + AGE layer schedules)
from .designs import Design, designs, get_design, positions, register
from .index import decode_positions, hope_index, rope_index
from .request_index import request_positions
from .age import age_schedule

# 3. rotation families
from .rotations import ALLOCATIONS, angles, frequency_matrix, inv_freq
from .rotations.directional import directional_matrix, nd_directions
from .rotations.mixed import mixed_init
from .rotations.geope import GeoPERotation, channel_coefficients, geope_frequencies, geope_rotation
from .rotations.scaling import scale_frequencies, scaled_inv_freq

# 4. apply
from .apply import apply_rotary, apply_rotary_fused, apply_rotary_qk, apply_rotary_qk_fused, cos_sin
from .apply.geope import GeoPE, apply_geope, apply_geope_qk
from .apply.mixed import MixedFrequencies
from .apply.linear_geope import linear_geope_attention

# all four stages in one object
from .rope import RoPE, design_frequencies
from .rope import DirectionalRoPE
from .nn.rotary import RotaryEmbedding
from .nn.learned import GRAPE, ComRoPE, LieRE

# analysis and integrations
from .analysis.metrics import attention_bias_map, layout_ptd, ptd
from .analysis.kernel import expected_kernel
from .analysis.relative import geope_expected_kernel, relative_error, relative_table
from .analysis.relative import rotary_score
from . import hf
from .hf import patch_model, unpatch_model
from .hf import patch_vision_model, unpatch_vision_model

__version__ = "0.1.0"

__all__ = [
    "Layout", "Text", "Image", "Video", "Audio", "VideoAudio", "Grid",
    "positions", "designs", "get_design", "register", "Design", "rope_index", "hope_index", "decode_positions", "request_positions", "age_schedule",
    "frequency_matrix", "inv_freq", "angles", "ALLOCATIONS",
    "nd_directions", "directional_matrix", "MixedFrequencies", "mixed_init",
    "GeoPERotation", "geope_frequencies", "geope_rotation", "channel_coefficients",
    "apply_rotary", "apply_rotary_qk", "apply_rotary_fused", "apply_rotary_qk_fused", "cos_sin",
    "GeoPE", "apply_geope", "apply_geope_qk", "linear_geope_attention",
    "RoPE", "design_frequencies",
    "DirectionalRoPE", "RotaryEmbedding", "scale_frequencies", "scaled_inv_freq",
    "ptd", "layout_ptd", "attention_bias_map", "expected_kernel",
    "relative_error", "relative_table", "geope_expected_kernel",
    "hf", "patch_model", "unpatch_model",
    "LieRE", "ComRoPE", "GRAPE", "rotary_score",
    "patch_vision_model", "unpatch_vision_model",
]
