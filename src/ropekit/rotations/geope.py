"""Stage 3 — quaternion rotation family: GeoPE (3×3 rotations of channel triples).

Channels are grouped in triples (the quaternion's i, j, k components): by default contiguous ones
(triple i = channels 3i, 3i+1, 3i+2), or with ``channels="thirds"`` one component per third of the
rotated channels (triple i = channels i, n+i, 2n+i). A token at ``(h, w)`` rotates triple i about the unit axis ``(0, θ_h, θ_w)/‖·‖`` by
``Θ = ½·√(θ_h² + θ_w²)`` (GeoPE eq. 4, the Lie-algebra mean of the h- and w-rotations); at ``(d, h, w)``
about ``(θ_d, θ_h, θ_w)/‖·‖`` by ``Θ = ⅓·√(θ_d² + θ_h² + θ_w²)`` (eq. 6); ``θ_a = p_a · ω_i``. A single
coordinate ``p`` is the paper's 1-D case (app. F): a rotation about the j axis by ``θ = p · ω_i``.

Every case is one *rotation vector* ``φ_i = Θ · axis`` per token and triple, linear in the position:
``φ_i(p) = ω_i · E p`` with ``E p = (0, p, 0)``, ``(0, p_h, p_w)/2`` or ``(p_d, p_h, p_w)/3``. This module
turns positions into ``φ`` and the Rodrigues coefficients ``cos Θ``, ``sin Θ/Θ`` and ``(1 − cos Θ)/Θ²``,
each smooth in ``Θ²`` so that ``Θ = 0`` is an exact identity with finite gradients. No 3×3 matrix is
built per query or key; ``ropekit.apply.geope`` applies the rotation to q/k. For the fast eager path the
rotation also carries Rodrigues' formula expanded per output channel (:func:`channel_coefficients`),
and for compiled code the same weights packed per triple (:func:`triple_weights`), computed once per
rotation and shared by every batch entry, head and layer that uses it.

GeoPE is **not** exactly relative: ``R_mᵀ R_n`` depends on the absolute positions, not only on
``n − m``, because rotations about different axes do not commute (paper §3.4). Only positions on
one line through the origin direction commute. ``ropekit.analysis.relative`` measures the error;
``ropekit.apply.linear_geope`` is the exactly relative variant.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .planar import MAX_DIM, check_base, check_count

__all__ = [
    "GEOPE_FREQ_STYLES",
    "GeoPERotation",
    "geope_frequencies",
    "lie_embedding",
    "rotation_vectors",
    "rodrigues_coefficients",
    "channel_coefficients",
    "triple_weights",
    "CHANNEL_OFFSETS",
    "GEOPE_CHANNELS",
    "check_channels",
    "geope_rotation",
]

GEOPE_FREQ_STYLES = ("decreasing", "paper")

# Below this Θ² the coefficients come from their Taylor series (error < 1e-15 there), which keeps
# values and gradients exact at Θ = 0 without dividing by Θ.
_SMALL = 1e-4

# Which channels form triple i of n: "interleaved" = (3i, 3i+1, 3i+2), the paper's layout (the default);
# "thirds" = (i, n+i, 2n+i), one component per third of the rotated channels (planar RoPE's "half" layout
# for triples: the same rotation on permuted channels, so q·k is unchanged when q and k share the layout)
GEOPE_CHANNELS = ("interleaved", "thirds")


def check_channels(channels: str) -> str:
    if channels not in GEOPE_CHANNELS:
        raise ValueError(
            f"`channels` must be 'interleaved' (triple i = channels 3i, 3i+1, 3i+2) or 'thirds' "
            f"(triple i = channels i, n+i, 2n+i), got {channels!r}"
        )
    return channels


# Channel offsets of the terms of :func:`channel_coefficients`: output channel j of a triple reads input
# channels j, j+1, j-1, j+2 and j-2 (those outside its own triple get a zero coefficient).
CHANNEL_OFFSETS = (0, 1, -1, 2, -2)


class GeoPERotation(NamedTuple):
    """Per-token, per-triple rotations: rotation vector and the three Rodrigues coefficients.

    ``vector (..., L, n, 3)`` is ``φ = Θ · axis``; ``cos``, ``sinc`` (= sin Θ / Θ) and ``versc``
    (= (1 − cos Θ) / Θ²) are ``(..., L, n)``. Rotating ``v`` is
    ``v cos Θ + sinc · (φ × v) + versc · φ (φ · v)`` — Rodrigues' formula with the axis folded into φ.
    ``coeffs`` (optional, no gradient) is the same rotation expanded per output channel,
    ``(5, ..., L, 3n)`` from :func:`channel_coefficients`; the eager apply path uses it when present.
    ``triples`` (optional, no gradient) holds the same nine nonzero weights per triple packed together,
    ``(..., L, n, 9)`` from :func:`triple_weights`; the compiled and accelerator paths use it when present.
    ``planes`` (optional, no gradient) holds those nine weights component-major, ``(9, ..., L, n)``: weight
    ``t`` of every triple as one contiguous plane, which the ``channels="thirds"`` layout reads, and the
    compiled CPU kernel of the interleaved layout.
    ``channels`` is the channel layout the rotation was built for, which :func:`ropekit.apply_geope`
    applies unless told otherwise.
    """

    vector: torch.Tensor
    cos: torch.Tensor
    sinc: torch.Tensor
    versc: torch.Tensor
    coeffs: torch.Tensor | None = None
    triples: torch.Tensor | None = None
    planes: torch.Tensor | None = None
    channels: str = "interleaved"

    @property
    def num_triples(self) -> int:
        return self.vector.shape[-2]

    @property
    def seq_len(self) -> int:
        return self.vector.shape[-3]


def _check_head_dim(head_dim: int) -> None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise TypeError(f"`head_dim` must be an int, got {type(head_dim).__name__}")
    if head_dim < 3:
        raise ValueError(f"GeoPE rotates channel triples: `head_dim` must be >= 3, got {head_dim}")
    check_count(head_dim, "head_dim", MAX_DIM)


def geope_frequencies(head_dim: int, lam: float = 100.0, freq_style: str = "decreasing") -> torch.Tensor:
    """Per-triple frequencies ``ω_i`` (float32, shape ``(n,)``, ``n = ⌊head_dim/3⌋``).

    ``"decreasing"`` (default): ``ω_i = λ^{-i/n}``, a spectrum from 1 down to ``λ^{-(n-1)/n}``
    like axial RoPE's. ``"paper"``: the literal ``λ^{2i/d}`` of GeoPE §3.1 with ``d = head_dim`` and
    ``i = 0 … n-1`` — increasing, which the spec reads as a typo but keeps for reproduction.
    """
    _check_head_dim(head_dim)
    check_base(lam, "lam")
    if freq_style not in GEOPE_FREQ_STYLES:
        raise ValueError(f"`freq_style` must be one of {GEOPE_FREQ_STYLES}, got {freq_style!r}")
    n = head_dim // 3
    i = torch.arange(n, dtype=torch.float64)
    expo = -i / n if freq_style == "decreasing" else 2.0 * i / head_dim
    freqs = (float(lam) ** expo).to(torch.float32)
    if not bool(torch.isfinite(freqs).all() and (freqs > 0).all()):
        raise ValueError(f"`lam` = {lam!r} is too large: its frequencies leave the float32 range")
    return freqs


def _check_coords(coords: torch.Tensor, name: str = "coords") -> torch.Tensor:
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"`{name}` must be a tensor of shape (..., L, A), got {type(coords).__name__}")
    if coords.ndim < 2:
        raise ValueError(f"`{name}` must have shape (..., L, A) with A = 1, 2 or 3 axes, got {tuple(coords.shape)}")
    if coords.shape[-1] not in (1, 2, 3):
        raise ValueError(
            f"GeoPE takes 1 (p), 2 (h, w) or 3 (d, h, w) coordinates per token; `{name}` has "
            f"{coords.shape[-1]} (shape {tuple(coords.shape)})"
        )
    if coords.is_complex():
        raise TypeError(f"`{name}` must be real, got {coords.dtype}")
    work = torch.float64 if coords.dtype == torch.float64 else torch.float32
    c = coords.to(work)
    if not torch.isfinite(c).all():
        raise ValueError(f"`{name}` contains NaN or inf; positions must be finite")
    return c


def lie_embedding(coords: torch.Tensor) -> torch.Tensor:
    """Map positions ``(..., L, A)`` to the direction ``E p`` of the rotation vector, ``(..., L, 3)``.

    1-D: ``(0, p, 0)`` (app. F, rotation about j); 2-D: ``(0, p_h, p_w)/2`` (eq. 4);
    3-D: ``(p_d, p_h, p_w)/3`` (eq. 6). Linear in ``p``, so differences of positions map to
    differences of rotation vectors (the basis of Linear GeoPE).
    """
    c = _check_coords(coords)
    A = c.shape[-1]
    if A == 3:
        return c / 3.0
    zero = torch.zeros_like(c[..., :1])
    if A == 2:
        return torch.cat((zero, c / 2.0), dim=-1)
    return torch.cat((zero, c, zero), dim=-1)


def rotation_vectors(coords: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotation vectors ``φ_i = ω_i · E p`` of every token and triple, ``(..., L, n, 3)`` (float32/64)."""
    e = lie_embedding(coords)
    return e[..., None, :] * freqs.to(e.dtype)[:, None]


def rodrigues_coefficients(theta_sq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``cos Θ``, ``sin Θ / Θ`` and ``(1 − cos Θ) / Θ²`` from ``Θ²``, smooth and NaN-free at 0.

    Small angles use the Taylor series in ``Θ²``; elsewhere ``1 − cos Θ = 2 sin²(Θ/2)`` avoids the
    cancellation of ``1 − cos`` in float32. The unused branch sees a safe input, so gradients stay finite.
    """
    small = theta_sq < _SMALL
    s_small = torch.where(small, theta_sq, torch.zeros_like(theta_sq))
    s_big = torch.where(small, torch.ones_like(theta_sq), theta_sq)
    t = torch.sqrt(s_big)
    half = 0.5 * t
    sin_half_over = torch.sin(half) / half
    cos_big, sinc_big, versc_big = torch.cos(t), torch.sin(t) / t, 0.5 * sin_half_over * sin_half_over
    s2 = s_small * s_small
    cos_small = 1.0 - s_small / 2.0 + s2 / 24.0
    sinc_small = 1.0 - s_small / 6.0 + s2 / 120.0
    versc_small = 0.5 - s_small / 24.0 + s2 / 720.0
    return (
        torch.where(small, cos_small, cos_big),
        torch.where(small, sinc_small, sinc_big),
        torch.where(small, versc_small, versc_big),
    )


def channel_coefficients(
    vector: torch.Tensor, cos: torch.Tensor, sinc: torch.Tensor, versc: torch.Tensor
) -> torch.Tensor:
    """Rodrigues' formula written per output channel: ``(5, ..., L, 3n)`` weights for :data:`CHANNEL_OFFSETS`.

    Component c of a rotated triple is ``Σ_d R_cd v_d`` with ``R_cd = δ_cd cos Θ + versc φ_c φ_d −
    sinc ε_cde φ_e`` (GeoPE eq. 2 via app. D). Laid out along the channels, output channel ``j = 3i + c``
    reads input channel ``j + o`` with weight ``C[o]_j`` for the five offsets ``o ∈ (0, +1, −1, +2, −2)``
    (zero where ``j + o`` leaves the triple), so a whole row rotates with five contiguous multiply-adds
    instead of strided per-component arithmetic. Inputs as in :class:`GeoPERotation`.
    """
    wp = versc[..., None] * vector  # versc · φ_c
    sp = sinc[..., None] * vector  # sinc · φ_c
    # cyclic neighbours within the triple: R_{c,c+1} = versc φ_c φ_{c+1} − sinc φ_{c+2} and
    # R_{c,c−1} = versc φ_c φ_{c−1} + sinc φ_{c+1}; offset +2 is R_{0,2} = R_{c,c−1} at c = 0, −2 is R_{2,0}
    out = torch.empty((5, *vector.shape), dtype=vector.dtype, device=vector.device)
    torch.addcmul(cos[..., None], wp, vector, out=out[0])
    torch.mul(wp, vector.roll(-1, -1), out=out[1]).sub_(sp.roll(1, -1))
    torch.mul(wp, vector.roll(1, -1), out=out[2]).add_(sp.roll(-1, -1))
    out[3].zero_()
    out[3, ..., 0] = out[2, ..., 0]
    out[2, ..., 0] = 0
    out[4].zero_()
    out[4, ..., 2] = out[1, ..., 2]
    out[1, ..., 2] = 0
    return out.flatten(-2)


def triple_weights(coeffs: torch.Tensor) -> torch.Tensor:
    """Pack the per-channel weights ``(5, ..., 3n)`` of :func:`channel_coefficients` per triple: ``(..., n, 9)``.

    Entry ``3c + t`` is the weight of term ``t`` of output component ``c``: component 0 reads input
    components 0, 1, 2, component 1 reads 1, 2, 0, component 2 reads 2, 1, 0 (its own first, then the
    nearer, then the farther, the order in which the eager path adds them). The nine numbers of a
    triple are the nonzero entries of its 3×3 rotation matrix, side by side in memory, so a kernel
    over triples reads 12 bytes of float32 weights per channel instead of the five planes' 20.
    """
    w0, wp1, wm1, wp2, wm2 = coeffs.unflatten(-1, (-1, 3)).unbind(0)
    return torch.stack((w0[..., 0], wp1[..., 0], wp2[..., 0],
                        w0[..., 1], wp1[..., 1], wm1[..., 1],
                        w0[..., 2], wm1[..., 2], wm2[..., 2]), dim=-1)


def geope_rotation(
    coords: torch.Tensor,
    head_dim: int,
    *,
    lam: float = 100.0,
    freq_style: str = "decreasing",
    freqs: torch.Tensor | None = None,
    channels: str = "interleaved",
) -> GeoPERotation:
    """GeoPE rotations for positions ``coords (..., L, A)``, A ∈ {1, 2, 3} (GeoPE eqs. 4, 6; app. F).

    Returns a :class:`GeoPERotation` with ``n = ⌊head_dim/3⌋`` triples, computed in float32 (float64 for
    float64 coords). ``freqs`` overrides :func:`geope_frequencies` (shape ``(n',)`` with ``3n' <= head_dim``).
    ``channels`` picks which apply-time weights are precomputed: the per-channel ``coeffs``, packed
    ``triples`` and component-major ``planes`` for ``"interleaved"`` (``planes`` for its compiled CPU kernel,
    which reads them in place), the ``planes`` for ``"thirds"``, and is recorded in
    the rotation, so that :func:`ropekit.apply_geope` applies that layout by default (the rotation itself
    is the same; applying it with the other layout computes the missing weights on the fly).
    Note: GeoPE is not exactly relative (see the module docstring).
    """
    _check_head_dim(head_dim)
    check_channels(channels)
    if freqs is None:
        freqs = geope_frequencies(head_dim, lam, freq_style)
    else:
        if not isinstance(freqs, torch.Tensor) or freqs.ndim != 1 or freqs.numel() == 0:
            raise ValueError("`freqs` must be a non-empty 1-D tensor of per-triple frequencies")
        if not freqs.is_floating_point() or not bool(torch.isfinite(freqs).all()):
            raise ValueError("`freqs` must be finite floating-point per-triple frequencies")
        if 3 * freqs.numel() > head_dim:
            raise ValueError(
                f"`freqs` has {freqs.numel()} triples ({3 * freqs.numel()} channels) but head_dim is {head_dim}"
            )
    vec = rotation_vectors(coords, freqs)
    theta_sq = (vec * vec).sum(-1)
    if not torch.compiler.is_compiling() and not bool(torch.isfinite(theta_sq).all()):
        raise ValueError(
            f"`coords` are too large: the GeoPE rotation angles overflow {theta_sq.dtype} "
            f"(largest |coordinate| {float(coords.abs().max()):.3g}); positions must keep ω·p finite"
        )
    cos, sinc, versc = rodrigues_coefficients(theta_sq)
    with torch.no_grad():
        coeffs = channel_coefficients(vec.detach(), cos.detach(), sinc.detach(), versc.detach())
        triples = triple_weights(coeffs)
    if channels == "thirds":
        return GeoPERotation(vec, cos, sinc, versc, planes=triples.movedim(-1, 0).contiguous(), channels="thirds")
    return GeoPERotation(vec, cos, sinc, versc, coeffs, triples, triples.movedim(-1, 0).contiguous())
