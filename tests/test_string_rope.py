"""STRING (Cayley and circulant): the properties the paper proves, and both constructions in float64."""
import math

import pytest
import torch
from torch.func import functional_call

import ropekit
from ropekit.analysis.relative import relative_error, rotary_score, score_scale
from ropekit.nn import STRING


def expm64(M: torch.Tensor, terms: int = 40) -> torch.Tensor:
    """float64 matrix exponential of (..., n, n) by scaling and squaring a Taylor series."""
    M = M.double()
    norm = float(M.abs().sum(-1).max()) if M.numel() else 0.0
    s = max(0, math.ceil(math.log2(norm)) + 1) if norm > 0.5 else 0
    A = M / 2 ** s
    out = term = torch.eye(M.shape[-1], dtype=torch.float64).expand_as(M).clone()
    for n in range(1, terms):
        term = term @ A / n
        out = out + term
    for _ in range(s):
        out = out @ out
    return out


def rope_matrix64(p: torch.Tensor, W: torch.Tensor, channels: str) -> torch.Tensor:
    """Dense D × D RoPE at coordinates p (A,): pair j turns by θ_j = p · W[:, j]; pairs (j, j + D/2) or
    (2j, 2j + 1)."""
    theta = p.double() @ W.double()
    half = theta.numel()
    R = torch.eye(2 * half, dtype=torch.float64)
    for j in range(half):
        a, b = (j, j + half) if channels == "half" else (2 * j, 2 * j + 1)
        c, s = math.cos(theta[j]), math.sin(theta[j])
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def cayley64(weight: torch.Tensor) -> torch.Tensor:
    """(I − S)(I + S)⁻¹ with S = weight − weightᵀ, in float64 with an explicit inverse."""
    S = weight.double() - weight.double().transpose(-1, -2)
    eye = torch.eye(S.shape[-1], dtype=torch.float64)
    return (eye - S) @ torch.linalg.inv(eye + S)


def circulant_generator64(c: torch.Tensor) -> torch.Tensor:
    """L = C − Cᵀ for the circulant C with C[i, j] = c[(i − j) mod b], filled entry by entry."""
    b = c.numel()
    C = torch.empty(b, b, dtype=torch.float64)
    for i in range(b):
        for j in range(b):
            C[i, j] = float(c[(i - j) % b])
    return C - C.T


def circulant_rotation64(p: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Dense D × D block-diagonal exp(Σ_a p_a L_a) from weight (A, n, b)."""
    A, n, _ = weight.shape
    blocks = [expm64(sum(float(p[a]) * circulant_generator64(weight[a, m]) for a in range(A))) for m in range(n)]
    return torch.block_diag(*blocks)


def maps(rot: STRING, coords: torch.Tensor, heads: int = 1) -> torch.Tensor:
    """The module's own D × D map per head and token, read off by rotating the basis vectors: (H, L, D, D)."""
    D, L = rot.head_dim, coords.shape[0]
    eye = torch.eye(D, dtype=rot.weight.dtype)
    basis = eye[:, None, None, :].expand(D, heads, L, D)  # batch entry i is e_i at every head and token
    out, _ = rot.rotate(basis, basis, coords)
    return out.permute(1, 2, 3, 0)  # column i = R e_i


VARIANTS = {
    "cayley": lambda A, **kw: STRING(24, A, init_scale=0.7, **kw),
    "cayley-interleaved-pairs": lambda A, **kw: STRING(24, A, init_scale=0.7, channels="interleaved", base=100.0,
                                                       **kw),
    "circulant": lambda A, **kw: STRING(24, A, variant="circulant", **kw),
    "circulant-blocks": lambda A, **kw: STRING(24, A, variant="circulant", block_size=8, init_scale=1.0, **kw),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("num_axes", [2, 3])
def test_every_map_is_orthogonal_to_float32_precision(name, num_axes):
    rot = VARIANTS[name](num_axes, seed=0)
    coords = torch.randn(5, num_axes, generator=torch.Generator().manual_seed(1)) * 6
    R = maps(rot, coords).double()
    eye = torch.eye(24, dtype=torch.float64)
    assert (R.transpose(-1, -2) @ R - eye).abs().max() < 2e-6
    assert torch.allclose(torch.linalg.det(R), torch.ones((), dtype=torch.float64), atol=1e-5)  # rotations (det +1), no reflections
    if rot.variant == "cayley":
        P = rot.orthogonal().detach().double()
        assert (P.T @ P - eye).abs().max() < 2e-6 and abs(float(torch.linalg.det(P)) - 1) < 1e-5


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("num_axes", [2, 3])
def test_scores_depend_only_on_the_coordinate_difference(name, num_axes):
    """⟨R(m) q, R(n) k⟩ = ⟨R(m + δ) q, R(n + δ) k⟩ for random real coordinates and shifts; and it does depend
    on n − m (no trivial invariance)."""
    rot = VARIANTS[name](num_axes, seed=2)
    g = torch.Generator().manual_seed(3)
    L = 16
    q, k = torch.randn(1, 1, L, 24, generator=g), torch.randn(1, 1, L, 24, generator=g)
    m, n = torch.rand(L, num_axes, generator=g) * 20 - 10, torch.rand(L, num_axes, generator=g) * 20 - 10
    delta = torch.rand(num_axes, generator=g) * 30 - 15

    def scores(pm, pn):
        return rot.rotate(q, q, pm)[0][0, 0] @ rot.rotate(k, k, pn)[1][0, 0].T  # (L, L): all pairs

    base, shifted = scores(m, n), scores(m + delta, n + delta)
    rms = base.square().mean().sqrt()
    assert (shifted - base).abs().max() / rms < 2e-5
    moved = scores(m, n + torch.rand(num_axes, generator=g) + 0.5)
    assert (moved - base).abs().max() / rms > 1e-2
    kw = dict(num_axes=num_axes, head_dim=24, num_trials=64, integer_positions=False)
    assert relative_error(rotary_score(rot), **kw) / score_scale(rotary_score(rot), num_axes=num_axes,
                                                                 head_dim=24, num_trials=64) < 2e-5


@pytest.mark.parametrize("num_axes, design", [(2, "rope2d"), (3, "mrope")])
@pytest.mark.parametrize("channels", ["half", "interleaved"])
def test_cayley_at_zero_parameters_is_plain_rope(num_axes, design, channels):
    rot = STRING(32, num_axes, channels=channels)  # init_scale 0 (the Cayley default): S = 0, P = I
    assert torch.equal(rot.orthogonal(), torch.eye(32))
    rope = ropekit.RoPE(design, head_dim=32, allocation="interleaved", channels=channels)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 10, 32, generator=g), torch.randn(2, 3, 10, 32, generator=g)
    coords = torch.randn(10, num_axes, generator=g) * 8
    for got, want in zip(rot.rotate(q, k, coords), rope.rotate(q, k, coords)):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_circulant_at_zero_parameters_is_the_identity():
    """The paper's circulant STRING has no fixed RoPE in it: c = 0 leaves q and k unchanged."""
    rot = STRING(24, 3, variant="circulant", init_scale=0.0)
    q = torch.randn(2, 2, 7, 24)
    torch.testing.assert_close(rot.rotate(q, q, torch.randn(7, 3) * 9)[0], q, rtol=0, atol=1e-6)


@pytest.mark.parametrize("channels", ["half", "interleaved"])
def test_cayley_construction_against_float64(channels):
    rot = STRING(16, 3, init_scale=1.0, channels=channels, learn_frequencies=True, seed=4)
    with torch.no_grad():
        rot.freqs.mul_(1 + 0.3 * torch.randn(rot.freqs.shape, generator=torch.Generator().manual_seed(5)))
    P = cayley64(rot.weight.detach())
    torch.testing.assert_close(rot.orthogonal().detach().double(), P, rtol=0, atol=2e-6)
    g = torch.Generator().manual_seed(6)
    coords = torch.randn(6, 3, generator=g) * 5
    q = torch.randn(2, 2, 6, 16, generator=g)
    rq, _ = rot.rotate(q, q, coords)
    W = rot.freqs.detach()
    for l in range(6):
        M = rope_matrix64(coords[l], W, channels) @ P  # RoPE(r) · P_S
        torch.testing.assert_close(rq[:, :, l].double(), q[:, :, l].double() @ M.T, rtol=0, atol=3e-5)


@pytest.mark.parametrize("block_size", [24, 8, 6, 5])
def test_circulant_construction_against_float64(block_size):
    D = 24 if block_size != 5 else 20
    rot = STRING(D, 2, variant="circulant", block_size=block_size, init_scale=0.8, seed=7)
    w = rot.weight.detach()
    # the generators are the circulant skew-symmetric matrices, built here entry by entry
    G = rot.generators().detach().double()
    for a in range(2):
        for m in range(D // block_size):
            torch.testing.assert_close(G[a, m], circulant_generator64(w[a, m]), rtol=0, atol=1e-7)
    g = torch.Generator().manual_seed(8)
    coords = torch.randn(5, 2, generator=g) * 4
    q = torch.randn(1, 3, 5, D, generator=g)
    rq, rk = rot.rotate(q, q.flip(1), coords)
    for l in range(5):
        R = circulant_rotation64(coords[l], w)
        torch.testing.assert_close(rq[:, :, l].double(), q[:, :, l].double() @ R.T, rtol=0, atol=3e-5)
        torch.testing.assert_close(rk[:, :, l].double(), q.flip(1)[:, :, l].double() @ R.T, rtol=0, atol=3e-5)


def test_circulant_is_rope_in_the_real_fourier_basis():
    """Mode k of a block (u_k = cos(2πkm/b), v_k = sin(2πkm/b)) is a RoPE plane: R u = cos φ u − sin φ v and
    R v = sin φ u + cos φ v, φ = Σ_a r_a θ_ak, θ_ak = −2 Σ_m c_a[m] sin(2πkm/b) (float64 throughout)."""
    b = 10
    rot = STRING(20, 2, variant="circulant", block_size=b, seed=9).double()
    w = rot.weight.detach()
    m = torch.arange(b, dtype=torch.float64)
    theta = torch.stack([torch.stack([torch.stack([-2 * (w[a, n] * torch.sin(2 * math.pi * k * m / b)).sum()
                                                   for k in range(b // 2 + 1)]) for n in range(2)])
                         for a in range(2)])
    torch.testing.assert_close(rot.frequencies().detach(), theta, rtol=0, atol=1e-12)
    r = torch.tensor([[1.7, -2.4]], dtype=torch.float64)
    for n in range(2):
        for k in range(b // 2 + 1):
            u, v = torch.cos(2 * math.pi * k * m / b), torch.sin(2 * math.pi * k * m / b)
            x = torch.zeros(2, 1, 1, 20, dtype=torch.float64)
            x[0, 0, 0, n * b:(n + 1) * b], x[1, 0, 0, n * b:(n + 1) * b] = u, v
            out, _ = rot.rotate(x, x, r)
            phi = float(r[0] @ theta[:, n, k])
            Ru, Rv = out[0, 0, 0, n * b:(n + 1) * b], out[1, 0, 0, n * b:(n + 1) * b]
            torch.testing.assert_close(Ru, math.cos(phi) * u - math.sin(phi) * v, rtol=0, atol=1e-12)
            torch.testing.assert_close(Rv, math.sin(phi) * u + math.cos(phi) * v, rtol=0, atol=1e-12)
            if k in (0, b // 2):  # the constant and alternating modes never turn
                assert torch.all(rot.frequencies()[:, n, k] == 0)


@pytest.mark.parametrize("variant", ["cayley", "circulant"])
def test_per_head_weights_batches_layouts_and_seq_dim(variant):
    kw = dict(variant=variant, init_scale=0.5)
    rot = STRING(16, 2, num_heads=3, seed=0, **kw)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 6, 16, generator=g)
    coords = ropekit.positions("G2x3", "rope2d")
    out = rot.rotate(q, q, coords)[0]
    for h in range(3):  # head h is a shared module holding the head's weights
        one = STRING(16, 2, **kw)
        with torch.no_grad():
            one.weight.copy_(rot.weight[h])
        torch.testing.assert_close(out[:, h:h + 1], one.rotate(q[:, h:h + 1], q[:, h:h + 1], coords)[0],
                                   rtol=0, atol=1e-6)
    assert torch.equal(rot.rotate(q, q, "G2x3")[0], out)
    back = rot.rotate(q.transpose(1, 2), q.transpose(1, 2), coords, seq_dim=1)[0]
    torch.testing.assert_close(back.transpose(1, 2), out, rtol=0, atol=0)
    batched = torch.stack([coords, coords.flip(0) * 2.5])
    for r in (rot, STRING(16, 2, seed=1, **kw)):
        both = r.rotate(q, q, batched)[0]
        for b in range(2):
            torch.testing.assert_close(both[b:b + 1], r.rotate(q[b:b + 1], q[b:b + 1], batched[b])[0], rtol=0,
                                       atol=1e-6)
    qb = q.bfloat16()
    got = rot.rotate(qb, qb, coords)[0]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), rot.rotate(qb.float(), qb.float(), coords)[0], rtol=1e-2, atol=2e-2)


def test_gradcheck_and_state_dict():
    g = torch.Generator().manual_seed(0)
    coords = torch.tensor([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]], dtype=torch.float64)
    x = torch.randn(1, 2, 3, 6, dtype=torch.float64, generator=g, requires_grad=True)
    cay = STRING(6, 2, init_scale=0.5, learn_frequencies=True, seed=0).double()
    w, f = (t.detach().clone().requires_grad_() for t in (cay.weight, cay.freqs))
    assert torch.autograd.gradcheck(lambda x, w, f: functional_call(cay, {"weight": w, "freqs": f}, (x, x, coords))[0],
                                    (x, w, f))
    circ = STRING(6, 2, variant="circulant", block_size=3, num_heads=2, seed=0).double()
    wc = circ.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: functional_call(circ, {"weight": w}, (x, x, coords))[1], (x, wc),
                                    fast_mode=True)
    q = torch.randn(1, 2, 4, 16)
    pos = torch.randn(4, 2)
    for make in (lambda s: STRING(16, 2, init_scale=0.5, seed=s), lambda s: STRING(16, 2, variant="circulant", seed=s)):
        a, b = make(0), make(1)
        assert set(a.state_dict()) == {"weight"}  # the RoPE frequencies are a function of the arguments
        assert not torch.equal(a.rotate(q, q, pos)[0], b.rotate(q, q, pos)[0])
        b.load_state_dict(a.state_dict())
        assert torch.equal(a.rotate(q, q, pos)[0], b.rotate(q, q, pos)[0])
    assert set(STRING(16, 2, learn_frequencies=True).state_dict()) == {"weight", "freqs"}


@pytest.mark.parametrize("make", [
    lambda i: STRING(24, seed=i),  # starts as RoPE: the Cayley map still gets gradients at S = 0
    lambda i: STRING(24, variant="circulant", block_size=8, seed=i),
])
def test_tinyvit_forward_backward(make):
    torch.manual_seed(0)
    model = ropekit.nn.TinyViT(image_size=16, patch=4, dim=48, depth=2, heads=2, rotary_factory=make)
    rotary_params = [p for n, p in model.named_parameters() if ".rotary." in n]
    assert rotary_params
    loss = torch.nn.functional.cross_entropy(model(torch.randn(3, 3, 16, 16)), torch.tensor([0, 1, 2]))
    loss.backward()
    for p in rotary_params:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


@pytest.mark.parametrize("call, exc, word", [
    (lambda: STRING(16, variant="dense"), ValueError, "variant"),
    (lambda: STRING(15), ValueError, "head_dim"),
    (lambda: STRING(16.0), TypeError, "head_dim"),
    (lambda: STRING(16, 0), ValueError, "num_axes"),
    (lambda: STRING(16, channels="adjacent"), ValueError, "channels"),
    (lambda: STRING(16, allocation="diagonal"), ValueError, "allocation"),
    (lambda: STRING(16, init_scale=-0.1), ValueError, "init_scale"),
    (lambda: STRING(16, learn_frequencies=1), TypeError, "learn_frequencies"),
    (lambda: STRING(16, block_size=4), ValueError, "block_size"),
    (lambda: STRING(16, variant="circulant", block_size=5), ValueError, "block_size"),
    (lambda: STRING(16, variant="circulant", block_size=2), ValueError, "block_size"),
    (lambda: STRING(16, variant="circulant", learn_frequencies=True), ValueError, "learn_frequencies"),
    (lambda: STRING(16, num_heads=0), ValueError, "num_heads"),
    (lambda: STRING(16, variant="circulant").orthogonal(), ValueError, "orthogonal"),
    (lambda: STRING(16).generators(), ValueError, "generators"),
    (lambda: STRING(16).rotate(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), torch.zeros(3, 3)),
     ValueError, "coords"),
    (lambda: STRING(16, num_heads=4).rotate(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), torch.zeros(3, 2)),
     ValueError, "num_heads"),
    (lambda: STRING(16, design="mrope").rotate(torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16), "T6"),
     ValueError, "num_axes"),
    (lambda: STRING(16, variant="circulant").rotate(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8),
                                                    torch.zeros(3, 2)), ValueError, "head_dim"),
])
def test_bad_input_names_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call()
