"""Qwen3-Omni-MoE's thinker (``qwen3_omni_moe_thinker``): TMRoPE with fractional video times.

transformers' ``get_rope_index`` of the family keeps ``(f · seconds_per_grid) · position_id_per_seconds`` as a
float32 number (no truncation), so its stock-equivalent design is ``tmrope`` with ``temporal_rounding="exact"``;
text after a video may then resume at a fractional position, and the positions and ``rope_deltas`` it returns are
float32 always. Audio, its start and end tokens, the position arguments and the refusals are Qwen2.5-Omni's.
Rotation: Qwen3-VL's interleaved ``mrope_section``. The MoE forwards add ``output_router_logits``, handed on unread.
"""
from .qwen2_5_omni import Qwen2_5OmniThinker
from .qwen3_vl import Qwen3VL


class Qwen3OmniMoeThinker(Qwen2_5OmniThinker):
    model_type = "qwen3_omni_moe_thinker"
    native_allocation = "interleaved"
    default_sections = (24, 20, 20)
    integer_positions = False
    forward_params = Qwen2_5OmniThinker.forward_params | {"output_router_logits"}
    text_params = Qwen3VL.text_params  # DeepStack features, handed on

    def stock_design(self) -> tuple[str, dict]:
        return "tmrope", {"temporal_rounding": "exact"}

    def interleave(self, config) -> tuple:
        """Video and audio tokens merged by time."""
        return "time", None

    def sections(self, rope: dict, half: int) -> list[int]:
        return Qwen3VL.sections(self, rope, half)  # the same height/width map as Qwen3-VL's
