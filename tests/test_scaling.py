"""Context extension: 1-D parity with transformers' ROPE_INIT_FUNCTIONS, multi-axis invariants, validation."""
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import ropekit
from ropekit.rotations.scaling import parse_scaling, scale_frequencies, scaled_inv_freq, scaling_from_config

HEAD_DIM = 64


def _longrope_lists(n, seed):
    g = torch.Generator().manual_seed(seed)
    return (1 + 3 * torch.rand(n, generator=g)).tolist()


CASES = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, 4096),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, 2048),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, 8192),
    "yarn-betas-notrunc": ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096,
                            "beta_fast": 16, "beta_slow": 2, "truncate": False}, 32768),
    "yarn-mscale": ({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                     "mscale": 1.0, "mscale_all_dim": 0.707}, 163840),
    "yarn-attn": ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 1024,
                   "attention_factor": 0.9}, 2048),
    "yarn-derived-factor": ({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 1024}, 3072),
    "longrope": ({"rope_type": "longrope", "short_factor": _longrope_lists(32, 0),
                  "long_factor": _longrope_lists(32, 1), "original_max_position_embeddings": 4096}, 131072),
    "longrope-factor": ({"rope_type": "longrope", "short_factor": _longrope_lists(32, 2),
                         "long_factor": _longrope_lists(32, 3), "factor": 16.0,
                         "original_max_position_embeddings": 2048}, 32768),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}, 131072),
}
THETAS = {"llama3": 500000.0, "longrope": 10000.0}


def _config(params, max_pos, theta):
    return LlamaConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4, head_dim=HEAD_DIM,
                       max_position_embeddings=max_pos,
                       rope_parameters={**params, "rope_theta": theta})


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("seq_len", [None, 100, 300000])
def test_inv_freq_and_attention_factor_equal_transformers(name, seq_len):
    params, max_pos = CASES[name]
    theta = THETAS.get(name.split("-")[0], 1e6)
    cfg = _config(params, max_pos, theta)
    ref, ref_attn = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, seq_len=seq_len)
    ours, attn = scaled_inv_freq(HEAD_DIM, cfg.rope_parameters, seq_len=seq_len,
                                 max_position_embeddings=max_pos)
    assert torch.equal(ours, ref), (ours - ref).abs().max()
    assert attn == ref_attn
    # the same numbers through a model config object
    ours2, attn2 = scaled_inv_freq(HEAD_DIM, scaling_from_config(cfg), seq_len=seq_len)
    assert torch.equal(ours2, ref) and attn2 == ref_attn


@pytest.mark.parametrize("name", ["linear", "yarn", "yarn-mscale", "longrope", "llama3", "dynamic"])
def test_rope_cos_sin_equal_transformers_rotary(name):
    """RoPE('vanilla', scaling=...) gives transformers' cos/sin, attention factor included, at a long length."""
    params, max_pos = CASES[name]
    theta = THETAS.get(name.split("-")[0], 1e6)
    cfg = _config(params, max_pos, theta)
    L = 300 if name != "dynamic" else 5000
    start = 0 if name not in ("longrope", "dynamic") else 200000 - L  # past the original context
    pos = torch.arange(start, start + L)[None]
    cos_ref, sin_ref = LlamaRotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), pos)
    rope = ropekit.RoPE("vanilla", head_dim=HEAD_DIM, base=theta,
                        scaling=scaling_from_config(cfg))
    cos, sin = rope.cos_sin(pos[0, :, None].float())
    assert rope.attention_scaling == LlamaRotaryEmbedding(cfg).attention_scaling
    torch.testing.assert_close(cos, cos_ref[0, :, : HEAD_DIM // 2], rtol=0, atol=0)
    torch.testing.assert_close(sin, sin_ref[0, :, : HEAD_DIM // 2], rtol=0, atol=0)


def test_ntk_equals_rotary_embedding_torch_theta_rescale():
    from rotary_embedding_torch import RotaryEmbedding

    for dim, s in [(64, 2.0), (32, 8.0)]:
        ref = RotaryEmbedding(dim, theta_rescale_factor=s).freqs.detach()
        ours, attn = scaled_inv_freq(dim, {"rope_type": "ntk", "factor": s})
        assert torch.equal(ours, ref) and attn == 1.0


@pytest.mark.parametrize("name", list(CASES))
def test_one_hot_allocations_scale_like_the_1d_spectrum(name):
    """M-RoPE / interleaved / VRoPE columns are the 1-D spectrum spread over axes: scaling them must give
    transformers' scaled inverse frequencies in the same columns."""
    params, max_pos = CASES[name]
    theta = THETAS.get(name.split("-")[0], 1e6)
    cfg = _config(params, max_pos, theta)
    ref, ref_attn = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, seq_len=5000)
    for alloc, axes in [("mrope", 3), ("interleaved", 3), ("vrope", 4)]:
        W = ropekit.frequency_matrix(alloc, HEAD_DIM, axes, base=theta)
        W2, attn = scale_frequencies(W, cfg.rope_parameters, seq_len=5000, max_position_embeddings=max_pos)
        assert torch.equal(W2, (W != 0) * ref[None]), alloc
        assert attn == ref_attn


def test_linear_interpolation_is_dividing_positions_for_any_W():
    W = ropekit.directional_matrix(64, dims=3, method="weyl")  # dense, signed entries
    c = torch.randn(50, 3, dtype=torch.float64) * 100
    W2, attn = scale_frequencies(W, {"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(ropekit.angles(c, W2.double()), ropekit.angles(c / 4, W.double()))
    assert attn == 1.0


def test_per_axis_factor_scales_only_the_temporal_axis():
    W = ropekit.frequency_matrix("mrope", 128, 3)
    W2, attn = scale_frequencies(W, {"rope_type": "yarn", "factor": [8.0, 1.0, 1.0],
                                     "original_max_position_embeddings": 2048})
    assert torch.equal(W2[1:], W[1:])                     # height / width untouched
    ref, ref_attn = scaled_inv_freq(128, {"rope_type": "yarn", "factor": 8.0,
                                          "original_max_position_embeddings": 2048})
    assert torch.equal(W2[0], (W[0] != 0) * ref)
    assert attn == ref_attn == pytest.approx(0.1 * math.log(8) + 1)
    # the same through `axes`
    W3, _ = scale_frequencies(W, {"rope_type": "yarn", "factor": 8.0, "axes": [0],
                                  "original_max_position_embeddings": 2048})
    assert torch.equal(W3, W2)


def test_yarn_on_dense_W_keeps_signs_and_interpolates_between_theta_and_theta_over_s():
    """Each entry is the frequency along its axis: fast ones (many turns over the context) are kept,
    slow ones divided by the factor, those between blended; signs never change."""
    W = ropekit.directional_matrix(64, dims=2, method="weyl")
    W2, _ = scale_frequencies(W, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096})
    nz = W != 0
    ratio = (W2[nz] / W[nz]).double()
    assert (ratio > 0).all() and (ratio <= 1 + 1e-6).all() and (ratio >= 0.25 - 1e-6).all()
    # low frequencies (long wavelengths) are interpolated, the highest kept
    mags = W.abs()
    assert W2.abs()[mags == mags[nz].min()].item() == pytest.approx(mags[nz].min().item() / 4, rel=1e-5)
    assert W2.abs()[mags == mags.max()].item() == mags.max().item()


def test_dynamic_is_identity_up_to_the_trained_length():
    W = ropekit.frequency_matrix("1d", 64)
    p = {"rope_type": "dynamic", "factor": 4.0, "max_position_embeddings": 1024}
    assert torch.equal(scale_frequencies(W, p, seq_len=1024)[0], W)
    assert not torch.equal(scale_frequencies(W, p, seq_len=1025)[0], W)


def test_rope_attention_scaling_multiplies_cos_sin_and_defaults_to_one():
    plain = ropekit.RoPE("mrope", head_dim=64)
    yarn = ropekit.RoPE("mrope", head_dim=64, scaling={"rope_type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 64})
    assert plain.attention_scaling == 1.0
    assert yarn.attention_scaling == pytest.approx(0.1 * math.log(4) + 1)
    c = torch.zeros(1, 3)
    cos, sin = yarn.cos_sin(c)
    torch.testing.assert_close(cos, torch.full_like(cos, yarn.attention_scaling))


BAD = [
    ({"rope_type": "ntk-by-parts", "factor": 2.0}, ValueError, "rope_type"),
    ({"rope_type": "linear", "factor": 0.0}, ValueError, "factor"),
    ({"rope_type": "linear", "factor": -2}, ValueError, "factor"),
    ({"rope_type": "linear", "factor": float("nan")}, ValueError, "factor"),
    ({"rope_type": "linear"}, ValueError, "factor"),
    ({"rope_type": "yarn", "factor": 4.0}, ValueError, "original_max_position_embeddings"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
     ValueError, "original_max_position_embeddings"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 8}, ValueError, "high_freq_factor"),
    ({"rope_type": "dynamic", "factor": 2.0}, ValueError, "max_position_embeddings"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 31, "long_factor": [2.0] * 31, "factor": 4.0,
      "original_max_position_embeddings": 64}, ValueError, "short_factor"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 31, "factor": 4.0,
      "original_max_position_embeddings": 64}, ValueError, "long_factor"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 32, "original_max_position_embeddings": 64},
     ValueError, "long_factor"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32,
      "original_max_position_embeddings": 64}, ValueError, "factor"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0}, ValueError,
     "original_max_position_embeddings"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 1, "beta_slow": 8},
     ValueError, "beta_fast"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 32}, ValueError, "beta_fast"),
    ({"rope_type": "linear", "factor": [2.0, 1.0]}, ValueError, "factor"),
    ({"rope_type": "linear", "factor": 2.0, "axes": [3]}, ValueError, "axes"),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}, ValueError, "rope_theta"),
    ("yarn", TypeError, "scaling"),
]


@pytest.mark.parametrize("params,exc,word", BAD)
def test_bad_scaling_is_rejected_naming_the_argument(params, exc, word):
    W = ropekit.frequency_matrix("1d", 64)
    with pytest.raises(exc, match=word):
        scale_frequencies(W, params, base=10000.0, seq_len=100)


def test_rope_rejects_bad_scaling_at_construction():
    with pytest.raises(ValueError, match="rope_type"):
        ropekit.RoPE("vanilla", head_dim=64, scaling={"rope_type": "bogus"})
    with pytest.raises(ValueError, match="short_factor"):
        ropekit.RoPE("vanilla", head_dim=64, scaling={"rope_type": "longrope", "short_factor": [1.0] * 8,
                                                      "long_factor": [1.0] * 8, "factor": 2.0,
                                                      "original_max_position_embeddings": 16}).cos_sin(
            torch.zeros(2, 1))


def test_parse_accepts_the_old_rope_scaling_key_type():
    assert parse_scaling({"type": "linear", "factor": 2.0}).rope_type == "linear"


def test_docs_examples_run():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text()
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        exec(compile(block, "docs/scaling.md", "exec"), namespace)
    assert namespace["rope"].attention_scaling == namespace["attention_factor"] == pytest.approx(0.1 * math.log(4) + 1)


@pytest.mark.parametrize("name", ["yarn", "llama3", "dynamic", "linear"])
def test_partial_rotary_matches_transformers(name):
    """partial_rotary_factor in the dict only describes the dim; the rotary dim you pass decides."""
    params, max_pos = CASES[name]
    cfg = _config({**params, "partial_rotary_factor": 0.5}, max_pos, 1e4)
    ref, ref_attn = ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, None, seq_len=9000)
    rope = ropekit.RoPE("vanilla", head_dim=HEAD_DIM, rotary_dim=HEAD_DIM // 2, base=1e4,
                        scaling=scaling_from_config(cfg))
    assert torch.equal(rope.frequencies(1, seq_len=9000)[0], ref)
    assert rope.attention_scaling == ref_attn


def test_axial_allocation_scales_each_axis_as_its_own_spectrum():
    """Axial gives every axis a full spectrum of R/A channels: scaling uses that spectrum's dim."""
    params = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}
    rope = ropekit.RoPE("rope2d", head_dim=HEAD_DIM, allocation="axial", scaling=params)
    W = rope.frequencies(2)
    per_axis, _ = scaled_inv_freq(HEAD_DIM // 2, params)
    torch.testing.assert_close(W[0, : HEAD_DIM // 4], per_axis, rtol=1e-6, atol=0)
    torch.testing.assert_close(W[1, HEAD_DIM // 4:], per_axis, rtol=1e-6, atol=0)
    assert (W[0, HEAD_DIM // 4:] == 0).all() and (W[1, : HEAD_DIM // 4] == 0).all()


# --------------------------------------------------------------------------------------------------
# one pipeline: RoPE and the patch scale the axial allocation alike, each axis as a spectrum of its own


def _yarn64(dim: int, base: float, factor: float, original: int, beta_fast=32.0, beta_slow=1.0):
    """YaRN's inverse frequencies of a rotary of ``dim`` channels, recomputed in float64 from the paper's formulas
    (interpolation by ``factor`` below the correction range, extrapolation above, a linear ramp between)."""
    import math

    j = torch.arange(0, dim, 2, dtype=torch.float64)
    extra = base ** (-j / dim)
    inter = extra / factor

    def corr(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # extrapolated share
    return inter * (1 - keep) + extra * keep


def test_axial_allocation_scales_each_axis_as_its_own_spectrum_in_rope_and_the_patch():
    """RoPE and patch_model asked for the same axial frequencies under YaRN: both equal YaRN over each axis's own
    R/A channels (float64 recomputation), not over the whole head."""
    from transformers import Qwen2VLConfig, Qwen2VLModel

    import ropekit

    rope_params = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64,
                   "mrope_section": [2, 3, 3]}
    want = _yarn64(8, 10000.0, 4.0, 64).float()  # head 16, two axes: 8 channels (4 pairs) each
    rope = ropekit.RoPE(design="rope2d", head_dim=16, allocation="axial", scaling=rope_params)
    W = rope.frequencies(2)
    cfg = Qwen2VLConfig(text_config=dict(hidden_size=32, intermediate_size=48, num_attention_heads=2,
                                         num_key_value_heads=1, vocab_size=80, num_hidden_layers=1,
                                         max_position_embeddings=256, rope_parameters=rope_params),
                        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=1,
                                           spatial_merge_size=2, patch_size=2, temporal_patch_size=2))
    model = ropekit.patch_model(Qwen2VLModel(cfg), "rope2d", allocation="axial")
    Wp = model.__dict__["_ropekit_patch"].geometries["rope2d"].W
    for got in (W, Wp):
        assert got.shape == (2, 8)
        torch.testing.assert_close(got[0, :4], want, rtol=1e-6, atol=0)
        torch.testing.assert_close(got[1, 4:], want, rtol=1e-6, atol=0)
        assert not got[0, 4:].any() and not got[1, :4].any()
