"""InternVL (``internvl``, the model V2PE was trained on): tiles of an InternViT tower, pixel-shuffled, in a 1-D
language model (Qwen2, Llama …).

How the model fills the tokens (transformers' ``InternVLModel.get_image_features``): every tile of
``pixel_values`` (one row per tile) runs through the tower, its CLS output is dropped
(``vision_feature_select_strategy="default"``), the ``(image_size / patch_size)²`` patch features are pixel-shuffled
by ``downsample_ratio`` (each 2 × 2 window becomes one token, row by row) and projected: one tile is an ``s × s``
grid of tokens, ``s = image_size / patch_size · downsample_ratio``. The processor writes an image as ``<img>``, the
tokens of its tiles one tile after another (the tiles row by row, then a thumbnail of the whole image when there
are several), ``</img>``; a video as one ``Frame i: <img> … </img>`` tile per frame. Tiles, thumbnails and frames
all carry the image token.

ropekit places every tile as an ``s × s`` image block of its own, in the order the model fills them; ``<img>``,
``</img>`` and the frame labels are text. The tiles' arrangement inside the image is not among the model's inputs
(the processor chooses it from the image size and keeps only the tile count), so the tiles are not joined into one
larger grid.
"""
from __future__ import annotations

from typing import Any, Optional

from .llava import GridLlava


class InternVL(GridLlava):
    model_type = "internvl"
    label = "InternVL"  # the family's name in messages

    def grid_side(self, config: Any, strategy: Optional[str]) -> int:
        """Tokens per side of one tile's grid; refuses a configuration whose tile tokens are no square grid (the
        model cannot reshape them either)."""
        if strategy != "default":
            raise ValueError(
                f"patch_model: {self.label} with vision_feature_select_strategy={strategy!r} keeps the tower's CLS "
                f"feature, so a tile's features are no patch grid (the model cannot reshape them either); use 'default'"
            )
        vcfg = config.vision_config
        size, patch = (_pair(vcfg.image_size), _pair(vcfg.patch_size))
        if size[0] != size[1] or patch[0] != patch[1] or size[0] % patch[0]:
            raise ValueError(
                f"patch_model: {self.label} needs square tiles of whole patches (the model reshapes a tile's features "
                f"into a square); got image_size {list(size)} and patch_size {list(patch)}"
            )
        side = size[0] // patch[0] * float(config.downsample_ratio)
        if side != int(side) or side < 1:
            raise ValueError(
                f"patch_model: {self.label}'s downsample_ratio {config.downsample_ratio} does not shrink a tile's "
                f"{size[0] // patch[0]} patches per side to a whole number of tokens"
            )
        return int(side)


def _pair(value: Any) -> tuple[int, int]:
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)
