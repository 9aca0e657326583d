"""Frequency-side schemes published 2025–26: Gemma 4's proportional RoPE, Bailing M-RoPE (Ling/Ming VL),
Spiral RoPE and Golden Gate RoPE.

Every expected value is recomputed here in float64 from the scheme's own definition (transformers'/vLLM's
inverse frequencies and pair-to-axis rule, the Spiral RoPE authors' axis-aligned blocks turned by 2×2
rotations, the Golden Gate RoPE blog's angle sequence), never by calling the function under test.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import ropekit
from ropekit import angles, frequency_matrix
from ropekit.rotations.directional import (
    GOLDEN_GATE_STEP,
    golden_gate_matrix,
    nd_directions,
    spiral_matrix,
)

# ---------------------------------------------------------------- shared references


def _inv_freq64(n_pairs, denominator, base):
    """``base^(-2j/denominator)``, j < n_pairs, in float64."""
    return torch.tensor([base ** (-2.0 * j / denominator) for j in range(n_pairs)], dtype=torch.float64)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _gptj(x, theta):
    """GPT-J rotation of pairs (2j, 2j + 1) by ``theta (..., R/2)`` on the first R channels of ``x``."""
    r = 2 * theta.shape[-1]
    even, odd = x[..., 0:r:2], x[..., 1:r:2]
    out = x.clone()
    out[..., 0:r:2] = even * torch.cos(theta) - odd * torch.sin(theta)
    out[..., 1:r:2] = odd * torch.cos(theta) + even * torch.sin(theta)
    return out


def _qk(head_dim, length, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, length, head_dim, generator=g, dtype=torch.float64),
            torch.randn(1, heads, length, head_dim, generator=g, dtype=torch.float64))


# ---------------------------------------------------------------- proportional RoPE (Gemma 4)


def _proportional_ref(head_dim, factor, base):
    """transformers' ``_compute_proportional_rope_parameters``: rope_angles = int(factor·head_dim // 2)
    frequencies ``base^(-2j/head_dim)``, then zeros up to head_dim/2 (float64)."""
    rope_angles = int(factor * head_dim // 2)
    inv = torch.zeros(head_dim // 2, dtype=torch.float64)
    inv[:rope_angles] = _inv_freq64(rope_angles, head_dim, base)
    return inv


@pytest.mark.parametrize("head_dim,factor,base", [(64, 0.25, 1e6), (512, 0.25, 1e6), (128, 0.5, 1e4),
                                                  (96, 0.3, 1e4), (64, 1.0, 1e4), (64, 0.0, 1e4)])
def test_proportional_matches_the_reference_frequencies(head_dim, factor, base):
    W = frequency_matrix("proportional", head_dim, base=base, partial_rotary_factor=factor)
    ref = _proportional_ref(head_dim, factor, base)
    assert W.shape == (1, head_dim // 2) and W.dtype == torch.float32
    torch.testing.assert_close(W[0].double(), ref, rtol=2e-6, atol=0.0)
    # transformers and vLLM compute the rotated part in float32 as 1 / base ** (2j / head_dim): bit for bit
    n = int(factor * head_dim // 2)
    f32 = 1.0 / (base ** (torch.arange(0, 2 * n, 2, dtype=torch.int64).float() / head_dim))
    assert torch.equal(W[0, :n], f32) and not W[0, n:].any()


def test_proportional_sections_equal_the_factor_and_the_edge_cases():
    D = 256
    by_factor = frequency_matrix("proportional", D, base=1e6, partial_rotary_factor=0.25)
    assert torch.equal(frequency_matrix("proportional", D, base=1e6, sections=[32, 96]), by_factor)
    # every pair rotates at factor 1: plain 1-D RoPE over the head dim; none at 0
    assert torch.equal(frequency_matrix("proportional", D, partial_rotary_factor=1.0), frequency_matrix("1d", D))
    assert not frequency_matrix("proportional", D, partial_rotary_factor=0.0).any()
    # vLLM's count int(head_size * factor) // 2 equals transformers' int(factor * head_dim // 2)
    for factor in (0.1, 0.25, 0.3, 0.33, 0.5, 0.77, 0.999):
        for hd in (10, 64, 96, 100, 512):
            W = frequency_matrix("proportional", hd, partial_rotary_factor=factor)
            assert int((W[0] > 0).sum()) == int(hd * factor) // 2


def test_proportional_matches_transformers_gemma4():
    try:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

        config = Gemma4TextConfig(head_dim=32, global_head_dim=64, hidden_size=128, num_attention_heads=4,
                                  num_hidden_layers=2)
        inv, attention_factor = ROPE_INIT_FUNCTIONS["proportional"](config, layer_type="full_attention")
        params = config.rope_parameters["full_attention"]
    except (ImportError, KeyError, TypeError, AttributeError) as err:  # a transformers without Gemma 4
        pytest.skip(f"transformers' Gemma 4 proportional RoPE is not available: {err}")
    W = frequency_matrix("proportional", 64, base=params["rope_theta"],
                         partial_rotary_factor=params["partial_rotary_factor"])
    assert attention_factor == 1.0
    assert torch.equal(W[0], inv.float())


def test_proportional_rotates_like_gemma4_rotate_half():
    """q·cos + rotate_half(q)·sin over the whole head with cos/sin = cat(freqs, freqs): the channels of the
    unrotated pairs, (j, j + D/2) for j ≥ n, come out unchanged."""
    D, L, n, base = 64, 7, 8, 1e6
    rope = ropekit.RoPE("vanilla", head_dim=D, allocation="proportional", sections=[n, D // 2 - n], base=base)
    q, k = _qk(D, L)
    pos = torch.arange(L, dtype=torch.float64) * 3.0 + 2.0
    q2, k2 = rope.rotate(q, k, pos[:, None])
    freqs = pos[:, None] * _proportional_ref(D, n / (D // 2), base)[None]
    emb = torch.cat((freqs, freqs), dim=-1)
    for x, out in ((q, q2), (k, k2)):
        ref = x * emb.cos() + _rotate_half(x) * emb.sin()
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
        passed = torch.cat((torch.arange(n, D // 2), torch.arange(D // 2 + n, D)))
        assert torch.equal(out[..., passed], x[..., passed])


@pytest.mark.parametrize("kwargs,err,words", [
    (dict(), ValueError, ["partial_rotary_factor", "sections", "0.25"]),
    (dict(partial_rotary_factor=0.25, sections=[8, 24]), ValueError, ["exactly one", "got both"]),
    (dict(partial_rotary_factor=1.5), ValueError, ["partial_rotary_factor", "[0, 1]"]),
    (dict(partial_rotary_factor=-0.1), ValueError, ["partial_rotary_factor", "[0, 1]"]),
    (dict(partial_rotary_factor=float("nan")), ValueError, ["partial_rotary_factor"]),
    (dict(partial_rotary_factor=True), TypeError, ["partial_rotary_factor"]),
    (dict(partial_rotary_factor="0.25"), TypeError, ["partial_rotary_factor"]),
    (dict(sections=[8, 8]), ValueError, ["sections", "rotated, unrotated", "32"]),
    (dict(sections=[8, 20, 4]), ValueError, ["sections", "rotated, unrotated"]),
    (dict(sections=[8.0, 24.0]), TypeError, ["sections"]),
])
def test_proportional_bad_parameters(kwargs, err, words):
    with pytest.raises(err) as info:
        frequency_matrix("proportional", 64, **kwargs)
    for w in words:
        assert w in str(info.value)


def test_proportional_refuses_other_axes_and_foreign_factors():
    with pytest.raises(ValueError, match=r"takes 1 axis.*num_axes=1"):
        frequency_matrix("proportional", 64, 3, partial_rotary_factor=0.25)
    for alloc, axes in (("1d", 1), ("mrope", 3), ("bailing-mrope", 3)):
        with pytest.raises(ValueError, match=r"`partial_rotary_factor` belongs to allocation 'proportional'.*rotary_dim"):
            frequency_matrix(alloc, 64, axes, partial_rotary_factor=0.5)


def test_proportional_is_an_allocation():
    assert "proportional" in ropekit.ALLOCATIONS and "bailing-mrope" in ropekit.ALLOCATIONS
    with pytest.raises(ValueError, match="proportional"):
        frequency_matrix("proportinal", 64, partial_rotary_factor=0.25)


# ---------------------------------------------------------------- Bailing M-RoPE (Ling/Ming VL)


def _bailing_axes(sections):
    """vLLM's BailingMRotaryEmbedding.select_cos_sin: spatial = h + w; a pair below it reads the height
    position when even, the width when odd; the pairs from spatial on read time."""
    t, h, w = sections
    spatial = h + w
    return [(1 if j % 2 == 0 else 2) if j < spatial else 0 for j in range(t + spatial)]


@pytest.mark.parametrize("rotary_dim,sections", [(64, [8, 12, 12]), (12, [2, 2, 2]), (128, [16, 24, 24]),
                                                 (32, [16, 0, 0]), (32, [0, 8, 8])])
def test_bailing_matches_vllm_axis_rule(rotary_dim, sections):
    W = frequency_matrix("bailing-mrope", rotary_dim, 3, base=5e5, sections=sections)
    ref = torch.zeros(3, rotary_dim // 2, dtype=torch.float64)
    inv = _inv_freq64(rotary_dim // 2, rotary_dim, 5e5)  # MRotaryEmbedding's spectrum over rotary_dim
    for j, axis in enumerate(_bailing_axes(sections)):
        ref[axis, j] = inv[j]
    torch.testing.assert_close(W.double(), ref, rtol=2e-6, atol=0.0)  # float32 powers of a float32 exponent
    f32 = 1.0 / (5e5 ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    assert torch.equal(W.sum(0), f32)  # one axis per pair, vLLM's float32 inv_freq bit for bit
    # the VideoRoPE paper's rule (h, w, h, w, …, then t) with the same sections
    assert torch.equal(W, frequency_matrix("videorope", rotary_dim, 3, base=5e5, sections=sections))


def test_bailing_selects_positions_like_vllm_unit_case():
    """vLLM's own case: sections [2, 2, 2], rotary dim 12, t/h/w positions (1, 3, 5) and (2, 4, 6): pair j
    reads h, w, h, w, t, t."""
    W = frequency_matrix("bailing-mrope", 12, 3, sections=[2, 2, 2]).double()
    coords = torch.tensor([[1.0, 3.0, 5.0], [2.0, 4.0, 6.0]], dtype=torch.float64)
    chosen = angles(coords, W) / W.sum(0)
    assert chosen.tolist() == [[3, 5, 3, 5, 1, 1], [4, 6, 4, 6, 2, 2]]


def test_bailing_with_interleaved_channels_is_gptj_rotation():
    """vLLM rotates (2j, 2j + 1) by the selected position times inv_freq[j], on the first rotary_dim channels."""
    head, R, sections, L = 80, 64, [8, 12, 12], 9
    rope = ropekit.RoPE("mrope", head_dim=head, rotary_dim=R, allocation="bailing-mrope", sections=sections,
                        channels="interleaved", base=1e4)
    g = torch.Generator().manual_seed(3)
    coords = torch.randint(0, 40, (L, 3), generator=g).double()
    q, k = _qk(head, L)
    q2, k2 = rope.rotate(q, k, coords)
    axes = torch.tensor(_bailing_axes(sections))
    theta = coords[:, axes] * _inv_freq64(R // 2, R, 1e4)[None]
    torch.testing.assert_close(q2, _gptj(q, theta), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k2, _gptj(k, theta), rtol=1e-6, atol=1e-6)
    assert torch.equal(q2[..., R:], q[..., R:])


@pytest.mark.parametrize("kwargs,err,words", [
    (dict(), ValueError, ["sections=[t, h, w]", "mrope_section", "[8, 12, 12]"]),
    (dict(sections=[8, 14, 10]), ValueError, ["sections", "h == w"]),
    (dict(sections=[8, 12, 13]), ValueError, ["sections", "32"]),
    (dict(sections=[8, 24]), ValueError, ["sections"]),
    (dict(sections=[8.0, 12.0, 12.0]), TypeError, ["sections"]),
])
def test_bailing_bad_parameters(kwargs, err, words):
    with pytest.raises(err) as info:
        frequency_matrix("bailing-mrope", 64, 3, **kwargs)
    for w in words:
        assert w in str(info.value)
    with pytest.raises(ValueError, match="num_axes=3"):
        frequency_matrix("bailing-mrope", 64, 2, sections=[8, 12, 12])


# ---------------------------------------------------------------- Spiral RoPE


def _turn(v, alpha):
    c, s = math.cos(alpha), math.sin(alpha)
    return (c * v[0] - s * v[1], s * v[0] + c * v[1])


def _spiral_ref(head_dim, K, base=10000.0, max_freq=1.0, same_theta=False):
    """The authors' construction, re-derived: their rotary module gets dim = head_dim/2 and builds
    max_freq·base^(-2n/dim) (n < dim/2), or with SAME_THETA dim/ROTATE frequencies each block of two
    repeated ROTATE = K/2 times; the row copy fills the first head_dim/2 channels and the column copy the
    rest (GPT-J pairs), and 4-channel block B is turned by (B mod K/2)·90°/(K/2). Turning a map that grows
    along unit vector e by α makes it grow along e turned by α (row e = (1, 0), column e = (0, 1))."""
    dim = head_dim // 2
    rotate = K // 2
    if same_theta:
        eff = dim // rotate
        spectrum = [max_freq * base ** (-2.0 * n / eff) for n in range(eff // 2)]
        per_half = []
        for block in range(len(spectrum) // 2):
            per_half += [spectrum[2 * block], spectrum[2 * block + 1]] * rotate
    else:
        per_half = [max_freq * base ** (-2.0 * n / dim) for n in range(dim // 2)]
    omegas = per_half + per_half  # row copy, then column copy
    W = torch.zeros(2, head_dim // 2, dtype=torch.float64)
    for pair, omega in enumerate(omegas):
        axis = (1.0, 0.0) if pair < head_dim // 4 else (0.0, 1.0)
        block = pair // 2
        u = _turn(axis, (block % rotate) * (math.pi / 2) / rotate)
        W[0, pair], W[1, pair] = omega * u[0], omega * u[1]
    return W


@pytest.mark.parametrize("head_dim,K,same_theta", [(64, 4, False), (64, 8, False), (128, 4, False),
                                                   (64, 4, True), (128, 8, True), (48, 4, False), (24, 4, False)])
def test_spiral_matches_the_authors_construction(head_dim, K, same_theta):
    W = spiral_matrix(head_dim, K, same_theta=same_theta, max_freq=1.5)
    ref = _spiral_ref(head_dim, K, max_freq=1.5, same_theta=same_theta)
    assert W.shape == (2, head_dim // 2)
    torch.testing.assert_close(W.double(), ref, rtol=1e-6, atol=1e-7)


def test_spiral_directions_are_evenly_spaced_and_two_is_axial():
    R, K = 64, 4
    W = spiral_matrix(R, K, dtype=torch.float64)
    phi = torch.remainder(torch.atan2(W[1], W[0]), math.pi)
    steps = torch.round(phi / (math.pi / K))
    torch.testing.assert_close(phi, steps * math.pi / K, rtol=0, atol=1e-12)
    assert sorted(torch.bincount(steps.long() % K).tolist()) == [R // (2 * K)] * K
    for R in (8, 16, 64, 256):
        for base in (100.0, 10000.0):
            assert torch.equal(spiral_matrix(R, 2, base=base), frequency_matrix("axial", R, 2, base=base))
    # same_theta: every direction carries the same set of R/(2K) frequencies
    W = spiral_matrix(128, 8, same_theta=True, dtype=torch.float64)
    mag, k = W.norm(dim=0), torch.round(torch.remainder(torch.atan2(W[1], W[0]), math.pi) / (math.pi / 8)).long()
    sets = [sorted(round(v, 12) for v in mag[k == d].tolist()) for d in range(8)]
    assert all(s == sets[0] for s in sets) and len(sets[0]) == 128 // 16


def _resample_turned(angle_map, alpha):
    """Turn a (n, n) angle map about the grid centre as the authors' code does: an affine sampling grid
    (output point (x, y) reads the input at R(α)(x, y), corners aligned), bilinear, clamped at the border."""
    n = angle_map.shape[-1]
    theta = torch.tensor([[[math.cos(alpha), -math.sin(alpha), 0.0],
                           [math.sin(alpha), math.cos(alpha), 0.0]]], dtype=torch.float64)
    grid = F.affine_grid(theta, (1, 1, n, n), align_corners=True)
    out = F.grid_sample(angle_map[None, None], grid, mode="bilinear", padding_mode="border", align_corners=True)
    return out[0, 0], grid[0]


def test_spiral_matches_resampled_maps_inside_the_grid_only():
    """Inside the grid the code's resampled angles equal W·p up to one constant per pair (which q·k does
    not see); where the turned sample leaves the grid the code clamps and W does not."""
    R, K, n = 32, 4, 9
    W = spiral_matrix(R, K, dtype=torch.float64)
    ref_axis = _spiral_ref(R, 2)  # the axis-aligned starting maps (no turn)
    r, c = torch.meshgrid(torch.arange(n, dtype=torch.float64), torch.arange(n, dtype=torch.float64), indexing="ij")
    m = (n - 1) // 2
    clamped_somewhere = False
    for pair in range(R // 2):
        start = ref_axis[0, pair] * r + ref_axis[1, pair] * c
        alpha = ((pair // 2) % (K // 2)) * math.pi / K
        code, grid = _resample_turned(start, alpha)
        mine = W[0, pair] * r + W[1, pair] * c
        inside = (grid.abs() <= 1 + 1e-12).all(-1)
        diff = (code - code[m, m]) - (mine - mine[m, m])
        assert diff[inside].abs().max() < 1e-9
        if (~inside).any():
            clamped_somewhere = True
            assert diff[~inside].abs().max() > 0.1 * W[:, pair].norm()  # a tenth of a grid step or more
    assert clamped_somewhere


def test_spiral_scores_are_relative():
    W = spiral_matrix(64, 8, dtype=torch.float64)
    q, k = _qk(64, 1, heads=1)
    p, d = torch.tensor([[3.0, -2.0], [10.0, 7.5]], dtype=torch.float64), torch.tensor([4.0, -1.0], dtype=torch.float64)

    def score(pq, pk):
        cq, sq = ropekit.cos_sin(angles(pq[None], W))
        ck, sk = ropekit.cos_sin(angles(pk[None], W))
        return (ropekit.apply_rotary(q, cq, sq, channels="interleaved")
                * ropekit.apply_rotary(k, ck, sk, channels="interleaved")).sum()

    torch.testing.assert_close(score(p[0], p[1]), score(p[0] + d, p[1] + d), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("args,kwargs,err,words", [
    ((64, 3), {}, ValueError, ["directions", "even"]),
    ((64, 0), {}, ValueError, ["directions"]),
    ((36, 4), {}, ValueError, ["rotary_dim", "divisible by", "8"]),
    ((40, 4), dict(same_theta=True), ValueError, ["same_theta", "16"]),
    ((64, 4), dict(max_freq=0.0), ValueError, ["max_freq"]),
    ((64, 4), dict(max_freq=float("inf")), ValueError, ["max_freq"]),
    ((64, 4), dict(same_theta=1), TypeError, ["same_theta"]),
    ((64, 4), dict(base=1.0), ValueError, ["base"]),
    ((64, 4.0), {}, TypeError, ["directions"]),
])
def test_spiral_bad_parameters(args, kwargs, err, words):
    with pytest.raises(err) as info:
        spiral_matrix(*args, **kwargs)
    for w in words:
        assert w in str(info.value)


# ---------------------------------------------------------------- Golden Gate RoPE


def _golden_gate_ref(head_dim, heads, min_freq, max_freq, zero_freqs):
    """The blog's 2-D module: magnitudes zeros, then min·(max/min)^t over t = linspace(0, 1, m); pair f of
    head h points at angle (h·n + f)·π/φ as (x, y) = (cos, sin), x the column, y the row."""
    n = head_dim // 2
    m = n - zero_freqs
    logs = [math.log(min_freq) + (i / (m - 1) if m > 1 else 0.0) * (math.log(max_freq) - math.log(min_freq))
            for i in range(m)]
    omega = [0.0] * zero_freqs + [math.exp(v) for v in logs]
    golden_ratio = (1 + math.sqrt(5)) / 2
    W = torch.zeros(heads, 2, n, dtype=torch.float64)
    for h in range(heads):
        for f in range(n):
            a = (h * n + f) * math.pi / golden_ratio
            x, y = math.cos(a), math.sin(a)
            W[h, 0, f], W[h, 1, f] = omega[f] * y, omega[f] * x  # (row, col)
    return W


@pytest.mark.parametrize("head_dim,heads,lo,hi,zeros", [(64, 4, 0.2, 20.0, 0), (32, 8, 1.0, 1e4, 4),
                                                        (16, 1, 0.8, 10.0, 7), (16, 2, 3.0, 3.0, 0),
                                                        (8, 3, 5.0, 0.5, 2)])
def test_golden_gate_matches_the_blog_module(head_dim, heads, lo, hi, zeros):
    W = golden_gate_matrix(head_dim, heads, min_freq=lo, max_freq=hi, zero_freqs=zeros, dtype=torch.float64)
    torch.testing.assert_close(W, _golden_gate_ref(head_dim, heads, lo, hi, zeros), rtol=1e-12, atol=1e-12)
    single = golden_gate_matrix(head_dim, min_freq=lo, max_freq=hi, zero_freqs=zeros)
    assert single.shape == (2, head_dim // 2) and torch.equal(single, W[0].float())


def test_golden_gate_differs_from_the_golden_method():
    """directional_matrix's 'golden' steps by π(1 − √5) (the full-turn golden angle, −2π/φ), Golden Gate by
    π/φ; the two direction sequences part after the first pair."""
    assert math.isclose(GOLDEN_GATE_STEP, math.pi / ((1 + math.sqrt(5)) / 2), rel_tol=1e-15)
    golden = nd_directions(8, 2, "golden")  # (cos, sin) of j·π(1 − √5)
    gg = golden_gate_matrix(16, min_freq=1.0, max_freq=1.0, dtype=torch.float64)
    gg_xy = torch.stack((gg[1], gg[0]), dim=-1)  # back to (x, y) = (col, row)
    torch.testing.assert_close(gg_xy[0], golden[0])
    assert not torch.allclose(gg_xy[1:], golden[1:], atol=1e-3)
    torch.testing.assert_close(golden[1], torch.tensor([math.cos(-2 * GOLDEN_GATE_STEP),
                                                        math.sin(-2 * GOLDEN_GATE_STEP)], dtype=torch.float64))


def test_golden_gate_per_head_angles():
    W = golden_gate_matrix(16, 3, min_freq=0.5, max_freq=8.0)
    coords = torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, -1.0]])
    a = angles(coords, W)
    assert a.shape == (3, 3, 8)
    for h in range(3):
        torch.testing.assert_close(a[h], angles(coords, W[h]))


@pytest.mark.parametrize("args,kwargs,err,words", [
    ((64,), dict(min_freq=0.0, max_freq=10.0), ValueError, ["min_freq"]),
    ((64,), dict(min_freq=1.0, max_freq=-1.0), ValueError, ["max_freq"]),
    ((64,), dict(min_freq=1.0, max_freq=float("nan")), ValueError, ["max_freq"]),
    ((64,), dict(min_freq=1.0, max_freq=10.0, zero_freqs=33), ValueError, ["zero_freqs", "32"]),
    ((64,), dict(min_freq=1.0, max_freq=10.0, zero_freqs=-1), ValueError, ["zero_freqs"]),
    ((64,), dict(min_freq=1.0, max_freq=10.0, zero_freqs=0.5), TypeError, ["zero_freqs"]),
    ((64, 0), dict(min_freq=1.0, max_freq=10.0), ValueError, ["heads"]),
    ((63,), dict(min_freq=1.0, max_freq=10.0), ValueError, ["rotary_dim"]),
    ((64,), dict(min_freq="1", max_freq=10.0), TypeError, ["min_freq"]),
])
def test_golden_gate_bad_parameters(args, kwargs, err, words):
    with pytest.raises(err) as info:
        golden_gate_matrix(*args, **kwargs)
    for w in words:
        assert w in str(info.value)
    with pytest.raises(TypeError, match="min_freq"):
        golden_gate_matrix(64, max_freq=10.0)  # the magnitudes have no default: the reference's are for [-1, 1] grids
