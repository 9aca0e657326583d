"""Stage 4 — apply GeoPE rotations to q and k (GeoPE eq. 2, as Rodrigues' formula on triples).

``x`` is ``(B, H, L, D)`` (``seq_dim=-2`` or ``2``) or ``(B, L, H, D)`` (``seq_dim=1`` or ``-3``). Triple i is channels
``3i, 3i+1, 3i+2`` (``channels="interleaved"``, the paper's layout and the default) or ``i, n+i, 2n+i``
(``channels="thirds"``); channels beyond ``3n`` pass through unchanged. Each triple ``v`` becomes
``v cos Θ + sinc · (φ × v) + versc · φ (φ · v)`` — the sandwich product ``r v r*`` without building
quaternions or 3×3 matrices. Maths in float32 (float64 for float64 input); output has the input's dtype.

Paths that give the same rotation (equal to float32 rounding; the compiled CPU kernel bit for bit):

- functional (autograd, broadcasting that grows ``x``): :func:`rotate_triples` on the triples, a handful
  of full-size temporaries; under ``torch.compile`` on accelerators (and on CPU without float32 weight
  planes, or for float64) each triple's three components combined with its nine packed weights
  (:func:`ropekit.rotations.geope.triple_weights`) with fixed slices instead, which Inductor fuses into one
  loop over triples;
- eager on CPU (everything else): the rotation's per-channel coefficients
  (:func:`ropekit.rotations.geope.channel_coefficients`) applied with five multiply-adds over shifted
  contiguous views, block by block along the sequence so float32 temporaries stay in cache, writing
  straight into the output — about the cost of the fused planar RoPE path. The shifted views reach
  across triple (and, merged, token) boundaries with zero weights, and ``0 · inf`` is NaN, so a block
  whose result is not finite is recomputed triple by triple: a NaN/inf input channel only ever affects
  its own triple of its own token, on every path. This is the reference the compiled kernel matches.
- compiled CPU kernel (``channels="interleaved"``, float32/bfloat16/float16): Inductor leaves the stride-3
  loop over interleaved triples scalar, so under ``torch.compile`` on CPU the call goes to the operator
  ``ropekit::geope_interleaved`` instead, which runs a small C++ kernel (:mod:`ropekit.apply._cpu_kernel`)
  reading the rotation's weight ``planes``: the eager path's sums in its order and rounding (fused or not,
  as ATen's ``addcmul`` there), so the same bits, at about compiled planar RoPE's cost. Its backward is the
  same operator with the transposed rotation. Eager calls of at least ``2**21`` elements without gradients
  take it too (same bits). Without a C++ compiler (or with ``ROPEKIT_COMPILE=0``) the operator sums with
  ``addcmul`` in torch instead, still the eager path's bits.

With ``channels="thirds"`` each component of every triple is a contiguous run of ``n`` channels, so both
the compiled and the eager path are three output slices of three multiply-adds each over contiguous
slices, with the rotation's component-major weight ``planes``; nothing crosses a triple, so no block
needs confining. This layout is the same rotation on permuted channels (``q·k`` is unchanged when q and k
share it); it vectorises under ``torch.compile`` on any backend, where the interleaved layout relies on the
CPU kernel above.
"""
from __future__ import annotations

import torch

from ..designs.registry import positions
from ..layout import Layout
from ..rotations.geope import (CHANNEL_OFFSETS, GeoPERotation, channel_coefficients, check_channels,
                               geope_frequencies, geope_rotation, triple_weights)
from . import _cpu_kernel
from ._inputs import canonical_seq_dim, check_qk, match_coords_batch, resolve_coords
from ._parallel import run_blocks

__all__ = ["apply_geope", "apply_geope_qk", "rotate_triples", "GeoPE"]


def rotate_triples(
    v: torch.Tensor, vector: torch.Tensor, cos: torch.Tensor, sinc: torch.Tensor, versc: torch.Tensor
) -> torch.Tensor:
    """Rodrigues' rotation of ``v (..., 3)`` by rotation vectors ``vector (..., 3)`` (broadcasting).

    ``cos``, ``sinc``, ``versc`` are the coefficients of :func:`ropekit.rotations.geope.rodrigues_coefficients`
    with the shape of ``vector`` minus its last axis.
    """
    a0, a1, a2 = vector.unbind(-1)
    v0, v1, v2 = v.unbind(-1)
    cross = torch.stack((a1 * v2 - a2 * v1, a2 * v0 - a0 * v2, a0 * v1 - a1 * v0), dim=-1)
    dot = (vector * v).sum(-1, keepdim=True)
    return v * cos[..., None] + cross * sinc[..., None] + vector * (dot * versc[..., None])


def _broadcast(t: torch.Tensor, extra: int, seq_dim: int, x_ndim: int) -> torch.Tensor:
    """Shape a rotation tensor ``(L, n, …)`` or ``(B, L, n, …)`` to broadcast against ``x``'s triples."""
    # t has `extra` trailing axes after (L, n): 1 for vectors, 0 for coefficients
    lead = t.ndim - 2 - extra  # 0 -> (L, …), 1 -> (B, L, …)
    if lead not in (0, 1):
        raise ValueError(
            "the rotation must be per token (L, n, 3) or per batch and token (B, L, n, 3), "
            f"got vector shape with {lead} leading axes"
        )
    if seq_dim == -2:
        if lead == 1 and x_ndim == 4:
            t = t[:, None]  # (B, 1, L, n, …)
        return t
    # (B, L, H, D): insert the head axis after L
    return t.unsqueeze(lead + 1)


def _validate(x: torch.Tensor, rotation: GeoPERotation, seq_dim: int) -> int:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"apply_geope: `x` must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if not isinstance(rotation, GeoPERotation):
        raise TypeError(
            "apply_geope: `rotation` must be a GeoPERotation; build it with "
            "ropekit.rotations.geope.geope_rotation(coords, head_dim)"
        )
    seq_dim = canonical_seq_dim(seq_dim, x.ndim)
    n = rotation.num_triples
    D = x.shape[-1]
    if D < 3:
        raise ValueError(f"GeoPE rotates channel triples: head_dim must be >= 3, got {D}")
    if 3 * n > D:
        raise ValueError(
            f"the rotation covers {n} triples ({3 * n} channels) but head_dim is {D}; "
            f"build it with geope_rotation(coords, head_dim={D})"
        )
    L = x.shape[seq_dim]
    if rotation.seq_len != L:
        raise ValueError(
            f"the rotation has {rotation.seq_len} positions but `x` has sequence length {L} at dim {seq_dim} "
            f"(`seq_dim`: -2/2 for (B, H, L, D), 1/-3 for (B, L, H, D))"
        )
    if rotation.vector.ndim == 4:  # per sample (B, L, n, 3): one row per sample of x, or one shared
        rb = rotation.vector.shape[0]
        if rb != 1 and (x.ndim != 4 or rb != x.shape[0]):
            raise ValueError(
                f"apply_geope: the rotation holds {rb} samples but `x` {tuple(x.shape)} "
                + (f"has batch {x.shape[0]}" if x.ndim == 4 else "is one sample")
                + "; build it from coordinates (B, L, A) with x's batch, or shared (L, A)"
            )
    return n, seq_dim


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _triples_view(x: torch.Tensor, n: int, channels: str) -> torch.Tensor:
    """The rotated channels ``x[..., :3n]`` as triples ``(..., n, 3)`` (a view) in either channel layout."""
    if channels == "thirds":
        return x[..., : 3 * n].unflatten(-1, (3, n)).transpose(-1, -2)
    return x[..., : 3 * n].unflatten(-1, (n, 3))


def _channels_from_triples(t: torch.Tensor, channels: str) -> torch.Tensor:
    """Inverse of :func:`_triples_view`: triples ``(..., n, 3)`` back to ``(..., 3n)`` channels."""
    return (t.transpose(-1, -2) if channels == "thirds" else t).flatten(-2)


def _rotate_functional(x: torch.Tensor, rotation: GeoPERotation, n: int, seq_dim: int,
                       channels: str = "interleaved") -> torch.Tensor:
    """Out-of-place Rodrigues rotation, differentiable and traceable (no in-place writes)."""
    dtype = x.dtype
    work = _work_dtype(x)
    vec = _broadcast(rotation.vector.to(work), 1, seq_dim, x.ndim)
    cos, sinc, versc = (_broadcast(t.to(work), 0, seq_dim, x.ndim) for t in (rotation.cos, rotation.sinc, rotation.versc))
    v = _triples_view(x.to(work), n, channels)
    out = _channels_from_triples(rotate_triples(v, vec, cos, sinc, versc), channels).to(dtype)
    if 3 * n == x.shape[-1]:
        return out
    return torch.cat((out, x[..., 3 * n :]), dim=-1)


def _coefficients(rotation: GeoPERotation, work: torch.dtype, device: torch.device) -> torch.Tensor:
    """The rotation's per-channel coefficients ``(5, ..., L, 3n)`` in the working dtype, on ``device``."""
    c = rotation.coeffs
    if c is None or c.dtype != work:  # e.g. float64 input with a float32 rotation: rebuild in float64
        with torch.no_grad():
            c = channel_coefficients(*(t.detach().to(work) for t in (rotation.vector, rotation.cos,
                                                                      rotation.sinc, rotation.versc)))
    return c.to(device=device, dtype=work).contiguous()


def _triple_weights(rotation: GeoPERotation, work: torch.dtype, device: torch.device) -> torch.Tensor:
    """The rotation's packed per-triple weights ``(..., L, n, 9)`` in the working dtype, on ``device``."""
    t = rotation.triples
    if t is None or t.dtype != work:
        if rotation.planes is not None and rotation.planes.dtype == work:
            return rotation.planes.to(device).movedim(0, -1).contiguous()
        t = triple_weights(_coefficients(rotation, work, device))
    return t.to(device=device, dtype=work).contiguous()


def _weight_planes(rotation: GeoPERotation, work: torch.dtype, device: torch.device) -> torch.Tensor:
    """The rotation's component-major weights ``(9, ..., L, n)`` in the working dtype, on ``device``."""
    p = rotation.planes
    if p is None or p.dtype != work:
        p = _triple_weights(rotation, work, device).movedim(-1, 0)
    return p.to(device=device, dtype=work).contiguous()


def _rotate_in_triples(xt: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Rotate ``xt (..., n, 3)`` inside each triple with the nine weights per triple of
    :func:`ropekit.rotations.geope.triple_weights` (``(..., n, 9)``, broadcasting against ``xt``).

    Each output component reads only its own triple's three components, so a NaN/inf never meets a
    weight from another triple. Written with fixed slices rather than cyclic shifts (``roll``): Inductor
    turns a roll into modular indexing that it cannot vectorise, while these are plain loads in one
    loop, and the nine weights of a triple lie side by side, so the loop reads 36 bytes of weights per
    float32 triple. Terms are summed in the blocked eager path's order (own component, then the nearer,
    then the farther).
    """
    return torch.stack(_rotated_components(xt.unbind(-1), weights.unbind(-1)), dim=-1)


def _rotated_components(v, w):
    """The three rotated components of triples ``v = (v0, v1, v2)`` with the nine weights ``w`` (in
    :func:`ropekit.rotations.geope.triple_weights`' order), as a tuple of three tensors."""
    v0, v1, v2 = v
    return (w[0] * v0 + w[1] * v1 + w[2] * v2,
            w[3] * v1 + w[4] * v2 + w[5] * v0,
            w[6] * v2 + w[7] * v1 + w[8] * v0)


def _rotate_thirds_functional(x: torch.Tensor, planes: torch.Tensor, n: int, seq_dim: int) -> torch.Tensor:
    """Out-of-place ``channels="thirds"`` form for tracing: each output third combines the three input
    thirds (contiguous slices) with three of the rotation's weight planes ``(9, ..., L, n)``, which a
    compiler fuses into vectorised loops. Differentiable in ``x`` (not in the rotation)."""
    work = _work_dtype(x)
    R = 3 * n
    xf = x.to(work)
    w = [_broadcast(p, 0, seq_dim, x.ndim) for p in planes.unbind(0)]
    # each third rounded to x's dtype before the join, so Inductor writes bfloat16 straight into the output
    out = torch.cat([o.to(x.dtype) for o in _rotated_components(xf[..., :R].split(n, dim=-1), w)], dim=-1)
    if R == x.shape[-1]:
        return out
    return torch.cat((out, x[..., R:]), dim=-1)


def _rotate_coeff_functional(x: torch.Tensor, weights: torch.Tensor, n: int, seq_dim: int) -> torch.Tensor:
    """Out-of-place per-triple form for tracing: each triple combines its own three components with the
    rotation's packed weights ``(..., L, n, 9)`` (:func:`_triple_weights`), which a compiler fuses into
    one loop. Differentiable in ``x`` (not in the rotation)."""
    work = _work_dtype(x)
    R = 3 * n
    xt = x[..., :R].to(work).unflatten(-1, (n, 3))
    out = _rotate_in_triples(xt, _broadcast(weights.to(work), 1, seq_dim, x.ndim)).flatten(-2).to(x.dtype)
    if R == x.shape[-1]:
        return out
    return torch.cat((out, x[..., R:]), dim=-1)


# Elements of x per eager block: float32 temporaries of this size (1 MiB) stay in a core's cache.
_BLOCK_ELEMS = 1 << 18


def _rotate_block(xf: torch.Tensor, coef: list[torch.Tensor], out: torch.Tensor) -> None:
    """``out[j] = Σ_o coef[o][j] · xf[j + o]`` along the last axis (offsets ``CHANNEL_OFFSETS``)."""
    R = xf.shape[-1]
    torch.mul(xf, coef[0], out=out)
    for o, c in zip(CHANNEL_OFFSETS[1:], coef[1:]):
        if o > 0:
            out[..., : R - o].addcmul_(xf[..., o:], c[..., : R - o])
        else:
            out[..., -o:].addcmul_(xf[..., : R + o], c[..., -o:])


def _confine(xf: torch.Tensor, coef: list[torch.Tensor], ob: torch.Tensor) -> None:
    """Redo a block whose result is not finite triple by triple, so a NaN/inf input channel reaches only
    its own triple (the shifted views multiply it by the zero weights of neighbouring triples: 0 · inf = NaN)."""
    shape = ob.shape
    xt = xf.reshape(*shape[:-1], -1, 3)
    ob.copy_(_rotate_in_triples(xt, triple_weights(torch.stack([c.expand(shape) for c in coef]))).reshape(shape))


def _run_blocked(x: torch.Tensor, weights: list[torch.Tensor], R: int, seq_dim: int, rotate, *,
                 merge: bool = False) -> torch.Tensor:
    """The eager paths' shared scaffold: an output whose channels past ``R`` pass through, and cache-sized
    blocks along the sequence run on the block pool (with several torch threads concurrently, each
    single-threaded: same results). ``rotate(xf, wb, tmp)`` fills the block's working-dtype buffer
    ``tmp`` from the block of ``x[..., :R]`` and of each broadcast-ready weight; bfloat16/float16 outputs
    go through one float32 buffer per block. ``merge`` flattens the sequence and channel axes first."""
    work = _work_dtype(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if R < x.shape[-1]:
        out[..., R:] = x[..., R:]
    ldim = x.ndim - 2 if seq_dim == -2 else 1
    L = x.shape[ldim]
    step = max(1, (_BLOCK_ELEMS * L) // max(1, x.numel()))

    def block(i: int, m: int) -> None:
        xf = x.narrow(ldim, i, m)[..., :R].to(work)
        ob = out.narrow(ldim, i, m)[..., :R]
        wb = [w.narrow(ldim - (x.ndim - w.ndim), i, m) for w in weights]
        if merge:
            xf, ob, wb = xf.flatten(-2), ob.flatten(-2), [w.flatten(-2) for w in wb]
        tmp = ob if ob.dtype == work else torch.empty(xf.shape, dtype=work, device=x.device)
        rotate(xf, wb, tmp)
        if tmp is not ob:
            ob.copy_(tmp)

    run_blocks([lambda i=i: block(i, min(step, L - i)) for i in range(0, L, step)])
    return out


def _rotate_eager(x: torch.Tensor, coef: list[torch.Tensor], n: int, seq_dim: int) -> torch.Tensor:
    """Blocked eager rotation of validated, gradient-free ``x`` with broadcast-ready coefficient views.

    Where a block's rows are contiguous and fully rotated (``D = 3n``, seq axis before channels), the
    sequence and channel axes are merged so every multiply-add runs over one long contiguous range; the
    zero coefficients at triple edges keep neighbouring rows and triples apart for finite input, and a
    block with a non-finite result is recomputed inside its triples (:func:`_confine`).
    """
    R, D = 3 * n, x.shape[-1]

    def rotate(xf, cb, tmp):
        _rotate_block(xf, cb, tmp)
        if not bool(torch.isfinite(tmp.sum())):  # a cheap detector (a finite sum may overflow: harmless)
            _confine(xf, cb, tmp)

    merge = seq_dim == -2 and R == D and x.stride(-1) == 1 and x.stride(-2) == D
    return _run_blocked(x, coef, R, seq_dim, rotate, merge=merge)


# (input component, weight index) of the three terms of each output component, as in _rotated_components
_THIRDS_TERMS = (((0, 0), (1, 1), (2, 2)), ((1, 3), (2, 4), (0, 5)), ((2, 6), (1, 7), (0, 8)))


def _rotate_thirds_eager(x: torch.Tensor, planes: list[torch.Tensor], n: int, seq_dim: int) -> torch.Tensor:
    """Blocked eager ``channels="thirds"`` rotation of validated, gradient-free ``x`` with the nine
    broadcast-ready weight planes: per block, three multiply-adds into each output third."""
    def rotate(xf, w, tmp):
        v = xf.split(n, dim=-1)
        for c, o in enumerate(tmp.split(n, dim=-1)):
            (a, wa), (b, wb), (d, wd) = _THIRDS_TERMS[c]
            torch.mul(v[a], w[wa], out=o)
            o.addcmul_(v[b], w[wb]).addcmul_(v[d], w[wd])

    return _run_blocked(x, planes, 3 * n, seq_dim, rotate)


# The compiled CPU kernel for channels="interleaved" (ropekit.apply._cpu_kernel): used under torch.compile on
# CPU, where Inductor leaves the stride-3 triple loop scalar, and eagerly for calls of at least this many elements
# of x (smaller ones skip the kernel's build, one to three seconds on first use, which Inductor caches on disk).
_KERNEL_MIN_ELEMS = 1 << 21
# weight planes of the transposed rotation R^T (the backward), in triple_weights' order R00 R01 R02 R11 R12 R10
# R22 R21 R20: R^T00 = R00, R^T01 = R10, R^T02 = R20, R^T11 = R11, R^T12 = R21, R^T10 = R01, R^T22 = R22, ...
_TRANSPOSED = (0, 5, 8, 3, 7, 1, 6, 4, 2)


def _env_allows_kernel() -> bool:
    from .fused import _env_allows_compile

    return _env_allows_compile()


def _interleaved_kernel(x: torch.Tensor):
    """The compiled kernel for ``x``'s dtype where it gives the eager path's bits here, else None: it is not
    built (no compiler, ``ROPEKIT_COMPILE=0``), or ATen's addcmul rounds its vector body and its remainder
    differently (:func:`ropekit.apply._cpu_kernel.addcmul_fuses`)."""
    if not _env_allows_kernel() or not _cpu_kernel.geope_supports(x) or _cpu_kernel.addcmul_fuses() is None:
        return None
    return _cpu_kernel.geope_kernel_for(x.dtype)


def _rotate_interleaved_addcmul(x: torch.Tensor, planes: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """The kernel's stand-in where it cannot run: each triple's three terms summed with ATen's ``addcmul`` in
    the blocked eager path's order, so it rounds as that path does (fused or not), from the float32 weight
    ``planes`` ``(9, [B,] L, n)``. Every triple reads only its own components (a NaN stays in its triple)."""
    n = planes.shape[-1]
    R = 3 * n
    w = [_broadcast(p, 0, seq_dim, x.ndim) for p in planes.unbind(0)]
    v0, v1, v2 = x[..., :R].to(torch.float32).unflatten(-1, (n, 3)).unbind(-1)
    out = torch.stack((torch.addcmul(torch.addcmul(v0 * w[0], v1, w[1]), v2, w[2]),
                       torch.addcmul(torch.addcmul(v1 * w[3], v2, w[4]), v0, w[5]),
                       torch.addcmul(torch.addcmul(v2 * w[6], v1, w[7]), v0, w[8])), -1).flatten(-2).to(x.dtype)
    return out if R == x.shape[-1] else torch.cat((out, x[..., R:]), dim=-1)


def _run_interleaved(xs: tuple, planes: torch.Tensor, seq_dim: int) -> tuple:
    """The operators' body: each tensor of ``xs`` (one, or q and k) rotated into a fresh tensor of its shape,
    strides and dtype, by the kernel in one pass over the planes, or by the addcmul stand-in."""
    outs = tuple(torch.empty_like(x) for x in xs)
    ldim = -2 if seq_dim == -2 else 1
    same = all(x.dtype == xs[0].dtype and x.ndim == xs[0].ndim and x.shape[ldim] == xs[0].shape[ldim]
               and (x.ndim == 3 or x.shape[0] == xs[0].shape[0]) and _cpu_kernel.geope_supports(x) for x in xs)
    kern = _interleaved_kernel(xs[0]) if same and planes.dtype == torch.float32 else None
    if kern is None:
        return tuple(o.copy_(_rotate_interleaved_addcmul(x, planes, seq_dim)) for x, o in zip(xs, outs))
    _cpu_kernel.rotate_geope_into(kern, xs, planes, outs, seq_dim, planes=True, fused=bool(_cpu_kernel.addcmul_fuses()))
    return outs


@torch.library.custom_op("ropekit::geope_interleaved", mutates_args=())
def _geope_interleaved(x: torch.Tensor, planes: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """GeoPE on the interleaved triples of CPU ``x`` (float32, bfloat16 or float16) with the rotation's float32
    weight ``planes`` ``(9, [B,] L, n)``; ``seq_dim`` -2 or 1. An operator of its own, so that torch.compile
    calls the compiled kernel instead of tracing the scalar stride-3 loop; the eager path's bits either way."""
    return _run_interleaved((x,), planes, seq_dim)[0]


@_geope_interleaved.register_fake
def _(x: torch.Tensor, planes: torch.Tensor, seq_dim: int) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("ropekit::geope_interleaved_qk", mutates_args=())
def _geope_interleaved_qk(q: torch.Tensor, k: torch.Tensor, planes: torch.Tensor,
                          seq_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_geope_interleaved` of q and k (one dtype, batch and sequence; head counts may differ) in one pass:
    each block of the rotation's planes is read once for both."""
    return _run_interleaved((q, k), planes, seq_dim)


@_geope_interleaved_qk.register_fake
def _(q: torch.Tensor, k: torch.Tensor, planes: torch.Tensor, seq_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k)


def _setup_backward(ctx, inputs, output) -> None:
    ctx.planes, ctx.seq_dim = inputs[-2], inputs[-1]


def _transposed(planes: torch.Tensor) -> torch.Tensor:
    # a rotation's adjoint is its transpose: the same operator with R^T's planes (pass-through channels: identity)
    return planes[list(_TRANSPOSED)]


def _backward(ctx, grad: torch.Tensor):
    return torch.ops.ropekit.geope_interleaved(grad.contiguous(), _transposed(ctx.planes), ctx.seq_dim), None, None


def _backward_qk(ctx, gq: torch.Tensor, gk: torch.Tensor):
    gq, gk = torch.ops.ropekit.geope_interleaved_qk(gq.contiguous(), gk.contiguous(), _transposed(ctx.planes),
                                                    ctx.seq_dim)
    return gq, gk, None, None


_geope_interleaved.register_autograd(_backward, setup_context=_setup_backward)
_geope_interleaved_qk.register_autograd(_backward_qk, setup_context=_setup_backward)


def _covers(planes: torch.Tensor, x: torch.Tensor, seq_dim: int) -> bool:
    """The planes broadcast against x's triples without growing x (a per-sample rotation of batch 1 or x's)."""
    rows = x.shape[:-1] + (planes.shape[-1],)
    return torch.broadcast_shapes(rows, _broadcast(planes[0], 0, seq_dim, x.ndim).shape) == rows


def _use_interleaved_kernel(x: torch.Tensor, planes: torch.Tensor | None) -> bool:
    """Whether a call takes :func:`_geope_interleaved`: CPU float32/bfloat16/float16 ``x`` whose rotation's
    float32 planes cover x's shape, under torch.compile, or eagerly for large calls without gradients whose
    kernel is at hand (built here)."""
    if planes is None or planes.dtype != torch.float32 or not _cpu_kernel.geope_supports(x):
        return False
    if torch.compiler.is_compiling():
        return True
    from .fused import _plain  # not a forward-mode dual nor a torch.func wrapper: the operator has no rules for them

    return (x.numel() >= _KERNEL_MIN_ELEMS and not (torch.is_grad_enabled() and x.requires_grad) and _plain(x)
            and not torch.jit.is_tracing() and _interleaved_kernel(x) is not None)


def _kernel_planes(x: torch.Tensor, rotation: GeoPERotation, seq_dim: int) -> torch.Tensor | None:
    """The float32 weight planes to hand to the interleaved operator for validated ``x``, or None where the
    call takes another path (a rotation or, outside torch.compile, an ``x`` that needs a gradient; not CPU;
    float64; a rotation that grows x; eagerly, a small call or no kernel)."""
    if torch.is_grad_enabled():
        if any(t.requires_grad for t in (rotation.vector, rotation.cos, rotation.sinc, rotation.versc)):
            return None
        if x.requires_grad and not torch.compiler.is_compiling():
            return None
    if x.device.type != "cpu" or x.dtype == torch.float64:
        return None
    planes = rotation.planes if rotation.planes is not None and rotation.planes.dtype == torch.float32 else None
    if planes is None and torch.compiler.is_compiling():
        planes = _weight_planes(rotation, torch.float32, x.device)  # traced: one transpose per call
    if _use_interleaved_kernel(x, planes) and _covers(planes, x, seq_dim):
        return planes
    return None


def apply_geope(x: torch.Tensor, rotation: GeoPERotation, *, seq_dim: int = -2,
                channels: str | None = None) -> torch.Tensor:
    """Rotate every channel triple of ``x`` by its token's GeoPE rotation (GeoPE eqs. 2-4).

    ``rotation`` comes from :func:`ropekit.rotations.geope.geope_rotation` with coordinates ``(L, A)``
    (shared by the batch) or ``(B, L, A)``. Channels beyond ``3n`` pass through. Without gradients the
    blocked eager path runs (see the module docstring; large interleaved calls on CPU take the compiled
    kernel, same bits); with gradients or when the rotation's batch broadcasts ``x`` to a larger shape, the
    functional one; under ``torch.compile`` the compiled CPU kernel (interleaved layout on CPU; with its own
    backward) or the per-channel form written for tracing (or the functional one when the rotation itself
    needs a gradient).

    ``channels``: ``"interleaved"`` (triple i = channels 3i, 3i+1, 3i+2; the paper's layout) or
    ``"thirds"`` (triple i = channels i, n+i, 2n+i; vectorises under ``torch.compile`` on any backend, where
    the interleaved layout takes a compiled CPU kernel on CPU); ``None`` (default)
    takes the layout the rotation was built for (:func:`ropekit.rotations.geope.geope_rotation`
    ``(channels=...)``, ``"interleaved"`` unless said otherwise), which also carries the weights that
    layout reads. Use one layout for q and k.
    """
    n, seq_dim = _validate(x, rotation, seq_dim)
    channels = check_channels(rotation.channels if channels is None else channels)
    fields = (rotation.vector, rotation.cos, rotation.sinc, rotation.versc)
    rotation_grad = torch.is_grad_enabled() and any(t.requires_grad for t in fields)
    if rotation_grad or (torch.is_grad_enabled() and x.requires_grad and not torch.compiler.is_compiling()):
        return _rotate_functional(x, rotation, n, seq_dim, channels)
    if channels == "thirds":
        planes = _weight_planes(rotation, _work_dtype(x), x.device)
        if torch.compiler.is_compiling() or x.device.type != "cpu":
            return _rotate_thirds_functional(x, planes, n, seq_dim)
        w = [_broadcast(p, 0, seq_dim, x.ndim) for p in planes.unbind(0)]
        rows = x.shape[:-1] + (n,)
        if torch.broadcast_shapes(rows, w[0].shape) != rows:
            return _rotate_functional(x, rotation, n, seq_dim, channels)
        return _rotate_thirds_eager(x, w, n, seq_dim)
    planes = _kernel_planes(x, rotation, seq_dim)
    if planes is not None:
        return torch.ops.ropekit.geope_interleaved(x, planes, seq_dim)
    if torch.compiler.is_compiling() or x.device.type != "cpu":
        # in-triple form: fused by a compiler; on accelerators it needs no host sync to confine NaN/inf
        return _rotate_coeff_functional(x, _triple_weights(rotation, _work_dtype(x), x.device), n, seq_dim)
    coef = [_broadcast(c, 0, seq_dim, x.ndim) for c in _coefficients(rotation, _work_dtype(x), x.device)]
    triples = x.shape[:-1] + (3 * n,)
    if torch.broadcast_shapes(triples, coef[0].shape) != triples:
        return _rotate_functional(x, rotation, n, seq_dim)
    return _rotate_eager(x, coef, n, seq_dim)


def apply_geope_qk(
    q: torch.Tensor, k: torch.Tensor, rotation: GeoPERotation, *, seq_dim: int = -2, channels: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys with the same GeoPE rotation (and the same ``channels`` layout). Where both take
    the compiled CPU kernel of the interleaved layout (see :func:`apply_geope`), one call rotates both, reading
    the rotation's weights once."""
    if check_channels(rotation.channels if channels is None else channels) == "interleaved":
        pair = _kernel_pair(q, k, rotation, seq_dim)
        if pair is not None:
            return pair
    return (apply_geope(q, rotation, seq_dim=seq_dim, channels=channels),
            apply_geope(k, rotation, seq_dim=seq_dim, channels=channels))


def _kernel_pair(q, k, rotation: GeoPERotation, seq_dim: int):
    """q and k rotated by one call of the interleaved operator, or None where either takes another path."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.dtype != k.dtype or q.ndim != k.ndim:
        return None
    _, sd = _validate(q, rotation, seq_dim)
    _validate(k, rotation, seq_dim)
    if q.ndim == 4 and q.shape[0] != k.shape[0]:
        return None
    planes = _kernel_planes(q, rotation, sd)
    if planes is None or _kernel_planes(k, rotation, sd) is None:
        return None
    return torch.ops.ropekit.geope_interleaved_qk(q, k, planes, sd)


class GeoPE:
    """GeoPE as a rotary object (``rotate(q, k, coords)``), usable wherever a :class:`ropekit.RoPE` is.

    ``coords`` is a tensor ``(L, A)``/``(B, L, A)`` with A = 1, 2 (h, w) or 3 (d, h, w), or a Layout /
    layout string placed by ``design`` (default ``"rope2d"``: (row, col) of each grid, text on the
    diagonal; ``"compact"`` gives (t, h, w) for videos). ``channels`` is the triple layout of
    :func:`apply_geope` (``"interleaved"``, the paper's, or ``"thirds"``, the same rotation on permuted channels). Not exactly relative (GeoPE §3.4); see
    :func:`ropekit.linear_geope_attention` for the variant that is.
    """

    def __init__(self, head_dim: int, *, lam: float = 100.0, freq_style: str = "decreasing",
                 design: str = "rope2d", design_options: dict | None = None, channels: str = "interleaved") -> None:
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 3:
            raise ValueError(f"GeoPE: `head_dim` must be an int >= 3 (one channel triple), got {head_dim!r}")
        geope_frequencies(head_dim, lam, freq_style)  # checks lam and freq_style now, not at the first forward
        options = {} if design_options is None else design_options
        if not isinstance(options, dict):
            raise TypeError(f"`design_options` must be a dict of the design's options, got {type(options).__name__}")
        positions("T1", design, **options)  # checks the design and its options
        self.channels = check_channels(channels)
        self.head_dim, self.lam, self.freq_style = head_dim, lam, freq_style
        self.design, self.design_options = design, options

    def __repr__(self) -> str:
        return (f"GeoPE(head_dim={self.head_dim}, triples={self.head_dim // 3}, lam={self.lam!r}, "
                f"freq_style={self.freq_style!r}, design={self.design!r}, channels={self.channels!r})")

    def coords(self, layout: "Layout | str") -> torch.Tensor:
        """Token coordinates ``(L, A)`` of the layout under this rotary's design."""
        return positions(layout, self.design, **self.design_options)

    def rotation(self, coords: torch.Tensor) -> GeoPERotation:
        """Per-token, per-triple rotations for coordinates ``(..., L, A)``; compute once per forward."""
        return geope_rotation(coords, self.head_dim, lam=self.lam, freq_style=self.freq_style, channels=self.channels)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords: "torch.Tensor | Layout | str", *, seq_dim: int = -2):
        """Rotate q and k (last dim ``head_dim``; ``seq_dim`` as in :meth:`ropekit.RoPE.rotate`) at ``coords``."""
        check_qk(q, k, self.head_dim)
        seq_dim = canonical_seq_dim(seq_dim, q.ndim)
        coords = match_coords_batch(resolve_coords(coords, self.design, self.design_options, q.device), q)
        return apply_geope_qk(q, k, self.rotation(coords), seq_dim=seq_dim, channels=self.channels)
