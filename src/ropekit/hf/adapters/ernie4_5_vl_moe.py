"""ERNIE-4.5-VL-MoE (``ernie4_5_vl_moe``).

Positions: Qwen2-VL's transformers 5.x rule (text advances by one; a block at ``s`` takes t = s + frame,
h = s + row, w = s + column of the merged grid; text after it continues at ``s + max(h, w)``), with each
video's ``t`` divided by the vision config's ``temporal_merge_size`` (its resampler merges that many frames into
one token step). A video is one block; images and their start/end tokens as Qwen2-VL's (the start/end tokens
are text).

Rotation: VideoRoPE's frequency allocation. ``mrope_section`` lists ``[h, w, t]`` pairs (h == w); transformers
pre-permutes the inverse frequencies so that, after its recomposition, the highest ``h + w`` frequency pairs
alternate height (even pairs) and width (odd pairs), each at its own frequency, and the lowest ``t`` pairs are
temporal: ropekit's ``"videorope"`` allocation with sections ``[t, h, w]``. The tables lay pair j on channels
2j, 2j + 1, and the model rotates in float32 whatever the activations' dtype (its rotary returns float32
cos/sin), so the patch hands float32 tables on as well.

The decoder layers route tokens to text or vision experts by ``moe_mm_token_type_ids``; the patch hands it on.
"""
from __future__ import annotations

from typing import Any

from .base import Adapter


class Ernie4_5VLMoe(Adapter):
    model_type = "ernie4_5_vl_moe"
    native_allocation = "videorope"
    default_sections = (22, 22, 20)  # transformers' default mrope_section, in its [h, w, t] order
    pair_layout = "pairs"
    float32_tables = True
    forward_params = frozenset({"moe_mm_token_type_ids", "output_router_logits"})
    layer_params = frozenset({"moe_mm_token_type_ids"})

    def sections(self, rope: dict, half: int) -> list[int]:
        """The config's ``mrope_section`` ``[h, w, t]`` as ropekit's ``[t, h, w]``."""
        given = list(rope.get("mrope_section") or self.default_sections)
        if len(given) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in given) or (
                given[0] != given[1] or sum(given) != half):
            raise ValueError(
                f"patch_model: ERNIE-4.5-VL `mrope_section` must be [h, w, t] with h == w, summing to the head's "
                f"{half} frequency pairs (transformers interleaves h and w pair by pair), got {given!r}"
            )
        return [given[2], given[0], given[1]]

    def temporal_merge(self, vision_config: Any) -> int:
        return int(getattr(vision_config, "temporal_merge_size", 1) or 1)
