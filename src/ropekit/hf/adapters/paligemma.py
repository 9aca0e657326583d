"""PaliGemma (``paligemma``): one SigLIP patch grid per image as a prefix, in a Gemma (PaliGemma 2: Gemma 2)
language model.

The processor writes the ``(image_size / patch_size)²`` image tokens of every image first, then ``<bos>``, the prompt
and a newline; the image tokens are the tower's patch features, row by row (SigLIP has no CLS token). The image
tokens and the prompt form the *prefix*, which attends to itself both ways (a mask built from ``token_type_ids``, 0
on the prefix); the suffix (and every generated token) attends causally. The patch hands ``token_type_ids`` on
unread and changes no mask.

Positions: PaliGemma counts from 1 (its forward and its ``generate`` add 1 to the 1-D positions), so every design's
positions are shifted by 1 here too. A shift of every token changes no distance between two tokens, and it keeps
``vanilla`` the stock model bit for bit.
"""
from __future__ import annotations

from typing import Any, Optional

from .llava import GridLlava


class PaliGemma(GridLlava):
    model_type = "paligemma"
    forward_params = frozenset({"token_type_ids"})
    position_origin = 1.0
    masks_in_forward = True
    generate_shift = 1.0

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        vcfg = config.vision_config
        if getattr(vcfg, "model_type", None) != "siglip_vision_model":
            raise ValueError(
                f"patch_model: PaliGemma with vision tower {getattr(vcfg, 'model_type', None)!r} is not supported; its "
                f"image token grid is known for siglip_vision_model"
            )
        if vcfg.image_size % vcfg.patch_size:
            raise ValueError(
                f"patch_model: vision image_size {vcfg.image_size} is not a multiple of patch_size {vcfg.patch_size}"
            )
        return vcfg.image_size // vcfg.patch_size
