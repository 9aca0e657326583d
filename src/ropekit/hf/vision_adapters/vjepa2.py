"""V-JEPA 2 (encoder and predictor): every attention module rotates its own q and k from token indices, split
into (frame, row, column) by the grid its config fixes (``crop_size / patch_size`` patches a side); three
equal channel blocks of ``d = 2·⌊⌊D/3⌋/2⌋`` channels turn with frame, row and column, the rest pass.

Its map is not a rotation: each block pairs channels (2j, 2j+1), but its sin/cos tables hold the ``d/2``
frequencies ``10000^(-2i/d)`` tiled twice rather than each repeated, so channel ``c`` turns at frequency
``c mod d/2`` and the two channels of a pair mostly at different ones. ``frequencies="stock"`` reproduces
that map as it is; the other families rotate.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..boundary import Contract
from .base import VisionAdapter


def block_width(head_dim: int) -> int:
    """Channels per axis the stock map turns."""
    return 2 * ((head_dim // 3) // 2)


class TiledStock:
    """The stock V-JEPA 2 map per (frame, row, column) block, in the tensor's own dtype as the stock computes it."""

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        self.d, self.base = block_width(head_dim), base

    def tables(self, coords: torch.Tensor) -> torch.Tensor:
        return coords.long()  # the stock multiplies integer token positions into the frequencies

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        d, half = self.d, self.d // 2
        exponent = torch.arange(half, dtype=x.dtype, device=x.device)
        exponent /= d / 2.0
        inv = 1.0 / self.base ** exponent
        out = []
        for axis in range(3):
            block = x[..., axis * d:(axis + 1) * d]
            angle = positions[..., axis].to(x.device)[:, None] * inv  # (L, d/2)
            cos, sin = angle.cos().repeat(1, 2), angle.sin().repeat(1, 2)  # tiled, as the stock tables are
            even, odd = block[..., 0::2], block[..., 1::2]
            turned = torch.stack((-odd, even), dim=-1).flatten(-2)  # pair (2j, 2j+1) -> (-x_2j+1, x_2j)
            out.append(block * cos + turned * sin)
        if 3 * d < x.shape[-1]:
            out.append(x[..., 3 * d:])
        return torch.cat(out, dim=-1)


class VJEPA2Adapter(VisionAdapter):
    name = "vjepa2"
    rotary_classes = ("VJEPA2Model", "VJEPA2Encoder", "VJEPA2Predictor")
    attention_classes = ("VJEPA2RopeAttention",)
    style = "method"
    method = "apply_rotary_embeddings"
    method_params = ("qk", "pos_ids")
    num_axes = 3

    def head_dim(self, attention: nn.Module) -> int:
        return attention.attention_head_size

    def num_heads(self, attention: nn.Module) -> int:
        return attention.num_attention_heads

    def base(self, anchor: nn.Module) -> float:
        return 10000.0  # fixed in the model's code

    def method_coords(self, attention: nn.Module, positions: Any) -> torch.Tensor:
        if not (isinstance(positions, (tuple, list)) and len(positions) == 3):
            raise ValueError("patch_vision_model: V-JEPA 2's attention handed on positions that are not its "
                             "(frame, row, column) ids; this transformers version is not supported")
        coords = torch.stack([p.float() for p in positions], dim=-1)  # (L, 3), or (B, H, L, 3) with masks
        return coords[:, 0] if coords.ndim == 4 else coords  # every head has the same positions

    def stock_rotator(self, anchor: nn.Module, head_dim: int) -> TiledStock:
        return TiledStock(head_dim, self.base(anchor))

    def guards(self, anchor: nn.Module) -> list:
        grids = {m.grid_size for m in anchor.modules() if type(m).__name__ in self.attention_classes}
        contract = Contract(frozenset({"pixel_values_videos"}), required=(("pixel_values_videos",),))
        return [(m, "forward", contract, grids.pop()) for m in anchor.modules()
                if type(m).__name__ == "VJEPA2PatchEmbeddings3D" and len(grids) == 1]

    def check_input(self, owner: nn.Module, grid: int, pixel_values_videos: torch.Tensor) -> None:
        size = tuple(pixel_values_videos.shape[-2:])
        patches = tuple(s // owner.patch_size for s in size)
        if patches != (grid, grid):
            crop = grid * owner.patch_size
            raise ValueError(
                f"patch_vision_model: V-JEPA 2 places patches by the grid its config fixes ({grid} x {grid} "
                f"patches, crop_size {crop}), but `pixel_values_videos` of {size[0]} x {size[1]} pixels gives "
                f"{patches[0]} x {patches[1]} patches, whose rows and frames the stock model would place "
                f"wrapped, so no design can place them exactly; resize the video to {crop} x {crop} (or build "
                f"the model with that crop_size)")
