"""What differs between model families: where the parts sit, their native M-RoPE layout, their video grids.

One adapter per family; a new family (LLaVA, a vision encoder) is one small file that subclasses
:class:`Adapter` and registers itself in :mod:`ropekit.hf.adapters`.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn


class Adapter:
    """A model family's specifics. Subclasses set the class attributes and override what differs."""

    model_type: str = ""
    native_allocation: str = "mrope"  # the frequency layout of a 3-axis design in this family
    default_sections: tuple[int, ...] = (16, 24, 24)  # mrope_section when the config has none
    one_d: bool = False  # the language model takes 1-D position ids (no compute_3d_position_ids to hook)

    def parts(self, model: nn.Module) -> tuple[Optional[nn.Module], nn.Module, nn.Module]:
        """(generation wrapper or None, bare multimodal model, text model) of ``model``."""
        top, inner = (model, model.model) if hasattr(model, "lm_head") and hasattr(model, "model") else (None, model)
        return top, inner, getattr(inner, "language_model", None)

    def check(self, inner: nn.Module) -> None:
        """Refuse, at patch time, a model whose layout this family's adapter cannot place."""

    def rotary_dim(self, text: nn.Module) -> int:
        """Channels per head the model rotates (the head dim, less under partial rotary)."""
        return int(text.layers[0].self_attn.head_dim)

    def merge(self, vision_config: Any) -> int:
        """Patches merged per token side (the grid given to the design is divided by this)."""
        return int(getattr(vision_config, "spatial_merge_size", 2))

    def sections(self, rope: dict, half: int) -> list[int]:
        """The model's ``mrope_section`` as ropekit sections (summing to ``half`` frequency pairs)."""
        return list(rope.get("mrope_section") or self.default_sections)

    def tokens_per_second(self, vision_config: Any) -> Optional[float]:
        """Temporal positions per second of video, when the family scales video time (else None)."""
        return None

    def video_grids(self, video_grid_thw: Any) -> Any:
        """The video grids ropekit places (a family may split a video into per-frame grids)."""
        return video_grid_thw

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        """1-D families: (token types, image_grid_thw, video_grid_thw) of one forward, from the image (1) and
        video (2) tokens ``types`` marks and the model's vision config; ``kwargs`` are the forward's arguments.
        Tokens the model fills with something that is no grid cell come back as text (0)."""
        raise NotImplementedError
