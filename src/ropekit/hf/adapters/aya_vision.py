"""Aya Vision (``aya_vision``): image tiles of a SigLIP tower, pixel-shuffled, in a Cohere 2 language model.

How the model fills the tokens (``AyaVisionModel.get_image_features``): every tile (one row of ``pixel_values``)
gives the tower's ``(image_size / patch_size)²`` patch features (``vision_feature_select_strategy="full"``: SigLIP
has no CLS token), pixel-shuffled by ``downsample_factor`` (each window becomes one token, row by row): one tile is an
``s × s`` grid, ``s = image_size / patch_size / downsample_factor``. The processor writes an image as
``<|START_OF_IMG|>``, for each tile (row by row) ``TILE_i`` and the tile's ``s²`` image tokens, then
``TILE_GLOBAL`` and the thumbnail's ``s²`` tokens (the thumbnail alone for an image that is one tile),
``<|END_OF_IMG|>``.

ropekit places every tile, and the thumbnail, as an ``s × s`` image block of its own; the markers are text.
Cohere's attention rotates channel pairs 2j, 2j + 1 (its tables repeat each frequency twice in a row), and Cohere 2
rotates only in its sliding-window layers (its global layers use no positions); the patch builds its tables in that
layout and, like the stock model, the global layers ignore them.
"""
from __future__ import annotations

from typing import Any, Optional

from .llava import GridLlava


class AyaVision(GridLlava):
    model_type = "aya_vision"

    def grid_side(self, config: Any, strategy: Optional[str]) -> int:
        """Tokens per side of a tile after the pixel shuffle; the tower's output must be the bare patch grid."""
        side, cls = self.grid(config, strategy)
        if cls:
            raise ValueError(
                "patch_model: Aya Vision with vision_feature_select_strategy='full' on a CLIP tower keeps the CLS "
                "feature, so a tile's features are no square patch grid (the model cannot pixel-shuffle them either); "
                "use 'default'"
            )
        factor = int(config.downsample_factor)
        if factor < 1 or side % factor:
            raise ValueError(
                f"patch_model: Aya Vision's downsample_factor {config.downsample_factor} does not divide the tile's "
                f"{side} patches per side"
            )
        return side // factor
