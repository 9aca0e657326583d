"""MiniCPM-V 4.7 (``minicpmv4_7``): canvas M-RoPE, ropekit's ``canvas-mrope`` design, in a Qwen3.5 text model.

Positions: ``MiniCPMV4_7Model.get_rope_index`` lays every picture and video frame (a thumbnail, and for large
pictures a grid of slices) on a canvas of its own, with the ``<image>``, ``</image>``, ``<slice>``, ``</slice>`` and
newline markers (text tokens, found by their ids in the config) pinned to the canvas's corners and edges; that is
``canvas-mrope`` with ``markers=True`` and each frame's ``slices`` and ``trailing`` markers, which the patch reads
per sample off the marker ids (:func:`ropekit.hf.state._canvas_layouts`). Every other design places the same
layout (each crop a grid of its own, the markers text).

Crop sizes come as ``target_sizes`` / ``target_sizes_videos`` (patch grids ``(h, w)``, one row per crop, in order),
merged ``4 × 4`` into a token (``downsample_mode="16x"``) or ``2 × 2`` (``"4x"``) by the config's
``downsample_mode``. A per-call ``downsample_mode`` is refused: the patch places with the config's.

Packing: as MiniCPM-V 4.6's, the processor lays a batch's crops out as one NaViT-packed row (``pixel_values``
``(1, 3, p, patches)``, each crop's patches after the previous crop's, one ``target_sizes`` row per crop; the model
reads row 0), the tower attends and merges within each crop, and the features fill the image tokens in crop order:
samples packed in one row join their pixels along the last dimension and their size rows in sample order, and each
sample keeps the canvas positions it has alone (:func:`ropekit.hf.pack` places every sample by itself).

Rotation: the language model is built from the text config (``AutoModel``); Qwen3.5's (interleaved
``mrope_section`` over the ``partial_rotary_factor`` part of the head) is the one the adapter knows.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .qwen3_5 import Qwen3_5


class MiniCPMV4_7(Qwen3_5):
    model_type = "minicpmv4_7"
    text_params = frozenset()
    position_params = frozenset({"target_sizes", "target_sizes_videos", "downsample_mode"})
    # the processor gives a batch's crops as one NaViT-packed row (the model reads row 0 only), one size row each
    pack_layout = {"pixel_values": "last", "pixel_values_videos": "last", "target_sizes": "first",
                   "target_sizes_videos": "first", "downsample_mode": "shared"}

    def check(self, inner: nn.Module) -> None:
        cls = type(getattr(inner, "language_model", None)).__name__
        if cls != "Qwen3_5TextModel":
            raise ValueError(
                f"patch_model: minicpmv4_7 with a {cls} language model is not supported: ropekit knows the rotary "
                f"layout of Qwen3_5TextModel only (the text config's model_type 'qwen3_5_text')"
            )
        if None in self.markers(inner.config):
            raise ValueError("patch_model: this MiniCPM-V 4.7 config lacks a marker id (image_start_id, image_end_id, "
                             "slice_start_id, slice_end_id, newline_id); its canvas cannot be read")

    def merge_of(self, config: Any) -> int:
        return 2 if getattr(config, "downsample_mode", "16x") == "4x" else 4

    def markers(self, config: Any) -> Optional[tuple[int, ...]]:
        return tuple(getattr(config, k, None) for k in
                     ("image_start_id", "image_end_id", "slice_start_id", "slice_end_id", "newline_id"))

    def position_arguments(self, given: dict) -> dict:
        if given.get("downsample_mode") is not None:
            raise ValueError(
                f"patched model: minicpmv4_7 got downsample_mode={given['downsample_mode']!r} for this call; the patch "
                f"places the crops with the config's downsample_mode (set model.config.downsample_mode instead)"
            )
        out = {k: v for k, v in given.items() if k not in self.position_params}
        for name, grid in (("target_sizes", "image_grid_thw"), ("target_sizes_videos", "video_grid_thw")):
            sizes = given.get(name)
            if sizes is not None:
                sizes = torch.as_tensor(sizes).reshape(-1, 2)
                out[grid] = torch.cat([torch.ones_like(sizes[:, :1]), sizes], dim=1)
        return out
