"""What differs between vision encoders with 2-D RoPE: their rotary and attention classes, how their patch
coordinates are built, their stock frequency layout and where q and k leave the projections.

The patch never copies an encoder's attention code. It replaces two instance attributes per encoder:

- the rotary module's ``forward`` returns the identity rotation (cos = 1, sin = 0, in the shape and dtype the
  model expects), so the model's own ``apply_rotary_pos_emb`` leaves q and k unchanged, and attaches the
  patch coordinates to the cos tensor (``_ropekit_coords``), so they travel with the model's own
  ``position_embeddings`` through every layer (and through gradient-checkpointing re-runs);
- the q/k projections' ``forward`` rotates their output with the ropekit family at those coordinates.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

COORDS_ATTR = "_ropekit_coords"


class VisionAdapter:
    """One encoder family. Subclasses set the class names and override what differs."""

    name: str = ""
    rotary_classes: tuple[str, ...] = ()
    attention_classes: tuple[str, ...] = ()
    fused_qkv: bool = False  # one ``qkv`` Linear (Qwen) rather than ``q_proj``/``k_proj``
    rotary_params: tuple[str, ...] = ()  # the rotary ``forward``'s parameters, all read by :meth:`coords`

    def matches(self, rotary: nn.Module) -> bool:
        return type(rotary).__name__ in self.rotary_classes

    def head_dim(self, attention: nn.Module) -> int:
        return attention.head_dim

    def num_heads(self, attention: nn.Module) -> int:
        return attention.num_heads

    def base(self, rotary: nn.Module) -> float:
        """The encoder's RoPE base (its ``rope_theta``)."""
        return float(rotary.config.rope_parameters["rope_theta"])

    def coords(self, rotary: nn.Module, **arguments: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(patch coordinates ``(P, 2)`` float32 exactly as the stock rotary uses them, a tensor whose
        device and dtype the stock cos/sin have) for the arguments of the rotary's ``forward``, by name
        (:attr:`rotary_params`)."""
        raise NotImplementedError

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        """``W (2, head_dim/2)``: with ``angles(coords, W)`` in the half-split channel layout, the stock rotation."""
        raise NotImplementedError

    def extra_hooks(self) -> tuple[str, ...]:
        """Methods of the encoder (the rotary's parent) that reorder the position embeddings (hooked to
        reorder the coordinates alike)."""
        return ()


def split_axes(inv_freq_h: torch.Tensor, inv_freq_w: torch.Tensor) -> torch.Tensor:
    """``W (2, n_h + n_w)``: the first pairs turn with the row (h), the rest with the column (w)."""
    W = torch.zeros(2, inv_freq_h.numel() + inv_freq_w.numel(), dtype=torch.float32)
    W[0, : inv_freq_h.numel()] = inv_freq_h.float()
    W[1, inv_freq_h.numel():] = inv_freq_w.float()
    return W
