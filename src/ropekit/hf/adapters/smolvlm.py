"""SmolVLM (``smolvlm``): Idefics3's layout (tiles row by row with ``<row_r_col_c>`` markers, then the global image;
each tile a pixel-shuffled ``s × s`` grid). Its processor also writes each video frame as such an image, after a
timestamp in text; the frames carry the image token and are placed as images."""
from __future__ import annotations

from .idefics3 import Idefics3


class SmolVLM(Idefics3):
    model_type = "smolvlm"
    name = "SmolVLM"
