"""Step 3.7 (``step3p7``): a global view and local tiles of one vision tower, each downsampled by two stride-2
convolutions, in a 1-D language model whose layer types rotate with their own rope parameters.

How the model fills the tokens (``Step3p7Model.get_image_features``): every view runs through the tower at its own
pixel size; its ``H / patch × W / patch`` patch grid is halved twice by convolutions (kernel 3, stride 2, padding 1:
``n → ⌈n / 2⌉`` per side) and read row by row. An image's tokens are its tiles' grids (``num_local_patches[i]`` rows
of ``pixel_values_local``, one after another), then its global view's grid (row ``i`` of ``pixel_values``). The
processor writes each tile as ``<patch_start>`` tokens ``<patch_end>`` (``<patch_newline>`` after the last tile of
a row of tiles), then ``<im_start>`` global tokens ``<im_end>``; the markers are text.

ropekit places every tile and the global view as a grid of its own, with the sides the model itself computes from
the pixel tensors it is given (the tile and view sizes are image-processor settings, not model settings). A forward
given encoded images (``mm_encoder_outputs``) without the pixels carries only token counts: refused, naming the fix
(``generate`` places the prompt from the pixels before it encodes them).

Rotation: each layer type (``full_attention``, ``sliding_attention``) has its own ``rope_parameters`` (base, and a
``partial_rotary_factor``: the share of the head it turns). The patch builds every design's tables per layer type
with that type's rotated channels.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .gemma3 import Gemma3
from .llava import Item, Llava, encoded_images, place_items


def _halved(n: int) -> int:
    """Output length of one downsampler convolution (kernel 3, stride 2, padding 1) over ``n`` inputs."""
    return (n - 1) // 2 + 1


class Step3p7(Llava):
    model_type = "step3p7"
    name = "Step 3.7"
    forward_params = frozenset({"pixel_values_local", "num_local_patches"})
    rotary_params = frozenset({"layer_type"})

    def check(self, inner: nn.Module) -> None:
        self.rope_variants(inner.language_model)

    rope_variants = Gemma3.rope_variants

    def table_dim(self, text: nn.Module, key: Optional[str]) -> int:
        """Rotated channels of the layers of type ``key``: their head size times that type's partial factor, as the
        model's rotary sizes its table."""
        types = list(text.config.layer_types)
        head = int(text.layers[types.index(key)].self_attn.head_dim)
        factor = float(text.config.rope_parameters[key].get("partial_rotary_factor", 1.0))
        dim = int(head * factor)
        if dim < 2 or dim % 2:
            raise ValueError(
                f"patch_model: Step 3.7's {key!r} layers rotate int({head} * partial_rotary_factor {factor}) = {dim} "
                f"channels per head; an even number >= 2 is needed (pairs of channels turn together)"
            )
        return dim

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        pixels = kwargs.get("pixel_values")
        if pixels is None:
            if encoded_images(kwargs) is not None:
                raise ValueError(
                    "patched Step 3.7: images were given as encoded features (mm_encoder_outputs) without their "
                    "pixels; those features carry only token counts, not the global view's and tiles' grids. Pass "
                    "position_ids = ropekit.hf.position_ids(model, **inputs) computed from the pixel inputs "
                    "(pixel_values, pixel_values_local, num_local_patches), or pass the pixels instead"
                )
            return place_items(types, 1, None, "image")[0], None, None
        return (*place_items(types, 1, self.items(inner, kwargs), "image"), None)

    def items(self, inner: nn.Module, kwargs: dict) -> list[Item]:
        """Per image: its tiles' grids, then its global view's grid, as the model concatenates their features."""
        patch = inner.config.vision_config.patch_size
        pixels, local = kwargs["pixel_values"], kwargs.get("pixel_values_local")
        counts = kwargs.get("num_local_patches")
        images = pixels.shape[0]
        counts = [0] * images if counts is None else [int(c) for c in torch.as_tensor(counts).reshape(-1).tolist()]
        tiles = 0 if local is None else int(local.shape[0])
        if len(counts) != images or any(c < 0 for c in counts) or (sum(counts) and sum(counts) != tiles):
            raise ValueError(
                f"patched Step 3.7: num_local_patches {counts} does not match the inputs: give one count per row of "
                f"pixel_values ({images} images) summing to the rows of pixel_values_local ({tiles} tiles), as the "
                f"processor does"
            )

        def grid(view: torch.Tensor) -> tuple[int, int, int]:
            h, w = int(view.shape[-2]) // patch, int(view.shape[-1]) // patch
            return 1, _halved(_halved(h)), _halved(_halved(w))

        tile = grid(local) if sum(counts) else None
        return [[tile] * c + [grid(pixels)] for c in counts]
