"""Mistral 3 (``mistral3``): images of any size through a Pixtral tower, 2 × 2 patches merged into one token, in a
1-D language model (Mistral).

How the model fills the tokens (``Mistral3Model.get_image_features``): an image of ``image_sizes`` ``(H, W)`` pixels
is a grid of ``H / patch_size × W / patch_size`` patches; the patch merger joins each ``spatial_merge_size²``
window into one token, row by row: ``rows × cols`` tokens, ``rows = H // (patch_size · spatial_merge_size)``, ``cols``
likewise. The processor writes each row as ``cols`` image tokens followed by ``[IMG_BREAK]``, the last row ending in
``[IMG_END]`` instead.

ropekit places an image as one ``rows × (cols + 1)`` block whose last column is the row ends (``[IMG_BREAK]``, and
``[IMG_END]`` on the last row): they sit at the end of every row, so as the grid's extra column they keep every row,
and the block, rectangular (as LLaVA-NeXT's newline tokens); placed as text they would cut the image into one-row
blocks. The row ends are found in the sequence (the token right after each row of image tokens) and checked: an
image not laid out so is a ValueError. Under ``generate``, which encodes the images first and drops
``image_sizes``, each image's token count comes from its encoded features and ``cols`` from the length of its first
row in the sequence. Image tokens without row ends are refused, except under a patch that places an image's
tokens as text (``vanilla``, the stock-equivalent one), where they are placed as the stock model places them.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .llava import Llava, encoded_images, place_items


class Mistral3(Llava):
    model_type = "mistral3"

    def check(self, inner: nn.Module) -> None:
        self.token_pixels(inner.config)

    def token_pixels(self, config: Any) -> int:
        """Pixels per side of one merged token (patch size × spatial merge)."""
        vcfg = config.vision_config
        if getattr(vcfg, "model_type", None) != "pixtral":
            raise ValueError(
                f"patch_model: Mistral 3 with vision tower {getattr(vcfg, 'model_type', None)!r} is not supported; its "
                f"image token grid is known for pixtral"
            )
        return int(vcfg.patch_size) * int(config.spatial_merge_size)

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        encoded, pixels = encoded_images(kwargs), kwargs.get("pixel_values")
        if pixels is None and encoded is None:
            return torch.zeros_like(types), None, None  # image token ids without images are text, as in stock
        if encoded is not None:
            features = encoded.pooler_output if hasattr(encoded, "pooler_output") else encoded
            if not isinstance(features, (list, tuple)):
                raise ValueError(
                    "patched Mistral 3: the encoded images (mm_encoder_outputs['image']) are not one feature tensor "
                    "per image, so their sizes are unknown; pass pixel_values and image_sizes instead"
                )
            images = [(int(f.shape[0]), None) for f in features]
        else:
            sizes = kwargs.get("image_sizes")
            if sizes is None:
                raise ValueError(
                    "patched Mistral 3: `pixel_values` without `image_sizes`; pass the image sizes the processor "
                    "returns (they decide each image's token grid)"
                )
            step = self.token_pixels(inner.config)
            grids = [(int(h) // step, int(w) // step) for h, w in torch.as_tensor(sizes).reshape(-1, 2).tolist()]
            images = [(r * c, c) for r, c in grids]
        try:
            types, grids = row_ends(types, images)
        except ValueError:
            if not _grids_as_text(inner):
                raise
            # no row ends, which no processor writes; the patch places a grid's tokens as text (vanilla), so the
            # image tokens in a row get the positions the stock model gives them
            items = [[(1, n // c, c)] if c and n % c == 0 else [n] for n, c in images]
            return (*place_items(types, 1, items, "image"), None)
        return (*place_items(types, 1, [[(1, r, c + 1)] for r, c in grids], "image"), None)


def _grids_as_text(inner: nn.Module) -> bool:
    """Whether the patch on ``inner`` places an image's tokens as it places text (every layer's design)."""
    from ..patch import _state
    from ..state import places_grids_as_text

    state = _state(inner)
    return state is not None and places_grids_as_text(state)


def row_ends(types: torch.Tensor, images: list[tuple[int, Optional[int]]]
             ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Mark the token after every row of each image (``[IMG_BREAK]``/``[IMG_END]``) as one of the image's tokens.

    ``images``: (image tokens, tokens per row or None to read it off the image's first row), in the order the model
    fills them (batch row by batch row). Returns (types with the row ends set to 1, (rows, cols) per image).
    """
    t = types.cpu().clone()
    where = (t == 1).nonzero().tolist()  # image tokens in the order the model fills them
    at, grids = 0, []
    length = t.shape[1]
    for i, (count, cols) in enumerate(images):
        if count < 1 or at >= len(where):
            raise _layout_error(i, "it has no image tokens left in the input")
        b, start = where[at]
        if cols is None:  # under generate: the first row's length
            run = t[b, start:] == 1
            cols = int(run.long().cumprod(0).sum())
        if cols < 1 or count % cols:
            raise _layout_error(i, f"{count} tokens are not whole rows of {cols}")
        rows = count // cols
        end = start + rows * (cols + 1)
        block = t[b, start:end]
        if end > length or not bool((block.view(rows, cols + 1)[:, :cols] == 1).all()) or bool(
                (block.view(rows, cols + 1)[:, cols] == 1).any()):
            raise _layout_error(i, f"its {rows} rows of {cols} image tokens are not each followed by one other token")
        block.view(rows, cols + 1)[:, cols] = 1
        grids.append((rows, cols))
        at += count
    if at != len(where):
        raise ValueError(
            f"patched Mistral 3: the input holds {len(where)} image tokens but its {len(images)} image(s) fill {at}; "
            f"give each image the tokens the model's processor gives it"
        )
    return t.to(types.device), grids


def _layout_error(index: int, why: str) -> ValueError:
    return ValueError(
        f"patched Mistral 3: image {index} is not laid out as the processor writes it (each row of image tokens "
        f"followed by [IMG_BREAK], the last by [IMG_END]): {why}"
    )
