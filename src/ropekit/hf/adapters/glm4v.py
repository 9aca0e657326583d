"""GLM-4.1V (``glm4v``), GLM-4.5V (``glm4v_moe``) and GLM-4.6V (``glm46v``).

Positions: transformers' ``Glm4vModel.get_rope_index`` is line for line Qwen3-VL's: text advances by one, an
image block at ``s`` takes t = s, h = s + row, w = s + column (merged grid), the text after it continues at
``s + max(h, w)``; a video is split into one ``(1, h, w)`` grid per frame, because the processor writes each
frame as its own ``<|begin_of_image|> … <|end_of_image|>`` block followed by its timestamp as text. The begin/end
tokens and timestamps are text. Video frames carry the *image* token id in ``input_ids``; only
``mm_token_type_ids`` (2 inside ``<|begin_of_video|> … <|end_of_video|>``) tells them apart.

Rotation: partial rotary (``partial_rotary_factor`` of the head) and *chunked* ``mrope_section`` over the rotated
pairs (chunk i drives axis i mod 3, as Qwen2-VL), the sections summing to the rotated pairs. The cos/sin layout
depends on the text model: GLM-4.1V's ``Glm4vTextModel`` puts pair j on channels 2j, 2j + 1 (it rotates with
``rotate_half_llm``), GLM-4.5V's ``Glm4vMoeTextModel`` on channels j, j + R/2 (``rotate_half``). GLM-4.6V builds
its text model from the text config (``AutoModel``), so its layout is read off the text model's class.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from .base import Adapter, partial_rotary_dim, split_frames

#: text model class -> how its cos/sin tables lay out a frequency pair (the class's own apply_rotary_pos_emb)
TEXT_LAYOUTS = {"Glm4vTextModel": "pairs", "Glm4vMoeTextModel": "half"}


class Glm4V(Adapter):
    model_type = "glm4v"
    native_allocation = "mrope"  # chunked sections, as Qwen2-VL
    default_sections = (8, 12, 12)
    video_ids_distinct = False
    #: the language model classes this family may hold, with their cos/sin layout, and what to call them
    text_layouts: dict = TEXT_LAYOUTS
    text_models: str = "GLM-4.1V's and GLM-4.5V's"

    def check(self, inner: nn.Module) -> None:
        text = getattr(inner, "language_model", None)
        cls = type(text).__name__
        if cls not in self.text_layouts:
            raise ValueError(
                f"patch_model: {self.model_type} with a {cls} language model is not supported: ropekit knows the "
                f"rotary layout of {' and '.join(self.text_layouts)} only ({self.text_models})"
            )

    def rotary_dim(self, text: nn.Module) -> int:
        return partial_rotary_dim(text)

    def table_layout(self, text: nn.Module) -> str:
        return self.text_layouts[type(text).__name__]

    def video_grids(self, video_grid_thw: Any, temporal_merge: int = 1) -> Any:
        return split_frames(video_grid_thw)


class Glm4VMoe(Glm4V):
    model_type = "glm4v_moe"
    forward_params = frozenset({"output_router_logits"})


class Glm46V(Glm4V):
    model_type = "glm46v"
