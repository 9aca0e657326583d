"""PaddleOCR-VL: Qwen2-VL's shape. Its ``get_rope_index`` and ``compute_3d_position_ids`` are Qwen2-VL's line for
line, and its text rotary splits the full head's pairs into chunked ``mrope_section`` (default ``[16, 24, 24]``)
with rotate-half tables. The processor gives it images only (no videos)."""
from .qwen2_vl import Qwen2VL


class PaddleOCRVL(Qwen2VL):
    model_type = "paddleocr_vl"
