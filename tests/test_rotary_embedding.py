"""ropekit.RotaryEmbedding: a drop-in for rotary-embedding-torch's common calls, buffers, scaling, validation."""
import math

import pytest
import torch
from rotary_embedding_torch import RotaryEmbedding as RefRotary
from rotary_embedding_torch import apply_rotary_emb
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from ropekit import RotaryEmbedding


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dim,head_dim,theta", [(64, 64, 10000), (32, 64, 500), (16, 48, 10000)])
@pytest.mark.parametrize("offset", [0, 7, 1000])
def test_rotate_queries_or_keys_equals_rotary_embedding_torch(dim, head_dim, theta, offset):
    ref = RefRotary(dim, theta=theta)
    ours = RotaryEmbedding(dim, base=theta, interleaved=True)
    x = _randn(2, 3, 11, head_dim)
    torch.testing.assert_close(ours.rotate_queries_or_keys(x, offset=offset),
                               ref.rotate_queries_or_keys(x, offset=offset), rtol=0, atol=0)
    # (B, L, H, D) layout
    xs = x.transpose(1, 2).contiguous()
    ref_s = RefRotary(dim, theta=theta, seq_before_head_dim=True)
    torch.testing.assert_close(ours.rotate_queries_or_keys(xs, offset=offset, seq_dim=1),
                               ref_s.rotate_queries_or_keys(xs, offset=offset), rtol=0, atol=0)


@pytest.mark.parametrize("q_len,k_len", [(3, 10), (1, 7), (5, 5)])
@pytest.mark.parametrize("offset", [0, 1, 4, 100])
def test_rotate_queries_with_cached_keys_equals_rotary_embedding_torch(q_len, k_len, offset):
    """The offset moves the queries only (keys stay at 0 … k_len-1), as in rotary-embedding-torch."""
    ref, ours = RefRotary(32), RotaryEmbedding(32, interleaved=True)
    q, k = _randn(1, 2, q_len, 48, seed=1), _randn(1, 2, k_len, 48, seed=2)  # 16 channels pass through
    got = ours.rotate_queries_with_cached_keys(q, k, offset=offset)
    want = ref.rotate_queries_with_cached_keys(q, k, offset=offset)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # (B, L, H, D) layout: rotary-embedding-torch's seq_before_head_dim
    qs, ks = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    ref_s = RefRotary(32, seq_before_head_dim=True)
    got = ours.rotate_queries_with_cached_keys(qs, ks, seq_dim=1, offset=offset)
    for a, b in zip(got, ref_s.rotate_queries_with_cached_keys(qs, ks, offset=offset)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_kv_cache_decoding_equals_one_full_pass():
    rot = RotaryEmbedding(64, design="circle")  # any design: text takes the same index on every axis
    x = _randn(1, 2, 9, 64, seed=3)
    full = rot.rotate_queries_or_keys(x)
    steps = [rot.rotate_queries_or_keys(x[:, :, :5])] + [
        rot.rotate_queries_or_keys(x[:, :, t: t + 1], offset=t) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=0, atol=0)


@pytest.mark.parametrize("design", ["mrope", "circle", "vrope", "rope2d"])
def test_text_under_any_design_is_1d_rope(design):
    """Text tokens sit on the diagonal, so every one-hot allocation reduces to the 1-D spectrum."""
    ours = RotaryEmbedding(64, design=design, interleaved=True)
    x = _randn(1, 2, 6, 64, seed=4)
    torch.testing.assert_close(ours.rotate_queries_or_keys(x, offset=3), RefRotary(64).rotate_queries_or_keys(
        x, offset=3), rtol=0, atol=0)


@pytest.mark.parametrize("H,W", [(4, 6), (5, 5)])
def test_axial_2d_equals_get_axial_freqs(H, W):
    per_axis = 16
    ref = RefRotary(per_axis)  # freqs_for='lang'
    freqs = ref.get_axial_freqs(H, W)  # (H, W, 2 * per_axis)
    q, k = _randn(2, 3, H, W, 48, seed=5), _randn(2, 3, H, W, 48, seed=6)
    q_ref, k_ref = apply_rotary_emb(freqs, q), apply_rotary_emb(freqs, k)
    ours = RotaryEmbedding(2 * per_axis, design="rope2d", allocation="axial", interleaved=True)
    q2, k2 = ours.rotate(q.flatten(2, 3), k.flatten(2, 3), f"G{H}x{W}")
    torch.testing.assert_close(q2.unflatten(2, (H, W)), q_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k2.unflatten(2, (H, W)), k_ref, rtol=1e-6, atol=1e-6)


def test_axial_pixel_frequencies_through_custom_frequencies():
    H, W, per_axis, max_freq = 6, 4, 16, 10
    ref = RefRotary(per_axis, freqs_for="pixel", max_freq=max_freq)
    q = _randn(1, 2, H, W, 32, seed=7)
    q_ref = apply_rotary_emb(ref.get_axial_freqs(H, W), q)
    band = torch.linspace(1.0, max_freq / 2, per_axis // 2) * math.pi
    Wm = torch.zeros(2, per_axis)
    Wm[0, : per_axis // 2], Wm[1, per_axis // 2:] = band, band
    ours = RotaryEmbedding(2 * per_axis, design="rope2d", interleaved=True, frequencies=Wm)
    grid = torch.stack(torch.meshgrid(torch.linspace(-1, 1, H), torch.linspace(-1, 1, W), indexing="ij"), -1)
    q2, _ = ours.rotate(q.flatten(2, 3), q.flatten(2, 3), grid.reshape(-1, 2))
    torch.testing.assert_close(q2.unflatten(2, (H, W)), q_ref, rtol=1e-6, atol=1e-6)


def test_linear_scaling_equals_interpolate_factor():
    ref = RefRotary(64, interpolate_factor=4.0)
    ours = RotaryEmbedding(64, interleaved=True, scaling={"rope_type": "linear", "factor": 4.0})
    x = _randn(1, 2, 50, 64, seed=8)
    torch.testing.assert_close(ours.rotate_queries_or_keys(x, offset=100), ref.rotate_queries_or_keys(x, offset=100),
                               rtol=1e-5, atol=1e-5)


def test_yarn_module_equals_transformers_llama_rotary():
    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "rope_theta": 10000.0}
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=2, head_dim=64, max_position_embeddings=2048,
                      rope_parameters=dict(params))
    q, k = _randn(1, 2, 40, 64, seed=9), _randn(1, 2, 40, 64, seed=10)
    pos = torch.arange(1000, 1040)[None]
    cos, sin = LlamaRotaryEmbedding(cfg)(q, pos)
    q_ref, k_ref = apply_rotary_pos_emb(q, k, cos, sin)
    ours = RotaryEmbedding(64, scaling=params)
    assert ours.attention_scaling == pytest.approx(0.1 * math.log(4) + 1)
    q2, k2 = ours.rotate(q, k, pos[0, :, None].float())
    torch.testing.assert_close(q2, q_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k2, k_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.rotate_queries_or_keys(q, offset=1000), q_ref, rtol=1e-6, atol=1e-6)


def test_rotate_without_coords_is_positions_0_to_L_minus_1():
    rot = RotaryEmbedding(32)
    q, k = _randn(2, 2, 7, 32, seed=11), _randn(2, 2, 7, 32, seed=12)
    q2, k2 = rot.rotate(q, k)
    torch.testing.assert_close(q2, rot.rotate_queries_or_keys(q), rtol=0, atol=0)
    q3, _ = rot(q, k, torch.arange(7.0)[:, None])
    torch.testing.assert_close(q3, q2, rtol=0, atol=0)


def test_buffers_follow_to_and_stay_out_of_the_state_dict():
    rot = RotaryEmbedding(64, design="mrope", scaling={"rope_type": "linear", "factor": 2.0})
    assert "W" in dict(rot.named_buffers()) and rot.state_dict() == {}
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), rot)
    model.load_state_dict(torch.nn.Sequential(torch.nn.Linear(4, 4)).state_dict(), strict=True)
    assert rot.to(torch.float64).W.dtype == torch.float64


def test_half_precision_modules_keep_exact_frequencies():
    """model.half() / .bfloat16() must not round the frequencies to 16 bits (every angle would drift)."""
    ref = RotaryEmbedding(64)
    for dtype in (torch.float16, torch.bfloat16):
        rot = RotaryEmbedding(64).to(dtype)
        assert rot.W.dtype == torch.float32 and torch.equal(rot.W, ref.W)
        x = _randn(1, 2, 5, 64, seed=14).to(dtype)
        torch.testing.assert_close(rot.rotate_queries_or_keys(x, offset=3000),
                                   ref.rotate_queries_or_keys(x, offset=3000), rtol=0, atol=0)
    assert rot.to("meta").W.device.type == "meta"


BAD = [
    (lambda: RotaryEmbedding(64, interleaved="yes"), TypeError, "interleaved"),
    (lambda: RotaryEmbedding(63), ValueError, "head_dim"),
    (lambda: RotaryEmbedding(64, design="nope"), ValueError, "design"),
    (lambda: RotaryEmbedding(64, num_axes=0), ValueError, "num_axes"),
    (lambda: RotaryEmbedding(64, scaling={"rope_type": "yarn", "factor": 2.0}), ValueError,
     "original_max_position_embeddings"),
    (lambda: RotaryEmbedding(64, frequencies=torch.ones(2, 32)), ValueError, "frequencies"),
    (lambda: RotaryEmbedding(64).rotate(torch.ones(1, 1, 3, 64), torch.ones(1, 1, 3, 64), torch.ones(3, 2)),
     ValueError, "coords"),
    (lambda: RotaryEmbedding(64).rotate_queries_or_keys(torch.ones(1, 1, 3, 64), seq_dim=0), ValueError, "seq_dim"),
    (lambda: RotaryEmbedding(64).rotate_queries_with_cached_keys(torch.ones(1, 1, 4, 64), torch.ones(1, 1, 3, 64)),
     ValueError, "q"),
    (lambda: RotaryEmbedding(64).rotate(torch.ones(1, 1, 3, 64), torch.ones(1, 1, 3, 64),
                                        torch.tensor([[0.0], [float("nan")], [2.0]])), ValueError, "coords"),
]


@pytest.mark.parametrize("make,exc,word", BAD)
def test_bad_arguments_are_rejected_naming_them(make, exc, word):
    with pytest.raises(exc, match=word):
        make()
