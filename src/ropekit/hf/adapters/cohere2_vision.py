"""Command A Vision (``cohere2_vision``): image tiles of a SigLIP tower, pixel-shuffled, in a Cohere 2 language model.

How the model fills the tokens (``Cohere2VisionModel.get_image_features``): every tile (one row of ``pixel_values``)
gives the tower's ``(image_size / patch_size)²`` patch features, pixel-shuffled by ``downsample_factor`` (each
window becomes one token, row by row): one tile is an ``s × s`` grid, ``s = image_size / patch_size /
downsample_factor``. The processor writes an image as ``<|START_OF_IMG|>``, then for each tile (the tiles row by
row, then the thumbnail) its ``s²`` image tokens and ``<|IMG_LINE_BREAK|>``, then ``<|END_OF_IMG|>``.

ropekit places every tile, and the thumbnail, as an ``s × s`` image block of its own; the markers are text. As on
Aya Vision, Cohere's attention rotates channel pairs 2j, 2j + 1 and Cohere 2 rotates only in its sliding-window
layers; the patch builds its tables in that layout and, like the stock model, the global layers ignore them.
"""
from __future__ import annotations

from typing import Any, Optional

from .llava import GridLlava


class Cohere2Vision(GridLlava):
    model_type = "cohere2_vision"

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        """Tokens per side of a tile after the pixel shuffle; the tower's output must be the bare patch grid."""
        vcfg = config.vision_config
        tower = getattr(vcfg, "model_type", None)
        if tower != "siglip_vision_model":
            raise ValueError(
                f"patch_model: Command A Vision with vision tower {tower!r} is not supported; its tile token grid is "
                f"known for siglip_vision_model (a tower with a CLS feature gives no square patch grid, which the "
                f"model's pixel shuffle needs too)"
            )
        if vcfg.image_size % vcfg.patch_size:
            raise ValueError(
                f"patch_model: vision image_size {vcfg.image_size} is not a multiple of patch_size {vcfg.patch_size}"
            )
        side, factor = vcfg.image_size // vcfg.patch_size, int(config.downsample_factor)
        if factor < 1 or side % factor:
            raise ValueError(
                f"patch_model: Command A Vision's downsample_factor {config.downsample_factor} does not divide the "
                f"tile's {side} patches per side"
            )
        return side // factor
