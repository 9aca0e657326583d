"""GLM-OCR (``glm_ocr``): GLM-4.1V's language side on a smaller vision tower.

transformers builds ``GlmOcrModel`` from GLM-4.1V's modular source: its ``get_rope_index`` and
``compute_3d_position_ids`` are ``Glm4vModel``'s (one ``(1, h, w)`` block per video frame, frames written with the
image token id, begin/end tokens and timestamps as text), and its text rotary is ``Glm4vTextRotaryEmbedding``'s
(chunked ``mrope_section`` over the ``partial_rotary_factor`` part of the head, default ``[8, 12, 12]``). Its
attention rotates neighbouring channels (``rotate_half_llm``), so the tables lay pair j on channels 2j, 2j + 1.
What differs from GLM-4.1V (the vision tower, a configurable ``head_dim``, attention without biases) never sees
positions.
"""
from .glm4v import Glm4V


class GlmOcr(Glm4V):
    model_type = "glm_ocr"
    text_layouts = {"GlmOcrTextModel": "pairs"}
    text_models = "GLM-OCR's"
