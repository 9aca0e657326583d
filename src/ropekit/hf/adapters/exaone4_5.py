"""EXAONE 4.5 (``exaone4_5``): Qwen2.5-VL's vision tower (patches of any image size, 2 × 2 merged) in a 1-D EXAONE 4
language model.

transformers builds the vision tower and the processor from Qwen2.5-VL's and Qwen2-VL's, but the language model
rotates with 1-D positions: the bare model has no ``get_rope_index`` (the Qwen ``compute_3d_position_ids`` and
``get_rope_index`` are removed), its forward counts token i at position i from the cache's length, and its
``prepare_inputs_for_generation`` drops the position ids ``generate`` carries, so decoding counts the same way:
padding included, a left-padded row's first token sits at its padding's length. Every design's positions of such a
row are shifted by that length too (a shift of a whole row changes no distance between its tokens), and the patch
hands ``generate``'s design positions on past ``prepare_inputs_for_generation``.

How the model fills the tokens: ``image_grid_thw`` row ``(t, h, w)`` is an image (``t = 1``) or a video of ``t``
frame pairs in patches; the tower merges each ``m × m`` window (``spatial_merge_size``) into one token and hands
them over row by row, frame by frame (the processor orders the patches by merge window, the tower's window
attention restores that order). An image is ``h/m × w/m`` tokens, a video ``t × h/m × w/m``, written between
``<vision_start>`` and ``<vision_end>``. ropekit places each image as an ``h/m × w/m`` image block and each video
as one ``t × h/m × w/m`` video block; the begin/end tokens are text.

EXAONE 4's attention rotates only in its sliding-window layers (its global layers use no positions); the patch hands
every layer its tables and, like the stock model, the global layers ignore them.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .llava import Llava, encoded_images, place_items


class Exaone4_5(Llava):
    model_type = "exaone4_5"
    label = "EXAONE 4.5"  # the family's name in messages
    frames_apart = False  # the processor writes each video frame as a block of its own (text between frames)
    forward_params = frozenset({"image_grid_thw", "video_grid_thw"})
    counts_padding = True  # its forward counts token i at i, and its generate drops the mask-aware position ids
    generate_drops_positions = True

    def check(self, inner: nn.Module) -> None:
        self.spatial_merge(inner.config)

    def spatial_merge(self, config: Any) -> int:
        m = int(getattr(config.vision_config, "spatial_merge_size", 0) or 0)
        if m < 1:
            raise ValueError(f"patch_model: {self.label}'s vision config has no spatial_merge_size (got {m})")
        return m

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        m = self.spatial_merge(inner.config)
        encoded = kwargs.get("mm_encoder_outputs") or {}
        images = self._grids(kwargs.get("image_grid_thw"), kwargs.get("pixel_values"), encoded_images(kwargs),
                             m, "image")
        videos = self._grids(kwargs.get("video_grid_thw"), kwargs.get("pixel_values_videos"),
                             encoded.get("video") if isinstance(encoded, dict) else None, m, "video")
        if videos is not None and self.frames_apart:
            videos = [[(1, h, w)] for item in videos for t, h, w in item for _ in range(t)]
        types, images = place_items(types, 1, images, "image")
        types, videos = place_items(types, 2, videos, "video")
        return types, images, videos

    def _grids(self, grid_thw: Any, pixels: Any, encoded: Any, m: int, what: str) -> Optional[list]:
        """Each image's (or video's) token grid ``(t, h/m, w/m)``; None without pixels or encoded features (its
        tokens are then text, as in the stock model)."""
        if pixels is None and encoded is None:
            return None
        if grid_thw is None:
            raise ValueError(
                f"patched {self.label}: {what}s were given without `{what}_grid_thw`; pass the grids the processor "
                f"returns (they decide each {what}'s token grid, and the model's vision tower needs them too)"
            )
        g = torch.as_tensor(grid_thw).reshape(-1, 3).tolist()
        if any(h % m or w % m for _, h, w in g):
            raise ValueError(
                f"patched {self.label}: {what}_grid_thw {g} has a side that is not a multiple of spatial_merge_size {m}"
            )
        return [[(t, h // m, w // m)] for t, h, w in g]
