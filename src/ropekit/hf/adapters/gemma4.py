"""Gemma 4 (``gemma4``): a vision tower over each image's own patch grid (any aspect ratio), average-pooled by
``pooling_kernel_size``, in a Gemma 4 language model with per-layer-type rotary tables.

Images: the processor resizes each image to whole ``k × k`` patch windows (``k = pooling_kernel_size``) and hands
its patches with their ``(x, y)`` patch coordinates (``image_position_ids``, ``(-1, -1)`` on padding). The pooler
averages each ``k × k`` window into one token, at index ``x // k + (cols / k) · (y // k)``: the image is a
``rows / k × cols / k`` grid read row by row, ``rows`` and ``cols`` its patch rows and columns. The processor writes
``<start_of_image>``, the grid's tokens, ``<end_of_image>``; the begin/end tokens are text. A video is one such block
per frame (its timestamp in text before it), each frame placed as a one-frame block of its own; audio tokens are a
run of the 1-D stream and are placed as text.

The grids are read from ``image_position_ids`` / ``video_position_ids`` (the encoded features carry only each
image's token count, not its shape): a forward given images needs them; ``generate`` places the prompt before it
encodes the images, from the arguments it was given.

Attention: on the models with ``use_bidirectional_attention="vision"`` the forward lets the tokens of one image
attend to each other both ways on sliding-window layers (from ``mm_token_type_ids``). The patch hands
``mm_token_type_ids`` on unread and changes no mask.

Rotation: sliding-window layers rotate the whole ``head_dim`` with base 1e4; full-attention layers have their own
head size (``global_head_dim``) and proportional RoPE (base 1e6, the first ``partial_rotary_factor · head / 2``
frequency pairs of the head's spectrum turn, the others are 0). The patch builds every design's tables per layer
type from that type's head size and parameters; on a proportional table a multi-axis design shares the turning
pairs among its axes.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .gemma3 import Gemma3
from .llava import Item, place_items


class Gemma4(Gemma3):
    model_type = "gemma4"
    name = "Gemma 4"
    forward_params = frozenset({"mm_token_type_ids", "image_position_ids", "video_position_ids",
                                "num_frames_per_video", "input_features", "input_features_mask", "per_layer_inputs"})
    text_params = frozenset({"per_layer_inputs", "logits_to_keep"})
    layer_params = frozenset({"per_layer_input", "shared_kv_states"})

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        k = getattr(config.vision_config, "pooling_kernel_size", None) if config.vision_config is not None else 1
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"patch_model: Gemma 4's vision config has pooling_kernel_size {k!r}; an int >= 1 is "
                             f"the window each image token pools")
        return k

    def table_dim(self, text: nn.Module, key: Optional[str]) -> int:
        """Head size of the layers of type ``key`` (Gemma 4's full-attention layers have ``global_head_dim``)."""
        types = list(text.config.layer_types)
        return int(text.layers[types.index(key)].self_attn.head_dim)

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        encoded = kwargs.get("mm_encoder_outputs") or {}
        k = self.grid_side(inner.config)
        found = []
        for kind, what, pixels in ((1, "image", "pixel_values"), (2, "video", "pixel_values_videos")):
            given = kwargs.get(pixels) is not None or encoded.get(what) is not None
            items = self.frames(kwargs.get(f"{what}_position_ids"), k, what) if given else None
            types, grids = place_items(types, kind, items, what)
            found.append(grids)
        return types, found[0], found[1]

    def frames(self, positions: Any, k: int, what: str) -> list[Item]:
        """One ``(1, rows / k, cols / k)`` grid per image (or video frame) from its patches' ``(x, y)``."""
        if positions is None:
            raise ValueError(
                f"patched Gemma 4: {what}s were given without `{what}_position_ids`; pass the {what} processor's "
                f"{what}_position_ids (each {what}'s patch grid, which decides its token grid; encoded features "
                f"carry only the token count)"
            )
        pos = torch.as_tensor(positions).cpu()
        items = []
        for i, p in enumerate(pos.reshape(-1, pos.shape[-2], 2)):
            p = p[(p != -1).all(-1)]
            if not len(p):
                items.append([])
                continue
            cols, rows = int(p[:, 0].max()) + 1, int(p[:, 1].max()) + 1
            if int(p.min()) < 0 or len(p) != rows * cols or rows % k or cols % k:
                raise ValueError(
                    f"patched Gemma 4: {what} {i}'s {len(p)} patches at {what}_position_ids are no full grid of "
                    f"{rows} x {cols} patches in whole {k} x {k} pooling windows (pooling_kernel_size), as the "
                    f"processor makes them; its tokens would not be that grid"
                )
            items.append([(1, rows // k, cols // k)])
        return items
