"""LieRE, ComRoPE and GRAPE (learned rotation families) against float64 brute force, invariants and RoPE."""
import math

import pytest
import torch
from torch.func import functional_call

import ropekit
from ropekit.apply.blocks import apply_block_rotation, apply_plane_rotation
from ropekit.analysis.relative import relative_error, rotary_score, score_scale
from ropekit.rotations.grape import grape_frequency_matrix, plane_generator
from ropekit.rotations.lie import block_rotation, commutator_norm, skew
from ropekit.rotations.planar import frequency_matrix, inv_freq


def expm_taylor(M: torch.Tensor, terms: int = 40) -> torch.Tensor:
    """float64 matrix exponential by scaling and squaring a Taylor series (independent of matrix_exp)."""
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


def full_generators(G: torch.Tensor) -> torch.Tensor:
    """Per-axis block generators (A, n, b, b) → full block-diagonal (A, D, D), float64."""
    return torch.stack([torch.block_diag(*G[a].double()) for a in range(G.shape[0])])


def brute_block(q: torch.Tensor, coords: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """R(p) q with R(p) = exp(Σ_a p_a G_a) built as one D × D matrix per token; q (B, H, L, D)."""
    F = full_generators(G)
    R = torch.stack([expm_taylor((p.double()[:, None, None] * F).sum(0)) for p in coords])  # (L, D, D)
    return torch.einsum("lij,bhlj->bhli", R, q.double())


COORDS = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 3.0], [2.0, 5.0], [-1.5, 0.25], [7.0, 6.0]])
FAMILIES = {
    "liere-dense": lambda: ropekit.LieRE(16, seed=0),
    "liere-blocks": lambda: ropekit.LieRE(16, block_size=4, seed=1),
    "comrope-ld": lambda: ropekit.ComRoPE(16, seed=2),
    "comrope-ap": lambda: ropekit.ComRoPE(16, variant="ap", seed=3),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_block_families_match_float64_brute_force(name):
    rot = FAMILIES[name]()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, len(COORDS), 16, generator=g), torch.randn(2, 3, len(COORDS), 16, generator=g)
    rq, rk = rot.rotate(q, k, COORDS)
    G = rot.generators().detach()
    torch.testing.assert_close(rq.double(), brute_block(q, COORDS, G), rtol=0, atol=2e-5)
    torch.testing.assert_close(rk.double(), brute_block(k, COORDS, G), rtol=0, atol=2e-5)
    # a rotation: norms kept; p = 0 (the first token) is exactly the identity
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), rtol=1e-5, atol=1e-5)
    assert torch.equal(rq[:, :, 0], q[:, :, 0])


def test_generators_are_skew_and_block_structured():
    for name, make in FAMILIES.items():
        G = make().generators().detach()
        assert torch.equal(G, -G.transpose(-1, -2)), name
    ap = ropekit.ComRoPE(24, num_axes=3, variant="ap", block_size=6, seed=0).generators().detach()
    for a in range(3):  # axis a lives only on its own 2 × 2 sub-block of every 6-channel block
        mask = torch.zeros(6, 6, dtype=torch.bool)
        mask[2 * a:2 * a + 2, 2 * a:2 * a + 2] = True
        assert torch.all(ap[a][:, ~mask] == 0) and torch.any(ap[a][:, mask] != 0)


def test_comrope_generators_commute_and_liere_do_not():
    for variant in ("ap", "ld"):
        rot = ropekit.ComRoPE(16, variant=variant, seed=4).double()  # float64: no rounding in λ_a · P
        G = rot.generators().detach()
        assert commutator_norm(G) < 1e-12
        # commuting: exp(Σ p_a G_a) = Π_a exp(p_a G_a)
        F, p = full_generators(G), torch.tensor([2.0, -3.0], dtype=torch.float64)
        joint = expm_taylor(p[0] * F[0] + p[1] * F[1])
        torch.testing.assert_close(joint, expm_taylor(p[0] * F[0]) @ expm_taylor(p[1] * F[1]), rtol=0, atol=1e-12)
    assert commutator_norm(ropekit.LieRE(16, seed=0).generators()) > 1e-2


@pytest.mark.parametrize(
    "make, exact",
    [
        (lambda: ropekit.ComRoPE(32, variant="ld", seed=0), True),
        (lambda: ropekit.ComRoPE(32, variant="ap", seed=0), True),
        (lambda: ropekit.ComRoPE(32, variant="ap", num_heads=2, seed=0), True),
        (lambda: ropekit.LieRE(32, block_size=2, seed=0), True),  # 2 × 2 blocks always commute
        (lambda: ropekit.GRAPE(32, 2, mode="interleaved", init_scale=0.5, seed=0), True),
        (lambda: ropekit.GRAPE(32, 3, init_scale=0.5, num_heads=2, learn_frequencies=True, seed=1), True),
        (lambda: ropekit.LieRE(32, seed=0), False),
        (lambda: ropekit.LieRE(32, block_size=8, num_heads=2, seed=0), False),
    ],
)
def test_relative_error(make, exact):
    rot = make()
    kw = dict(num_axes=rot.num_axes, head_dim=32, num_trials=64)
    ratio = relative_error(rotary_score(rot), **kw) / score_scale(rotary_score(rot), **kw)
    if exact:
        assert ratio < 1e-4  # float32 rounding of the matrix exponential / rotation
    else:
        assert ratio > 0.05  # non-commuting generators: the score depends on absolute positions


def test_gradcheck_float64_functional_and_module():
    g = torch.Generator().manual_seed(0)
    coords = torch.tensor([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]], dtype=torch.float64)
    x = torch.randn(1, 2, 3, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = (0.3 * torch.randn(2, 2, 3, 3, dtype=torch.float64, generator=g)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: apply_block_rotation(x, block_rotation(coords, skew(w))), (x, w))

    lie = ropekit.LieRE(6, block_size=3, seed=0).double()
    wl = lie.weight.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: functional_call(lie, {"weight": w}, (x, x, coords))[0], (x, wl))

    com = ropekit.ComRoPE(6, variant="ld", block_size=3, seed=0).double()
    ws, wa = (t.detach().clone().requires_grad_() for t in (com.weight, com.axis_scale))
    assert torch.autograd.gradcheck(
        lambda x, w, a: functional_call(com, {"weight": w, "axis_scale": a}, (x, x, coords))[1], (x, ws, wa))

    grape = ropekit.GRAPE(6, 2, mode="interleaved", init_scale=0.5, learn_frequencies=True, seed=0).double()
    wg, wf = (t.detach().clone().requires_grad_() for t in (grape.weight, grape.freqs))
    assert torch.autograd.gradcheck(
        lambda x, w, f: functional_call(grape, {"weight": w, "freqs": f}, (x, x, coords))[0], (x, wg, wf))


def test_state_dict_round_trip():
    q = torch.randn(1, 2, len(COORDS), 16)
    for make in (lambda s: ropekit.LieRE(16, num_heads=2, seed=s), lambda s: ropekit.ComRoPE(16, seed=s),
                 lambda s: ropekit.ComRoPE(16, variant="ap", seed=s),
                 lambda s: ropekit.GRAPE(16, 2, mode="interleaved", init_scale=0.5, seed=s)):
        a, b = make(0), make(1)
        assert not torch.equal(a.rotate(q, q, COORDS)[0], b.rotate(q, q, COORDS)[0])
        b.load_state_dict(a.state_dict())
        assert torch.equal(a.rotate(q, q, COORDS)[0], b.rotate(q, q, COORDS)[0])
    sd = ropekit.GRAPE(16, 2, mode="interleaved").state_dict()
    assert set(sd) == {"weight"}  # the fixed frequency matrix is a function of the arguments, not a weight
    assert set(ropekit.GRAPE(16, 2, mode="interleaved", learn_frequencies=True).state_dict()) == {"weight", "freqs"}


@pytest.mark.parametrize("mode, allocation", [("chunked", "mrope"), ("interleaved", "interleaved")])
def test_grape_canonical_is_mrope_or_interleaved(mode, allocation):
    W = grape_frequency_matrix(mode, 128, 3)
    assert torch.equal(W, frequency_matrix(allocation, 128, 3))  # same axis map, same float32 spectrum
    coords = ropekit.positions("T3 I4x6 T2", "mrope")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, len(coords), 128, generator=g), torch.randn(2, 4, len(coords), 128, generator=g)
    ref = ropekit.RoPE("mrope", head_dim=128, allocation=allocation).rotate(q, k, coords)
    canonical = ropekit.GRAPE(128, 3, mode=mode, learned=False).rotate(q, k, coords)
    learned_at_init = ropekit.GRAPE(128, 3, mode=mode).rotate(q, k, "T3 I4x6 T2")  # planes start canonical
    for r, c, l in zip(ref, canonical, learned_at_init):
        assert torch.equal(c, r)  # canonical planes: bit for bit
        torch.testing.assert_close(l, r, rtol=0, atol=1e-5)  # Q = I through the plane path: x + (RoPE(x) − x)


def test_grape_adjacent_pairs_match_interleaved_channel_rope():
    coords = ropekit.positions("T2 I3x4", "mrope")
    q = torch.randn(1, 2, len(coords), 32, generator=torch.Generator().manual_seed(0))
    ref = ropekit.RoPE("mrope", head_dim=32, allocation="interleaved", channels="interleaved").rotate(q, q, coords)[0]
    canonical = ropekit.GRAPE(32, 3, mode="interleaved", channels="interleaved", learned=False)
    assert torch.equal(canonical.rotate(q, q, coords)[0], ref)
    at_init = ropekit.GRAPE(32, 3, mode="interleaved", channels="interleaved")
    torch.testing.assert_close(at_init.rotate(q, q, coords)[0], ref, rtol=0, atol=1e-5)
    assert not torch.allclose(ropekit.GRAPE(32, 3, mode="interleaved").rotate(q, q, coords)[0], ref, atol=1e-2)


def test_grape_spectrum_options():
    W = grape_frequency_matrix("interleaved", 16, 2, base=100.0, log_freq_scale=2.0)
    expected = inv_freq(16, 100.0).double() ** 0.5
    torch.testing.assert_close(W.sum(0).double(), expected, rtol=1e-6, atol=0)
    W = grape_frequency_matrix("chunked", 16, 3, sections=[2, 3, 3])
    assert (W != 0).float().argmax(0).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("channels", ["half", "interleaved"])
def test_grape_learned_planes_match_rank2_generators(channels):
    rot = ropekit.GRAPE(8, 2, mode="interleaved", rotary_dim=6, init_scale=0.8, seed=5, channels=channels)
    U = rot.basis().detach().double()  # (8, 6): orthonormal columns
    torch.testing.assert_close(U.T @ U, torch.eye(6, dtype=torch.float64), rtol=0, atol=1e-6)
    W = rot.freqs.double()
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, len(COORDS), 8, generator=g)
    rq, _ = rot.rotate(q, q, COORDS)
    for l, p in enumerate(COORDS.double()):
        theta = p @ W  # plane angles (3,)
        L = sum(theta[j] * plane_generator(U[:, j], U[:, j + 3]) for j in range(3))
        ref = q[:, :, l].double() @ expm_taylor(L).T
        torch.testing.assert_close(rq[:, :, l].double(), ref, rtol=0, atol=1e-5)
    # the orthogonal complement of the planes (2 channels' worth) is left alone
    perp = torch.linalg.svd(U.T, full_matrices=True).Vh[6:].T  # (8, 2), orthogonal to every plane
    torch.testing.assert_close((rq.double() @ perp), (q.double() @ perp), rtol=0, atol=1e-5)


def test_layouts_batches_heads_and_seq_dim():
    rot = ropekit.LieRE(16, block_size=8, num_heads=3, seed=0)
    coords = ropekit.positions("G2x3", "rope2d")
    q = torch.randn(2, 3, 6, 16)
    torch.testing.assert_close(rot.rotate(q, q, "G2x3")[0], rot.rotate(q, q, coords)[0], rtol=0, atol=0)
    # (B, L, H, D) with seq_dim=1 is the same rotation
    out = rot.rotate(q.transpose(1, 2), q.transpose(1, 2), coords, seq_dim=1)[0]
    torch.testing.assert_close(out.transpose(1, 2), rot.rotate(q, q, coords)[0], rtol=0, atol=0)
    # per-sample coordinates (B, L, A) equal rotating each sample on its own
    batched = torch.stack([coords, coords.flip(0) * 2])
    for r in (rot, ropekit.ComRoPE(16), ropekit.GRAPE(16, 2, mode="interleaved", init_scale=0.3)):
        out = r.rotate(q, q, batched)[0]
        for b in range(2):
            torch.testing.assert_close(out[b:b + 1], r.rotate(q[b:b + 1], q[b:b + 1], batched[b])[0], rtol=0,
                                       atol=1e-6)
    # low-precision input keeps its dtype; the maths runs in float32
    qb = q.bfloat16()
    out = ropekit.ComRoPE(16, seed=0).rotate(qb, qb, coords)[0]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ropekit.ComRoPE(16, seed=0).rotate(qb.float(), qb.float(), coords)[0],
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("make", [
    lambda i: ropekit.LieRE(24, block_size=8, seed=i),
    lambda i: ropekit.ComRoPE(24, variant="ap", seed=i),
    lambda i: ropekit.GRAPE(24, 2, mode="interleaved", init_scale=0.2, seed=i),
])
def test_tinyvit_forward_backward(make):
    torch.manual_seed(0)
    model = ropekit.nn.TinyViT(image_size=16, patch=4, dim=48, depth=2, heads=2, rotary_factory=make)
    rotary_params = [p for n, p in model.named_parameters() if ".rotary." in n]
    assert rotary_params  # the generators are the model's parameters
    loss = torch.nn.functional.cross_entropy(model(torch.randn(3, 3, 16, 16)), torch.tensor([0, 1, 2]))
    loss.backward()
    assert torch.isfinite(loss)
    for p in rotary_params:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


@pytest.mark.parametrize("call, exc, word", [
    (lambda: ropekit.LieRE(16, block_size=5), ValueError, "block_size"),
    (lambda: ropekit.LieRE(16.0), TypeError, "head_dim"),
    (lambda: ropekit.LieRE(16, num_axes=0), ValueError, "num_axes"),
    (lambda: ropekit.LieRE(16, init_scale=float("nan")), ValueError, "init_scale"),
    (lambda: ropekit.ComRoPE(16, variant="xx"), ValueError, "variant"),
    (lambda: ropekit.ComRoPE(16, num_axes=3, variant="ap", block_size=4), ValueError, "block_size"),
    (lambda: ropekit.GRAPE(16, 3, mode="axis"), ValueError, "mode"),
    (lambda: ropekit.GRAPE(16, 3, rotary_dim=7), ValueError, "rotary_dim"),
    (lambda: ropekit.GRAPE(24, 3), ValueError, "sections"),
    (lambda: ropekit.GRAPE(16, 3, sections=[1, 2, 3]), ValueError, "sections"),
    (lambda: ropekit.GRAPE(16, 3, learned=False, num_heads=2), ValueError, "num_heads"),
    (lambda: ropekit.GRAPE(16, 3, learned=1), TypeError, "learned"),
    (lambda: ropekit.GRAPE(16, 3, channels="adjacent"), ValueError, "channels"),
    (lambda: ropekit.LieRE(16).rotate(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), torch.zeros(3, 3)),
     ValueError, "coords"),
    (lambda: ropekit.LieRE(16).rotate(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16),
                                      torch.tensor([[0.0, 1.0], [float("nan"), 0.0], [1.0, 1.0]])), ValueError, "coords"),
    (lambda: ropekit.LieRE(16).rotate(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.zeros(3, 2)),
     ValueError, "head_dim"),
    (lambda: ropekit.LieRE(16).rotate(torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16), torch.zeros(3, 2)),
     ValueError, "sequence length"),
    (lambda: ropekit.LieRE(16, num_heads=4).rotate(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16),
                                                   torch.zeros(3, 2)), ValueError, "num_heads"),
    (lambda: ropekit.ComRoPE(16).rotate(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16), [[0, 0]] * 3),
     TypeError, "coords"),
    (lambda: ropekit.ComRoPE(16, design="mrope").rotate(torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16), "T6"),
     ValueError,
     "num_axes"),
    (lambda: ropekit.GRAPE(16, 2, mode="interleaved").rotate(torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16),
                                                             torch.zeros(3, 2), seq_dim=0), ValueError, "seq_dim"),
    (lambda: rotary_score(object()), TypeError, "rotary"),
])
def test_bad_input_names_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call()
