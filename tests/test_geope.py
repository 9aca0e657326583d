"""GeoPE against the paper's quaternion definitions (float64, built here), RoPE and invariants."""
import math

import pytest
import torch

from ropekit.apply.geope import apply_geope, apply_geope_qk
from ropekit.apply.planar import apply_rotary
from ropekit.rotations.geope import geope_frequencies, geope_rotation, rodrigues_coefficients


# ---- float64 quaternion reference (GeoPE app. A), written independently of the library ----------------

def qmul(a, b):
    """Hamilton product of quaternions (..., 4) = (w, x, y, z) (paper eq. 17)."""
    w1, v1 = a[..., :1], a[..., 1:]
    w2, v2 = b[..., :1], b[..., 1:]
    w = w1 * w2 - (v1 * v2).sum(-1, keepdim=True)
    v1, v2 = torch.broadcast_tensors(v1, v2)
    v = w1 * v2 + w2 * v1 + torch.linalg.cross(v1, v2, dim=-1)
    return torch.cat((w, v), -1)


def qconj(a):
    return torch.cat((a[..., :1], -a[..., 1:]), -1)


def qexp(u):
    """exp of a pure quaternion (Lie-algebra vector) u (..., 3): cos‖u‖ + sin‖u‖ u/‖u‖."""
    n = u.norm(dim=-1, keepdim=True)
    safe = torch.where(n > 0, n, torch.ones_like(n))
    return torch.cat((torch.cos(n), torch.sin(n) * u / safe), -1)


def reference_quaternion(coords, freqs):
    """r per (token, triple) from the log-exp mean of the axis rotations (eqs. 3, 5; app. F for 1-D)."""
    c = coords.to(torch.float64)
    theta = c[:, None, :] * freqs.to(torch.float64)[None, :, None]  # (L, n, A)
    A = c.shape[-1]
    if A == 1:  # r(θ) = cos(θ/2) + sin(θ/2) j   (eq. 46)
        logs = [torch.stack((0 * theta[..., 0], theta[..., 0] / 2, 0 * theta[..., 0]), -1)]
    else:
        axes = [1, 2] if A == 2 else [0, 1, 2]  # h ↔ j, w ↔ k; d ↔ i
        logs = []
        for a, comp in enumerate(axes):
            u = torch.zeros(*theta.shape[:-1], 3, dtype=torch.float64)
            u[..., comp] = theta[..., a] / 2  # log(cos(θ/2) + sin(θ/2) e) = (θ/2) e
            logs.append(u)
    return qexp(sum(logs) / len(logs))


def sandwich(x, r):
    """r p r* on every triple of x (..., L, D), with r (L, n, 4); channels past 3n pass through."""
    n = r.shape[-2]
    v = x[..., : 3 * n].to(torch.float64).unflatten(-1, (n, 3))
    p = torch.cat((torch.zeros_like(v[..., :1]), v), -1)
    out = qmul(qmul(r, p), qconj(r))[..., 1:]
    return torch.cat((out.flatten(-2), x[..., 3 * n :].to(torch.float64)), -1)


def paper_matrix_2d(th, tw):
    """The closed-form R_i of GeoPE §3.2 for one triple (float64)."""
    rho2 = th * th + tw * tw
    rho = math.sqrt(rho2)
    T = 0.5 * rho
    c, s = math.cos(T), math.sin(T)
    return torch.tensor([
        [c, -tw * s / rho, th * s / rho],
        [tw * s / rho, 1 - tw * tw * (1 - c) / rho2, th * tw * (1 - c) / rho2],
        [-th * s / rho, th * tw * (1 - c) / rho2, 1 - th * th * (1 - c) / rho2],
    ], dtype=torch.float64)


def _grid(h, w):
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack((ys.flatten(), xs.flatten()), -1).float()


# ---- frequencies -------------------------------------------------------------------------------------

def test_frequencies_follow_spec_and_paper_literal():
    f = geope_frequencies(24, lam=100.0)
    n = 8
    assert f.shape == (n,) and f.dtype == torch.float32
    assert torch.allclose(f.double(), torch.tensor([100.0 ** (-i / n) for i in range(n)], dtype=torch.float64))
    p = geope_frequencies(24, lam=100.0, freq_style="paper")
    assert torch.allclose(p.double(), torch.tensor([100.0 ** (2 * i / 24) for i in range(n)], dtype=torch.float64))
    assert geope_frequencies(10).shape == (3,)  # n = ⌊D/3⌋


# ---- against the quaternion definition ---------------------------------------------------------------

@pytest.mark.parametrize("num_axes", [1, 2, 3])
def test_equals_quaternion_sandwich_product(num_axes):
    g = torch.Generator().manual_seed(num_axes)
    D, L = 20, 7  # 6 triples + 2 pass-through channels
    coords = torch.randint(-6, 9, (L, num_axes), generator=g).float()
    coords[0] = 0
    x = torch.randn(2, 3, L, D, generator=g)
    out = apply_geope(x, geope_rotation(coords, D))
    ref = sandwich(x, reference_quaternion(coords, geope_frequencies(D)))
    assert out.dtype == x.dtype
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-5)


def test_equals_paper_closed_form_matrix():
    D = 12
    coords = torch.tensor([[3.0, 5.0], [-2.0, 7.0], [4.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    freqs = geope_frequencies(D).double()
    x = torch.randn(1, 1, coords.shape[0], D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out = apply_geope(x, geope_rotation(coords, D))
    for t in range(coords.shape[0]):
        for i in range(D // 3):
            R = paper_matrix_2d(float(coords[t, 0] * freqs[i]), float(coords[t, 1] * freqs[i]))
            torch.testing.assert_close(out[0, 0, t, 3 * i : 3 * i + 3], R @ x[0, 0, t, 3 * i : 3 * i + 3])


def test_norm_of_every_triple_is_preserved():
    g = torch.Generator().manual_seed(2)
    coords = torch.randn(9, 3, generator=g) * 20
    x = torch.randn(2, 2, 9, 15, generator=g)
    out = apply_geope(x, geope_rotation(coords, 15))
    torch.testing.assert_close(out.unflatten(-1, (5, 3)).norm(dim=-1), x.unflatten(-1, (5, 3)).norm(dim=-1))


# ---- degenerate and symmetric cases ------------------------------------------------------------------

def test_one_dimensional_position_is_rope_with_negative_angle():
    """App. F: a 1-D position rotates (v_x, v_z) of each triple like RoPE with angle −θ; v_y is untouched."""
    g = torch.Generator().manual_seed(3)
    D, L = 18, 11
    p = torch.arange(L, dtype=torch.float32)[:, None] * 1.5 - 4
    x = torch.randn(2, 2, L, D, generator=g)
    out = apply_geope(x, geope_rotation(p, D))
    theta = p * geope_frequencies(D)[None, :]  # (L, n)
    pairs = torch.stack((x[..., 0::3], x[..., 2::3]), -1).flatten(-2)  # (v_x, v_z) interleaved
    rope = apply_rotary(pairs, torch.cos(-theta), torch.sin(-theta), channels="interleaved")
    torch.testing.assert_close(out[..., 0::3], rope[..., 0::2])
    torch.testing.assert_close(out[..., 2::3], rope[..., 1::2])
    torch.testing.assert_close(out[..., 1::3], x[..., 1::3])


def test_swapping_h_and_w_relabels_the_j_and_k_components():
    """§3.2 symmetry: R(w, h) = Q R(h, w) Qᵀ with Q the proper rotation (x, y, z) → (−x, z, y).

    So neither axis is privileged: exchanging the two coordinates is the same as exchanging the j and k
    channels of every triple (and negating i). The naive product r_h r_w does not have this property.
    """
    g = torch.Generator().manual_seed(4)
    D, L = 12, 10
    coords = torch.randint(-5, 6, (L, 2), generator=g).float()
    x = torch.randn(1, 2, L, D, generator=g, dtype=torch.float64)
    Q = torch.tensor([[-1.0, 0, 0], [0, 0, 1], [0, 1, 0]], dtype=torch.float64)

    def conj(fn, y):  # Q · fn(Qᵀ y) on every triple
        t = y.unflatten(-1, (D // 3, 3))
        return (fn((t @ Q).flatten(-2)).unflatten(-1, (D // 3, 3)) @ Q.T).flatten(-2)

    swapped = apply_geope(x, geope_rotation(coords.flip(-1).double(), D))
    via_q = conj(lambda y: apply_geope(y, geope_rotation(coords.double(), D)), x)
    torch.testing.assert_close(swapped, via_q)

    # the naive composition r_h r_w fails the same check (so the check is not vacuous)
    f = geope_frequencies(D).double()

    def naive(c):
        th, tw = c[:, None, 0] * f, c[:, None, 1] * f
        rh = torch.stack((torch.cos(th / 2), 0 * th, torch.sin(th / 2), 0 * th), -1)
        rw = torch.stack((torch.cos(tw / 2), 0 * tw, 0 * tw, torch.sin(tw / 2)), -1)
        return qmul(rh, rw)

    naive_swapped = sandwich(x, naive(coords.flip(-1).double()))
    naive_via_q = conj(lambda y: sandwich(y, naive(coords.double())), x)
    assert (naive_swapped - naive_via_q).abs().max() > 1e-2


def test_three_axes_are_symmetric_under_cyclic_relabelling():
    """Eq. 5: cycling (d, h, w) → (h, w, d) equals cycling the (i, j, k) components of every triple."""
    g = torch.Generator().manual_seed(5)
    D, L = 9, 8
    coords = torch.randint(-4, 5, (L, 3), generator=g).double()
    x = torch.randn(1, 1, L, D, generator=g, dtype=torch.float64)
    out = apply_geope(x, geope_rotation(coords[:, [1, 2, 0]], D))
    perm = [1, 2, 0]  # C: (a, b, c) → (b, c, a)
    inv = [2, 0, 1]
    inner = apply_geope(x.unflatten(-1, (3, 3))[..., inv].flatten(-2), geope_rotation(coords, D))
    torch.testing.assert_close(out, inner.unflatten(-1, (3, 3))[..., perm].flatten(-2))


# ---- numerics ----------------------------------------------------------------------------------------

def test_zero_position_is_exact_identity_with_finite_gradients():
    coords = torch.zeros(3, 2, requires_grad=True)
    x = torch.randn(1, 2, 3, 7, requires_grad=True)
    out = apply_geope(x, geope_rotation(coords, 7))
    assert torch.equal(out, x)
    out.square().sum().backward()
    assert torch.isfinite(coords.grad).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(x.grad, 2 * x.detach())


def test_gradient_wrt_positions_is_exact_near_and_at_zero():
    """The Taylor branch keeps d(output)/d(position) correct at 0 (checked by float64 finite differences)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 1, 3, 6, generator=g, dtype=torch.float64)
    w = torch.randn(1, 1, 3, 6, generator=g, dtype=torch.float64)
    for base in (0.0, 1e-3, 0.3):
        coords = torch.full((3, 3), base, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(lambda c: (apply_geope(x, geope_rotation(c, 6)) * w).sum(), (coords,))


def test_rodrigues_coefficients_match_closed_forms_across_the_branch():
    t = torch.tensor([0.0, 1e-4, 5e-3, 9.9e-3, 1.01e-2, 0.1, 1.0, 3.0, 40.0], dtype=torch.float64)
    c, s, v = rodrigues_coefficients(t * t)
    safe = torch.where(t > 0, t, torch.ones_like(t))
    torch.testing.assert_close(c, torch.cos(t))
    torch.testing.assert_close(s, torch.where(t > 0, torch.sin(t) / safe, torch.ones_like(t)))
    torch.testing.assert_close(v, torch.where(t > 0, (1 - torch.cos(t)) / safe**2, torch.full_like(t, 0.5)))


# ---- layouts and dtypes ------------------------------------------------------------------------------

def test_layouts_batch_positions_and_dtype():
    g = torch.Generator().manual_seed(7)
    B, H, L, D = 2, 3, 5, 9
    coords = torch.randn(B, L, 2, generator=g) * 4
    x = torch.randn(B, H, L, D, generator=g)
    rot = geope_rotation(coords, D)
    out = apply_geope(x, rot)
    for b in range(B):  # per-batch positions equal applying each batch's own rotation
        torch.testing.assert_close(out[b : b + 1], apply_geope(x[b : b + 1], geope_rotation(coords[b], D)))
    torch.testing.assert_close(apply_geope(x.transpose(1, 2), rot, seq_dim=1), out.transpose(1, 2))
    shared = geope_rotation(coords[0], D)
    torch.testing.assert_close(apply_geope(x.transpose(1, 2), shared, seq_dim=1),
                               apply_geope(x, shared).transpose(1, 2))
    xb = x.bfloat16()
    ob = apply_geope(xb, rot)
    assert ob.dtype == torch.bfloat16
    torch.testing.assert_close(ob.float(), apply_geope(xb.float(), rot), atol=0.02, rtol=0.01)
    q, k = apply_geope_qk(x, x * 2, rot)
    torch.testing.assert_close(k, 2 * q)


@pytest.mark.parametrize("D", [12, 14])  # every channel rotated (merged rows) / two pass-through channels
def test_blocked_eager_path_matches_quaternion_reference(monkeypatch, D):
    """The cache-blocked eager path (many blocks, a ragged last one) against the float64 sandwich product,
    in both q/k layouts, batched positions, bfloat16, a non-contiguous input and a rotation built by hand
    (no precomputed channel coefficients); and equal to the autograd path to float32 rounding."""
    import ropekit.apply.geope as geo
    from ropekit.rotations.geope import GeoPERotation

    monkeypatch.setattr(geo, "_BLOCK_ELEMS", 216)  # blocks of 3 (D = 12) or 2 (D = 14) tokens: L = 13 is ragged
    g = torch.Generator().manual_seed(8)
    B, H, L = 2, 3, 13
    coords = torch.randn(B, L, 3, generator=g) * 5
    x = torch.randn(B, H, L, D, generator=g)
    freqs = geope_frequencies(D)
    ref = torch.stack([sandwich(x[b], reference_quaternion(coords[b], freqs)) for b in range(B)])
    rot = geope_rotation(coords, D)
    tol = dict(atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(apply_geope(x, rot).double(), ref, **tol)
    torch.testing.assert_close(apply_geope(x.transpose(1, 2).contiguous(), rot, seq_dim=1).transpose(1, 2).double(), ref, **tol)
    torch.testing.assert_close(apply_geope(x.transpose(1, 2), rot, seq_dim=1).transpose(1, 2).double(), ref, **tol)
    bare = GeoPERotation(rot.vector, rot.cos, rot.sinc, rot.versc)
    torch.testing.assert_close(apply_geope(x, bare).double(), ref, **tol)
    xg = x.clone().requires_grad_(True)
    torch.testing.assert_close(apply_geope(x, rot), apply_geope(xg, rot).detach(), atol=1e-6, rtol=1e-6)
    xb = x.bfloat16()
    refb = torch.stack([sandwich(xb[b].double(), reference_quaternion(coords[b], freqs)) for b in range(B)])
    ob = apply_geope(xb, rot)
    assert ob.dtype == torch.bfloat16
    torch.testing.assert_close(ob.double(), refb.bfloat16().double(), atol=0.02, rtol=0.01)
    shared = geope_rotation(coords[0], D)
    ref0 = sandwich(x, reference_quaternion(coords[0], freqs))
    torch.testing.assert_close(apply_geope(x, shared).double(), ref0, **tol)
    # the form used under torch.compile (traced there; run eagerly here), also differentiable in x
    traced = geo._rotate_coeff_functional(xg, rot.triples, D // 3, -2)
    torch.testing.assert_close(traced.detach().double(), ref, **tol)
    traced.square().sum().backward()  # rotations preserve each triple's norm, so d‖Rx‖²/dx = 2x there
    torch.testing.assert_close(xg.grad[..., : 3 * (D // 3)], 2 * x[..., : 3 * (D // 3)])


def test_packed_triple_weights_are_the_rotation_matrix_entries():
    """``triple_weights`` holds, per triple, R[c, c], then R[c, c±1], then the farther entry, where R is the
    float64 rotation matrix of the quaternion sandwich (columns = images of the basis vectors)."""
    from ropekit.rotations.geope import triple_weights

    g = torch.Generator().manual_seed(3)
    D, L = 9, 5
    coords = torch.randn(L, 3, generator=g) * 4
    r = reference_quaternion(coords, geope_frequencies(D))
    basis = torch.eye(3, dtype=torch.float64)
    # column d of R_(l, i) = sandwich of basis vector d placed in triple i
    cols = torch.stack([sandwich(basis[d].repeat(D // 3).expand(L, D), r).unflatten(-1, (D // 3, 3))
                        for d in range(3)], -1)  # (L, n, c, d) = R[c, d]
    order = [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0), (2, 2), (2, 1), (2, 0)]
    expected = torch.stack([cols[..., c, d] for c, d in order], -1)
    rot = geope_rotation(coords, D)
    torch.testing.assert_close(rot.triples.double(), expected, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(triple_weights(rot.coeffs), rot.triples, atol=0, rtol=0)


# ---- bad input ---------------------------------------------------------------------------------------

def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="head_dim.*>= 3"):
        geope_frequencies(2)
    with pytest.raises(TypeError, match="head_dim"):
        geope_frequencies(6.0)
    with pytest.raises(ValueError, match="freq_style"):
        geope_frequencies(6, freq_style="increasing")
    with pytest.raises(ValueError, match="lam"):
        geope_frequencies(6, lam=0)
    with pytest.raises(ValueError, match="1 .*2 .*or 3"):
        geope_rotation(torch.zeros(4, 4), 6)
    with pytest.raises(ValueError, match="NaN"):
        geope_rotation(torch.tensor([[0.0, float("nan")]]), 6)
    with pytest.raises(ValueError, match="head_dim must be >= 3"):
        apply_geope(torch.zeros(1, 1, 1, 2), geope_rotation(torch.zeros(1, 2), 3))
    with pytest.raises(ValueError, match="head_dim=6"):
        apply_geope(torch.zeros(1, 1, 1, 6), geope_rotation(torch.zeros(1, 2), 9))
    with pytest.raises(ValueError, match="sequence length 3"):
        apply_geope(torch.zeros(1, 1, 3, 6), geope_rotation(torch.zeros(2, 2), 6))
    with pytest.raises(TypeError, match="geope_rotation"):
        apply_geope(torch.zeros(1, 1, 2, 6), torch.zeros(2, 2, 3))
    with pytest.raises(TypeError, match="floating-point"):
        apply_geope(torch.zeros(1, 1, 2, 6, dtype=torch.long), geope_rotation(torch.zeros(2, 2), 6))


def test_blocked_eager_path_threaded_equals_serial(monkeypatch):
    """With 2 torch threads the blocks run on worker threads: the same bits as one thread, for 7 blocks
    (an odd count, ragged last one), and a NaN in one token still reaches only its own triple."""
    import ropekit.apply.geope as geo

    monkeypatch.setattr(geo, "_BLOCK_ELEMS", 2 * 3 * 2 * 12)  # 2 tokens per block: L = 13 is 7 blocks
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 3, 13, 12, generator=g).bfloat16()
    x[1, 2, 6, 4] = float("nan")  # token 6, triple 1 (channels 3..5)
    rot = geope_rotation(torch.randn(13, 2, generator=g) * 4, 12)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = apply_geope(x, rot)
        torch.set_num_threads(2)
        threaded = apply_geope(x, rot)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(threaded.isnan(), serial.isnan())
    assert torch.equal(threaded.nan_to_num(), serial.nan_to_num())
    bad = threaded.isnan().nonzero().tolist()
    assert bad and all((b, h, l) == (1, 2, 6) and 3 <= c < 6 for b, h, l, c in bad)
