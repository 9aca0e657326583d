"""VideoLLaMA 3's vision encoder: integer (row, column) patch indices per image or video frame (several images
in one unbatched sequence); rows and columns share ``θ^(-4j/D)`` (half-split channels), as Qwen2-VL's tower."""
from __future__ import annotations

import torch
from torch import nn

from .base import VisionAdapter, split_axes


class VideoLlama3VisionAdapter(VisionAdapter):
    name = "video_llama_3"
    rotary_classes = ("VideoLlama3VisionRotaryEmbedding",)
    attention_classes = ("VideoLlama3VisionAttention",)
    rotary_params = ("x", "position_ids")

    def coords(self, rotary: nn.Module, x: torch.Tensor, position_ids: torch.Tensor):
        return position_ids.float(), x.new_empty((), dtype=torch.float32)  # stock cos/sin are float32

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        return split_axes(rotary.inv_freq, rotary.inv_freq)
