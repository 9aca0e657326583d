"""Qianfan-OCR (``qianfan_ocr``): InternVL's model (transformers builds it from InternVL's classes) with an InternViT
tower and a Qwen3 language model.

The tokens are filled and written as on InternVL (:mod:`.internvl`): every tile, and the thumbnail of an image of
several tiles, is one ``s × s`` pixel-shuffled grid, ``s = image_size / patch_size · downsample_ratio``, between
``<img>`` and ``</img>``; the family has no videos. ropekit places it as InternVL, each tile a block of its own.
"""
from __future__ import annotations

from .internvl import InternVL


class QianfanOCR(InternVL):
    model_type = "qianfan_ocr"
    label = "Qianfan-OCR"
