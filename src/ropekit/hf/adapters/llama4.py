"""Llama 4 (``llama4``): image tiles of a ViT tower, pixel-shuffled, in a Llama 4 language model whose rotary is a
complex table, with chunked-attention layers and RoPE-free (NoPE) layers.

How the model fills the tokens (``Llama4VisionModel``): every tile of ``pixel_values`` (one row per tile) gives
``(image_size / patch_size)²`` patch features (the tower's class feature, appended last, is dropped), pixel-shuffled
by ``pixel_shuffle_ratio`` (each 2 × 2 window of patches becomes one token, row by row): one tile is an ``s × s``
grid, ``s = image_size / patch_size · pixel_shuffle_ratio``. The processor writes ``<|image_start|>``, then, when the
image is split, each tile's ``s²`` tokens row by row with ``<|tile_x_separator|>`` between the tiles of a row and
``<|tile_y_separator|>`` after each row, then ``<|image|>`` and the whole image's ``s²`` tokens, ``<|image_end|>``.
ropekit places every tile, and the whole image, as an ``s × s`` block of its own; the markers are text.

Rotation: the text rotary returns ``e^{i theta}`` per frequency pair (``torch.polar``), which the attention multiplies
with channels ``(2j, 2j + 1)`` read as a complex number; the patch returns its tables in that form. Layers with
``no_rope_layers[i] == 0`` use no positions (their temperature tuning counts tokens, not positions), and the
chunked-attention layers' masks are built by transformers from the attention mask: the patch hands every layer its
table and changes no mask, so both stay as in the stock model.

The generation model is the multimodal model itself (no bare ``model`` inside it); its text model is
``language_model.model``.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from .llava import GridLlava


class Llama4(GridLlava):
    model_type = "llama4"
    name = "Llama 4"
    complex_tables = True

    def parts(self, model: nn.Module) -> tuple[Optional[nn.Module], nn.Module, nn.Module]:
        lm = getattr(model, "language_model", None)
        return model, model, getattr(lm, "model", None)

    def table_layout(self, text: nn.Module) -> str:
        return "pairs"  # complex multiplication of channels (2j, 2j + 1)

    def rotary_dim(self, text: nn.Module) -> int:
        return int(text.layers[0].self_attn.head_dim)

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        """Tokens per side of one tile after the pixel shuffle."""
        vcfg = config.vision_config
        size, patch, ratio = vcfg.image_size, vcfg.patch_size, float(vcfg.pixel_shuffle_ratio)
        side = size // patch * ratio if isinstance(size, int) and isinstance(patch, int) else 0
        if not isinstance(size, int) or size % patch or side != int(side) or side < 1:
            raise ValueError(
                f"patch_model: Llama 4 tiles of image_size {size}, patch_size {patch} and pixel_shuffle_ratio "
                f"{ratio}: the pixel shuffle needs square tiles of whole patches that it shrinks to a whole number "
                f"of tokens per side (the model cannot reshape them otherwise)"
            )
        return int(side)
