"""Directional N-D RoPE: the N-D paper's direction generator and the resulting frequency matrix.

References: a pure-Python re-computation of the paper's procedure (float continued fractions, the
standard library's inverse normal CDF, a Decimal root of the generalised golden ratio), explicit
float64 rotation matrices, and invariants (unit norm, relative property, norm preservation).
"""
import math
from decimal import Decimal, getcontext
from statistics import NormalDist

import pytest
import torch

from ropekit import angles, apply_rotary, cos_sin
from ropekit.rotations.directional import METHODS, directional_matrix, nd_directions, primes, sqrt_convergent

# ---------------------------------------------------------------- independent re-computation


def _is_prime(n):
    return n >= 2 and all(n % k for k in range(2, math.isqrt(n) + 1))


def _ref_primes(count):
    out, n = [], 1
    while len(out) < count:
        n += 1
        if _is_prime(n):
            out.append(n)
    return out


def _ref_convergent(alpha, cf_terms, tol):
    """Convergents from the float expansion alpha -> 1/(alpha - floor(alpha)), stopped at |q·α − p| < tol."""
    x, (p2, p1), (q2, q1) = alpha, (0, 1), (1, 0)
    for _ in range(cf_terms):
        a = math.floor(x)
        p2, p1 = p1, a * p1 + p2
        q2, q1 = q1, a * q1 + q2
        if abs(q1 * alpha - p1) < tol:
            break
        x = 1.0 / (x - a)
    return p1, q1


def _ref_ggr_steps(dims):
    getcontext().prec = 50
    x = Decimal(1.5)
    for _ in range(60):  # Newton on x^(N+1) - x - 1
        x -= (x ** (dims + 1) - x - 1) / ((dims + 1) * x**dims - 1)
    return [float((1 / x) ** k % 1) for k in range(1, dims + 1)]


def _ref_directions(num, dims, method, cf_terms=20, error=1e-4):
    if method == "weyl":
        steps = [math.sqrt(p) % 1.0 for p in _ref_primes(dims)]
    else:
        steps = _ref_ggr_steps(dims)
    ps = _ref_primes(num * dims)
    inv_cdf = NormalDist().inv_cdf
    rows = []
    for i in range(num):
        row = []
        for j in range(dims):
            u = ((i + 1) * steps[j]) % 1.0
            y = inv_cdf(u)
            whole = math.floor(y)
            alpha = math.sqrt(ps[i * dims + j])
            p, q = _ref_convergent(alpha, cf_terms, error / 4)
            delta = q * alpha - p
            mult = round((y - whole) / delta)
            row.append(abs((mult * q) * alpha - mult * p) + whole)
        norm = math.sqrt(sum(v * v for v in row))
        rows.append([v / norm for v in row])
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------- generator


def test_primes_and_convergents_match_definitions():
    assert primes(200) == _ref_primes(200)
    for p in _ref_primes(60):
        num, den = sqrt_convergent(p)
        assert (num, den) == _ref_convergent(math.sqrt(p), 20, 1e-4 / 4)
        assert abs(den * math.sqrt(p) - num) < 1e-4 / 4
    # cf_terms caps the number of convergents: √2 = [1; 2, 2, …] -> 1, 3/2, 7/5
    assert sqrt_convergent(2, cf_terms=3, error=1e-12) == (7, 5)


@pytest.mark.parametrize("method", ["weyl", "ggr"])
@pytest.mark.parametrize("dims", [1, 2, 3, 5])
def test_deterministic_methods_reproduce_paper_procedure(method, dims):
    got = nd_directions(40, dims, method)
    ref = _ref_directions(40, dims, method)
    assert got.dtype == torch.float64 and got.shape == (40, dims)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


def test_error_and_cf_terms_enter_as_in_the_paper():
    ref = _ref_directions(24, 3, "weyl", cf_terms=6, error=1e-6)
    torch.testing.assert_close(nd_directions(24, 3, "weyl", cf_terms=6, error=1e-6), ref, rtol=0, atol=1e-12)
    coarse = nd_directions(24, 3, "weyl", error=1e-1)
    assert not torch.allclose(coarse, ref, atol=1e-6)


def test_weyl_directions_stay_close_to_their_gaussian_targets():
    # the CF step moves each coordinate by less than about `error`, so the direction is the
    # normalised inverse-CDF sample up to O(error)
    num, dims = 64, 3
    inv_cdf = NormalDist().inv_cdf
    steps = [math.sqrt(p) % 1.0 for p in _ref_primes(dims)]
    y = torch.tensor([[inv_cdf(((i + 1) * s) % 1.0) for s in steps] for i in range(num)], dtype=torch.float64)
    target = y / y.norm(dim=-1, keepdim=True)
    got = nd_directions(num, dims, "weyl", error=1e-4)
    assert (got - target).abs().max() < 1e-3


@pytest.mark.parametrize("method", METHODS)
def test_unit_norm_count_and_finiteness(method):
    dims = 2 if method == "golden" else 4
    d = nd_directions(33, dims, method, seed=3)
    assert d.shape == (33, dims) and d.dtype == torch.float64
    assert torch.isfinite(d).all()
    torch.testing.assert_close(d.norm(dim=-1), torch.ones(33, dtype=torch.float64), rtol=0, atol=1e-12)


def test_seeding():
    for m in ("sobol", "uniform", "random"):
        a = nd_directions(16, 3, m, seed=1)
        assert torch.equal(a, nd_directions(16, 3, m, seed=1)), m
        assert not torch.allclose(a, nd_directions(16, 3, m, seed=2)), m
    assert torch.equal(nd_directions(16, 3, "weyl"), nd_directions(16, 3, "weyl", seed=5))


def test_golden_directions_are_golden_angle_steps():
    d = nd_directions(50, 2, "golden")
    step = math.pi * (1 - math.sqrt(5))
    ref = torch.tensor([[math.cos(j * step), math.sin(j * step)] for j in range(50)], dtype=torch.float64)
    torch.testing.assert_close(d, ref, rtol=0, atol=1e-12)


def test_sobol_directions_cover_the_circle():
    d = nd_directions(256, 2, "sobol", seed=0)
    ang = torch.sort(torch.atan2(d[:, 1], d[:, 0])).values
    gaps = torch.diff(torch.cat([ang, ang[:1] + 2 * math.pi]))
    assert gaps.max() < 8 * (2 * math.pi / 256)


# ---------------------------------------------------------------- frequency matrix


def test_directional_matrix_columns_are_magnitude_times_direction():
    W = directional_matrix(32, 3, "weyl", base=100.0, dtype=torch.float64)
    u = nd_directions(16, 3, "weyl")
    assert W.shape == (3, 16)
    omega = torch.tensor([100.0 ** (-2 * j / 32) for j in range(16)], dtype=torch.float64)
    torch.testing.assert_close(W.norm(dim=0), omega, rtol=1e-12, atol=0)
    torch.testing.assert_close(W / W.norm(dim=0), u.T, rtol=0, atol=1e-12)
    assert directional_matrix(32, 3, "weyl").dtype == torch.float32


def _rotation(p, W, channels):
    """Explicit float64 block rotation matrix for position p (A,) under W (A, R/2)."""
    half = W.shape[1]
    R = torch.zeros(2 * half, 2 * half, dtype=torch.float64)
    for j in range(half):
        phi = float(sum(p[a] * W[a, j] for a in range(W.shape[0])))
        c1, c2 = (j, j + half) if channels == "half" else (2 * j, 2 * j + 1)
        R[c1, c1], R[c1, c2], R[c2, c1], R[c2, c2] = math.cos(phi), -math.sin(phi), math.sin(phi), math.cos(phi)
    return R


@pytest.mark.parametrize("channels", ["half", "interleaved"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_apply_matches_explicit_rotations_and_is_relative(channels, dims):
    g = torch.Generator().manual_seed(dims)
    W = directional_matrix(8, dims, "sobol", seed=0, dtype=torch.float64)
    pos = torch.randn(5, dims, generator=g, dtype=torch.float64) * 7
    q = torch.randn(1, 1, 5, 8, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 5, 8, generator=g, dtype=torch.float64)
    cos, sin = cos_sin(angles(pos, W))
    rq = apply_rotary(q, cos, sin, channels=channels)
    rk = apply_rotary(k, cos, sin, channels=channels)
    for i in range(5):
        torch.testing.assert_close(rq[0, 0, i], _rotation(pos[i], W, channels) @ q[0, 0, i])
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))  # norm preserved
    scores = rq[0, 0] @ rk[0, 0].T
    for m in range(5):
        for n in range(5):
            rel = _rotation(pos[n] - pos[m], W, channels)  # depends on n − m only
            torch.testing.assert_close(scores[m, n], q[0, 0, m] @ rel @ k[0, 0, n])


def test_partial_rotary_and_float32_angles():
    W = directional_matrix(8, 2, "ggr")
    coords = torch.tensor([[0.0, 0.0], [3.0, -2.0]])
    a = angles(coords, W)
    assert a.dtype == torch.float32 and a.shape == (2, 4)
    x = torch.randn(1, 2, 2, 12)
    out = apply_rotary(x, *cos_sin(a))
    assert torch.equal(out[..., 8:], x[..., 8:])
    torch.testing.assert_close(out[:, :, 0], x[:, :, 0])  # origin: identity


# ---------------------------------------------------------------- bad input


def test_bad_input():
    with pytest.raises(ValueError, match="`dims` must be >= 1"):
        nd_directions(4, 0)
    with pytest.raises(ValueError, match="`num` must be >= 1"):
        nd_directions(0, 2)
    with pytest.raises(TypeError, match="`num` must be an int"):
        nd_directions(2.5, 2)
    with pytest.raises(ValueError, match="unknown direction method 'halton'.*sobol, weyl, ggr, uniform, golden, random"):
        nd_directions(4, 2, "halton")
    with pytest.raises(ValueError, match="'golden' makes 2-D directions only, got dims=3"):
        nd_directions(4, 3, "golden")
    with pytest.raises(ValueError, match="`cf_terms` must be an int >= 1"):
        nd_directions(4, 2, "weyl", cf_terms=0)
    with pytest.raises(ValueError, match="`error` must be a finite number > 0"):
        nd_directions(4, 2, "weyl", error=0.0)
    with pytest.raises(ValueError, match="`rotary_dim` must be a positive even number"):
        directional_matrix(7, 2)
    with pytest.raises(ValueError, match="`base` must be a finite number > 1"):
        directional_matrix(8, 2, base=-1.0)
    with pytest.raises(ValueError, match="perfect square"):
        sqrt_convergent(9)
