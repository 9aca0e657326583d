"""DeepSeek-VL (``deepseek_vl``): a SigLIP tower whose patch features, through an MLP aligner, fill a run of image
tokens in a 1-D language model (Llama).

How the model fills the tokens (``DeepseekVLModel.get_image_features``): every image of ``pixel_values`` gives the
tower's ``(image_size / patch_size)²`` patch features, row by row (SigLIP has no CLS output), each aligned into one
token: one image is an ``s × s`` grid, ``s = image_size / patch_size``. The processor writes an image as
``num_image_tokens`` image tokens and nothing around them; ropekit places each image as an ``s × s`` block.
"""
from __future__ import annotations

from typing import Any, Optional

from .llava import GridLlava


class DeepseekVL(GridLlava):
    model_type = "deepseek_vl"
    name = "DeepSeek-VL"

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        vcfg = config.vision_config
        tower = getattr(vcfg, "model_type", None)
        if tower != "siglip_vision_model":
            raise ValueError(
                f"patch_model: DeepSeek-VL with vision tower {tower!r} is not supported; its image token grid is known "
                f"for siglip_vision_model (patch features only, row by row)"
            )
        if vcfg.image_size % vcfg.patch_size:
            raise ValueError(f"patch_model: DeepSeek-VL's vision image_size {vcfg.image_size} is not a multiple of "
                             f"patch_size {vcfg.patch_size}")
        return vcfg.image_size // vcfg.patch_size
