"""LLaVA: a CLIP or SigLIP vision tower whose patch features fill a run of image tokens in a 1-D language model.

The language model (Llama, Qwen2, Mistral …) rotates with 1-D position ids, so there is no
``compute_3d_position_ids`` to hook: the patch places the tokens in the bare model's ``forward``. Each
image is one ``(image_size / patch_size)²`` grid of tokens, read from the model's own vision config. With
``vision_feature_select_strategy="full"`` a CLIP tower also hands over its CLS feature, first in each
image's run of tokens; it is placed as a text token right before the grid. SigLIP has no CLS, so its
``"default"`` strategy drops a real patch and leaves no grid: refused.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ...index import mismatch
from .base import Adapter, rotate_half_layout

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

    def table_layout(self, text: nn.Module) -> str:
        return rotate_half_layout(text)  # any 1-D language model: Llama's rotate-half, Cohere's pairs, …

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

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        if kwargs.get("pixel_values") is None and encoded_images(kwargs) is None:
            return torch.zeros_like(types), None, None  # image token ids without images are text, as in stock
        side, cls = self.image_grid(inner, kwargs)
        return (*image_runs(types, side, cls), None)

    def image_grid(self, inner: nn.Module, kwargs: dict) -> tuple[int, int]:
        """(tokens per side of every image's grid, 1 when a CLS token leads each image's run else 0) in this
        forward: families whose images (or tiles, or crops) all fill one fixed grid override this."""
        strategy = kwargs.get("vision_feature_select_strategy") or inner.config.vision_feature_select_strategy
        return self.grid(inner.config, strategy)



class GridLlava(Llava):
    """A LLaVA-shaped family whose every image (or tile, or thumbnail) is one square grid of :meth:`grid_side`
    tokens per side (InternVL, Aya Vision, Gemma 3, PaliGemma, Idefics3, SmolVLM): the side is checked at patch
    time and is the grid each call's images are placed on."""

    def grid_side(self, config: Any, strategy: Optional[str]) -> int:
        """Tokens per side of one image's grid under the vision feature ``strategy`` (None where the family has
        none); a ValueError for a configuration whose images are no square grid."""
        raise NotImplementedError

    def check(self, inner: nn.Module) -> None:
        self.grid_side(inner.config, getattr(inner.config, "vision_feature_select_strategy", None))

    def image_grid(self, inner: nn.Module, kwargs: dict) -> tuple[int, int]:
        strategy = (kwargs.get("vision_feature_select_strategy")
                    or getattr(inner.config, "vision_feature_select_strategy", None))
        return self.grid_side(inner.config, strategy), 0

def encoded_images(kwargs: dict) -> Any:
    """The images ``generate`` encoded before the first forward (``mm_encoder_outputs["image"]``; Idefics3 and
    SmolVLM also take the pooled features as a bare tensor), or None."""
    encoded = kwargs.get("mm_encoder_outputs")
    if isinstance(encoded, torch.Tensor) or encoded is None:
        return encoded
    return encoded.get("image")


Item = list  # one image or video as the model fills its tokens: ints (that many text tokens) and (t, h, w) grids


def pooled_items(sizes: Any, fh: int, fw: int, what: str) -> list[Item]:
    """One grid item per row ``(h, w)`` of ``sizes`` (patch rows and columns per image or tile), each token holding an
    ``fh × fw`` window of patches; ``what`` names them in the error raised when a size is no whole number of windows
    (``"patched LFM2-VL: image"`` gives "patched LFM2-VL: image 0 has ...")."""
    items = []
    for i, (h, w) in enumerate(torch.as_tensor(sizes).reshape(-1, 2).tolist()):
        if h < fh or w < fw or h % fh or w % fw:
            raise ValueError(f"{what} {i} has {h} x {w} patches, no whole number of the {fh} x {fw} patch windows "
                             f"each token holds, as the processor makes them")
        items.append([(1, h // fh, w // fw)])
    return items


def place_items(types: torch.Tensor, kind: int, items: Optional[list[Item]], what: str) -> tuple[torch.Tensor, Any]:
    """Cut the tokens of ``kind`` (in batch-row order, as the model fills them) into ``items`` in order.

    Each item lists its parts: an int ``n`` is ``n`` tokens placed as text (a CLS or newline feature),
    a ``(t, h, w)`` tuple a grid of ``t·h·w`` tokens. ``items=None`` (no images/videos given): the tokens
    are text, as in the stock model. Returns (types, grids ``(n, 3)`` or None); ``what`` names the input
    in the error raised when the token count is not the items' count.
    """
    if items is None:
        return types.masked_fill(types == kind, 0), None
    parts = [p for item in items for p in item]
    flat = torch.cat([torch.full((_tokens(p),), 0 if isinstance(p, int) else kind) for p in parts]
                     or [torch.zeros(0, dtype=torch.long)])
    is_kind = types == kind
    count = int(is_kind.sum())
    if count != flat.numel():
        per = [sum(_tokens(p) for p in item) for item in items]
        raise ValueError(
            f"{mismatch(what, count, flat.numel())}: "
            f"patched model: the input holds {count} {what} tokens but its {len(items)} {what}(s) fill {flat.numel()} "
            f"(tokens per {what}: {per}, from the {what} sizes and the model's config); give each {what} the "
            f"tokens the model's processor gives it"
        )
    types = types.masked_scatter(is_kind, flat.to(types.device, types.dtype))
    grids = [p for p in parts if not isinstance(p, int)]
    return types, torch.tensor(grids, dtype=torch.long).reshape(-1, 3)


def _tokens(part: Any) -> int:
    return part if isinstance(part, int) else part[0] * part[1] * part[2]


def image_runs(types: torch.Tensor, side: int, cls: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split the image tokens (type 1, in batch-row order, as the model fills them) into images of
    ``cls + side²`` tokens; a leading CLS token of each becomes text. Returns (types, image_grid_thw)."""
    per = side * side + cls
    count = int((types == 1).sum())
    if count % per:
        raise ValueError(
            f"{mismatch('image', count)}: "
            f"patched model: {count} image tokens are not a whole number of images of {per} tokens "
            f"({side}x{side} patches{' + CLS' if cls else ''}, from the vision config); give {per} image tokens "
            f"per image"
        )
    return place_items(types, 1, [base_item(side, cls)] * (count // per), "image")


def base_item(side: int, cls: int = 0, newline: int = 0) -> Item:
    """One image as the vision tower's base grid, with a leading CLS and a trailing newline token as text."""
    return ([cls] if cls else []) + [(1, side, side)] + ([newline] if newline else [])
