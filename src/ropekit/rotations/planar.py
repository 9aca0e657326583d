"""Stage 3 — planar rotation family: every 2×2-rotation scheme is one frequency matrix ``W``.

``W`` has shape ``(A, R/2)`` (or ``(heads, A, R/2)`` for per-head schemes), ``R`` the rotary dim;
the angle of frequency pair j for a token at coordinates ``c`` is ``c · W[:, j]``.
Axial, M-RoPE sections, interleaved (Qwen3-VL), VRoPE groups and plain 1-D RoPE are one-hot
columns; proportional RoPE (Gemma 4) is 1-D RoPE with its trailing columns zero; directional and mixed
RoPE fill ``W`` densely.
"""
from __future__ import annotations

from typing import Sequence

import math
import numbers

import torch

from .published import PUBLISHED, published_matrix

__all__ = ["inv_freq", "frequency_matrix", "angles", "ALLOCATIONS", "check_allocation", "check_base", "check_sections"]

ALLOCATIONS = ("1d", "mrope", "interleaved", "vrope", "axial", "proportional") + PUBLISHED


# Upper bounds that keep absurd sizes from allocating gigabytes before anything else fails.
MAX_DIM = 1 << 16  # rotary/head dims
MAX_AXES = 1 << 10  # coordinate axes


def check_allocation(allocation: str) -> str:
    """``allocation`` if it is one of :data:`ALLOCATIONS`, else a ValueError suggesting the nearest names.

    A design name is not an allocation (allocations and designs are paired, :attr:`Design.allocation`): the
    message names the design's allocation, and :func:`ropekit.design_frequencies`, which builds a design's
    frequencies with its own allocation (and checks its axes); a design whose option picks its allocation
    (GRAPE) has more than one, which is why this function does not take design names itself.
    """
    if isinstance(allocation, str) and allocation in ALLOCATIONS:
        return allocation
    from ..designs.registry import did_you_mean, get_design  # the error path only

    try:
        design = get_design(allocation) if isinstance(allocation, str) else None
    except ValueError:
        design = None
    if design is not None:
        own = repr(design.allocation)
        if design.allocation_option is not None:
            option, picks = design.allocation_option
            own += "".join(f" ({a!r} with {option}={v!r})" for v, a in picks.items() if a != design.allocation)
        raise ValueError(
            f"unknown allocation {allocation!r}: {allocation!r} is a position design, not an allocation; its "
            f"allocation is {own}: frequency_matrix({design.allocation!r}, ...), or "
            f"ropekit.design_frequencies({design.name!r}, ...), which builds a design's frequencies with its own "
            f"allocation; allocations: {', '.join(ALLOCATIONS)}"
        )
    raise ValueError(f"unknown allocation {allocation!r}{did_you_mean(allocation, ALLOCATIONS)}; "
                     f"choose one of {', '.join(ALLOCATIONS)}")


def check_count(value: int, name: str, most: int) -> int:
    """An int in ``[1, most]`` (bools and other types are TypeErrors)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"`{name}` must be >= 1, got {value}")
    if value > most:
        raise ValueError(f"`{name}` = {value} is too large (at most {most})")
    return value


def check_seed(seed) -> None:
    """``None`` or an int in ``[0, 2**63)`` (what torch generators take)."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"`seed` must be an int or None, got {seed!r}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"`seed` must be in [0, 2**63), got {seed}")


def _check_dim(dim: int, name: str = "rotary_dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"`{name}` must be an int, got {type(dim).__name__}")
    if dim < 2 or dim % 2:
        raise ValueError(f"`{name}` must be a positive even number (channels rotate in pairs), got {dim}")
    return check_count(dim, name, MAX_DIM)


def check_base(base: float, name: str = "base") -> float:
    """A frequency base must be a finite real number > 1.

    Frequencies are ``base ** -e`` for exponents ``e`` in [0, 1): a base <= 1 makes them all equal
    (base 1) or growing past 1 (base < 1, which aliases and overflows float32 for tiny bases), and a
    non-finite base makes them NaN.
    """
    if isinstance(base, bool) or not isinstance(base, numbers.Real):
        raise TypeError(f"`{name}` must be a real number > 1, got {type(base).__name__}")
    if not (math.isfinite(base) and base > 1):
        raise ValueError(
            f"`{name}` must be a finite number > 1 (frequencies are its powers {name}^-e, 0 <= e < 1), got {base!r}"
        )
    return float(base)


def inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Standard inverse frequencies ``base ** (-2j / dim)``, ``j = 0 … dim/2 - 1`` (float32)."""
    _check_dim(dim, "dim")
    base = check_base(base)
    # same expression as the Hugging Face reference, so M-RoPE matches it bit for bit
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if not bool((freqs > 0).all()):
        raise ValueError(f"`base` = {base!r} is too large: frequencies base^(-2j/{dim}) underflow to 0 in float32")
    return freqs


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
    partial_rotary_factor: float | None = None,
) -> torch.Tensor:
    """Build ``W (num_axes, rotary_dim/2)`` for a named allocation.

    Every axis receives at least one frequency: an ``"mrope"`` allocation needs at least ``num_axes``
    sections (3 by default) and ``"interleaved"`` with ``sections`` exactly one section per axis.

    - ``"1d"``: one axis, standard RoPE.
    - ``"mrope"``: chunk i of ``sections`` (default ``[16, 24, 24]`` scaled to ``rotary_dim``) uses axis
      ``i mod A``; highest frequencies to the first (temporal) axis — Qwen2-VL.
    - ``"interleaved"``: frequency j uses axis ``j mod A`` (Qwen3-VL; with ``sections``, axis a ≥ 1 takes
      ``j ≡ a (mod A)`` for ``j < A·sections[a]`` and axis 0 the rest, as Qwen3-VL does).
    - ``"vrope"``: frequency k uses coordinate ``k mod A`` (VRoPE's interleaved groups).
    - ``"axial"``: the frequencies split into A contiguous equal chunks, each a full spectrum
      ``base ** (-j / n)`` over its ``n = rotary_dim / (2A)`` pairs (rope-vit axial).
    - ``"proportional"`` (Gemma 4's proportional RoPE, one axis): the standard spectrum over the whole
      ``rotary_dim`` (pass the head dim), of which only the first ``n = int(partial_rotary_factor ·
      rotary_dim // 2)`` pairs rotate; the other columns are 0 (cos 1, sin 0: those channels pass
      through). Give ``partial_rotary_factor`` in [0, 1] (Gemma 4's full-attention layers: 0.25) or
      ``sections=[n, rotary_dim/2 − n]`` (rotated, unrotated pairs), which is what ``RoPE`` passes on.
      Unlike ``rotary_dim < head_dim``, the rotated pairs keep the frequencies ``base^(−2j/head_dim)``,
      and with ``channels="half"`` they are channels ``(j, j + head_dim/2)``, not the leading ones.
    - published multimodal variants (``"mrope-interleave"``, ``"videorope"``, ``"hope"``, ``"mmrope"``,
      ``"mhrope"`` per head, …): see :mod:`ropekit.rotations.published`.
    """
    _check_dim(rotary_dim)
    check_count(num_axes, "num_axes", MAX_AXES)
    half = rotary_dim // 2
    check_allocation(allocation)
    if partial_rotary_factor is not None and allocation != "proportional":
        raise ValueError(
            f"`partial_rotary_factor` belongs to allocation 'proportional' (Gemma 4), not {allocation!r}; "
            f"drop it, or rotate fewer channels with rotary_dim < head_dim (RoPE(rotary_dim=...))"
        )
    if allocation == "proportional":
        if num_axes != 1:
            raise ValueError(f"allocation 'proportional' takes 1 axis (1-D positions, as in Gemma 4), got "
                             f"num_axes={num_axes}; pass num_axes=1 and 1-D coordinates")
        rotated = _proportional_pairs(half, partial_rotary_factor, sections)
        W = inv_freq(rotary_dim, base)[None, :].clone()
        W[:, rotated:] = 0.0
        return W
    if allocation == "bailing-mrope" and sections is not None:
        sections = check_sections(sections)
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
        if len(sections) < num_axes:
            raise ValueError(
                f"allocation 'mrope' with {len(sections)} sections {sections} gives frequencies to "
                f"{len(sections)} axes but the coordinates have num_axes={num_axes}; pass one section per axis "
                f"(`sections`) or another allocation ('interleaved', 'axial', 'vrope')"
            )
        axis_of = torch.repeat_interleave(torch.arange(len(sections)) % num_axes, torch.tensor(sections))
        return _one_hot(axis_of, freqs, num_axes)
    if allocation == "interleaved":
        axis_of = j % num_axes
        if sections is not None:
            sections = _check_sections(sections, half)
            if len(sections) != num_axes:
                raise ValueError(
                    f"allocation 'interleaved' takes one of `sections` per axis: got {len(sections)} sections "
                    f"{sections} for num_axes={num_axes}"
                )
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


def _proportional_pairs(half: int, factor, sections) -> int:
    """Number of rotated pairs of allocation 'proportional' from ``partial_rotary_factor`` or ``sections``."""
    if (factor is None) == (sections is None):
        raise ValueError(
            "allocation 'proportional' needs exactly one of `partial_rotary_factor` (the fraction of the head "
            "dim that rotates, e.g. 0.25 as in Gemma 4's full-attention layers) or `sections`=[rotated, "
            f"unrotated] pairs summing to rotary_dim/2 = {half}"
            + ("; got both" if factor is not None else "")
        )
    if sections is not None:
        secs = check_sections(sections)
        if len(secs) != 2 or min(secs) < 0 or sum(secs) != half:
            raise ValueError(
                f"allocation 'proportional': `sections` must be [rotated, unrotated] pairs, non-negative and "
                f"summing to rotary_dim/2 = {half} (e.g. [{half // 4}, {half - half // 4}]), got {list(sections)}"
            )
        return secs[0]
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real):
        raise TypeError(f"`partial_rotary_factor` must be a real number in [0, 1], got {type(factor).__name__}")
    if not (math.isfinite(factor) and 0.0 <= factor <= 1.0):
        raise ValueError(
            f"`partial_rotary_factor` must be in [0, 1] (the fraction of the head dim that rotates), got {factor!r}"
        )
    # transformers' expression, int(factor * head_dim // 2); vLLM's int(head_size * factor) // 2 is the same
    return int(float(factor) * (2 * half) // 2)


def check_sections(sections: Sequence[int]) -> list[int]:
    """``sections`` as a list of Python ints; floats (even 3.0), bools and other types are refused, not truncated."""
    if isinstance(sections, torch.Tensor):
        if sections.ndim != 1 or sections.is_floating_point() or sections.dtype == torch.bool:
            raise TypeError(f"`sections` must be a 1-D integer tensor or a list of ints, got {sections!r}")
        sections = sections.tolist()
    if isinstance(sections, (str, bytes)) or not hasattr(sections, "__iter__"):
        raise TypeError(f"`sections` must be a sequence of ints such as [16, 24, 24], got {sections!r}")
    secs = list(sections)
    bad = [s for s in secs if isinstance(s, bool) or not isinstance(s, numbers.Integral)]
    if bad:
        raise TypeError(f"`sections` must hold ints (numbers of frequency pairs), got {list(secs)!r}")
    return [int(s) for s in secs]


def _check_sections(sections: Sequence[int], half: int) -> list[int]:
    secs = check_sections(sections)
    if not secs or any(s < 0 for s in secs) or sum(secs) != half:
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
    for name, t, dims in (("coords", coords, "(..., L, A)"), ("W", W, "(A, R/2) or (H, A, R/2)")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"angles: `{name}` must be a tensor {dims}, got {type(t).__name__}")
        if t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"angles: `{name}` must hold real numbers, got {t.dtype}")
    if coords.ndim < 2:
        raise ValueError(f"angles: `coords` must have shape (..., L, A), got {tuple(coords.shape)}; "
                         f"for 1-D positions use coords[:, None]")
    if W.ndim not in (2, 3):
        raise ValueError(f"angles: `W` must have shape (A, R/2) or (H, A, R/2), got {tuple(W.shape)}")
    if coords.shape[-1] != W.shape[-2]:
        raise ValueError(
            f"angles: coords have {coords.shape[-1]} axes but W expects {W.shape[-2]}; `coords` and `W` must "
            f"agree: build W with num_axes={coords.shape[-1]} or use the design's allocation"
        )
    out = product(coords, W)
    if not torch.compiler.is_compiling() and not bool(torch.isfinite(out).all()):  # one read-back; the cause
        work = out.dtype  # is looked for on the error path only
        _check_finite(coords.to(work), "coords", "positions must be finite numbers")
        _check_finite(W.to(work), "W", "frequencies must be finite numbers")
        _check_finite(out, "coords", f"the angles coords·W overflow {work}; positions are too large for these "
                                     f"frequencies")
    return out


def product(coords: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """The arithmetic of :func:`angles` without its checks, for callers that validated ``coords`` and ``W`` once
    (a patched model's rotary: frequencies built at patch time, positions placed by the patch)."""
    work = torch.float64 if torch.float64 in (coords.dtype, W.dtype) else torch.float32
    c = coords if coords.dtype == work else coords.to(work)
    Wf = W if W.dtype == work else W.to(work)
    if W.ndim == 3:  # per head: (..., L, A) -> (..., 1, L, A, 1) * (H, 1, A, R/2)
        return (c[..., None, :, :, None] * Wf[:, None, :, :]).sum(-2)
    if W.shape[-2] == 1:
        return c * Wf[0]
    return (c[..., None] * Wf).sum(-2)


def _check_finite(t: torch.Tensor, name: str, why: str) -> None:
    """Raise a ValueError naming ``name`` if ``t`` holds NaN/inf (not while tracing: no data-dependent branch)."""
    if not torch.compiler.is_compiling() and not bool(torch.isfinite(t).all()):
        raise ValueError(f"angles: `{name}` gives NaN or inf; {why}")
