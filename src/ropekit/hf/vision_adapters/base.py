"""What differs between vision encoders with RoPE: their rotary and attention classes, how their patch
coordinates are built, their stock frequency layout and where q and k are taken to be rotated.

The patch never copies an encoder's attention code. Most encoders compute their rotation tables in one rotary
module and hand them to every attention layer; for those (``style = "rotary"``) it replaces two kinds of
instance attributes:

- the rotary module's ``forward`` returns the identity rotation (cos = 1, sin = 0, or the complex 1, in the
  shape and dtype the model expects), so the model's own rotary apply leaves q and k unchanged, and attaches
  the patch coordinates to that tensor (``_ropekit_coords``), so they travel with the model's own position
  embeddings through every layer (and through gradient-checkpointing re-runs);
- the modules whose outputs are q and k (the q/k projections, or the q/k norms where the encoder normalises
  q and k before rotating them) rotate their output with the ropekit family at those coordinates.

Encoders that rotate inside each attention module from token indices (``style = "method"``, V-JEPA 2) have
that attention method replaced instead: it receives the stock positions and rotates with the ropekit family.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

COORDS_ATTR = "_ropekit_coords"


class VisionAdapter:
    """One encoder family. Subclasses set the class names and override what differs."""

    name: str = ""
    rotary_classes: tuple[str, ...] = ()  # "rotary" style: the rotary module; "method" style: the encoder(s)
    attention_classes: tuple[str, ...] = ()
    style: str = "rotary"
    fused_qkv: bool = False  # one ``qkv`` Linear (Qwen) rather than ``q_proj``/``k_proj``
    qk_modules: tuple[str, ...] = ("q_proj", "k_proj")  # submodules whose outputs are q and k (flat heads)
    qk_per_head: bool = False  # their outputs are already (B, L, H, D) (q/k norms)
    rotary_params: tuple[str, ...] = ()  # the rotary ``forward``'s parameters, all read by :meth:`coords`
    embedding_param: str = "position_embeddings"  # the attention parameter carrying the rotary's output
    attention_params: tuple[str, ...] = ()  # more attention parameters the hook hands on unread
    method: str = ""  # ("method" style) the attention method that rotates q or k
    method_params: tuple[str, ...] = ()  # its parameters: the tensor, then the stock positions
    num_axes: int = 2
    rotary_per_layer: bool = False  # every layer has its own rotary module (SAM 3)
    stock_channels: str = "half"  # the stock pairs: "half" (i, i + R/2) or "interleaved" (2j, 2j + 1)
    patches_first: bool = False  # the patches are the first tokens (unrotated tokens follow them)

    def matches(self, rotary: nn.Module) -> bool:
        return type(rotary).__name__ in self.rotary_classes

    def head_dim(self, attention: nn.Module) -> int:
        return attention.head_dim

    def num_heads(self, attention: nn.Module) -> int:
        return attention.num_heads

    def num_kv_heads(self, attention: nn.Module) -> int:
        """Heads of k (fewer than q's with grouped-query attention)."""
        return self.num_heads(attention)

    def base(self, rotary: nn.Module) -> float:
        """The encoder's RoPE base (its ``rope_theta``)."""
        return float(rotary.config.rope_parameters["rope_theta"])

    def coords(self, rotary: nn.Module, **arguments: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(patch coordinates ``(P, A)`` or ``(B, P, A)`` float32 exactly as the stock rotary uses them, a
        tensor whose device and dtype the stock cos/sin have) for the arguments of the rotary's ``forward``,
        by name (:attr:`rotary_params`)."""
        raise NotImplementedError

    def identity(self, coords: torch.Tensor, like: torch.Tensor, head_dim: int) -> Any:
        """What the stock rotary returns, as the identity rotation: (cos 1, sin 0), one row per patch."""
        shape = (*coords.shape[:-1], head_dim)
        cos = torch.ones(shape, dtype=like.dtype, device=like.device)
        setattr(cos, COORDS_ATTR, coords)
        return cos, torch.zeros(shape, dtype=like.dtype, device=like.device)

    def embedded_coords(self, embeddings: Any) -> Optional[torch.Tensor]:
        """The coordinates :meth:`identity` attached, from the attention's :attr:`embedding_param`."""
        if isinstance(embeddings, tuple) and embeddings:
            return getattr(embeddings[0], COORDS_ATTR, None)
        return None

    def stock_frequencies(self, rotary: nn.Module) -> torch.Tensor:
        """``W (A, head_dim/2)``: with ``angles(coords, W)`` in the half-split channel layout, the stock rotation."""
        raise NotImplementedError

    def stock_permutation(self, head_dim: int) -> Optional[torch.Tensor]:
        """Channel order that turns the stock layout into the half-split one (None: it is half-split)."""
        return None

    def stock_rotator(self, rotary: nn.Module, head_dim: int) -> Optional[Any]:
        """A rotator for the stock map where it is not a planar rotation in a permuted half-split layout."""
        return None

    def method_coords(self, attention: nn.Module, positions: Any) -> torch.Tensor:
        """("method" style) the coordinates ``(P, A)`` or ``(B, P, A)`` for the stock positions argument."""
        raise NotImplementedError

    def guards(self, anchor: nn.Module) -> list[tuple[nn.Module, str, Any, Any]]:
        """``(module, method, Contract, info)``: calls :meth:`check_input` sees (with ``info``) before the stock
        method runs."""
        return []

    def check_input(self, owner: nn.Module, info: Any, **arguments: Any) -> None:
        """Raise ValueError for an input whose patches the patch cannot place as the stock does."""

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
