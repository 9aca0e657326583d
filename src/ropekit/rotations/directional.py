"""Directional N-D RoPE: frequency pair j rotates by ``ω_j · (u_j · p)`` for a direction ``u_j ∈ S^{N-1}``.

Every planar scheme is a frequency matrix ``W (A, R/2)`` (docs/conventions.md, "Frequencies"); here
``W[:, j] = ω_j u_j`` (docs/conventions.md, "Directional N-D RoPE and RoPE-Mixed"; the N-D paper's section
"Coming up with these vectors"). The directions come from the
N-D paper's generator:

1. low-discrepancy (or random) samples ``s ∈ [0, 1)^N`` — ``sobol``, ``weyl``, ``ggr`` or ``uniform``;
2. the inverse normal CDF turns each coordinate into an approximately Gaussian value ``y``;
3. the fractional part of ``y`` is replaced by ``|a·√p − b|`` for integers a, b found with the
   continued-fraction convergents of ``√p`` (p = the k-th prime for the k-th coordinate, row-major),
   so every coordinate is an incoherent irrational, and the integer part of ``y`` is added back;
4. each row is normalised onto the sphere.

``golden`` (2-D, Jerry Xiong's golden-angle directions) and ``random`` (normalised Gaussian) are the
two reference generators without step 3.

Two published 2-D schemes of the same form ``W[:, j] = ω_j u_j`` bring their own magnitudes ``ω_j`` as
well as their own directions, so they are builders of their own rather than ``method`` names of
:func:`directional_matrix` (whose magnitudes are always ``base^(-2j/R)``):

- :func:`spiral_matrix` — Spiral RoPE (Liu et al. 2026): K directions ``kπ/K`` over rope-vit's axial
  spectrum;
- :func:`golden_gate_matrix` — Golden Gate RoPE (Jerry Xiong 2025, 2-D): direction ``k·π/φ`` for the
  k-th pair counted over all heads, log-spaced magnitudes between ``min_freq`` and ``max_freq``.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from .planar import MAX_AXES, _check_dim, check_base, check_count, check_seed, inv_freq

__all__ = ["METHODS", "nd_directions", "directional_matrix", "primes", "sqrt_convergent", "spiral_matrix",
           "golden_gate_matrix", "GOLDEN_GATE_STEP"]

METHODS = ("sobol", "weyl", "ggr", "uniform", "golden", "random")
# methods whose samples go through the inverse-CDF + continued-fraction procedure (step 2-3)
_CF_METHODS = ("sobol", "weyl", "ggr", "uniform")
# keeps the inverse normal CDF finite for a sample that is exactly 0 (possible for `uniform`)
_TINY = 2.0**-53
# at most this many direction coordinates (num · dims): each takes a prime and its continued fraction
_MAX_ENTRIES = 1 << 16


def primes(count: int) -> list[int]:
    """The first ``count`` primes (sieve of Eratosthenes, bound grown until enough are found)."""
    if count <= 0:
        return []
    bound = max(16, int(count * (math.log(count + 1) + math.log(math.log(count + 2)) + 2)))
    while True:
        sieve = bytearray([1]) * bound
        sieve[0:2] = b"\x00\x00"
        for n in range(2, math.isqrt(bound - 1) + 1):
            if sieve[n]:
                sieve[n * n :: n] = bytearray(len(range(n * n, bound, n)))
        found = [n for n in range(bound) if sieve[n]]
        if len(found) >= count:
            return found[:count]
        bound *= 2


@lru_cache(maxsize=None)
def sqrt_convergent(n: int, cf_terms: int = 20, error: float = 1e-4) -> tuple[int, int]:
    """Last continued-fraction convergent ``b/a`` of ``√n`` taken by the paper's stopping rule.

    Partial quotients come from the exact periodic expansion of a quadratic surd (integers only);
    convergents are generated until ``|a·√n − b| < error / 4`` (the paper passes ``error / 4``) or
    ``cf_terms`` convergents have been formed. Returns ``(b, a)`` (numerator, denominator).
    """
    root = math.isqrt(n)
    if root * root == n:
        raise ValueError(f"sqrt_convergent: {n} is a perfect square; √n has no infinite continued fraction")
    alpha = math.sqrt(n)
    m, d, a = 0, 1, root
    b_prev, b = 0, 1  # numerators p_{-2}, p_{-1}
    q_prev, q = 1, 0  # denominators q_{-2}, q_{-1}
    for _ in range(cf_terms):
        b_prev, b = b, a * b + b_prev
        q_prev, q = q, a * q + q_prev
        if abs(q * alpha - b) < error / 4:
            break
        m = d * a - m
        d = (n - m * m) // d
        a = (root + m) // d
    return b, q


def _weyl_generators(dims: int) -> torch.Tensor:
    """Fractional parts of √(first `dims` primes): the additive-recurrence steps of `weyl`."""
    g = torch.tensor([math.sqrt(p) for p in primes(dims)], dtype=torch.float64)
    return g - torch.floor(g)


def _ggr_generators(dims: int) -> torch.Tensor:
    """Steps ``φ^{-k}``, k = 1 … dims, of the generalised golden ratio φ (root of ``x^{N+1} = x + 1``).

    The root is found by bisection on [1, 2] in float64 (100 halvings, as the paper's procedure does).
    """
    lo, hi = 1.0, 2.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if mid ** (dims + 1) < mid + 1:
            lo = mid
        else:
            hi = mid
    g = torch.exp(torch.arange(1, dims + 1, dtype=torch.float64) * math.log(1.0 / lo))
    return g - torch.floor(g)


def _kronecker(num: int, steps: torch.Tensor) -> torch.Tensor:
    """Samples ``{i · g}`` for i = 1 … num (additive recurrence), shape (num, dims)."""
    x = torch.arange(1, num + 1, dtype=torch.float64)[:, None] * steps[None, :]
    return x - torch.floor(x)


def _unit_samples(num: int, dims: int, method: str, seed: int | None) -> torch.Tensor:
    """Step 1: samples in [0, 1)^dims, shape (num, dims), float64."""
    if method == "sobol":
        engine = torch.quasirandom.SobolEngine(dims, scramble=True, seed=seed)
        return engine.draw(num, dtype=torch.float64)
    if method == "weyl":
        return _kronecker(num, _weyl_generators(dims))
    if method == "ggr":
        return _kronecker(num, _ggr_generators(dims))
    gen = torch.Generator()
    gen.manual_seed(seed) if seed is not None else gen.seed()
    return torch.rand(num, dims, generator=gen, dtype=torch.float64)


def _incoherent(samples: torch.Tensor, cf_terms: int, error: float) -> torch.Tensor:
    """Steps 2-3: Gaussian values whose fractional parts are replaced by ``|a√p − b|`` (float64)."""
    num, dims = samples.shape
    y = torch.special.ndtri(samples.clamp(_TINY, 1.0 - _TINY))
    y_int = torch.floor(y)
    y_frac = y - y_int
    ps = primes(num * dims)
    conv = [sqrt_convergent(p, cf_terms, error) for p in ps]
    # math.sqrt is correctly rounded; torch.sqrt on CPU may differ by an ulp, which the cancellation in
    # (mult·a)·√p − mult·b (terms ~1e9) would magnify to ~1e-7
    alpha = torch.tensor([math.sqrt(p) for p in ps], dtype=torch.float64).reshape(num, dims)
    b = torch.tensor([c[0] for c in conv], dtype=torch.float64).reshape(num, dims)
    a = torch.tensor([c[1] for c in conv], dtype=torch.float64).reshape(num, dims)
    delta = a * alpha - b  # the convergent's signed error, |delta| < error/4 unless cf_terms ran out
    mult = torch.where(delta.abs() > 1e-18, torch.round(y_frac / delta), torch.zeros_like(delta))
    # (mult·a)·√p − mult·b in the paper's order of operations (integers formed first), so the result
    # matches its float64 arithmetic, including the ~1e-7 cancellation error that order carries
    return ((mult * a) * alpha - mult * b).abs() + y_int


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"unknown direction method {method!r}; choose one of {', '.join(METHODS)}")
    return method


def nd_directions(
    num: int,
    dims: int,
    method: str = "sobol",
    *,
    seed: int | None = None,
    cf_terms: int = 20,
    error: float = 1e-4,
) -> torch.Tensor:
    """``num`` unit directions in ``dims`` dimensions, ``(num, dims)`` float64 (N-D paper's generator).

    ``sobol`` (scrambled; ``seed`` fixes the scramble), ``weyl`` (``{i·√p_k}``), ``ggr`` (generalised
    golden ratio) and ``uniform`` (seeded i.i.d.) samples pass through the inverse normal CDF and the
    continued-fraction step (``cf_terms`` convergents at most, stop once ``|a√p − b| < error/4``) before
    normalisation; ``weyl`` and ``ggr`` are deterministic. ``golden`` (2-D only) gives angles
    ``j · π(1 − √5)``, j = 0 … num-1; ``random`` normalises seeded Gaussian vectors.
    """
    check_count(num, "num", _MAX_ENTRIES)
    check_count(dims, "dims", MAX_AXES)
    if method in _CF_METHODS and num * dims > _MAX_ENTRIES:
        raise ValueError(
            f"`num` × `dims` = {num * dims} direction coordinates are too many for the continued-fraction "
            f"step (one prime each; at most {_MAX_ENTRIES})"
        )
    _check_method(method)
    check_seed(seed)
    if isinstance(cf_terms, bool) or not isinstance(cf_terms, int) or cf_terms < 1:
        raise ValueError(f"`cf_terms` must be an int >= 1, got {cf_terms!r}")
    if not (isinstance(error, (int, float)) and math.isfinite(error) and error > 0):
        raise ValueError(f"`error` must be a finite number > 0, got {error!r}")
    if method == "golden":
        if dims != 2:
            raise ValueError(f"method 'golden' makes 2-D directions only, got dims={dims}; use 'sobol' or 'weyl'")
        theta = torch.arange(num, dtype=torch.float64) * (math.pi * (1.0 - math.sqrt(5.0)))
        return torch.stack((torch.cos(theta), torch.sin(theta)), dim=-1)
    if method == "random":
        gen = torch.Generator()
        gen.manual_seed(seed) if seed is not None else gen.seed()
        v = torch.randn(num, dims, generator=gen, dtype=torch.float64)
        return v / v.norm(dim=-1, keepdim=True)
    samples = _unit_samples(num, dims, method, seed)
    v = _incoherent(samples, cf_terms, error)
    norm = v.norm(dim=-1, keepdim=True)
    if bool((norm == 0).any()):  # every coordinate rounded to 0: keep the plain Gaussian value instead
        y = torch.special.ndtri(samples.clamp(_TINY, 1.0 - _TINY))
        v = torch.where(norm == 0, y, v)
        norm = v.norm(dim=-1, keepdim=True)
    return v / norm


def directional_matrix(
    rotary_dim: int,
    dims: int,
    method: str = "sobol",
    *,
    base: float = 10000.0,
    seed: int | None = None,
    cf_terms: int = 20,
    error: float = 1e-4,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Frequency matrix ``W (dims, rotary_dim/2)`` with ``W[:, j] = ω_j u_j``; ``dtype`` a floating dtype.

    Magnitudes are the standard RoPE spectrum ``ω_j = base^{-2j/R}``, j = 0 … R/2-1 (the N-D paper's
    ``base_thetas``, base 10000); directions ``u_j`` are ``nd_directions(R/2, dims, method, …)``, the
    j-th direction for the j-th pair. Use with ``ropekit.angles(coords, W)`` for coords with ``dims`` axes.
    """
    _check_dim(rotary_dim)
    inv_freq(rotary_dim, base)  # checks base, including frequencies that underflow float32
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"`dtype` must be a floating torch.dtype such as torch.float32, got {dtype!r}")
    half = rotary_dim // 2
    u = nd_directions(half, dims, method, seed=seed, cf_terms=cf_terms, error=error)
    omega = float(base) ** (-2.0 * torch.arange(half, dtype=torch.float64) / rotary_dim)
    return (u.T * omega[None, :]).to(dtype)


#: Golden Gate RoPE's angle step between consecutive directions: π/φ = π(√5 − 1)/2 (≈ 111.2°), the golden
#: section of the half turn (a direction and its opposite span the same line)
GOLDEN_GATE_STEP = math.pi * (math.sqrt(5.0) - 1.0) / 2.0
# at most this many heads for golden_gate_matrix (each a full (2, R/2) matrix)
_MAX_HEADS = 1 << 12


def _check_dtype(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"`dtype` must be a floating torch.dtype such as torch.float32, got {dtype!r}")


def _positive(value, name: str, hint: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a real number > 0, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"`{name}` must be a finite number > 0 ({hint}), got {value!r}")
    return float(value)


def _finish(W: torch.Tensor, dtype: torch.dtype, what: str) -> torch.Tensor:
    out = W.to(dtype)
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"{what}: the frequencies overflow {dtype}; choose smaller frequencies")
    return out


def spiral_matrix(
    rotary_dim: int,
    directions: int = 4,
    *,
    base: float = 10000.0,
    max_freq: float = 1.0,
    same_theta: bool = False,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Spiral RoPE's frequency matrix ``W (2, rotary_dim/2)`` for 2-D coordinates ``(row, col)``.

    Spiral RoPE (Liu et al. 2026, "Spiral RoPE: Rotate Your Rotary Positional Embeddings in the 2D Plane")
    ties groups of channel pairs to ``K = directions`` directions evenly spaced over the half turn,
    ``φ_k = kπ/K`` (k = 0 … K-1, measured from the row axis towards the column axis), and rotates each
    pair by its frequency times the projection of the position onto its direction. Pairs are numbered as
    in the authors' code, whose pairs are GPT-J's ``(2j, 2j + 1)`` (use ``channels="interleaved"`` to
    load its weights):

    - pair ``j < R/4`` starts from the row axis, pair ``j ≥ R/4`` from the column axis (rope-vit's axial
      halves); its frequency is ``max_freq · base^(-4p/R)``, ``p = j mod R/4`` (the axial spectrum);
    - the pairs go in blocks of two, and block ``b = ⌊j/2⌋`` is turned by ``(b mod K/2)·π/K``, so the row
      half covers ``φ_0 … φ_{K/2-1}`` and the column half ``φ_{K/2} … φ_{K-1}``.

    ``same_theta=True`` is the code's ``SAME_THETA`` option: every direction gets the same
    ``R/(2K)`` frequencies ``max_freq · base^(-2qK/R)`` (q = 0 … R/(2K) − 1), block b carrying
    ``q ∈ {2⌊b'/(K/2)⌋, 2⌊b'/(K/2)⌋ + 1}`` with ``b'`` its block within its half. ``directions=2`` is axial
    RoPE: ``frequency_matrix("axial", rotary_dim, 2, base=base)``. ``max_freq`` is the code's
    ``MAX_FREQ_LANG`` (1.0 by default there, 1.5 in its ImageNet runs).

    The authors' code turns a block by resampling its axis-aligned angle map bilinearly about the grid's
    centre, clamping samples that fall outside the grid to its border. Inside the grid this is the
    projection above plus a constant phase per pair, which cancels in ``q·k``; at the corners, for
    directions off the axes, the clamped angles stop growing with position and the score is no longer
    relative. ``W`` is the projection everywhere (the rule the paper states), so it matches the code
    wherever the code does not clamp.
    """
    _check_dim(rotary_dim)
    base = check_base(base)
    K = check_count(directions, "directions", MAX_AXES)
    if K % 2:
        raise ValueError(
            f"`directions` must be even (Spiral RoPE turns the row and the column halves alike, so directions "
            f"come in perpendicular pairs; the authors' ROTATE is directions/2), got {K}; use e.g. 4 or 8"
        )
    if rotary_dim % (2 * K):
        raise ValueError(
            f"Spiral RoPE with directions={K} needs rotary_dim divisible by 2·directions = {2 * K} (blocks of "
            f"two pairs per direction in each half), got rotary_dim={rotary_dim}; change either"
        )
    if not isinstance(same_theta, bool):
        raise TypeError(f"`same_theta` must be True or False, got {same_theta!r}")
    if same_theta and rotary_dim % (4 * K):
        raise ValueError(
            f"Spiral RoPE with same_theta=True and directions={K} needs rotary_dim divisible by 4·directions = "
            f"{4 * K} (each direction gets rotary_dim/(2·directions) frequencies, an even number), got "
            f"rotary_dim={rotary_dim}; use same_theta=False or change either"
        )
    max_freq = _positive(max_freq, "max_freq", "the highest frequency, 1.0 in the authors' code by default")
    _check_dtype(dtype)
    half, quarter, per_half = rotary_dim // 2, rotary_dim // 4, K // 2
    j = torch.arange(half, dtype=torch.float64)
    from_col = torch.div(j, quarter, rounding_mode="floor")  # 0: row half, 1: column half
    p = j - from_col * quarter
    turn = torch.remainder(torch.div(j, 2, rounding_mode="floor"), per_half)
    k = turn + from_col * per_half  # direction index, φ_k = kπ/K
    phi = k * (math.pi / K)
    cos, sin = torch.cos(phi), torch.sin(phi)
    cos[2 * k == K] = 0.0  # the column axis exactly, so directions=2 is axial RoPE bit for bit
    if same_theta:
        q = 2 * torch.div(torch.div(p, 2, rounding_mode="floor"), per_half, rounding_mode="floor") + p % 2
        omega = max_freq / base ** (q / (rotary_dim // (2 * K)))
    else:
        omega = max_freq / base ** (p / quarter)  # the axial allocation's expression
    return _finish(torch.stack((omega * cos, omega * sin)), dtype, "spiral_matrix")


def golden_gate_matrix(
    rotary_dim: int,
    heads: int | None = None,
    *,
    min_freq: float,
    max_freq: float,
    zero_freqs: int = 0,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Golden Gate RoPE's frequency matrix for 2-D coordinates ``(row, col)``: ``W (2, rotary_dim/2)``, or
    per head ``(heads, 2, rotary_dim/2)``.

    Golden Gate RoPE (Jerry Xiong, "On N-dimensional Rotary Positional Embeddings", 2025; its 2-D module)
    gives pair f of head h the direction at angle ``a = (h·R/2 + f)·π/φ`` (:data:`GOLDEN_GATE_STEP`; the
    count runs on across heads, so no two heads share directions), as ``(x, y) = (cos a, sin a)`` with x
    the column and y the row: ``W[h, :, f] = ω_f · (sin a, cos a)`` in ``(row, col)`` order. Magnitudes:
    the first ``zero_freqs`` pairs 0 (not rotated), the other ``m`` log-spaced from ``min_freq`` up to
    ``max_freq``, ``ω = min_freq · (max_freq/min_freq)^(i/(m-1))`` (``min_freq`` alone when m = 1).
    ``heads=None`` returns head 0 as ``(2, R/2)``.

    Not a ``method`` of :func:`directional_matrix`: its magnitudes are not ``base^(-2j/R)`` and rise
    with j, its step is π/φ (``golden`` steps by π(1 − √5), the full-turn golden angle), and directions
    continue from head to head. The reference module places positions on a grid normalised to about
    [−1, 1] (scaled by the aspect ratio); that placement is a position design, not part of ``W`` — on
    integer coordinates, scale ``min_freq`` and ``max_freq`` by the reference's grid step to match it.
    """
    _check_dim(rotary_dim)
    n = rotary_dim // 2
    count = 1 if heads is None else check_count(heads, "heads", _MAX_HEADS)
    if isinstance(zero_freqs, bool) or not isinstance(zero_freqs, int):
        raise TypeError(f"`zero_freqs` must be an int (a number of unrotated pairs), got {zero_freqs!r}")
    if not 0 <= zero_freqs <= n:
        raise ValueError(f"`zero_freqs` must be in [0, rotary_dim/2 = {n}] (pairs left unrotated), got {zero_freqs}")
    lo = _positive(min_freq, "min_freq", "the lowest non-zero frequency")
    hi = _positive(max_freq, "max_freq", "the highest frequency")
    _check_dtype(dtype)
    m = n - zero_freqs
    t = torch.arange(m, dtype=torch.float64) / (m - 1) if m > 1 else torch.zeros(m, dtype=torch.float64)
    omega = torch.cat((torch.zeros(zero_freqs, dtype=torch.float64), lo * (hi / lo) ** t))
    a = torch.arange(count * n, dtype=torch.float64).reshape(count, n) * GOLDEN_GATE_STEP
    W = torch.stack((omega * torch.sin(a), omega * torch.cos(a)), dim=1)  # (heads, 2 = (row, col), n)
    W = _finish(W, dtype, "golden_gate_matrix")
    return W[0] if heads is None else W
