"""Stage 3 — planar rotation family: every 2×2-rotation scheme is one frequency matrix ``W``.

``W`` has shape ``(A, R/2)`` (or ``(heads, A, R/2)`` for per-head schemes), ``R`` the rotary dim;
the angle of frequency pair j for a token at coordinates ``c`` is ``c · W[:, j]`` (SPEC §1).
Axial, M-RoPE sections, interleaved (Qwen3-VL), VRoPE groups and plain 1-D RoPE are one-hot
columns; directional and mixed RoPE fill ``W`` densely.
"""
from __future__ import annotations

from typing import Sequence

import torch

from .published import PUBLISHED, published_matrix

__all__ = ["inv_freq", "frequency_matrix", "angles", "ALLOCATIONS"]

ALLOCATIONS = ("1d", "mrope", "interleaved", "vrope", "axial") + PUBLISHED


def _check_dim(dim: int, name: str = "rotary_dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"`{name}` must be an int, got {type(dim).__name__}")
    if dim < 2 or dim % 2:
        raise ValueError(f"`{name}` must be a positive even number (channels rotate in pairs), got {dim}")
    return dim


def inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Standard inverse frequencies ``base ** (-2j / dim)``, ``j = 0 … dim/2 - 1`` (float32)."""
    _check_dim(dim, "dim")
    if not base > 0:
        raise ValueError(f"`base` must be > 0, got {base}")
    # same expression as the Hugging Face reference, so M-RoPE matches it bit for bit
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _one_hot(axis_of: torch.Tensor, freqs: torch.Tensor, num_axes: int) -> torch.Tensor:
    W = torch.zeros(num_axes, freqs.numel(), dtype=torch.float32)
    W[axis_of, torch.arange(freqs.numel())] = freqs
    return W


def frequency_matrix(
    allocation: str,
    rotary_dim: int,
    num_axes: int = 1,
    *,
    base: float = 10000.0,
    sections: Sequence[int] | None = None,
) -> torch.Tensor:
    """Build ``W (num_axes, rotary_dim/2)`` for a named allocation (SPEC §4).

    - ``"1d"``: one axis, standard RoPE.
    - ``"mrope"``: chunk i of ``sections`` (default ``[16, 24, 24]`` scaled to ``rotary_dim``) uses axis
      ``i mod A``; highest frequencies to the first (temporal) axis — Qwen2-VL.
    - ``"interleaved"``: frequency j uses axis ``j mod A`` (Qwen3-VL; with ``sections``, axis a ≥ 1 takes
      ``j ≡ a (mod A)`` for ``j < A·sections[a]`` and axis 0 the rest, as Qwen3-VL does).
    - ``"vrope"``: frequency k uses coordinate ``k mod A`` (VRoPE's interleaved groups).
    - ``"axial"``: the frequencies split into A contiguous equal chunks, each a full spectrum
      ``base ** (-j / n)`` over its ``n = rotary_dim / (2A)`` pairs (rope-vit axial).
    - published multimodal variants (``"mrope-interleave"``, ``"videorope"``, ``"hope"``, ``"mmrope"``,
      ``"mhrope"`` per head, …): see :mod:`ropekit.rotations.published`.
    """
    _check_dim(rotary_dim)
    if isinstance(num_axes, bool) or not isinstance(num_axes, int) or num_axes < 1:
        raise ValueError(f"`num_axes` must be an int >= 1, got {num_axes!r}")
    half = rotary_dim // 2
    if allocation not in ALLOCATIONS:
        raise ValueError(f"unknown allocation {allocation!r}; choose one of {', '.join(ALLOCATIONS)}")
    if allocation == "1d":
        if num_axes != 1:
            raise ValueError(f"allocation '1d' takes 1 axis, got num_axes={num_axes}; use 'mrope', 'axial' …")
        return inv_freq(rotary_dim, base)[None, :]
    freqs = inv_freq(rotary_dim, base)
    if allocation in PUBLISHED:
        return published_matrix(allocation, freqs, num_axes, sections)
    j = torch.arange(half)
    if allocation == "mrope":
        if sections is None:
            if half % 8:
                raise ValueError(
                    f"allocation 'mrope' needs `sections` for rotary_dim={rotary_dim}; default [16, 24, 24] "
                    f"scales only to rotary_dim divisible by 16"
                )
            sections = [half // 4, 3 * half // 8, 3 * half // 8]
        sections = _check_sections(sections, half)
        axis_of = torch.repeat_interleave(torch.arange(len(sections)) % num_axes, torch.tensor(sections))
        return _one_hot(axis_of, freqs, num_axes)
    if allocation == "interleaved":
        axis_of = j % num_axes
        if sections is not None:
            sections = _check_sections(sections, half)
            axis_of = torch.zeros(half, dtype=torch.long)
            for a in range(1, min(len(sections), num_axes)):
                axis_of[a : sections[a] * num_axes : num_axes] = a
        return _one_hot(axis_of, freqs, num_axes)
    if allocation == "vrope":
        return _one_hot(j % num_axes, freqs, num_axes)
    # axial
    if half % num_axes:
        raise ValueError(
            f"allocation 'axial' splits rotary_dim/2 = {half} pairs evenly over {num_axes} axes; "
            f"choose rotary_dim divisible by {2 * num_axes}"
        )
    n = half // num_axes
    per_axis = 1.0 / (base ** (torch.arange(n, dtype=torch.float64) / n))
    return _one_hot(torch.arange(num_axes).repeat_interleave(n), per_axis.float().repeat(num_axes), num_axes)


def _check_sections(sections: Sequence[int], half: int) -> list[int]:
    secs = [int(s) for s in sections]
    if any(s < 0 for s in secs) or sum(secs) != half:
        raise ValueError(
            f"`sections` {list(sections)} must be non-negative and sum to rotary_dim/2 = {half} "
            f"(e.g. [16, 24, 24] for head_dim 128)"
        )
    return secs


def angles(coords: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Rotation angles ``coords @ W`` in float32 (float64 when coords or W are float64).

    ``coords (..., L, A)`` with ``W (A, R/2)`` gives ``(..., L, R/2)``; with a per-head ``W (H, A, R/2)``
    it gives ``(..., H, L, R/2)``. The product is taken elementwise and summed over the axes so
    one-hot columns reproduce ``position * inv_freq`` exactly (no TF32, no re-association).
    """
    if not isinstance(coords, torch.Tensor) or not isinstance(W, torch.Tensor):
        raise TypeError("angles: `coords` and `W` must be tensors")
    if coords.shape[-1] != W.shape[-2]:
        raise ValueError(
            f"angles: coords have {coords.shape[-1]} axes but W expects {W.shape[-2]}; "
            f"build W with num_axes={coords.shape[-1]} or use the design's allocation"
        )
    work = torch.float64 if torch.float64 in (coords.dtype, W.dtype) else torch.float32
    c = coords.to(work)
    Wf = W.to(work)
    if W.ndim == 3:  # per head: (..., L, A) -> (..., 1, L, A, 1) * (H, 1, A, R/2)
        return (c[..., None, :, :, None] * Wf[:, None, :, :]).sum(-2)
    if W.shape[-2] == 1:
        return c * Wf[0]
    return (c[..., None] * Wf).sum(-2)
