"""Linear GeoPE attention against a float64 reference that materialises every relative rotation matrix."""
import math

import pytest
import torch

from ropekit.apply.geope import apply_geope
from ropekit.apply.linear_geope import linear_geope_attention, linear_geope_scores
from ropekit.rotations.geope import geope_frequencies, geope_rotation


def quat_matrix(r):
    """3×3 rotation matrix of unit quaternions r (..., 4) = (w, x, y, z)."""
    w, x, y, z = r.unbind(-1)
    return torch.stack((
        torch.stack((1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)), -1),
        torch.stack((2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)), -1),
        torch.stack((2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)), -1),
    ), -2)


def lie_vector(pos, freqs):
    """u per (token, triple): (0, θ_h/4, θ_w/4) (eq. 7) or (θ_d, θ_h, θ_w)/6 (eq. 55), float64."""
    theta = pos.double()[:, None, :] * freqs.double()[None, :, None]
    if pos.shape[-1] == 2:
        return torch.cat((torch.zeros_like(theta[..., :1]), theta / 4), -1)
    return theta / 6


def reference_attention(q, k, v, pos_q, pos_k, mask=None, causal=False, scale=None):
    """Materialise R(u_k − u_q) = exp(u_rel) as (Lq, Lk, n, 3, 3) matrices, then plain softmax attention."""
    D = q.shape[-1]
    n = D // 3
    f = geope_frequencies(D)
    u_rel = lie_vector(pos_k, f)[None] - lie_vector(pos_q, f)[:, None]  # (Lq, Lk, n, 3)
    norm = u_rel.norm(dim=-1, keepdim=True)
    unit = torch.where(norm > 0, u_rel / torch.where(norm > 0, norm, torch.ones_like(norm)), torch.zeros_like(u_rel))
    R = quat_matrix(torch.cat((torch.cos(norm), torch.sin(norm) * unit), -1))  # exp(u_rel)
    qt = q[..., : 3 * n].double().unflatten(-1, (n, 3))
    kt = k[..., : 3 * n].double().unflatten(-1, (n, 3))
    s = torch.einsum("bhmic,mnicd,bhnid->bhmn", qt, R, kt)
    s = s + q[..., 3 * n :].double() @ k[..., 3 * n :].double().transpose(-1, -2)
    s = s * (scale if scale is not None else 1 / math.sqrt(D))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double()


def _grid(*sizes):
    mesh = torch.meshgrid(*[torch.arange(s) for s in sizes], indexing="ij")
    return torch.stack([m.flatten() for m in mesh], -1).float()


def _qkv(L, D, seed, B=2, H=2, Lk=None):
    g = torch.Generator().manual_seed(seed)
    Lk = L if Lk is None else Lk
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, H, Lk, D, generator=g),
            torch.randn(B, H, Lk, 5, generator=g))


@pytest.mark.parametrize("block", [3, 128])
@pytest.mark.parametrize("sizes", [(3, 4), (2, 2, 3)])
def test_matches_materialised_reference(sizes, block):
    pos = _grid(*sizes) - 1.0
    L = pos.shape[0]
    q, k, v = _qkv(L, 14, seed=len(sizes))  # 4 triples + 2 pass-through channels
    out = linear_geope_attention(q, k, v, pos, block_size=block)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, pos, pos), atol=2e-5, rtol=1e-5)


def test_mask_causal_cross_attention_and_scale():
    pos = _grid(3, 3) * 2.0
    q, k, v = _qkv(9, 12, seed=3)
    g = torch.Generator().manual_seed(9)
    bool_mask = torch.rand(2, 1, 9, 9, generator=g) > 0.3
    bool_mask[..., 0] = True  # every row keeps at least one key
    out = linear_geope_attention(q, k, v, pos, attn_mask=bool_mask, block_size=4)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, pos, pos, mask=bool_mask), atol=2e-5, rtol=1e-5)
    add = torch.randn(9, 9, generator=g)
    out = linear_geope_attention(q, k, v, pos, attn_mask=add, block_size=4, scale=0.3)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, pos, pos, mask=add, scale=0.3), atol=2e-5, rtol=1e-5)
    out = linear_geope_attention(q, k, v, pos, is_causal=True, block_size=2)
    torch.testing.assert_close(out.double(), reference_attention(q, k, v, pos, pos, causal=True), atol=2e-5, rtol=1e-5)
    # cross-attention: 4 queries at their own positions against the 9 keys
    pq = torch.tensor([[0.5, 0.0], [4.0, 1.0], [-2.0, 3.0], [1.0, 1.0]])
    q4 = q[:, :, :4]
    out = linear_geope_attention(q4, k, v, pq, pos, block_size=3)
    torch.testing.assert_close(out.double(), reference_attention(q4, k, v, pq, pos), atol=2e-5, rtol=1e-5)
    # (B, L, H, D) layout
    out_t = linear_geope_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), pos, seq_dim=1)
    torch.testing.assert_close(out_t, linear_geope_attention(q, k, v, pos).transpose(1, 2))


def test_exactly_relative_under_a_common_shift():
    pos = _grid(4, 4)
    q, k, v = _qkv(16, 12, seed=4)
    base = linear_geope_attention(q, k, v, pos, block_size=5)
    for shift in ([7.0, -3.0], [100.0, 250.0]):
        moved = linear_geope_attention(q, k, v, pos + torch.tensor(shift), block_size=5)
        torch.testing.assert_close(moved, base, atol=1e-6, rtol=1e-6)


def test_equals_geope_when_positions_lie_on_one_axis():
    """Rotations about one fixed axis commute, so there R_mᵀ R_n = R(φ_n − φ_m): GeoPE and Linear GeoPE agree."""
    pos = torch.stack((torch.arange(7.0), torch.zeros(7)), -1)  # a column of an image
    q, k, v = _qkv(7, 9, seed=5)
    rot = geope_rotation(pos, 9)
    geo_scores = apply_geope(q, rot) @ apply_geope(k, rot).transpose(-1, -2)
    lin_scores = linear_geope_scores(q, k, pos, pos, geope_frequencies(9))
    torch.testing.assert_close(lin_scores, geo_scores, atol=1e-5, rtol=1e-5)


def test_gradients_match_the_reference():
    pos = _grid(2, 3)
    q, k, v = (t.double().requires_grad_() for t in _qkv(6, 9, seed=6, B=1))
    out = linear_geope_attention(q, k, v, pos, block_size=4)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref = reference_attention(q, k, v, pos, pos)
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)
    # float32 with checkpointing off gives the same gradients as with it on
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    g_on = torch.autograd.grad(linear_geope_attention(q32, k32, v32, pos, block_size=4).sum(), (q32, k32))
    g_off = torch.autograd.grad(
        linear_geope_attention(q32, k32, v32, pos, block_size=4, use_checkpoint=False).sum(), (q32, k32))
    for a, b in zip(g_on, g_off):
        torch.testing.assert_close(a, b)


def test_dtype_is_preserved():
    pos = _grid(2, 2)
    q, k, v = _qkv(4, 6, seed=7)
    out = linear_geope_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), pos)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), linear_geope_attention(q.bfloat16().float(), k.bfloat16().float(),
                                                                   v.bfloat16().float(), pos), atol=0.02, rtol=0.02)


def test_bad_input_raises_clear_errors():
    pos = _grid(2, 2)
    q, k, v = _qkv(4, 6, seed=8)
    with pytest.raises(ValueError, match="4 tokens"):
        linear_geope_attention(q, k, v, pos[:3])
    with pytest.raises(ValueError, match="1, 2 .*or 3"):
        linear_geope_attention(q, k, v, torch.zeros(4, 4))
    with pytest.raises(ValueError, match="NaN"):
        linear_geope_attention(q, k, v, torch.full((4, 2), float("nan")))
    with pytest.raises(ValueError, match="head_dim must be >= 3"):
        linear_geope_attention(q[..., :2], k[..., :2], v, pos)
    with pytest.raises(ValueError, match="same head_dim"):
        linear_geope_attention(q, k[..., :3], v, pos)
    with pytest.raises(ValueError, match="block_size"):
        linear_geope_attention(q, k, v, pos, block_size=0)
    with pytest.raises(ValueError, match="attn_mask"):
        linear_geope_attention(q, k, v, pos, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="floating-point"):
        linear_geope_attention(q.long(), k, v, pos)


@pytest.mark.parametrize("triple_chunk", [1, 32])
def test_key_chunks_and_reused_buffers_match_the_reference(monkeypatch, triple_chunk):
    """Many key chunks (the last one shorter), buffers reused without autograd, fresh tensors with it."""
    import ropekit.apply.linear_geope as lg

    monkeypatch.setattr(lg, "_PAIRS", 1)  # 16 keys per chunk: 37 keys give chunks of 16, 16 and 5
    monkeypatch.setattr(lg, "_GRAD_PAIRS", 1)
    pos = _grid(37, 1) * 0.5 + torch.tensor([0.0, 2.0])
    pos[5] = pos[20]  # a coincident pair across chunks: zero displacement, only q·k remains
    q, k, v = (t.double() for t in _qkv(37, 13, seed=11, B=1, H=2))
    f = geope_frequencies(13)
    ref = reference_attention(q, k, v, pos, pos)
    with torch.no_grad():
        s = lg.linear_geope_scores(q, k, pos, pos, f, triple_chunk=triple_chunk)
    torch.testing.assert_close(torch.softmax(s / math.sqrt(13), -1) @ v, ref)
    q.requires_grad_()
    k.requires_grad_()
    out = torch.softmax(lg.linear_geope_scores(q, k, pos, pos, f, triple_chunk=triple_chunk) / math.sqrt(13), -1) @ v
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), (q, k))
    ref_grads = torch.autograd.grad((reference_attention(q, k, v, pos, pos) * w).sum(), (q, k))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_triple_chunk_must_be_positive():
    q, k, _ = _qkv(4, 9, seed=12, B=1, H=1)
    with pytest.raises(ValueError, match="triple_chunk"):
        linear_geope_scores(q, k, _grid(2, 2), _grid(2, 2), geope_frequencies(9), triple_chunk=0)


def _eager_fused_kernels(monkeypatch):
    """Run the fused kernels' expressions without compiling them (same maths, small inputs only)."""
    import ropekit.apply._linear_geope_fused as fz

    monkeypatch.setattr(fz, "_kernels", lambda compiled: (fz.rotated_scores, fz.rotated_query_grad))


@pytest.mark.parametrize("sizes", [(3, 4), (2, 2, 3)])
def test_fused_kernel_maths_matches_the_reference(monkeypatch, sizes):
    """The fused path's formulas (2-D, with the zero axis component dropped, and 3-D), values and gradients."""
    _eager_fused_kernels(monkeypatch)
    pos = _grid(*sizes) * 0.75 - 1.0
    pos[1] = pos[-1]  # a coincident pair: zero displacement, only q·k remains
    L = pos.shape[0]
    q, k, v = (t.double().requires_grad_() for t in _qkv(L, 14, seed=20 + len(sizes), B=1))
    out = linear_geope_attention(q, k, v, pos, block_size=5, fused=True)
    ref = reference_attention(q, k, v, pos, pos)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)
    # float32 takes the polynomial sine; batched positions and cross-attention keys at other positions
    pq = torch.stack((pos, pos.flip(0) * 2.0))
    q32, k32, v32 = (t.detach().float().repeat(2, 1, 1, 1) for t in (q, k, v))
    out32 = linear_geope_attention(q32, k32[:, :, :4], v32[:, :, :4], pq, pq[:, 3:7], fused=True)
    ref32 = torch.cat([reference_attention(q32[b:b + 1], k32[b:b + 1, :, :4], v32[b:b + 1, :, :4], pq[b], pq[b, 3:7])
                       for b in range(2)])
    torch.testing.assert_close(out32.double(), ref32, atol=2e-5, rtol=1e-5)


def test_fused_sine_polynomial_is_float32_accurate():
    from ropekit.apply._linear_geope_fused import _sin_vers

    A = torch.linspace(0.0, 300.0, 200001).double()  # float32 angles, so the reference sees the same inputs
    s, v = _sin_vers(A.float()[:, None], torch.ones(1))
    torch.testing.assert_close(s[:, 0].double(), torch.sin(A), atol=2e-6, rtol=0)
    torch.testing.assert_close(v[:, 0].double(), 1 - torch.cos(A), atol=2e-6, rtol=0)
    small = torch.tensor([0.0, 1e-6, 1e-3], dtype=torch.float64)  # vers A ≈ A²/2 keeps its relative precision
    _, v_small = _sin_vers(small.float()[:, None], torch.ones(1))
    torch.testing.assert_close(v_small[:, 0].double(), 2 * torch.sin(small / 2) ** 2, atol=0, rtol=1e-5)


def test_compiled_kernel_matches_the_reference():
    """The compiled kernel (what large calls use by default), float32, forward and gradients."""
    pos = _grid(3, 4)
    q, k, v = (t.requires_grad_() for t in _qkv(12, 12, seed=30, B=1, H=1))
    out = linear_geope_attention(q, k, v, pos, fused=True)  # one block: one shape, two compilations
    ref = reference_attention(q, k, v, pos, pos)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-5)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w.double()).sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a.double(), b.double(), atol=5e-5, rtol=1e-4)


def test_fused_must_be_a_bool_or_none():
    pos = _grid(2, 2)
    q, k, v = _qkv(4, 6, seed=31)
    with pytest.raises(TypeError, match="fused"):
        linear_geope_attention(q, k, v, pos, fused="yes")
