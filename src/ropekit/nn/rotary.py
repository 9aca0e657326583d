"""``RotaryEmbedding``: any ropekit design as a small ``nn.Module``, for everyday attention code.

>>> rot = ropekit.RotaryEmbedding(64)                          # 1-D RoPE, no layout needed
>>> q = rot.rotate_queries_or_keys(q)                          # q: (B, H, L, 64)
>>> q1 = rot.rotate_queries_or_keys(q1, offset=L)              # the next token while decoding with a KV cache
>>> rot2 = ropekit.RotaryEmbedding(64, design="circle")        # multimodal: pass a layout or coordinates
>>> q, k = rot2.rotate(q, k, "T3 I4x4 T2")
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch import nn

from ..apply._inputs import check_qk, match_coords_batch
from ..apply.planar import cos_sin
from ..designs.registry import design_axes, positions
from ..layout import Layout
from ..rope import RoPE, rotate_qk_tables, rotate_table
from ..rotations.planar import angles
from ..rotations.scaling import scale_frequencies

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Rotary position embedding for q/k of shape ``(B, H, L, D)`` (or ``(B, L, H, D)`` with ``seq_dim=1``).

    - ``head_dim``: channels rotated (pairs); a larger head passes its remaining channels through, as
      rotary-embedding-torch does when its ``dim`` is smaller than the head. ``rotary_dim`` rotates only the
      first ``rotary_dim`` of ``head_dim`` channels.
    - ``design`` / ``allocation`` / ``sections`` / ``base``: as in :class:`ropekit.RoPE` (``"vanilla"`` is
      plain 1-D RoPE; ``design="rope2d", allocation="axial"`` is the axial 2-D RoPE of vision transformers).
    - ``num_axes``: axes of the coordinates the module is fed (default: the design's own count).
    - ``interleaved``: pair channels ``(2j, 2j+1)`` like rotary-embedding-torch and GPT-J, instead of
      ``(j, j + R/2)`` like Hugging Face models (the default).
    - ``scaling``: context extension, a ``rope_parameters``-style dict (``docs/scaling.md``); its attention
      factor multiplies cos/sin.
    - ``frequencies``: your own frequency matrix ``(num_axes, rotary_dim/2)`` instead of the allocation's.

    The frequency matrix is a non-persistent buffer: it follows ``.to()`` / ``.cuda()`` and stays out of the
    state dict (it is a function of the arguments, not a weight). ``.half()`` / ``.bfloat16()`` leave it in
    float32 (rounding frequencies to 16 bits would shift every angle); angles are always float32, whatever
    the input dtype.
    """

    def __init__(
        self,
        head_dim: int,
        design: str = "vanilla",
        *,
        rotary_dim: int | None = None,
        allocation: str | None = None,
        base: float = 10000.0,
        sections: Sequence[int] | None = None,
        num_axes: int | None = None,
        interleaved: bool = False,
        scaling: Mapping[str, Any] | None = None,
        frequencies: torch.Tensor | None = None,
        design_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(interleaved, bool):
            raise TypeError(f"`interleaved` must be True or False, got {interleaved!r}")
        self.rope = RoPE(design, head_dim, rotary_dim=rotary_dim, allocation=allocation, base=base,
                         sections=sections, channels="interleaved" if interleaved else "half",
                         design_options=dict(design_options or {}),
                         scaling=None if scaling is None else dict(scaling))
        natural = design_axes(design, **self.rope.design_options)
        if num_axes is None:
            num_axes = natural
        if isinstance(num_axes, bool) or not isinstance(num_axes, int) or num_axes < 1:
            raise ValueError(f"`num_axes` must be an int >= 1, got {num_axes!r}")
        self.num_axes = num_axes
        W = self._custom(frequencies, scaling) if frequencies is not None else self.rope.frequencies(num_axes)
        self.register_buffer("W", W.clone(), persistent=False)
        self._W_exact = W.clone()  # float32 master copy: .half() / .bfloat16() must not round the frequencies

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        if self.W.dtype not in (torch.float32, torch.float64):
            self.W = self._W_exact.to(self.W.device)
        return self

    def _custom(self, W: torch.Tensor, scaling: Mapping[str, Any] | None) -> torch.Tensor:
        shape = (self.num_axes, self.rope.rotary_dim // 2)
        if not isinstance(W, torch.Tensor) or not W.is_floating_point():
            raise TypeError(f"`frequencies` must be a float tensor of shape {shape}, got {type(W).__name__}")
        if tuple(W.shape) != shape:
            raise ValueError(f"`frequencies` must have shape (num_axes, rotary_dim/2) = {shape}, got "
                             f"{tuple(W.shape)}")
        if self.rope._scaling.depends_on_length:
            raise ValueError("`scaling`: dynamic NTK and LongRoPE need the allocation's frequencies; "
                             "with custom `frequencies` use a static method (linear, ntk, yarn, llama3)")
        return scale_frequencies(W.float(), self.rope._scaling, base=self.rope.base)[0]

    @property
    def attention_scaling(self) -> float:
        """Factor multiplying cos and sin (YaRN / LongRoPE; 1.0 otherwise)."""
        return self.rope.attention_scaling

    def extra_repr(self) -> str:
        return (f"design={self.rope.design!r}, rotary_dim={self.rope.rotary_dim}, num_axes={self.num_axes}, "
                f"channels={self.rope.channels!r}")

    # --- cos / sin ---------------------------------------------------------------------------------------

    def cos_sin(self, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos/sin ``(..., L, rotary_dim/2)`` for coordinates ``(..., L, num_axes)``; with per-head
        frequencies (``design="mhrope"``) ``(1, H, L, rotary_dim/2)`` or ``(B, H, L, rotary_dim/2)``."""
        if not isinstance(coords, torch.Tensor):
            raise TypeError(f"`coords` must be a tensor (L, {self.num_axes}), got {type(coords).__name__}")
        if coords.ndim not in (2, 3) or coords.shape[-1] != self.num_axes:
            raise ValueError(f"`coords` must be (L, {self.num_axes}) or (B, L, {self.num_axes}) for this module "
                             f"(num_axes={self.num_axes}), got shape {tuple(coords.shape)}")
        if not torch.isfinite(coords).all():
            raise ValueError("`coords` contain NaN or inf; positions must be finite numbers")
        coords = coords.to(self.W.device)
        W = self.W
        if self.rope._scaling.depends_on_length:
            seq_len = int(coords.max().floor()) + 1 if coords.numel() else None
            W = self.rope.frequencies(self.num_axes, seq_len).to(self.W.device)
        if W.ndim == 3 and coords.ndim == 2:  # per-head W: keep a batch axis, (1, H, L, R/2)
            coords = coords[None]
        cos, sin = cos_sin(angles(coords, W))
        scale = self.attention_scaling
        return (cos, sin) if scale == 1.0 else (cos * scale, sin * scale)

    def text_positions(self, length: int, offset: int | float = 0, device: Any = None) -> torch.Tensor:
        """Coordinates ``(length, num_axes)`` of a text run starting at ``offset`` (the same index on every axis)."""
        pos = torch.arange(length, dtype=torch.float32, device=device or self.W.device) + offset
        return pos[:, None].expand(length, self.num_axes)

    # --- rotate ------------------------------------------------------------------------------------------

    def rotate_queries_or_keys(self, x: torch.Tensor, offset: int | float = 0, seq_dim: int = -2) -> torch.Tensor:
        """Rotate ``x`` whose tokens sit at positions ``offset, offset+1, …`` along ``seq_dim``.

        ``seq_dim=-2`` for ``(B, H, L, D)`` (or ``(B, L, D)``), ``1``/``-3`` for ``(B, L, H, D)``. With a KV
        cache, pass the number of tokens already cached as ``offset``. Multi-axis designs place the tokens
        as text (the same index on every axis); for image or video tokens use :meth:`rotate`.
        """
        seq_dim = self._seq_dim(x, seq_dim)
        coords = self.text_positions(x.shape[seq_dim], offset, x.device)
        cos, sin = self.cos_sin(coords)
        return rotate_table(x, cos, sin, channels=self.rope.channels, seq_dim=seq_dim)

    def rotate_queries_with_cached_keys(
        self, q: torch.Tensor, k: torch.Tensor, seq_dim: int = -2, offset: int | float = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys at positions ``0 … k_len-1``; the (fewer) queries at ``k_len - q_len + offset …``.

        With ``offset=0`` the queries are the last ``q_len`` of the keys' tokens. ``offset`` moves the queries
        only, never the keys, as rotary-embedding-torch's method of the same name does: it counts from the
        end of the keys' range minus the queries' length, not from 0.
        """
        sd = self._seq_dim(q, seq_dim)
        q_len, k_len = q.shape[sd], k.shape[self._seq_dim(k, seq_dim)]
        if q_len > k_len:
            raise ValueError(f"`q` has {q_len} tokens but `k` only {k_len}; queries must be the last keys' tokens")
        return (self.rotate_queries_or_keys(q, offset=offset + k_len - q_len, seq_dim=seq_dim),
                self.rotate_queries_or_keys(k, offset=0, seq_dim=seq_dim))

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        coords_or_layout: "torch.Tensor | Layout | str | None" = None,
        *,
        seq_dim: int = -2,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k at the given coordinates ``(L, A)`` / ``(B, L, A)``, a layout (``"T3 I4x4 T2"``) or,
        with ``None``, the text positions ``0 … L-1``."""
        sd = self._seq_dim(q, seq_dim)
        if coords_or_layout is None:
            coords = self.text_positions(q.shape[sd], 0, q.device)
        elif isinstance(coords_or_layout, torch.Tensor):
            coords = coords_or_layout
        else:
            coords = self.rope.coords(coords_or_layout)
        check_qk(q, k)
        cos, sin = self.cos_sin(match_coords_batch(coords, q) if isinstance(coords, torch.Tensor) else coords)
        return rotate_qk_tables(q, k, cos, sin, channels=self.rope.channels, seq_dim=sd)

    forward = rotate

    @staticmethod
    def _seq_dim(x: torch.Tensor, seq_dim: int) -> int:
        """The sequence dimension in the apply functions' terms: -2 for (B, H, L, D) / (B, L, D), 1 for (B, L, H, D)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"expected a tensor for q/k/x, got {type(x).__name__}")
        if x.ndim == 3 and seq_dim in (-2, 1):
            return -2
        if x.ndim == 4 and seq_dim in (-2, 2):
            return -2
        if x.ndim == 4 and seq_dim in (1, -3):
            return 1
        raise ValueError(f"`seq_dim` must be -2 for (B, H, L, D) or (B, L, D), or 1 / -3 for (B, L, H, D); "
                         f"got seq_dim={seq_dim} for a tensor of shape {tuple(x.shape)}")
