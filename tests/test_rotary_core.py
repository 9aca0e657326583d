"""Rotary core: frequency matrices + apply, against transformers and a float64 brute force."""
import math

import pytest
import torch
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, apply_rotary_pos_emb

import ropekit
from ropekit import angles, apply_rotary, apply_rotary_qk, cos_sin, frequency_matrix


def brute_force(x, coords, W, channels):
    """Rotate each channel pair by an explicit 2×2 matrix, float64, one pair at a time."""
    x = x.double()
    out = x.clone()
    R = 2 * W.shape[-1]
    phi = coords.double() @ W.double()  # (L, R/2)
    for j in range(R // 2):
        a, b = (j, j + R // 2) if channels == "half" else (2 * j, 2 * j + 1)
        c, s = torch.cos(phi[:, j]), torch.sin(phi[:, j])
        out[..., a] = c * x[..., a] - s * x[..., b]
        out[..., b] = s * x[..., a] + c * x[..., b]
    return out


@pytest.mark.parametrize("sections", [[16, 24, 24], [8, 28, 28]])
def test_mrope_matches_transformers(sections):
    cfg = Qwen2VLTextConfig(
        hidden_size=256, num_attention_heads=2, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections},
    )
    ref_rot = Qwen2VLRotaryEmbedding(cfg)
    g = torch.Generator().manual_seed(0)
    B, H, L, D = 2, 2, 37, 128
    pos = torch.randint(0, 3000, (3, B, L), generator=g)
    q, k = torch.randn(B, H, L, D, generator=g), torch.randn(B, H, L, D, generator=g)
    cos_ref, sin_ref = ref_rot(q, pos)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos_ref, sin_ref)

    W = frequency_matrix("mrope", D, 3, base=1e6, sections=sections)
    cos, sin = cos_sin(angles(pos.permute(1, 2, 0).float(), W))  # (B, L, D/2)
    # the angles themselves agree bit for bit with transformers' position * inv_freq
    assert torch.equal(torch.cat([cos, cos], -1), cos_ref)
    q2, k2 = apply_rotary_qk(q, k, cos, sin)
    torch.testing.assert_close(q2, q_ref, rtol=0, atol=2e-6)
    torch.testing.assert_close(k2, k_ref, rtol=0, atol=2e-6)


ALLOCS = [("1d", 1, None), ("mrope", 3, [4, 6, 6]), ("interleaved", 3, None), ("interleaved", 3, [6, 5, 5]),
          ("vrope", 4, None), ("axial", 2, None), ("axial", 4, None)]


@pytest.mark.parametrize("alloc,A,sections", ALLOCS)
@pytest.mark.parametrize("channels", ["half", "interleaved"])
def test_every_allocation_matches_brute_force(alloc, A, sections, channels):
    g = torch.Generator().manual_seed(1)
    D = 32
    W = frequency_matrix(alloc, D, A, sections=sections)
    coords = torch.rand(11, A, generator=g) * 200
    x = torch.randn(2, 3, 11, D, generator=g, dtype=torch.float64)
    cos, sin = cos_sin(angles(coords, W))
    got = apply_rotary(x, cos, sin, channels=channels)
    # angles are float32 by design (docs/conventions.md, "Precision"): agreement to float32 angle rounding at |angle| ~ 200
    torch.testing.assert_close(got, brute_force(x, coords, W, channels), rtol=0, atol=5e-5)


def test_allocation_structure_matches_definitions():
    D = 64
    inv = [10000.0 ** (-2 * j / D) for j in range(D // 2)]
    W = frequency_matrix("mrope", D, 3, sections=[8, 12, 12])
    for j in range(D // 2):
        axis = 0 if j < 8 else (1 if j < 20 else 2)
        assert W[axis, j].item() == pytest.approx(inv[j], rel=1e-6)
        assert (W[:, j] != 0).sum() == 1
    W = frequency_matrix("vrope", D, 4)
    assert all(W[j % 4, j] != 0 for j in range(D // 2))
    # Qwen3-VL interleaving with sections: h on j ≡ 1, w on j ≡ 2 (mod 3) below 3·section, t elsewhere
    W = frequency_matrix("interleaved", D, 3, sections=[12, 10, 10])
    axis = W.abs().argmax(0).tolist()
    assert axis == [1 if (j % 3 == 1 and j < 30) else 2 if (j % 3 == 2 and j < 30) else 0 for j in range(32)]
    # axial: each axis gets its own full spectrum base^(-j/n), n = D/(2A)
    W = frequency_matrix("axial", D, 2, base=100.0)
    n = D // 4
    for a in range(2):
        for j in range(n):
            assert W[a, a * n + j].item() == pytest.approx(100.0 ** (-j / n), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_dtype_in_equals_dtype_out_and_math_in_float32(dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 2, 9, 16, generator=g).to(dtype)
    coords = torch.arange(2040, 2049, dtype=torch.float32)[:, None]
    if dtype == torch.float64:
        coords = coords.double()  # float64 positions keep float64 angles
    cos, sin = cos_sin(angles(coords, frequency_matrix("1d", 16)))
    y = apply_rotary(x, cos, sin)
    assert y.dtype == dtype
    ref = brute_force(x.double(), coords, frequency_matrix("1d", 16), "half")
    tol = {torch.float64: 1e-6, torch.float32: 1e-4}.get(dtype, 2e-2)
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * 4)


def test_partial_rotary_passes_the_tail_through():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 5, 24, generator=g)
    W = frequency_matrix("1d", 16)
    cos, sin = cos_sin(angles(torch.arange(5.0)[:, None] * 7, W))
    y = apply_rotary(x, cos, sin)
    assert torch.equal(y[..., 16:], x[..., 16:])
    torch.testing.assert_close(y[..., :16], apply_rotary(x[..., :16].contiguous(), cos, sin))


def test_blhd_layout_equals_bhld():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 7, 16, generator=g)
    W = frequency_matrix("mrope", 16, 3, sections=[2, 3, 3])
    cos, sin = cos_sin(angles(torch.rand(2, 7, 3, generator=g) * 50, W))  # batched (B, L, R/2)
    a = apply_rotary(q, cos, sin, channels="interleaved")
    b = apply_rotary(q.transpose(1, 2), cos, sin, channels="interleaved", seq_dim=1).transpose(1, 2)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rotation_preserves_norm_and_is_relative():
    g = torch.Generator().manual_seed(5)
    W = frequency_matrix("mrope", 32, 3, sections=[4, 6, 6]).double()
    q, k = torch.randn(32, generator=g, dtype=torch.float64), torch.randn(32, generator=g, dtype=torch.float64)
    m, n, delta = (torch.rand(3, generator=g, dtype=torch.float64) * s for s in (100, 100, 999))

    def score(pm, pn):
        c, s = cos_sin(angles(torch.stack([pm, pn]).double(), W))
        x = torch.stack([q, k])[None, None]
        r = apply_rotary(x.expand(1, 1, 2, 32), c, s)[0, 0]
        assert torch.allclose(r.norm(dim=-1), x[0, 0].norm(dim=-1))
        return (r[0] * r[1]).sum()

    assert score(m, n).item() == pytest.approx(score(m + delta, n + delta).item(), abs=1e-9)


def test_rope_object_end_to_end():
    rope = ropekit.RoPE("mrope", head_dim=32, sections=[4, 6, 6])
    coords = rope.coords("T3 I2x2 T2")
    q = torch.randn(1, 2, coords.shape[0], 32)
    q2, k2 = rope.rotate(q, q, "T3 I2x2 T2")
    # text-only layouts: every design reduces to 1-D RoPE
    t = ropekit.RoPE("mrope", head_dim=32, sections=[4, 6, 6]).rotate(q[:, :, :5], q[:, :, :5], "T5")[0]
    t1 = ropekit.RoPE("vanilla", head_dim=32).rotate(q[:, :, :5], q[:, :, :5], "T5")[0]
    torch.testing.assert_close(t, t1, rtol=0, atol=0)
    assert q2.shape == q.shape


def test_bad_input_errors():
    with pytest.raises(ValueError, match="sum to rotary_dim/2"):
        frequency_matrix("mrope", 64, 3, sections=[16, 24, 24])
    with pytest.raises(ValueError, match="even"):
        frequency_matrix("1d", 31)
    with pytest.raises(ValueError, match="unknown allocation"):
        frequency_matrix("spiral", 32, 2)
    with pytest.raises(ValueError, match="head_dim must be even"):
        apply_rotary(torch.randn(1, 1, 2, 7), torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="rotary_dim <= head_dim"):
        apply_rotary(torch.randn(1, 1, 2, 8), torch.zeros(2, 8), torch.zeros(2, 8))
    with pytest.raises(ValueError, match="sequence length"):
        apply_rotary(torch.randn(1, 1, 3, 8), torch.zeros(2, 4), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="axes"):
        angles(torch.zeros(4, 2), frequency_matrix("mrope", 16, 3, sections=[2, 3, 3]))
    with pytest.raises(ValueError, match="head_dim"):
        ropekit.RoPE("vanilla", head_dim=63)
    with pytest.raises(ValueError, match="unknown design"):
        ropekit.RoPE("spiral")
    with pytest.raises(TypeError, match="unknown option"):
        ropekit.positions("T3", "vanilla", radius=3)
    with pytest.raises(ValueError, match="NaN"):
        ropekit.RoPE("vanilla", head_dim=8).cos_sin(torch.tensor([[math.nan]]))
