"""Idefics3 (``idefics3``): image tiles of a SigLIP-like tower, pixel-shuffled, in a 1-D language model (Llama).

How the model fills the tokens (``Idefics3Model.get_image_features``): every tile of ``pixel_values`` (samples ×
tiles, all-zero tiles being padding) gives ``(image_size / patch_size)²`` patch features, pixel-shuffled by
``scale_factor`` (each ``scale_factor × scale_factor`` window becomes one token, row by row): one tile is an
``s × s`` grid, ``s = image_size / patch_size / scale_factor``. The processor writes a split image as, for each tile
row by row, ``<fake_token_around_image><row_r_col_c>`` and the tile's ``s²`` image tokens (a newline after each
row of tiles), then ``<fake_token_around_image><global-img>`` and the whole image's ``s²`` tokens, closed by
``<fake_token_around_image>``; an image that is not split is the global part alone.

ropekit places every tile, and the global image, as an ``s × s`` image block of its own; the tile markers between
them are text, as the model reads them.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from .llava import GridLlava


class Idefics3(GridLlava):
    model_type = "idefics3"
    name = "Idefics3"
    forward_params = frozenset({"pixel_attention_mask"})

    def parts(self, model: nn.Module) -> tuple[Optional[nn.Module], nn.Module, nn.Module]:
        top, inner = (model, model.model) if hasattr(model, "lm_head") and hasattr(model, "model") else (None, model)
        return top, inner, getattr(inner, "text_model", None)

    def image_grid(self, inner: nn.Module, kwargs: dict) -> tuple[int, int]:
        pixels = kwargs.get("pixel_values")
        size = inner.config.vision_config.image_size
        if pixels is not None and tuple(pixels.shape[-2:]) != (size, size):
            raise ValueError(
                f"patched {self.name}: pixel_values tiles of {tuple(pixels.shape[-2:])} pixels; ropekit places tiles "
                f"of "
                f"the vision config's image_size ({size} x {size}), which are what the processor makes and what its "
                f"image token count assumes"
            )
        return super().image_grid(inner, kwargs)

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        """Tokens per side of one tile's grid after the pixel shuffle."""
        vcfg = config.vision_config
        patches, scale = vcfg.image_size // vcfg.patch_size, config.scale_factor
        if vcfg.image_size % vcfg.patch_size or patches % scale:
            raise ValueError(
                f"patch_model: {self.name} tiles of {vcfg.image_size} pixels, patch_size {vcfg.patch_size} and "
                f"scale_factor {scale}: the pixel shuffle needs a whole number of patches per side divisible by the "
                f"scale factor"
            )
        return patches // scale
