"""LLaVA: a CLIP or SigLIP vision tower whose patch features fill a run of image tokens in a 1-D language model.

The language model (Llama, Qwen2, Mistral …) rotates with 1-D position ids, so there is no
``compute_3d_position_ids`` to hook: the patch places the tokens in the bare model's ``forward``. Each
image is one ``(image_size / patch_size)²`` grid of tokens, read from the model's own vision config. With
``vision_feature_select_strategy="full"`` a CLIP tower also hands over its CLS feature, first in each
image's run of tokens; it is placed as a text token right before the grid. SigLIP has no CLS, so its
``"default"`` strategy drops a real patch and leaves no grid: refused.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import Adapter

_CLS_TOWERS = ("clip_vision_model",)  # vision towers whose first output token is a CLS token
_GRID_TOWERS = ("siglip_vision_model",)  # vision towers whose outputs are the patch grid only


def scaled_sections(half: int, proportions: tuple[int, ...] = (16, 24, 24)) -> list[int]:
    """Qwen2-VL's M-RoPE split (time 16, height 24, width 24 of 64 frequency pairs) scaled to ``half`` pairs:
    time gets its share rounded, height and width split the rest (height the smaller half)."""
    t = round(half * proportions[0] / sum(proportions))
    h = (half - t) // 2
    return [t, h, half - t - h]


class Llava(Adapter):
    model_type = "llava"
    one_d = True
    native_allocation = "mrope"

    def sections(self, rope: dict, half: int) -> list[int]:
        return list(rope.get("mrope_section") or scaled_sections(half))

    def merge(self, vision_config: Any) -> int:
        return 1

    def check(self, inner: nn.Module) -> None:
        self.grid(inner.config, inner.config.vision_feature_select_strategy)

    def grid(self, config: Any, strategy: str) -> tuple[int, int]:
        """(tokens per image side, 1 when a CLS token leads each image's run else 0)."""
        vcfg = config.vision_config
        tower = getattr(vcfg, "model_type", None)
        if tower not in _CLS_TOWERS + _GRID_TOWERS:
            raise ValueError(
                f"patch_model: LLaVA with vision tower {tower!r} is not supported; its image token grid is known "
                f"for {', '.join(_CLS_TOWERS + _GRID_TOWERS)}"
            )
        if strategy not in ("default", "full"):
            raise ValueError(f"patch_model: unknown vision_feature_select_strategy {strategy!r} ('default' or 'full')")
        cls = tower in _CLS_TOWERS
        if not cls and strategy == "default":
            raise ValueError(
                "patch_model: LLaVA with a SigLIP tower and vision_feature_select_strategy='default' drops the "
                "first patch (SigLIP has no CLS token), so the image tokens are no grid; use strategy 'full'"
            )
        size, patch = vcfg.image_size, vcfg.patch_size
        if size % patch:
            raise ValueError(f"patch_model: vision image_size {size} is not a multiple of patch_size {patch}")
        return size // patch, int(cls and strategy == "full")

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any]:
        encoded = (kwargs.get("mm_encoder_outputs") or {}).get("image")
        if kwargs.get("pixel_values") is None and encoded is None:
            return torch.zeros_like(types), None  # image token ids without images are text, as in the stock model
        strategy = kwargs.get("vision_feature_select_strategy") or inner.config.vision_feature_select_strategy
        side, cls = self.grid(inner.config, strategy)
        return image_runs(types, side, cls)


def image_runs(types: torch.Tensor, side: int, cls: int, newline: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the image tokens (type 1, in batch-row order, as the model fills them) into images of
    ``cls + side² + newline`` tokens; a leading CLS token and a trailing newline token of each become text.
    Returns (types, image_grid_thw)."""
    per = side * side + cls + newline
    is_image = (types == 1).reshape(-1)
    count = int(is_image.sum())
    if count % per:
        extra = (" + CLS" if cls else "") + (" + newline" if newline else "")
        raise ValueError(
            f"patched model: {count} image tokens are not a whole number of images of {per} tokens "
            f"({side}x{side} patches{extra}, from the vision config); give {per} image tokens per image"
        )
    order = is_image.long().cumsum(0) - 1
    if cls:
        types = types.masked_fill((is_image & (order % per == 0)).view_as(types), 0)
    if newline:
        types = types.masked_fill((is_image & (order % per == per - 1)).view_as(types), 0)
    return types, torch.tensor([[1, side, side]]).repeat(count // per, 1)
