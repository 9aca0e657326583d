"""FoPE (Fourier Position Embedding) against its formula in float64 and a re-derivation of vLLM's forward."""
import math

import pytest
import torch
from torch.func import functional_call

import ropekit
from ropekit.analysis.relative import relative_error, rotary_score, score_scale
from ropekit.nn import FoPE


def kept_frequencies(rotary_dim: int, base: float, train_len: int, num_inv_freq=None) -> torch.Tensor:
    """The paper's rule in float64: ω_f = base^(−2f/R); keep those whose period 2π/ω is below the training
    length (or the first num_inv_freq)."""
    omega = torch.tensor([base ** (-2.0 * f / rotary_dim) for f in range(rotary_dim // 2)], dtype=torch.float64)
    if num_inv_freq is not None:
        return omega[:num_inv_freq]
    return omega[2 * math.pi / omega < train_len]


def fope_float64(x: torch.Tensor, pos: torch.Tensor, omega: torch.Tensor, C: torch.Tensor, S: torch.Tensor):
    """x (B, H, L, D); pos (L,); C, S (F, F) shared or (G, F, F) per KV head (head j → group j // (H/G)).

    Pair d (channels d and d + D/2): d < F turns with c_d = Σ_f cos(ω_f t) C[f, d], s_d = Σ_f sin(ω_f t) S[f, d];
    d ≥ F is left alone. Written out element by element."""
    B, H, L, D = x.shape
    half, F = D // 2, omega.numel()
    x, C, S = x.double(), C.double(), S.double()
    out = x.clone()
    for l in range(L):
        t = float(pos[l])
        cw, sw = torch.cos(omega * t), torch.sin(omega * t)
        for h in range(H):
            Ch = C if C.ndim == 2 else C[h // (H // C.shape[0])]
            Sh = S if S.ndim == 2 else S[h // (H // S.shape[0])]
            for d in range(F):
                c, s = float((cw * Ch[:, d]).sum()), float((sw * Sh[:, d]).sum())
                a, b = x[:, h, l, d], x[:, h, l, d + half]
                out[:, h, l, d] = a * c - b * s
                out[:, h, l, d + half] = b * c + a * s
    return out


def scramble(module: FoPE, seed: int = 0, scale: float = 0.4) -> FoPE:
    """Coefficients far from the identity (what a trained FoPE has), so every Fourier term matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (module.cos_coef, module.sin_coef):
            p.add_(scale * torch.randn(p.shape, generator=g))
    return module


@pytest.mark.parametrize("kw", [
    dict(head_dim=32, max_position_embeddings=256),
    dict(head_dim=32, max_position_embeddings=256, num_kv_heads=2),
    dict(head_dim=48, max_position_embeddings=100, rotary_dim=32, base=500.0, num_kv_heads=1),
    dict(head_dim=16, max_position_embeddings=4096, num_inv_freq=5, num_kv_heads=2),
])
def test_matches_the_formula_in_float64(kw):
    rot = scramble(FoPE(**kw, seed=1))
    omega = kept_frequencies(kw.get("rotary_dim", kw["head_dim"]), kw.get("base", 10000.0),
                             kw["max_position_embeddings"], kw.get("num_inv_freq"))
    assert rot.num_freqs == omega.numel() and 0 < omega.numel() < kw["head_dim"] // 2
    torch.testing.assert_close(rot.inv_freq.double(), omega, rtol=1e-6, atol=0)
    g = torch.Generator().manual_seed(2)
    D, L = kw["head_dim"], 7
    pos = torch.tensor([0.0, 1.0, 5.0, 17.0, 63.5, 120.0, 199.0])
    q, k = torch.randn(2, 4, L, D, generator=g), torch.randn(2, 2, L, D, generator=g)  # GQA: 4 query, 2 KV heads
    if kw.get("num_kv_heads") == 1:
        k = k[:, :1]
    rq, rk = rot.rotate(q, k, pos)
    C, S = rot.cos_coef.detach(), rot.sin_coef.detach()
    torch.testing.assert_close(rq.double(), fope_float64(q, pos, omega, C, S), rtol=0, atol=3e-4)
    torch.testing.assert_close(rk.double(), fope_float64(k, pos, omega, C, S), rtol=0, atol=3e-4)
    # the zero-frequency pairs pass through bit for bit
    F, half = omega.numel(), D // 2
    for x, r in ((q, rq), (k, rk)):
        assert torch.equal(r[..., F:half], x[..., F:half]) and torch.equal(r[..., half + F:], x[..., half + F:])


def vllm_forward_expected(positions, query, key, head_size, inv_freq, cos_coef, sin_coef, sep_head):
    """vLLM's FourierRotaryEmbedding.forward_native, re-derived step by step in float64 (not its code).

    Its inputs are token-major: query (T, H_q · head_size), key (T, H_kv · head_size), positions (T,) ints.
    The cache row of position t holds, per KV head g, cos_full = [c, c] and sin_full = [s, s] with c, s the
    mixed series padded to head_size/2 by 1 (cos) and 0 (sin); with sep_head=False every head reads
    coefficient set 0. The query of token i is reshaped so that its heads form H_kv consecutive groups, group
    g reading KV row g; then x·cos_full + rotate_neox(x)·sin_full with rotate_neox(x) = [−x₂, x₁]."""
    T = positions.numel()
    Hkv = cos_coef.shape[0]
    half = head_size // 2
    q = query.double().reshape(T, -1, head_size)
    k = key.double().reshape(T, -1, head_size)
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    for i in range(T):
        t = int(positions[i])
        phase = t * inv_freq.double()
        rows = []
        for g in range(Hkv if sep_head else 1):
            c = torch.cos(phase) @ cos_coef[g].double()
            s = torch.sin(phase) @ sin_coef[g].double()
            c = torch.cat([c, torch.ones(half - c.numel(), dtype=torch.float64)])
            s = torch.cat([s, torch.zeros(half - s.numel(), dtype=torch.float64)])
            rows.append((torch.cat([c, c]), torch.cat([s, s])))
        for x, out in ((q, out_q), (k, out_k)):
            per_group = x.shape[1] // Hkv if sep_head else x.shape[1]
            for j in range(x.shape[1]):
                cf, sf = rows[j // per_group] if sep_head else rows[0]
                v = x[i, j]
                out[i, j] = v * cf + torch.cat([-v[half:], v[:half]]) * sf
    return out_q.reshape(T, -1), out_k.reshape(T, -1)


@pytest.mark.parametrize("sep_head", [True, False])
def test_matches_a_rederivation_of_vllms_forward(sep_head):
    """Same random weights in vLLM's layout: (H_kv, F, F) coefficients, token-major q/k, integer positions.
    ropekit's shared module (num_kv_heads=None) holds vLLM's coefficient set 0."""
    Hkv, Hq, D, T = 2, 6, 32, 9
    rot = FoPE(D, 512, base=10000.0, num_kv_heads=Hkv if sep_head else None, init_factor=0.5, seed=3)
    F = rot.num_freqs
    g = torch.Generator().manual_seed(4)
    cos_coef, sin_coef = torch.randn(Hkv, F, F, generator=g), torch.randn(Hkv, F, F, generator=g)
    with torch.no_grad():
        rot.cos_coef.copy_(cos_coef if sep_head else cos_coef[0])
        rot.sin_coef.copy_(sin_coef if sep_head else sin_coef[0])
    positions = torch.tensor([0, 3, 4, 11, 30, 100, 255, 400, 511])
    query, key = torch.randn(T, Hq * D, generator=g), torch.randn(T, Hkv * D, generator=g)
    eq, ek = vllm_forward_expected(positions, query, key, D, rot.inv_freq, cos_coef, sin_coef, sep_head)
    # ropekit: (B, H, L, D) with the tokens as one sequence
    q = query.reshape(T, Hq, D).transpose(0, 1)[None]
    k = key.reshape(T, Hkv, D).transpose(0, 1)[None]
    rq, rk = rot.rotate(q, k, positions.float())
    torch.testing.assert_close(rq[0].transpose(0, 1).reshape(T, -1).double(), eq, rtol=0, atol=5e-4)
    torch.testing.assert_close(rk[0].transpose(0, 1).reshape(T, -1).double(), ek, rtol=0, atol=5e-4)
    # the dropped frequencies are vLLM's: ω > 2π/max_position_embeddings, compared in float32
    full = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    assert torch.equal(rot.inv_freq, full[full > 2 * torch.pi / 512])


def test_identity_coefficients_are_rope_on_the_kept_frequencies():
    """C = S = I: RoPE on the F kept pairs and the identity on the rest, which is ropekit's proportional
    allocation with F rotated pairs (the standard spectrum, trailing columns zero)."""
    D = 64
    rot = FoPE(D, 512, num_kv_heads=2, init_factor=0.0)
    F = rot.num_freqs
    assert F == 16 and torch.equal(rot.cos_coef, torch.eye(F).expand(2, F, F))
    ref = ropekit.RoPE("vanilla", head_dim=D, allocation="proportional", sections=[F, D // 2 - F])
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 12, D, generator=g), torch.randn(2, 2, 12, D, generator=g)
    pos = torch.arange(12.0) * 37
    for got, want in zip(rot.rotate(q, k, pos), ref.rotate(q, k, pos[:, None])):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    kw = dict(num_axes=1, head_dim=D, num_trials=64)
    assert relative_error(rotary_score(rot), **kw) / score_scale(rotary_score(rot), **kw) < 1e-5


def test_mixed_coefficients_are_neither_rotations_nor_exactly_relative():
    """The Fourier series c_d, s_d are no cosine/sine of one angle: norms change and the score keeps some
    absolute position (the spectral mixing the paper models)."""
    rot = scramble(FoPE(32, 256, seed=0))
    kw = dict(num_axes=1, head_dim=32, num_trials=64)
    assert relative_error(rotary_score(rot), **kw) / score_scale(rotary_score(rot), **kw) > 0.05
    q = torch.randn(1, 1, 5, 32)
    rq, _ = rot.rotate(q, q, torch.arange(5.0) * 9)
    assert not torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), rtol=1e-3)


def test_initialisation_is_identity_plus_xavier_normal():
    F = FoPE(64, 512, num_kv_heads=8, init_factor=0.5, seed=0).num_freqs
    big = FoPE(64, 512, num_kv_heads=8, init_factor=0.5, seed=0)
    noise = big.cos_coef.detach() - torch.eye(F)
    expected = 0.5 * math.sqrt(2.0 / (F * F + 8 * F))  # torch's Xavier fans of an (8, F, F) tensor
    assert noise.std().item() == pytest.approx(expected, rel=0.1)
    shared = FoPE(64, 512, init_factor=0.5, seed=0).sin_coef.detach() - torch.eye(F)
    assert shared.std().item() == pytest.approx(0.5 / math.sqrt(F), rel=0.2)
    again = FoPE(64, 512, num_kv_heads=8, init_factor=0.5, seed=0)
    assert torch.equal(again.cos_coef, big.cos_coef) and not torch.equal(big.cos_coef, big.sin_coef)


def test_layouts_batches_seq_dim_and_dtype():
    rot = scramble(FoPE(32, 128, num_kv_heads=2, seed=0))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 6, 32, generator=g), torch.randn(2, 2, 6, 32, generator=g)
    ref = rot.rotate(q, k, torch.arange(6.0))
    for coords in ("T6", torch.arange(6.0)[:, None], torch.arange(6)):
        for a, b in zip(rot.rotate(q, k, coords), ref):
            assert torch.equal(a, b)
    out = rot.rotate(q.transpose(1, 2), k.transpose(1, 2), torch.arange(6.0), seq_dim=1)
    for a, b in zip(out, ref):
        torch.testing.assert_close(a.transpose(1, 2), b, rtol=0, atol=0)
    batched = torch.stack([torch.arange(6.0), torch.arange(6.0) * 3 + 2])[..., None]  # (B, L, 1)
    out = rot.rotate(q, k, batched)
    for b in range(2):
        one = rot.rotate(q[b:b + 1], k[b:b + 1], batched[b])
        torch.testing.assert_close(out[0][b:b + 1], one[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(out[1][b:b + 1], one[1], rtol=0, atol=1e-6)
    qb = q.bfloat16()
    got = rot.rotate(qb, qb[:, :2], torch.arange(6.0))[0]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), rot.rotate(qb.float(), qb[:, :2].float(), torch.arange(6.0))[0],
                               rtol=1e-2, atol=2e-2)


def test_gradcheck_state_dict_and_training_step():
    rot = FoPE(8, 64, num_kv_heads=2, init_factor=0.5, seed=0).double()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 3, 8, dtype=torch.float64, generator=g, requires_grad=True)
    pos = torch.tensor([0.0, 2.0, 5.0], dtype=torch.float64)
    wc, ws = (p.detach().clone().requires_grad_() for p in (rot.cos_coef, rot.sin_coef))
    assert torch.autograd.gradcheck(
        lambda x, c, s: functional_call(rot, {"cos_coef": c, "sin_coef": s}, (x, x, pos))[0], (x, wc, ws))
    a, b = FoPE(32, 256, num_kv_heads=2, seed=0), FoPE(32, 256, num_kv_heads=2, seed=1)
    assert set(a.state_dict()) == {"cos_coef", "sin_coef"}  # inv_freq is a function of the arguments
    q = torch.randn(1, 2, 5, 32)
    assert not torch.equal(a.rotate(q, q, torch.arange(5.0))[0], b.rotate(q, q, torch.arange(5.0))[0])
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.rotate(q, q, torch.arange(5.0))[0], b.rotate(q, q, torch.arange(5.0))[0])
    attn = ropekit.nn.RotaryAttention(64, 2, FoPE(32, 256, num_kv_heads=2, seed=0))
    loss = attn(torch.randn(2, 10, 64), torch.arange(10.0)[:, None], causal=True).square().mean()
    loss.backward()
    for p in (attn.rotary.cos_coef, attn.rotary.sin_coef):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


@pytest.mark.parametrize("call, exc, word", [
    (lambda: FoPE(31, 256), ValueError, "head_dim"),
    (lambda: FoPE(32.0, 256), TypeError, "head_dim"),
    (lambda: FoPE(32, 0), ValueError, "max_position_embeddings"),
    (lambda: FoPE(32, 6), ValueError, "max_position_embeddings"),
    (lambda: FoPE(32, 256.0), TypeError, "max_position_embeddings"),
    (lambda: FoPE(32, 256, rotary_dim=40), ValueError, "rotary_dim"),
    (lambda: FoPE(32, 256, rotary_dim=15), ValueError, "rotary_dim"),
    (lambda: FoPE(32, 256, base=1.0), ValueError, "base"),
    (lambda: FoPE(32, 256, num_kv_heads=0), ValueError, "num_kv_heads"),
    (lambda: FoPE(32, 256, num_inv_freq=17), ValueError, "num_inv_freq"),
    (lambda: FoPE(32, 256, init_factor=-1.0), ValueError, "init_factor"),
    (lambda: FoPE(32, 256, num_kv_heads=2).rotate(torch.randn(1, 3, 4, 32), torch.randn(1, 2, 4, 32),
                                                  torch.arange(4.0)), ValueError, "num_kv_heads"),
    (lambda: FoPE(32, 256).rotate(torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16), torch.arange(4.0)),
     ValueError, "head_dim"),
    (lambda: FoPE(32, 256).rotate(torch.randn(1, 2, 4, 32), torch.randn(1, 2, 4, 32), torch.zeros(4, 2)),
     ValueError, "coords"),
    (lambda: FoPE(32, 256).rotate(torch.randn(1, 2, 4, 32), torch.randn(1, 2, 4, 32), torch.zeros(3)),
     ValueError, "sequence length"),
    (lambda: FoPE(32, 256).rotate(torch.randn(1, 2, 4, 32), torch.randn(1, 2, 4, 32), torch.arange(4.0),
                                  seq_dim=0), ValueError, "seq_dim"),
])
def test_bad_input_names_the_argument(call, exc, word):
    with pytest.raises(exc, match=word):
        call()
