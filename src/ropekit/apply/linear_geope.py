"""Linear GeoPE attention (GeoPE §3.4), computed in query blocks without materialising rotations.

The score between a query at m and a key at n is ``⟨q_m, R(φ(n) − φ(m)) k_n⟩`` where ``φ`` is GeoPE's
per-triple rotation vector (twice the Lie-algebra vector ``u = (0, θ_h/4, θ_w/4)``, or
``(θ_d, θ_h, θ_w)/6`` in 3-D) and ``R(φ)`` the rotation by ``‖φ‖`` about ``φ/‖φ‖``. Because ``φ`` is linear in
the position, the relative rotation depends only on ``n − m``: Linear GeoPE is exactly relative, but it
does not factor into per-token rotations, so it cannot be applied to q and k separately.

For triple i, ``φ_i(n − m) = ω_i P`` with one displacement vector ``P = E(p_n − p_m) ∈ R³`` shared by all
triples (``E`` from :func:`ropekit.rotations.geope.lie_embedding`). With the unit axis ``a = P/‖P‖`` and
angle ``A_i = ω_i ‖P‖``, Rodrigues' formula (GeoPE app. D) gives

    ⟨q, R k⟩ = Σ_c q_c · (cos A · k_c + sin A · (a × k)_c + (1 − cos A) · a_c (a · k)).

For a block of Bq queries and a chunk of t triples this needs only ``(B, H, Bq, Lk, t)`` temporaries,
never the ``(Lq, Lk, n, 3, 3)`` matrices the paper materialises. Each query block is checkpointed when
gradients are on, so the backward pass also holds one block at a time.
"""
from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from ..rotations.geope import geope_frequencies, lie_embedding

__all__ = ["linear_geope_scores", "linear_geope_attention"]


def _as_batched(pos: torch.Tensor, name: str, length: int, batch: int) -> torch.Tensor:
    if not isinstance(pos, torch.Tensor):
        raise TypeError(f"`{name}` must be a tensor (L, A) or (B, L, A), got {type(pos).__name__}")
    if pos.ndim == 2:
        pos = pos[None]
    if pos.ndim != 3:
        raise ValueError(f"`{name}` must be (L, A) or (B, L, A), got shape {tuple(pos.shape)}")
    if pos.shape[1] != length:
        raise ValueError(f"`{name}` has {pos.shape[1]} positions but the sequence has {length} tokens")
    if pos.shape[0] not in (1, batch):
        raise ValueError(f"`{name}` has batch {pos.shape[0]} but q/k have batch {batch}")
    return pos


def linear_geope_scores(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_q: torch.Tensor,
    pos_k: torch.Tensor,
    freqs: torch.Tensor,
    *,
    triple_chunk: int = 8,
) -> torch.Tensor:
    """Unscaled Linear GeoPE scores ``⟨q_m, R(φ(n) − φ(m)) k_n⟩`` of every pair, ``(B, H, Lq, Lk)``.

    ``q (B, H, Lq, D)``, ``k (B, H, Lk, D)``, positions ``(Lq, A)``/``(Lk, A)`` or batched ``(B, L, A)``,
    ``freqs (n,)`` with ``3n <= D`` (channels past 3n contribute a plain dot product). Triples are taken
    ``triple_chunk`` at a time, so the largest temporary is ``(B, H, Lq, Lk, triple_chunk)``; call it on
    query blocks (as :func:`linear_geope_attention` does) for long sequences. Positions are treated as
    constants (no gradient). Computed in float32 (float64 if q is float64).
    """
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, H, Lq, D = q.shape
    Lk = k.shape[-2]
    n = freqs.numel()
    pq = _as_batched(pos_q, "pos_q", Lq, B).detach().to(work)
    pk = _as_batched(pos_k, "pos_k", Lk, B).detach().to(work)
    if pq.shape[-1] != pk.shape[-1]:
        raise ValueError(f"`pos_q` has {pq.shape[-1]} axes but `pos_k` has {pk.shape[-1]}")
    # one displacement per pair, shared by every triple: φ_i(n − m) = ω_i · P
    P = lie_embedding(pk[:, None, :, :] - pq[:, :, None, :])[:, None]  # (Pb, 1, Lq, Lk, 3)
    dist = P.norm(dim=-1, keepdim=True)  # (Pb, 1, Lq, Lk, 1)
    inv = torch.where(dist > 0, 1.0 / torch.where(dist > 0, dist, torch.ones_like(dist)), torch.zeros_like(dist))
    axis = [P[..., c : c + 1] * inv for c in range(3)]  # unit axis (0 where the positions coincide)
    if 3 * n < D:
        scores = q[..., 3 * n :].to(work) @ k[..., 3 * n :].to(work).transpose(-1, -2)
    else:
        scores = q.new_zeros((B, H, Lq, Lk), dtype=work)
    w_all = freqs.to(work)
    for j0 in range(0, n, triple_chunk):
        j1 = min(j0 + triple_chunk, n)
        angle = dist * w_all[j0:j1]  # (Pb, 1, Lq, Lk, t)
        cos, sin = torch.cos(angle), torch.sin(angle)
        vers = 2.0 * torch.sin(0.5 * angle).square()  # 1 − cos, without cancellation
        del angle
        qt = q[..., 3 * j0 : 3 * j1].to(work).unflatten(-1, (j1 - j0, 3))  # (B, H, Lq, t, 3)
        kt = k[..., 3 * j0 : 3 * j1].to(work).unflatten(-1, (j1 - j0, 3))[:, :, None]  # (B, H, 1, Lk, t, 3)
        kc = [kt[..., c] for c in range(3)]
        vak = vers * (axis[0] * kc[0] + axis[1] * kc[1] + axis[2] * kc[2])  # (1 − cos) (a · k)
        for c in range(3):
            a, b = (c + 1) % 3, (c + 2) % 3
            # (R k)_c = cos k_c + sin (a × k)_c + (1 − cos) a_c (a · k)   (Rodrigues, GeoPE eq. 36)
            rk = cos * kc[c] + sin * (axis[a] * kc[b] - axis[b] * kc[a]) + axis[c] * vak
            scores = scores + torch.einsum("bhmni,bhmi->bhmn", rk, qt[..., c])
    return scores


def _block(q, k, v, pos_q, pos_k, freqs, mask, scale, causal_from):
    s = linear_geope_scores(q, k, pos_q, pos_k, freqs) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(s.dtype)
    if causal_from is not None:
        qi = torch.arange(q.shape[-2], device=q.device)[:, None] + causal_from
        ki = torch.arange(k.shape[-2], device=q.device)[None, :]
        s = s.masked_fill(ki > qi, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"`{name}` must be a floating-point tensor, got {getattr(t, 'dtype', type(t))}")
        if t.ndim != 4:
            raise ValueError(f"`{name}` must be 4-D (B, H, L, D) (or (B, L, H, D) with seq_dim=1), got {tuple(t.shape)}")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"q, k, v must share batch and heads, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length, got {k.shape[-2]} and {v.shape[-2]}")
    if q.shape[-1] < 3:
        raise ValueError(f"GeoPE rotates channel triples: head_dim must be >= 3, got {q.shape[-1]}")


def linear_geope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pos_q: torch.Tensor,
    pos_k: torch.Tensor | None = None,
    *,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int = 128,
    lam: float = 100.0,
    freq_style: str = "decreasing",
    freqs: torch.Tensor | None = None,
    seq_dim: int = -2,
    use_checkpoint: bool = True,
) -> torch.Tensor:
    """``softmax(S · scale) v`` with Linear GeoPE scores S (GeoPE §3.4, eq. 7), in query blocks.

    ``q (B, H, Lq, D)``, ``k``/``v (B, H, Lk, ·)`` (or ``(B, L, H, D)`` with ``seq_dim=1``); positions
    ``(L, A)`` or ``(B, L, A)`` with A = 2 (h, w) or 3 (d, h, w) (A = 1 is the 1-D case); ``pos_k`` defaults
    to ``pos_q``. ``attn_mask`` follows ``scaled_dot_product_attention``: boolean (True = attend) or
    additive float, broadcastable to ``(B, H, Lq, Lk)``; ``is_causal`` lets query i see keys 0 … i (may be
    combined with a mask). ``scale`` defaults to ``1/√D``. Rows with every key masked give NaN, as in the
    reference attention. Peak extra memory is ``O(B·H·block_size·Lk·D/3)``, also in backward
    (``use_checkpoint``). Maths in float32; the output has q's dtype.
    """
    if seq_dim not in (-2, 1):
        raise ValueError(f"`seq_dim` must be -2 (B,H,L,D) or 1 (B,L,H,D), got {seq_dim}")
    if seq_dim == 1:
        q, k, v = (t.transpose(1, 2) if isinstance(t, torch.Tensor) else t for t in (q, k, v))
    _check_qkv(q, k, v)
    B, H, Lq, D = q.shape
    Lk = k.shape[-2]
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"`block_size` must be a positive int, got {block_size!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif not (isinstance(scale, (int, float)) and scale > 0):
        raise ValueError(f"`scale` must be a positive number or None (1/√head_dim), got {scale!r}")
    if freqs is None:
        freqs = geope_frequencies(D, lam, freq_style)
    elif 3 * freqs.numel() > D:
        raise ValueError(f"`freqs` covers {3 * freqs.numel()} channels but head_dim is {D}")
    pos_k = pos_q if pos_k is None else pos_k
    pq = _as_batched(pos_q, "pos_q", Lq, B)
    pk = _as_batched(pos_k, "pos_k", Lk, B)
    for name, p in (("pos_q", pq), ("pos_k", pk)):
        if p.shape[-1] not in (1, 2, 3):
            raise ValueError(f"`{name}` must have 1, 2 (h, w) or 3 (d, h, w) axes, got {p.shape[-1]}")
        if not torch.isfinite(p.float()).all():
            raise ValueError(f"`{name}` contains NaN or inf; positions must be finite")
    mask = None
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError("`attn_mask` must be a tensor (bool: True = attend, or additive float)")
        try:
            full = torch.broadcast_shapes(attn_mask.shape, (B, H, Lq, Lk))
        except RuntimeError:
            full = None
        if full != (B, H, Lq, Lk):
            raise ValueError(f"`attn_mask` {tuple(attn_mask.shape)} must broadcast to (B, H, Lq, Lk) = {(B, H, Lq, Lk)}")
        mask = attn_mask.reshape((1,) * (4 - attn_mask.ndim) + tuple(attn_mask.shape))
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    vw = v.to(work)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs = []
    for s in range(0, Lq, block_size):
        e = min(s + block_size, Lq)
        m = None if mask is None else (mask if mask.shape[-2] == 1 else mask[..., s:e, :])
        args = (q[:, :, s:e], k, vw, pq[:, s:e], pk, freqs, m, scale, s if is_causal else None)
        if grad and use_checkpoint:
            outs.append(checkpoint(_block, *args, use_reentrant=False))
        else:
            outs.append(_block(*args))
    out = torch.cat(outs, dim=2).to(q.dtype)
    return out.transpose(1, 2) if seq_dim == 1 else out
