"""LLaVA-NeXT and LLaVA-NeXT-Video: "anyres" tiled images (and pooled video frames) in a 1-D language model.

How the model fills an image's tokens (transformers' ``pack_image_features``): the base view — the whole
image resized to the tower's input, ``s × s`` patch features with ``s = image_size / patch_size`` — then
the high-resolution view: the image's tiles (``image_grid_pinpoints`` picks their layout from the
image size) joined into one patch grid, cut back to the image's aspect ratio ("unpadded"), with the
model's ``image_newline`` feature appended to every row and read row by row.

ropekit places the two views as two image blocks, one after the other: the base view as an ``s × s``
grid, the high-resolution view as a ``rows × (cols + 1)`` grid whose last column holds the newline
tokens. The newline features sit at the end of each row of the model's own packed feature grid, so
counting them as that grid's extra column keeps every row, and the block, rectangular; placed as text
they would cut the view into one-row blocks with text positions between them.

A video (NeXT-Video) is one block of ``frames × p × p`` tokens, ``p`` the frame's patch grid after the
model's spatial pooling (``s // spatial_pool_stride``). Grids are read from the forward's
``image_sizes`` and the config, or — under ``generate``, which encodes the images first and drops the
sizes — from the encoded features themselves (where the newline feature sits).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .llava import Item, Llava, base_item, place_items


class LlavaNext(Llava):
    model_type = "llava_next"
    video_newline = 0  # newline tokens after each video's frames
    name = "LLaVA-NeXT"

    def check(self, inner: nn.Module) -> None:
        super().check(inner)
        self.patch_side(inner.config, inner.config.vision_feature_select_strategy)  # every image is tiled

    def patch_side(self, config: Any, strategy: str) -> int:
        """Patches per side of the tower's grid, refusing a strategy whose features are not exactly that grid
        (the model reshapes tiles and video frames into ``s × s`` grids, so it cannot run them either)."""
        side, cls = self.grid(config, strategy)
        if cls:
            raise ValueError(
                f"patched {self.name}: vision_feature_select_strategy='full' keeps the CLIP CLS feature, so tiled "
                f"images and video frames are no patch grid (the model cannot reshape them either); use 'default'"
            )
        return side

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        strategy = kwargs.get("vision_feature_select_strategy") or inner.config.vision_feature_select_strategy
        encoded = kwargs.get("mm_encoder_outputs") or {}
        types, images = place_items(types, 1, self.image_items(inner, kwargs, encoded.get("image"), strategy), "image")
        types, videos = place_items(types, 2, self.video_items(inner, kwargs, encoded.get("video"), strategy), "video")
        return types, images, videos

    # images ---------------------------------------------------------------------------------------

    def image_items(self, inner: nn.Module, kwargs: dict, encoded: Any, strategy: str) -> Optional[list[Item]]:
        """Each image's parts (grids and text tokens) in the order the model fills them; None without images."""
        if encoded is not None:
            return [self.encoded_image(inner, f, strategy, i) for i, f in enumerate(encoded.pooler_output)]
        if kwargs.get("pixel_values") is None:
            return None
        sizes = kwargs.get("image_sizes")
        if sizes is None:
            raise ValueError(
                f"patched {self.name}: `pixel_values` without `image_sizes`; pass the image sizes the processor "
                f"returns (they decide each image's tiles and so its token grid)"
            )
        sizes = torch.as_tensor(sizes).reshape(-1, 2).tolist()
        if any(min(s) < 1 for s in sizes):
            raise ValueError(f"patched {self.name}: `image_sizes` must be (height, width) >= 1 each, got {sizes}")
        side, cls = self.grid(inner.config, strategy)
        return [self.tiled_image(inner.config, strategy, [int(v) for v in size]) if tiled else base_item(side, cls, 1)
                for size, tiled in zip(sizes, self.tiled(kwargs, len(sizes)))]

    def tiled(self, kwargs: dict, count: int) -> list[bool]:
        """Which of ``count`` images the model tiles: all of them on LLaVA-NeXT."""
        return [True] * count

    def tiled_image(self, config: Any, strategy: str, size: list[int]) -> Item:
        """Base view, then the unpadded high-resolution view with its newline column."""
        side = self.patch_side(config, strategy)
        rows, cols = unpadded_grid(config, size, side)
        if not rows or not cols:  # an extreme aspect ratio unpads to nothing: the base view alone
            return [(1, side, side)]
        rows, cols = self.shrink(config, rows, cols, side)
        return [(1, side, side), (1, rows, cols + 1)]

    def shrink(self, config: Any, rows: int, cols: int, side: int) -> tuple[int, int]:
        """The high-resolution grid after any downscaling the model applies (none on LLaVA-NeXT)."""
        return rows, cols

    def encoded_image(self, inner: nn.Module, features: torch.Tensor, strategy: str, index: int) -> Item:
        """An image's parts read off its packed features (``mm_encoder_outputs``, as ``generate`` passes them)."""
        side, cls = self.grid(inner.config, strategy)
        if features.shape[0] == cls + side * side + 1:  # a base view only, then one newline feature
            return base_item(side, cls, 1)
        side = self.patch_side(inner.config, strategy)
        if features.shape[0] == side * side:  # tiled, but the high-resolution view unpadded to nothing
            return [(1, side, side)]
        rows, width = newline_rows(features[side * side:], inner.image_newline)
        if not rows:
            raise ValueError(
                f"patched {self.name}: the encoded features of image {index} (mm_encoder_outputs['image']) are not "
                f"laid out as the model packs them (a {side}x{side} base view, then rows that each end in the "
                f"model's image_newline feature); pass pixel_values and image_sizes instead"
            )
        return [(1, side, side), (1, rows, width)]

    # videos ---------------------------------------------------------------------------------------

    def pooled_side(self, config: Any, side: int) -> int:
        """A video frame's grid side after the model's spatial pooling (kernel = stride, no padding)."""
        return side // int(config.spatial_pool_stride)

    def video_items(self, inner: nn.Module, kwargs: dict, encoded: Any, strategy: str) -> Optional[list[Item]]:
        """Each video: a ``frames × p × p`` block, then the family's newline tokens; None without videos."""
        pixels = kwargs.get("pixel_values_videos")
        if encoded is None and pixels is None:
            return None
        p = self.pooled_side(inner.config, self.patch_side(inner.config, strategy))
        if encoded is not None:
            counts = [f.numel() // f.shape[-1] - self.video_newline for f in encoded.pooler_output]
        else:
            if pixels.ndim != 5:
                raise ValueError(
                    f"patched {self.name}: `pixel_values_videos` must be (videos, frames, channels, height, width), "
                    f"got shape {tuple(pixels.shape)}"
                )
            counts = [pixels.shape[1] * p * p] * pixels.shape[0]
        if any(n % (p * p) or n < p * p for n in counts):
            raise ValueError(
                f"patched {self.name}: encoded videos of {counts} frame tokens are not whole frames of {p}x{p} "
                f"pooled patches (from the vision config); pass pixel_values_videos instead"
            )
        return [[(n // (p * p), p, p)] + ([self.video_newline] if self.video_newline else []) for n in counts]


class LlavaNextVideo(LlavaNext):
    model_type = "llava_next_video"
    name = "LLaVA-NeXT-Video"


def unpadded_grid(config: Any, size: list[int], side: int) -> tuple[int, int]:
    """(rows, cols) of patches of an image's high-resolution view: its tiles as transformers lays them out
    for ``size`` (height, width) and ``image_grid_pinpoints``, cut back to the image's aspect ratio.

    Uses transformers' own ``get_anyres_image_grid_shape`` and ``unpad_image`` (the latter on an empty
    tensor of the grid's shape), so the grid is the one the model packs, rounding included.
    """
    from transformers.models.llava_next.modeling_llava_next import get_anyres_image_grid_shape, unpad_image

    pinpoints = config.image_grid_pinpoints
    if not isinstance(pinpoints, list) or not pinpoints:
        raise ValueError(
            f"patch_model: config.image_grid_pinpoints must be a list of (height, width) resolutions, got {pinpoints!r}"
        )
    tiles_h, tiles_w = get_anyres_image_grid_shape(size, pinpoints, config.vision_config.image_size)
    view = unpad_image(torch.empty(0, tiles_h * side, tiles_w * side), size)
    return int(view.shape[1]), int(view.shape[2])


def newline_rows(features: torch.Tensor, newline: torch.Tensor) -> tuple[int, int]:
    """(rows, tokens per row) of a packed high-resolution view whose every row ends in ``newline``
    (exact copies of the model's parameter); (0, 0) when the features are not laid out so."""
    is_newline = (features == newline.to(features.device, features.dtype)).all(-1)
    rows = int(is_newline.sum())
    if not rows or features.shape[0] % rows:
        return 0, 0
    width = features.shape[0] // rows
    return (rows, width) if bool(is_newline.view(rows, width)[:, -1].all()) else (0, 0)
