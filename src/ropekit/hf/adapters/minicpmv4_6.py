"""MiniCPM-V 4.6 (``minicpmv4_6``): a SigLIP-like tower over each crop's own patch grid, merged window by window, in
a Qwen3.5 text model that the stock model hands no positions (every token takes the next 1-D index).

How the model fills the tokens (``MiniCPMV4_6Model.get_image_features``): each crop (the thumbnail, and each slice
of a large picture) is an ``h × w`` patch grid (one row of ``target_sizes``); under ``downsample_mode="16x"`` the
tower's window merger turns each ``2 × 2`` window (``window_kernel_size``) into one feature, and the merger then
joins each ``merge_kernel_size`` window ``merger_times`` times, row by row: the crop is a grid of
``h / (2·m_h^k) × w / (2·m_w^k)`` tokens (``"4x"`` skips the window merger). Video frames are crops too
(``target_sizes_videos``, one row per frame). The markers the processor writes around them (``<image>``, ``<slice>``,
newlines) are text.

ropekit places every crop and frame as a block of its own grid; its stock-equivalent design is ``vanilla``.
The grids are read from ``target_sizes`` / ``target_sizes_videos`` (encoded features carry only token counts): a
forward given images needs them.

Packing: the processor lays a batch's crops out as one NaViT-packed row (``pixel_values`` ``(1, 3, p, patches)``,
each crop's patches after the previous crop's, one ``target_sizes`` row per crop); the tower attends within each
crop (``cu_seqlens`` from ``target_sizes``), merges within each window and crop, and the features fill the image
tokens in crop order. Samples packed in one row therefore join their pixels along the last dimension and their
size rows in sample order, which gives each crop the features it gets alone. (transformers 5.18's window merger
reads every crop of a call as the first one's size: there a ``"16x"`` row whose crops differ in size is refused.)

Rotation: the Qwen3.5 text model rotates part of each head (``partial_rotary_factor``) with one table for its three
M-RoPE axes (interleaved ``mrope_section``), which the stock model fills with the same 1-D index; a 3-axis design
turns its axes in that interleaved layout. Its linear-attention layers take no positions.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .base import partial_rotary_dim
from .llava import Llava, encoded_images, place_items, pooled_items


#: the oldest transformers release ropekit was tested with whose window merger (``"16x"``) takes crops of several
#: sizes in one call (5.18's reads every crop as the first one's size)
PER_CROP_WINDOW_MERGER = "5.24.0"


class MiniCPMV4_6(Llava):
    model_type = "minicpmv4_6"
    name = "MiniCPM-V 4.6"
    native_allocation = "interleaved"  # Qwen3.5's rotary interleaves its mrope_section (3-axis designs follow it)
    forward_params = frozenset({"target_sizes", "target_sizes_videos", "downsample_mode"})
    # the processor gives a batch's crops as one NaViT-packed row (the model reads row 0 only), one size row each
    pack_layout = {"pixel_values": "last", "pixel_values_videos": "last", "target_sizes": "first",
                   "target_sizes_videos": "first", "downsample_mode": "shared"}

    def check(self, inner: nn.Module) -> None:
        self.shrink(inner.config, None)

    def rotary_dim(self, text: nn.Module) -> int:
        return partial_rotary_dim(text)  # layer 0 may be a linear-attention layer, without rotary

    def shrink(self, config: Any, mode: Optional[str]) -> tuple[int, int]:
        """Patches per token along (rows, columns) under ``downsample_mode`` ``mode`` (None: the config's)."""
        mode = mode or getattr(config, "downsample_mode", "16x")
        if mode not in ("16x", "4x"):
            raise ValueError(f"patched MiniCPM-V 4.6: downsample_mode {mode!r}; '16x' or '4x' are the modes the model "
                             f"knows")
        wh, ww = tuple(config.vision_config.window_kernel_size) if mode == "16x" else (1, 1)
        mh, mw = tuple(config.merge_kernel_size)
        times = int(config.merger_times)
        return wh * mh ** times, ww * mw ** times

    def check_packed(self, config: Any, row: dict) -> None:
        from ..boundary import _release, transformers_version

        version = transformers_version()
        mode = row.get("downsample_mode") or getattr(config, "downsample_mode", "16x")
        if mode != "16x" or version.startswith("<") or _release(version) >= _release(PER_CROP_WINDOW_MERGER):
            return
        for name in ("target_sizes", "target_sizes_videos"):  # images and videos are encoded apart
            sizes = row.get(name)
            shapes = set() if sizes is None else {tuple(s) for s in torch.as_tensor(sizes).reshape(-1, 2).tolist()}
            if len(shapes) > 1:
                raise ValueError(
                    f"pack: MiniCPM-V 4.6 in downsample_mode '16x' on transformers {version}: the packed row's crops "
                    f"have {len(shapes)} sizes ({name} {sorted(shapes)}); the window merger of transformers 5.18 "
                    f"reads every crop of one call as the first one's size (ropekit knows one that takes each "
                    f"crop's own from {PER_CROP_WINDOW_MERGER} on), so the packed samples would not get the "
                    f"features they get alone; pack samples whose crops have one size, use downsample_mode '4x', "
                    f"or upgrade transformers (>= {PER_CROP_WINDOW_MERGER})"
                )

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        fh, fw = self.shrink(inner.config, kwargs.get("downsample_mode"))
        out = []
        for kind, pixels, encoded, sizes_name, what in (
                (1, "pixel_values", encoded_images(kwargs), "target_sizes", "image"),
                (2, "pixel_values_videos", _encoded_videos(kwargs), "target_sizes_videos", "video")):
            if kwargs.get(pixels) is None and encoded is None:
                types = types.masked_fill(types == kind, 0)  # tokens without pictures are text, as in stock
                out.append(None)
                continue
            sizes = kwargs.get(sizes_name)
            if sizes is None:
                raise ValueError(
                    f"patched MiniCPM-V 4.6: {what}s were given without `{sizes_name}`; pass the processor's "
                    f"{sizes_name} (each crop's patch rows and columns, which decide its token grid; encoded features "
                    f"carry only the token count)"
                )
            items = pooled_items(sizes, fh, fw, f"patched MiniCPM-V 4.6 ({sizes_name}): {what} crop")
            types, grids = place_items(types, kind, items, what)
            out.append(grids)
        return types, out[0], out[1]


def _encoded_videos(kwargs: dict) -> Any:
    encoded = kwargs.get("mm_encoder_outputs")
    return encoded.get("video") if isinstance(encoded, dict) else None
