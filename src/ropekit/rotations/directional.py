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
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from .planar import MAX_AXES, _check_dim, check_count, check_seed, inv_freq

__all__ = ["METHODS", "nd_directions", "directional_matrix", "primes", "sqrt_convergent"]

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
