"""VideoLLaMA3 (``video_llama_3``): a SigLIP-style tower over each image's (or video's) own patch grid, in a 1-D
language model (Qwen2). transformers' ``get_rope_index`` and ``compute_3d_position_ids`` on this family only raise
("not needed"): its language model rotates with 1-D positions.

How the model fills the tokens (``VideoLlama3VisionModel``): an image of ``image_grid_thw`` ``(1, h, w)`` patches with
merge size ``m`` (``image_merge_sizes``, 1 for images in the released processor) is resized (bilinear, each token the
average of an ``m × m`` window) to an ``h / m × w / m`` grid read row by row; a video of ``(t, h, w)`` with its own
merge size (2) is ``t`` such frame grids. The processor writes an image as its tokens alone, and a video as
``Time <s>s:`` and each frame's tokens, frames separated by commas; token compression (``video_compression_mask``)
may drop tokens of frames that repeat the previous one.

ropekit places each image, and each video frame, as a block of its own grid (a frame as a one-frame video block);
a frame whose tokens compression dropped only in part is no grid and is refused; a frame dropped whole has no
tokens. The grids are read from the grids and merge sizes (the encoded features carry only token counts).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .llava import Llava, encoded_images, place_items


class VideoLlama3(Llava):
    model_type = "video_llama_3"
    name = "VideoLLaMA3"
    forward_params = frozenset({"image_grid_thw", "image_merge_sizes", "video_grid_thw", "video_merge_sizes",
                                "video_compression_mask"})

    def check(self, inner: nn.Module) -> None:
        pass  # every grid comes with the call

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        encoded = kwargs.get("mm_encoder_outputs") or {}
        given = kwargs.get("pixel_values") is not None or encoded_images(kwargs) is not None
        images = self.items(kwargs, "image", None) if given else None
        types, image_grids = place_items(types, 1, images, "image")
        given = kwargs.get("pixel_values_videos") is not None or encoded.get("video") is not None
        videos = self.items(kwargs, "video", kwargs.get("video_compression_mask")) if given else None
        types, video_grids = place_items(types, 2, videos, "video")
        return types, image_grids, video_grids

    def items(self, kwargs: dict, what: str, kept: Optional[torch.Tensor]) -> list:
        """Per image (or video), one ``(1, h / m, w / m)`` grid per frame whose tokens are kept."""
        grids, merges = kwargs.get(f"{what}_grid_thw"), kwargs.get(f"{what}_merge_sizes")
        if grids is None or merges is None:
            raise ValueError(
                f"patched VideoLLaMA3: {what}s were given without `{what}_grid_thw` and `{what}_merge_sizes`; pass "
                f"the processor's (they decide each {what}'s token grid; encoded features carry only token counts)"
            )
        grids = torch.as_tensor(grids).reshape(-1, 3).tolist()
        merges = torch.as_tensor(merges).reshape(-1).tolist()
        kept = None if kept is None else torch.as_tensor(kept).reshape(-1).cpu().bool()
        items, at = [], 0
        for i, ((t, h, w), m) in enumerate(zip(grids, merges)):
            if m < 1 or h % m or w % m:
                raise ValueError(f"patched VideoLLaMA3: {what} {i} of {h} x {w} patches does not merge by {m}")
            per = (h // m) * (w // m)
            item = []
            for f in range(t):
                frame = None if kept is None else kept[at + f * per: at + (f + 1) * per]
                if frame is None or bool(frame.all()):
                    item.append((1, h // m, w // m))
                elif bool(frame.any()):
                    raise ValueError(
                        f"patched VideoLLaMA3: token compression (video_compression_mask) kept {int(frame.sum())} "
                        f"of the {per} tokens of frame {f} of {what} {i}: they are no grid a design could place; "
                        f"turn the compression off for these frames, or give the whole frame"
                    )
            at += t * per
            items.append(item)
        return items
