"""Linear GeoPE attention (GeoPE §3.4), computed in query blocks without materialising rotations.

The score between a query at m and a key at n is ``⟨q_m, R(φ(n) − φ(m)) k_n⟩`` where ``φ`` is GeoPE's
per-triple rotation vector (twice the Lie-algebra vector ``u = (0, θ_h/4, θ_w/4)``, or
``(θ_d, θ_h, θ_w)/6`` in 3-D) and ``R(φ)`` the rotation by ``‖φ‖`` about ``φ/‖φ‖``. Because ``φ`` is linear in
the position, the relative rotation depends only on ``n − m``: Linear GeoPE is exactly relative, but it
does not factor into per-token rotations, so it cannot be applied to q and k separately.

For triple i, ``φ_i(n − m) = ω_i P`` with one displacement vector ``P = E(p_n − p_m) ∈ R³`` shared by all
triples (``E`` from :func:`ropekit.rotations.geope.lie_embedding`). With the unit axis ``a = P/‖P‖`` and
angle ``A_i = ω_i ‖P‖``, Rodrigues' formula (GeoPE app. D) gives

    ⟨q, R k⟩ = q·k + sin A · a·(k × q) + (1 − cos A) · ((a·q)(a·k) − q·k).

The axis is shared by the triples, so the triple sums ``Σ_i f(A_i) q_id k_ic`` (f = sin A, 1 − cos A;
nine channel pairs c, d) are one batched matmul over the triples; the axis is applied afterwards, per
pair. Only the two trigonometric values and one broadcast product per (pair, triple) remain elementwise.
Keys are taken in chunks of a few thousand pairs, so the temporaries stay near cache size, and never
reach the ``(Lq, Lk, n, 3, 3)`` matrices the paper materialises. Each query block is checkpointed when
gradients are on, so the backward pass also holds one block at a time.

Large calls take a faster route by default: the same Rodrigues expression compiled into one loop per
(query, key) pair (:mod:`ropekit.apply._linear_geope_fused`), which keeps nothing of size pair × triple
and recomputes in backward. The eager path above remains for small calls and where compiling fails.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch.utils.checkpoint import checkpoint

from ..rotations.geope import check_channels, geope_frequencies, lie_embedding
from ._linear_geope_fused import fused_rotated_scores
from ._inputs import canonical_seq_dim

__all__ = ["linear_geope_scores", "linear_geope_attention"]


def _as_batched(pos: torch.Tensor, name: str, length: int, batch: int) -> torch.Tensor:
    if not isinstance(pos, torch.Tensor):
        raise TypeError(f"`{name}` must be a tensor (L, A) or (B, L, A), got {type(pos).__name__}")
    if pos.ndim == 2:
        pos = pos[None]
    if pos.ndim != 3:
        raise ValueError(f"`{name}` must be (L, A) or (B, L, A), got shape {tuple(pos.shape)}")
    if pos.shape[1] != length:
        raise ValueError(f"`{name}` has {pos.shape[1]} positions but the sequence has {length} tokens "
                         f"(the sequence dim is chosen by `seq_dim`)")
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
    triple_chunk: int = 32,
    fused: bool | None = None,
    channels: str = "interleaved",
) -> torch.Tensor:
    """Unscaled Linear GeoPE scores ``⟨q_m, R(φ(n) − φ(m)) k_n⟩`` of every pair, ``(B, H, Lq, Lk)``.

    ``q (B, H, Lq, D)``, ``k (B, H, Lk, D)``, positions ``(Lq, A)``/``(Lk, A)`` or batched ``(B, L, A)``,
    ``freqs (n,)`` with ``3n <= D`` (channels past 3n contribute a plain dot product). Rodrigues' formula
    splits each triple's score into ``q_i·k_i − vers A_i (q_i·k_i − (a·q_i)(a·k_i)) + sin A_i a·(k_i × q_i)``;
    the two triple sums ``T^f_cd = Σ_i f(A_i) k_ic q_id`` (f = sin, vers) are one batched matmul over the
    triples, and the axis ``a`` enters only afterwards, per pair. Keys are taken a few thousand pairs at a
    time and triples ``triple_chunk`` at a time, so apart from the ``(B, H, Lq, Lk)`` result the temporaries
    stay small; call it on query blocks (as :func:`linear_geope_attention` does) for long sequences. Positions are treated as constants (no
    gradient). Computed in float32 (float64 if q is float64).

    ``fused``: True runs the compiled kernel of :mod:`ropekit.apply._linear_geope_fused` (each pair in one
    pass over the triples, nothing of size pair × triple stored; the first call per process compiles it,
    which takes seconds), False the eager chunked path above, None (default) the compiled kernel for
    calls of at least ``2**21`` (pair, triple) products when ``torch.compile`` works here, else eager.
    ``channels``: which channels form triple i, ``"interleaved"`` (3i, 3i+1, 3i+2) or ``"thirds"``
    (i, n+i, 2n+i), as in :func:`ropekit.apply_geope`.
    """
    check_channels(channels)
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"`fused` must be True, False or None (automatic), got {fused!r}")
    if isinstance(triple_chunk, bool) or not isinstance(triple_chunk, int) or triple_chunk < 1:
        raise ValueError(f"`triple_chunk` must be a positive int, got {triple_chunk!r}")
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, H, Lq, D = q.shape
    Lk = k.shape[-2]
    n = freqs.numel()
    pq = _as_batched(pos_q, "pos_q", Lq, B).detach().to(work)
    pk = _as_batched(pos_k, "pos_k", Lk, B).detach().to(work)
    if pq.shape[-1] != pk.shape[-1]:
        raise ValueError(f"`pos_q` has {pq.shape[-1]} axes but `pos_k` has {pk.shape[-1]}")
    qw, kw = q.to(work), k.to(work)
    # every channel's plain dot product: the cos A = 1 part of each triple plus the unrotated tail
    scores = qw @ kw.transpose(-1, -2)
    if n == 0:
        return scores
    if _use_fused(fused, q.device, B * H * Lq * Lk * n):
        try:
            return scores + _fused_part(qw, kw, pq, pk, freqs.to(work), channels)
        except Exception as err:  # noqa: BLE001 - no compiler here: fall back to the eager path, once
            if fused:
                raise
            _FUSED_FAILED.add(q.device.type)
            warnings.warn(f"Linear GeoPE: the compiled kernel failed ({type(err).__name__}: {err}); "
                          "using the slower eager path from now on", RuntimeWarning, stacklevel=2)
    # E is linear, so E(p_n) − E(p_m) is each pair's displacement vector (exactly 0 where p_n = p_m)
    eq = lie_embedding(pq)[:, None, :, :, None]  # (Pb, 1, Lq, 3, 1)
    ek = lie_embedding(pk).transpose(-1, -2)[:, None, None]  # (Pb, 1, 1, 3, Lk)
    # per triple (f = sin A, ½ vers A) take ω and ω/2: sin(ω r) and sin(ω r / 2)² = ½ (1 − cos ω r)
    w2 = torch.stack((freqs.to(work), 0.5 * freqs.to(work)), dim=-1)[..., None]  # (n, 2, 1)
    qT = _channel_major(qw, n, channels).contiguous()  # (B, H, Lq, 3, n)
    kT = _channel_major(kw, n, channels).permute(0, 1, 4, 3, 2)  # (B, H, n, 3, Lk)
    # without autograd the large per-chunk temporaries are written into reused buffers (no fresh pages)
    scratch = None if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad) else {}
    # keys in chunks so the (pair, triple) temporaries stay near cache size; under autograd larger ones,
    # since many small pair-sized tensors kept for backward fragment the heap (measured: 3× the memory)
    kc = max(_MIN_KEYS, (_PAIRS if scratch is not None else _GRAD_PAIRS) // max(1, B * H * Lq))
    parts = []
    for s in range(0, Lk, kc):
        e = min(s + kc, Lk)
        parts.append(_rotated_part(qT, kT[..., s:e].contiguous(), ek[..., s:e] - eq, w2, triple_chunk, scratch))
    return scores + torch.cat(parts, dim=-1)


_FUSED_MIN_WORK = 2**21  # (pair, triple) products from which the compiled kernel is the default
_FUSED_FAILED: set = set()  # device types where compiling it failed (then eager is the default)


def _use_fused(fused: bool | None, device: torch.device, work: int) -> bool:
    if fused is not None:
        return fused
    return work >= _FUSED_MIN_WORK and device.type not in _FUSED_FAILED and not torch.compiler.is_compiling()


def _channel_major(x: torch.Tensor, n: int, channels: str) -> torch.Tensor:
    """The triples of ``x (..., L, D)`` channel-major, ``(..., L, 3, n)`` (a view): component c of triple i at
    ``[c, i]``. With ``channels="thirds"`` that is the channels as they lie."""
    if channels == "thirds":
        return x[..., : 3 * n].unflatten(-1, (3, n))
    return x[..., : 3 * n].unflatten(-1, (n, 3)).transpose(-1, -2)


def _fused_part(qw, kw, pq, pk, w, channels="interleaved"):
    """The rotated part of every pair's score by the compiled kernel (triples channel-major)."""
    n = w.numel()
    qT = _channel_major(qw, n, channels)  # (B, H, Lq, 3, n)
    kT = _channel_major(kw, n, channels)
    planar = pq.shape[-1] < 3  # 1-D/2-D embeddings (0, ·, ·): the kernel drops the zero component
    return fused_rotated_scores(qT, kT, lie_embedding(pq)[:, None], lie_embedding(pk)[:, None], w, planar=planar)


_PAIRS = 8192  # (batch · head · query, key) pairs per chunk in :func:`linear_geope_scores`
_GRAD_PAIRS = 32768  # the same under autograd
_MIN_KEYS = 16


def _buffer(scratch: dict | None, key: str, shape: torch.Size, like: torch.Tensor) -> torch.Tensor | None:
    """A reusable output buffer of ``shape`` (None when buffers are off, i.e. under autograd)."""
    if scratch is None:
        return None
    key = (key, tuple(shape))  # a shorter last chunk gets its own buffer instead of evicting the main one
    if key not in scratch:
        scratch[key] = like.new_empty(shape)
    return scratch[key]


def _weights(dist: torch.Tensor, w2: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``(sin A_i, ½ vers A_i)`` per pair and triple, ``(Pb, 1, Lq, t, 2, Lk)``, from ``dist (Pb, 1, Lq, 1, Lk)``."""
    f = torch.mul(dist[..., None, :, :], w2, out=out)
    f.sin_()  # sin A, sin(A/2); positions carry no gradient
    f[..., 1, :].square_()  # ½ vers A = sin²(A/2), free of the cancellation in 1 − cos A near 0
    return f


def _weighted_keys(kT: torch.Tensor, f: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``f(A_i) k_ic`` per pair, ``(B, H, Lq, t, 6·Lk)``; k first, as the broadcast loop is faster that way."""
    return torch.mul(kT[:, :, None, :, None], f[..., :, None, :], out=out).flatten(-3)


def _triple_sums(qT, kT, dist, w2, scratch, key):
    """``T[d, (f, c, n)] = Σ_i q_id f(A_i) k_ic`` of a key chunk, ``(B, H, Lq, 3, 6·Lk)``, in reused buffers."""
    f_shape = dist.shape[:-2] + w2.shape[:2] + dist.shape[-1:]
    f = _weights(dist, w2, out=_buffer(scratch, "f", f_shape, dist))
    fk_shape = torch.broadcast_shapes(kT[:, :, None, :, None].shape, f[..., :, None, :].shape)
    fk = _weighted_keys(kT, f, out=_buffer(scratch, "fk", fk_shape, f))
    return torch.matmul(qT, fk, out=_buffer(scratch, key, fk.shape[:-2] + (3, fk.shape[-1]), fk))


class _TripleSums(torch.autograd.Function):
    """:func:`_triple_sums` under autograd; backward recomputes the weights from the distances, so only
    pair-sized tensors are kept between forward and backward."""

    @staticmethod
    def forward(ctx, qT, kT, dist, w2):
        ctx.save_for_backward(qT, kT, dist, w2)
        return qT @ _weighted_keys(kT, _weights(dist, w2))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        qT, kT, dist, w2 = ctx.saved_tensors
        f = _weights(dist, w2)
        gq = gk = None
        if ctx.needs_input_grad[0]:
            gq = (g @ _weighted_keys(kT, f).transpose(-1, -2)).sum_to_size(qT.shape)
        if ctx.needs_input_grad[1]:
            gfk = (qT.transpose(-1, -2) @ g).unflatten(-1, (2, 3, -1))  # (B, H, Lq, t, 2, 3, Lk)
            gk = (gfk * f[..., :, None, :]).sum(dim=(2, 4)).sum_to_size(kT.shape)
        return gq, gk, None, None


def _rotated_part(qT, kT, P, w2, triple_chunk, scratch=None):
    """``Σ_i ⟨q_i, (R_i − I) k_i⟩`` of a key chunk, ``(B, H, Lq, Lk)``, by Rodrigues (GeoPE eq. 36).

    ``qT (B, H, Lq, 3, n)``, ``kT (B, H, n, 3, Lk)``, displacements ``P (Pb, 1, Lq, 3, Lk)``. With the unit
    axis a and A_i = ω_i‖P‖: ``⟨q, (R − I) k⟩ = sin A · a·(k × q) + vers A · ((a·q)(a·k) − q·k)``. The
    triple sums ``T^f_dc = Σ_i f(A_i) q_id k_ic`` are one matmul over the triples; a enters per pair.
    """
    n = w2.shape[0]
    dist = P.norm(dim=-2, keepdim=True)  # (Pb, 1, Lq, 1, Lk)
    inv = torch.where(dist > 0, 1.0 / torch.where(dist > 0, dist, torch.ones_like(dist)), torch.zeros_like(dist))
    axis = P * inv  # unit axis, 0 where the positions coincide (then only q·k remains)
    T = None
    for j0 in range(0, n, triple_chunk):
        j1 = min(j0 + triple_chunk, n)
        if scratch is None:  # autograd: a Function that keeps no (pair, triple) tensor for backward
            part = _TripleSums.apply(qT[..., j0:j1], kT[:, :, j0:j1], dist, w2[j0:j1])
        else:
            part = _triple_sums(qT[..., j0:j1], kT[:, :, j0:j1], dist, w2[j0:j1], scratch, f"T{j0}")
        part = part.unflatten(-1, (2, 3, -1))  # (B, H, Lq, 3, 2, 3, Lk)
        T = part if T is None else T + part
    # per pair, a = axis. sin: a·(k × q) = Σ_e a_e (k_{e+1} q_{e+2} − k_{e+2} q_{e+1}), whose q_d terms are
    # a_{d+1} k_{d+2} − a_{d+2} k_{d+1}. vers: aᵀ T^vers a − trace T^vers, times 2 since f holds ½ vers A.
    a = [axis[..., e, :] for e in range(3)]  # (Pb, 1, Lq, Lk)
    sin_part, vers_part = 0.0, 0.0
    for d in range(3):
        d1, d2 = (d + 1) % 3, (d + 2) % 3
        sin_part = sin_part + T[..., d, 0, d2, :] * a[d1] - T[..., d, 0, d1, :] * a[d2]
        av = T[..., d, 1, 0, :] * a[0] + T[..., d, 1, 1, :] * a[1] + T[..., d, 1, 2, :] * a[2]
        vers_part = vers_part + av * a[d] - T[..., d, 1, d, :]
    return sin_part + 2.0 * vers_part


def _block(q, k, v, pos_q, pos_k, freqs, mask, scale, causal_from, fused, channels):
    s = linear_geope_scores(q, k, pos_q, pos_k, freqs, fused=fused, channels=channels) * scale
    if not torch.compiler.is_compiling() and not bool(torch.isfinite(s.sum())):
        raise ValueError(
            "the attention scores q·R·k · scale are not finite: q or k hold NaN/inf, or `scale` "
            f"({scale:.3g}) is too large for these values"
        )
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
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"q, k and v must have one dtype (as in scaled_dot_product_attention), got "
                        f"`q` {q.dtype}, `k` {k.dtype}, `v` {v.dtype}")
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
    fused: bool | None = None,
    channels: str = "interleaved",
) -> torch.Tensor:
    """``softmax(S · scale) v`` with Linear GeoPE scores S (GeoPE §3.4, eq. 7), in query blocks.

    ``q (B, H, Lq, D)``, ``k``/``v (B, H, Lk, ·)`` (``seq_dim=-2`` or ``2``; or ``(B, L, H, D)`` with
    ``seq_dim=1`` or ``-3``); positions
    ``(L, A)`` or ``(B, L, A)`` with A = 2 (h, w) or 3 (d, h, w) (A = 1 is the 1-D case); ``pos_k`` defaults
    to ``pos_q``. ``attn_mask`` follows ``scaled_dot_product_attention``: boolean (True = attend) or
    additive float, broadcastable to ``(B, H, Lq, Lk)``; ``is_causal`` lets query i see keys 0 … i (may be
    combined with a mask). ``scale`` (finite, > 0) defaults to ``1/√D``. Empty sequences give an empty
    (Lq = 0) or zero (Lk = 0) output, as ``scaled_dot_product_attention`` does. Rows with every key masked give NaN, as in the
    reference attention. Peak extra memory is ``O(B·H·block_size·Lk·D/3)``, also in backward
    (``use_checkpoint``). Maths in float32; the output has q's dtype. ``fused`` picks the score kernel
    (compiled / eager / automatic, see :func:`linear_geope_scores`); ``channels`` the triple layout
    (``"interleaved"`` or ``"thirds"``, as in :func:`ropekit.apply_geope`).
    """
    check_channels(channels)
    seq_dim = canonical_seq_dim(seq_dim, q.ndim if isinstance(q, torch.Tensor) else 4)
    if seq_dim == 1:
        q, k, v = (t.transpose(1, 2) if isinstance(t, torch.Tensor) else t for t in (q, k, v))
    _check_qkv(q, k, v)
    B, H, Lq, D = q.shape
    Lk = k.shape[-2]
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"`block_size` must be a positive int, got {block_size!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"`scale` must be a positive number or None (1/√head_dim), got {scale!r}")
    elif not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"`scale` must be a finite number > 0 or None (1/√head_dim), got {scale!r}")
    scale = float(scale)
    if not isinstance(is_causal, bool):
        raise TypeError(f"`is_causal` must be True or False, got {is_causal!r}")
    if freqs is None:
        freqs = geope_frequencies(D, lam, freq_style)
    elif not isinstance(freqs, torch.Tensor) or freqs.ndim != 1 or not freqs.is_floating_point():
        raise TypeError(f"`freqs` must be a 1-D floating tensor of per-triple frequencies or None, got {freqs!r}")
    elif not bool(torch.isfinite(freqs).all()):
        raise ValueError("`freqs` must be finite")
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
    if Lq == 0 or Lk == 0:  # as scaled_dot_product_attention: no queries, or attention over no keys = 0
        out = torch.zeros(B, H, Lq, v.shape[-1], dtype=q.dtype, device=q.device)
        return out.transpose(1, 2) if seq_dim == 1 else out
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    vw = v.to(work)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    outs = []
    for s in range(0, Lq, block_size):
        e = min(s + block_size, Lq)
        m = None if mask is None else (mask if mask.shape[-2] == 1 else mask[..., s:e, :])
        args = (q[:, :, s:e], k, vw, pq[:, s:e], pk, freqs, m, scale, s if is_causal else None, fused, channels)
        if grad and use_checkpoint:
            outs.append(checkpoint(_block, *args, use_reentrant=False))
        else:
            outs.append(_block(*args))
    out = torch.cat(outs, dim=2).to(q.dtype)
    return out.transpose(1, 2) if seq_dim == 1 else out
