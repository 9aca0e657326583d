"""Qwen3-VL: interleaved ``mrope_section``; its processor separates video frames with timestamp text."""
from typing import Any

from .base import Adapter, split_frames


class Qwen3VL(Adapter):
    model_type = "qwen3_vl"
    native_allocation = "interleaved"
    default_sections = (24, 20, 20)
    text_params = frozenset({"visual_pos_masks", "deepstack_visual_embeds"})  # DeepStack features, handed on

    def sections(self, rope: dict, half: int) -> list[int]:
        """transformers' Qwen3-VL reads only the height and width entries of ``mrope_section``: height takes
        frequency pairs 1, 4, 7, … below ``3·s[1]``, width 2, 5, 8, … below ``3·s[2]``, both cut at the
        head's ``half`` pairs, and time the rest. The same map as ropekit sections summing to ``half``."""
        given = list(rope.get("mrope_section") or self.default_sections)
        if len(given) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in given):
            raise ValueError(
                f"patch_model: Qwen3-VL `mrope_section` must be 3 non-negative ints (time, height, width), got {given!r}"
            )
        height = len(range(1, min(3 * given[1], half), 3))
        width = len(range(2, min(3 * given[2], half), 3))
        return [half - height - width, height, width]

    def video_grids(self, video_grid_thw: Any, temporal_merge: int = 1) -> Any:
        return split_frames(video_grid_thw)
