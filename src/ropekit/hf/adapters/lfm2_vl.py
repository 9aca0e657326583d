"""LFM2-VL (``lfm2_vl``): a SigLIP2 NaFlex tower over each tile's own patch grid (any aspect ratio), pixel-unshuffled
by ``downsample_factor``, in an LFM2 language model (short-convolution layers and attention layers).

How the model fills the tokens (``Lfm2VlModel.get_image_features``): each row of ``pixel_values`` (a tile, a
thumbnail, or a whole small image) holds ``h × w`` patches (``spatial_shapes``, the rest padding); each
``f × f`` window of patches (``f = downsample_factor``) becomes one token, row by row: a ``h / f × w / f`` grid. The
processor writes ``<|image_start|>``, for a tiled image each tile's tokens after its ``<|img_row_r_col_c|>`` marker
and then ``<|img_thumbnail|>`` and the thumbnail's tokens, ``<|image_end|>`` (the markers only with
``use_image_special_tokens``). ropekit places every tile and thumbnail as a block of its own grid; the markers are
text.

The grids are read from ``spatial_shapes`` (the encoded features carry only each image's token count): a forward
given images needs them; ``generate`` places the prompt before it encodes the images, from what it was given.

Rotation: only the attention layers rotate (1-D RoPE, rotate-half); the convolution layers take no positions and
ignore the tables they are handed, as in the stock model.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import partial_rotary_dim
from .llava import Llava, encoded_images, place_items, pooled_items


class Lfm2Vl(Llava):
    model_type = "lfm2_vl"
    name = "LFM2-VL"
    forward_params = frozenset({"spatial_shapes", "pixel_attention_mask"})

    def check(self, inner: nn.Module) -> None:
        f = getattr(inner.config, "downsample_factor", None)
        if not isinstance(f, int) or f < 1:
            raise ValueError(f"patch_model: LFM2-VL's downsample_factor {f!r}; an int >= 1 is the window each "
                             f"image token holds")

    def rotary_dim(self, text: nn.Module) -> int:
        return partial_rotary_dim(text)  # layer 0 may be a convolution layer, without attention

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        if kwargs.get("pixel_values") is None and encoded_images(kwargs) is None:
            return torch.zeros_like(types), None, None  # image token ids without images are text, as in stock
        shapes = kwargs.get("spatial_shapes")
        if shapes is None:
            raise ValueError(
                "patched LFM2-VL: images were given without `spatial_shapes`; pass the processor's spatial_shapes "
                "(each tile's patch rows and columns, which decide its token grid; encoded features carry only the "
                "token count)"
            )
        f = inner.config.downsample_factor
        items = pooled_items(shapes, f, f, "patched LFM2-VL (spatial_shapes, downsample_factor): image")
        types, grids = place_items(types, 1, items, "image")
        return types, grids, None
