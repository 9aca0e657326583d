"""Qwen3-VL: interleaved ``mrope_section``; its processor separates video frames with timestamp text."""
from typing import Any

import torch

from .base import Adapter


class Qwen3VL(Adapter):
    model_type = "qwen3_vl"
    native_allocation = "interleaved"
    default_sections = (24, 20, 20)

    def video_grids(self, video_grid_thw: Any) -> Any:
        if video_grid_thw is None:
            return None
        g = torch.as_tensor(video_grid_thw)
        per_frame = torch.repeat_interleave(g, g[:, 0], dim=0)
        per_frame[:, 0] = 1
        return per_frame

    def frames(self, video_grid_thw: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(video_grid_thw)[:, 0].long()
