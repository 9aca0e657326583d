"""Trust in the rotation/apply stage: no guessing, no silent garbage, confined non-finite values.

Every test here is a defect a user could hit (issue 8): ambiguous ``seq_dim``, q/k of the wrong width,
coordinates with the wrong number of axes, NaN leaking between GeoPE triples and tokens, absurd bases
and scales, raw tracebacks instead of sentences, and rotary families that were not drop-in. References
are float64 brute force (explicit matrices) or invariants (norm of each rotated pair/triple).
"""
from __future__ import annotations

import math

import pytest
import torch

import ropekit
from ropekit import (
    GeoPE,
    MixedFrequencies,
    RoPE,
    angles,
    apply_geope,
    apply_rotary,
    apply_rotary_fused,
    apply_rotary_qk,
    apply_rotary_qk_fused,
    cos_sin,
    design_frequencies,
    directional_matrix,
    frequency_matrix,
    geope_rotation,
    inv_freq,
    linear_geope_attention,
    nd_directions,
)
from ropekit.apply import triton_rope
from ropekit.nn import RotaryAttention, TinyViT


def _qk(B=2, H=3, L=5, D=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, L, D, generator=g, dtype=dtype), torch.randn(B, H, L, D, generator=g, dtype=dtype)


def _planar_reference(x, coords, W, channels="half"):
    """float64 rotation of ``x (B, H, L, D)`` pair by pair with explicit 2×2 matrices."""
    ang = coords.double() @ W.double()  # (L, R/2)
    out = x.double().clone()
    half = ang.shape[-1]
    for j in range(half):
        a, b = (j, j + half) if channels == "half" else (2 * j, 2 * j + 1)
        c, s = ang[:, j].cos(), ang[:, j].sin()
        xa, xb = x.double()[..., a], x.double()[..., b]
        out[..., a], out[..., b] = xa * c - xb * s, xa * s + xb * c
    return out


# --- 1. seq_dim names a dimension; it is never guessed ------------------------------------------------

def test_seq_dim_2_on_bhld_is_the_sequence_dim():
    """``seq_dim=2`` on (B, H, L, D) must mean dim 2 = L (it used to be read as BLHD's dim 1)."""
    rope = RoPE("vanilla", head_dim=16)
    q, k = _qk(B=1, H=3, L=5)
    coords = torch.arange(5.0)[:, None]
    ref = _planar_reference(q, coords, rope.frequencies(1))
    for sd in (2, -2):
        out, _ = rope.rotate(q, k, coords, seq_dim=sd)
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    # and BLHD with 1 or -3 gives the same rotation, transposed
    for sd in (1, -3):
        out, _ = rope.rotate(q.transpose(1, 2), k.transpose(1, 2), coords, seq_dim=sd)
        torch.testing.assert_close(out.transpose(1, 2).double(), ref, rtol=1e-5, atol=1e-5)


def _apply_paths(x, cos, sin, seq_dim):
    yield "apply_rotary", lambda: apply_rotary(x, cos, sin, seq_dim=seq_dim)
    yield "apply_rotary_qk", lambda: apply_rotary_qk(x, x, cos, sin, seq_dim=seq_dim)
    yield "apply_rotary_fused", lambda: apply_rotary_fused(x, cos, sin, seq_dim=seq_dim)
    yield "apply_rotary_qk_fused", lambda: apply_rotary_qk_fused(x, x, cos, sin, seq_dim=seq_dim)


@pytest.mark.parametrize("seq_dim", [0, 3, -1, -4, 4, 1.0, True, "2"])
def test_bad_seq_dim_is_rejected_on_every_path(seq_dim):
    x = torch.randn(2, 3, 5, 8)
    cos = sin = torch.ones(5, 4)
    paths = list(_apply_paths(x, cos, sin, seq_dim))
    paths.append(("RoPE.rotate", lambda: RoPE("vanilla", head_dim=8).rotate(x, x, torch.zeros(5, 1), seq_dim=seq_dim)))
    rot = geope_rotation(torch.zeros(5, 2), 8)
    paths.append(("apply_geope", lambda: apply_geope(x, rot, seq_dim=seq_dim)))
    paths.append(("GeoPE.rotate", lambda: GeoPE(8).rotate(x, x, torch.zeros(5, 2), seq_dim=seq_dim)))
    paths.append(("linear_geope", lambda: linear_geope_attention(x, x, x, torch.zeros(5, 2), seq_dim=seq_dim)))
    for name, call in paths:
        with pytest.raises((ValueError, TypeError), match="seq_dim") as info:
            call()
        assert info.type in (ValueError, TypeError), name


def test_seq_dim_2_reaches_geope_and_linear_geope():
    x = torch.randn(1, 2, 5, 6, dtype=torch.float64)
    coords = torch.rand(5, 2, dtype=torch.float64) * 4
    rot = geope_rotation(coords, 6)
    torch.testing.assert_close(apply_geope(x, rot, seq_dim=2), apply_geope(x, rot))
    torch.testing.assert_close(apply_geope(x.transpose(1, 2), rot, seq_dim=-3).transpose(1, 2), apply_geope(x, rot))
    a = linear_geope_attention(x, x, x, coords, seq_dim=2)
    torch.testing.assert_close(a, linear_geope_attention(x, x, x, coords))


def test_triton_wrapper_reads_seq_dim_literally(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = torch.randn(1, 3, 5, 8)
    ang = torch.rand(5, 4) * 3
    ref = apply_rotary(x, ang.cos(), ang.sin())
    torch.testing.assert_close(triton_rope.apply_rotary_triton(x, ang.cos(), ang.sin(), seq_dim=2), ref)
    with pytest.raises(ValueError, match="seq_dim"):
        triton_rope.apply_rotary_triton(x, ang.cos(), ang.sin(), seq_dim=0)


# --- 2. q/k width must equal head_dim ------------------------------------------------------------------

def test_rotate_rejects_tensors_wider_than_head_dim():
    rope = RoPE("circle", head_dim=64)
    q, k = _qk(B=1, H=2, L=5, D=128)
    with pytest.raises(ValueError, match=r"head_dim.*64.*128|128.*head_dim.*64"):
        rope.rotate(q, k, "T5")
    with pytest.raises(ValueError, match="head_dim"):
        GeoPE(12).rotate(torch.randn(1, 1, 4, 15), torch.randn(1, 1, 4, 15), torch.zeros(4, 2))


def test_rotate_rejects_incompatible_q_and_k():
    rope = RoPE("vanilla", head_dim=8)
    q = torch.randn(2, 2, 5, 8)
    with pytest.raises(ValueError, match="`k`"):
        rope.rotate(q, torch.randn(3, 2, 5, 8), "T5")  # batch differs
    with pytest.raises(ValueError, match="`k`"):
        rope.rotate(q, torch.randn(2, 2, 5, 8)[..., None, :], "T5")  # rank differs
    with pytest.raises(ValueError, match="`k`"):
        GeoPE(8).rotate(q, torch.randn(3, 2, 5, 8), torch.zeros(5, 2))


# --- 3. the axis count of coords must match the design/allocation ----------------------------------------

def test_design_frequencies_does_not_switch_allocation_silently():
    with pytest.raises(ValueError, match=r"circle.*3 axes.*4"):
        design_frequencies("circle", 64, 4)
    with pytest.raises(ValueError, match=r"mrope.*3 axes.*2"):
        design_frequencies("mrope", 64, 2)
    # the design's own count still works, and an explicit allocation for other counts too
    assert design_frequencies("circle", 64, 3).shape == (3, 32)
    assert design_frequencies("circle", 64, 4, allocation="interleaved").shape == (4, 32)


def test_rope_rejects_coords_of_another_design():
    rope = RoPE("circle", head_dim=32)
    vcoords = ropekit.positions("T2 V2x2x2 T2", "vrope")  # 4 axes
    q, k = _qk(B=1, H=1, L=vcoords.shape[0], D=32)
    with pytest.raises(ValueError, match=r"circle.*3.*coords.*4|coords.*4.*circle.*3"):
        rope.rotate(q, k, vcoords)
    with pytest.raises(ValueError, match="coords"):
        RoPE("rope2d", head_dim=32).cos_sin(torch.zeros(5, 3))


def test_frequency_matrix_mrope_leaves_no_axis_without_frequencies():
    with pytest.raises(ValueError, match="sections"):
        frequency_matrix("mrope", 64, 4)
    with pytest.raises(ValueError, match="sections"):
        frequency_matrix("interleaved", 64, 2, sections=[16, 8, 8])


# --- 4. a non-finite channel only affects its own pair/triple of its own token -----------------------------

def _nan_confinement(run, D, group, token=3, channel=0, L=6):
    """Put NaN (and +inf) in one channel of one token; everything outside its group must stay finite."""
    for bad in (math.nan, math.inf):
        x = torch.randn(1, 2, L, D)
        x[0, 1, token, channel] = bad
        out = run(x)
        mask = torch.ones_like(out, dtype=torch.bool)
        for c in group(channel):
            mask[0, 1, token, c] = False
        assert torch.isfinite(out[mask]).all(), f"non-finite leaked for {bad}"


def _pair(D, channels="half"):
    def group(c):
        if channels == "half":
            return {c % (D // 2), c % (D // 2) + D // 2}
        return {c - c % 2, c - c % 2 + 1}
    return group


def _triple(c):
    return {3 * (c // 3), 3 * (c // 3) + 1, 3 * (c // 3) + 2}


@pytest.mark.parametrize("channels", ["half", "interleaved"])
@pytest.mark.parametrize("channel", [0, 5])
def test_planar_paths_confine_non_finite_values(channels, channel, monkeypatch):
    D, L = 8, 6
    ang = torch.rand(L, D // 2) * 6
    c, s = ang.cos(), ang.sin()
    group = _pair(D, channels)
    paths = {
        "eager": lambda x: apply_rotary(x, c, s, channels=channels),
        "fused": lambda x: apply_rotary_fused(x, c, s, channels=channels),
        "fused grad": lambda x: apply_rotary_fused(x.requires_grad_(True), c, s, channels=channels).detach(),
        "RoPE": lambda x: RoPE("vanilla", head_dim=D, channels=channels).rotate(x, x, torch.arange(float(L))[:, None])[0],
    }
    for name, run in paths.items():
        _nan_confinement(run, D, group, channel=channel, L=L)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _nan_confinement(lambda x: triton_rope.apply_rotary_triton(x, c, s, channels=channels), D, group,
                     channel=channel, L=L)


def test_compiled_paths_confine_non_finite_values():
    D, L = 6, 6
    ang = torch.rand(L, D // 2) * 6
    c, s = ang.cos(), ang.sin()
    torch._dynamo.reset()
    planar = torch.compile(lambda x: apply_rotary_fused(x, c, s), fullgraph=True, backend="aot_eager")
    _nan_confinement(planar, D, _pair(D))
    rot = geope_rotation(torch.rand(L, 2) * 5, D)
    geo = torch.compile(lambda x: apply_geope(x, rot), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        _nan_confinement(geo, D, _triple, channel=4)


@pytest.mark.parametrize("channel", [0, 4, 8])
@pytest.mark.parametrize("D", [12, 14])
def test_geope_confines_non_finite_values_in_both_paths(channel, D):
    """The issue's reproducer: NaN in token 3, channel 0 used to reach token 2 and the next triple."""
    geo = GeoPE(D)
    coords = torch.rand(6, 2) * 5

    def no_grad(x):
        with torch.no_grad():
            return geo.rotate(x, x, coords)[0]

    def grad(x):
        return geo.rotate(x.requires_grad_(True), x, coords)[0].detach()

    def group(c):
        return _triple(c) if c < 3 * (D // 3) else {c}

    for run in (no_grad, grad):
        _nan_confinement(run, D, group, channel=channel)
    # batched (B, L, A) coords and (B, L, H, D) layout take other eager branches
    bcoords = torch.rand(1, 6, 2) * 5
    rot = geope_rotation(bcoords, D)
    with torch.no_grad():
        _nan_confinement(lambda x: apply_geope(x.transpose(1, 2), rot, seq_dim=1).transpose(1, 2), D, group,
                         channel=channel)


# --- 5/6. bad numbers are refused --------------------------------------------------------------------------

def test_directional_matrix_takes_floating_dtypes_only():
    with pytest.raises(TypeError, match="dtype"):
        directional_matrix(16, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match="dtype"):
        directional_matrix(16, 2, dtype="float32")


@pytest.mark.parametrize("sections", [[2.9, 3, 3], [3.0, 3, 2.5], [True, 4, 3]])
def test_non_integer_sections_are_rejected_not_truncated(sections):
    with pytest.raises((TypeError, ValueError), match="sections"):
        frequency_matrix("mrope", 16, 3, sections=sections)
    with pytest.raises((TypeError, ValueError), match="sections"):
        RoPE("mrope", head_dim=16, sections=sections).frequencies(3)
    with pytest.raises((TypeError, ValueError), match="sections"):
        design_frequencies("mrope", 16, 3, sections=sections)


@pytest.mark.parametrize("base", [1e-50, 0.0, -2.0, math.inf, math.nan, 1.0, 1e-3])
def test_degenerate_bases_are_rejected(base):
    with pytest.raises(ValueError, match="base"):
        RoPE("vanilla", head_dim=16, base=base)
    with pytest.raises(ValueError, match="base"):
        inv_freq(16, base)
    with pytest.raises(ValueError, match="base"):
        directional_matrix(16, 2, base=base)


@pytest.mark.parametrize("lam", [1e-50, math.inf, math.nan, 1.0])
def test_degenerate_geope_lambda_is_rejected(lam):
    with pytest.raises(ValueError, match="lam"):
        GeoPE(12, lam=lam)


@pytest.mark.parametrize("scale", [math.inf, math.nan, 0.0, -1.0, True])
def test_linear_geope_scale_must_be_finite_and_positive(scale):
    x = torch.randn(1, 1, 4, 6)
    with pytest.raises((ValueError, TypeError), match="scale"):
        linear_geope_attention(x, x, x, torch.zeros(4, 2), scale=scale)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e38])
def test_non_finite_coords_and_overflowing_angles_are_rejected(value):
    coords = torch.zeros(4, 1)
    coords[2, 0] = value
    rope = RoPE("vanilla", head_dim=8)
    q, k = _qk(B=1, H=1, L=4, D=8)
    if math.isfinite(value):  # finite coords whose angles are finite are fine
        assert torch.isfinite(rope.cos_sin(coords)[0]).all()
    else:
        for call in (lambda: rope.cos_sin(coords), lambda: rope.rotate(q, k, coords)):
            with pytest.raises(ValueError, match="coords"):
                call()
    big = torch.full((4, 2), 3e38)  # finite float32, but a dense W sums two such products: overflow
    with pytest.raises(ValueError, match="coords"):
        angles(big, torch.ones(2, 8))
    geo_coords = torch.zeros(4, 2)
    geo_coords[1, 1] = value if value != 1e38 else 3e38
    with pytest.raises(ValueError, match="coords"):
        GeoPE(12).rotate(torch.randn(1, 1, 4, 12), torch.randn(1, 1, 4, 12), geo_coords)


# --- 7. sentences instead of tracebacks --------------------------------------------------------------------

def test_linear_geope_with_empty_sequences_matches_sdpa_shapes():
    q = torch.randn(2, 3, 0, 6)
    out = linear_geope_attention(q, q, q, torch.zeros(0, 2))
    assert out.shape == (2, 3, 0, 6)
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert out.shape == ref.shape


@pytest.mark.parametrize("call,name", [
    (lambda: apply_rotary(torch.randn(1, 1, 4, 8), torch.ones(4), torch.ones(4)), "cos"),
    (lambda: apply_rotary(torch.randn(1, 1, 4, 8), [[1.0] * 4] * 4, [[0.0] * 4] * 4), "cos"),
    (lambda: apply_rotary(torch.randn(1, 1, 4, 8), None, None), "cos"),
    (lambda: apply_rotary_fused(torch.randn(1, 1, 4, 8), torch.ones(4, 4), None), "sin"),
    (lambda: RoPE("vanilla", head_dim=8).rotate(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), torch.arange(4.0)), "coords"),
    (lambda: angles(torch.zeros(4, 2), torch.ones(3)), "W"),
    (lambda: angles(torch.tensor(1.0), torch.ones(1, 3)), "coords"),
    (lambda: nd_directions(4, 2, seed="a"), "seed"),
    (lambda: directional_matrix(8, 2, seed="a"), "seed"),
    (lambda: cos_sin([0.0, 1.0]), "angles"),
    (lambda: RoPE("vanilla", head_dim=8).cos_sin([[0.0]]), "coords"),
    (lambda: MixedFrequencies(8, 2).rotate(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.zeros(4)), "coords"),
])
def test_bad_arguments_get_a_sentence_naming_them(call, name):
    with pytest.raises((ValueError, TypeError), match=f"`{name}`"):
        call()


def test_design_options_none_means_no_options():
    assert RoPE("circle", head_dim=16, design_options=None).design_options == {}


# --- 8/9. every rotary family is a drop-in rotary ------------------------------------------------------------

def test_geope_accepts_layouts_like_rope():
    geo = GeoPE(12)
    q, k = _qk(B=1, H=2, L=6, D=12)
    out = geo.rotate(q, k, "G2x3")
    ref = geo.rotate(q, k, ropekit.positions("G2x3", "rope2d"))
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=0)
    torch.testing.assert_close(geo.rotate(q, k, ropekit.Layout.parse("G2x3"))[1], ref[1], rtol=0, atol=0)


def _families():
    yield "rope mrope", lambda hd: RoPE("mrope", head_dim=hd), 3
    yield "rope rope2d", lambda hd: RoPE("rope2d", head_dim=hd), 2
    yield "rope axial", lambda hd: RoPE("rope2d", head_dim=hd, allocation="axial"), 2
    yield "directional", lambda hd: ropekit.DirectionalRoPE(hd, 2, seed=0), 2
    yield "mixed", lambda hd: MixedFrequencies(hd, 2, 2, seed=0), 2
    yield "geope", lambda hd: GeoPE(hd), 2


@pytest.mark.parametrize("name,make,axes", list(_families()), ids=[f[0] for f in _families()])
def test_every_family_is_a_drop_in_rotary(name, make, axes):
    """Same ``rotate(q, k, coords)`` contract through ropekit.nn: translation invariance of attention."""
    torch.manual_seed(0)
    attn = RotaryAttention(32, 2, make(16)).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    coords = torch.rand(9, axes, dtype=torch.float64) * 4
    a = attn(x, coords)
    assert torch.isfinite(a).all()
    if name != "geope":  # planar families are exactly relative
        shift = torch.arange(1.0, axes + 1, dtype=torch.float64) * 7
        torch.testing.assert_close(attn(x, coords + shift), a, rtol=0, atol=1e-9)
    assert not torch.allclose(attn(x, coords.flip(0)), a)
    if axes == 2:
        vit = TinyViT(image_size=8, patch=4, dim=32, depth=2, heads=2, num_classes=3,
                      rotary_factory=lambda i: make(16))
        vit(torch.randn(2, 3, 8, 8)).sum().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in vit.parameters())


def test_mixed_rotate_equals_the_functional_recipe():
    mixed = MixedFrequencies(8, 2, 2, seed=1)
    q, k = _qk(B=2, H=2, L=5, D=8)
    coords = torch.rand(5, 2) * 3
    c, s = cos_sin(mixed(coords))  # (H, L, R/2)
    ref_q = torch.stack([_planar_reference(q[:, h:h + 1], coords, mixed.freqs[h].detach())[:, 0] for h in range(2)], 1)
    out_q, _ = mixed.rotate(q, k, coords)
    torch.testing.assert_close(out_q.double(), ref_q, rtol=1e-5, atol=1e-5)
    assert c.shape == (2, 5, 4)


# --- 10. reprs say what is used -------------------------------------------------------------------------------

def test_reprs_show_the_resolved_configuration():
    r = repr(RoPE("circle", head_dim=64))
    assert "allocation='mrope'" in r and "rotary_dim=64" in r and "None" not in r
    g = repr(GeoPE(12, lam=50.0))
    assert g.startswith("GeoPE(") and "head_dim=12" in g and "lam=50.0" in g


# --- 11. property tests: every public entry point, random bad and random valid inputs ----------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ropekit.apply.geope import apply_geope_qk  # noqa: E402,F401

_SHAPES = [(), (0,), (3,), (5, 4), (5, 1), (4, 3), (1, 1, 5, 8), (2, 2, 5, 8), (1, 5, 2, 8), (1, 2, 5, 7),
           (2, 5, 3), (1, 2, 0, 8), (1, 2, 3, 4, 5)]
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.int64, torch.bool, torch.complex64]
_FILLS = ["randn", "zeros", "nan", "inf", "huge"]


def _tensor(shape, dtype, fill):
    t = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)), dtype=torch.float64)
    t = {"randn": t, "zeros": t * 0, "nan": t * math.nan, "inf": t + math.inf, "huge": t * 1e300}[fill]
    if dtype == torch.bool:
        return t > 0
    if dtype == torch.int64:
        return t.clamp(-1e6, 1e6).nan_to_num().long()
    return t.to(dtype)


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([-(2**63), -1, 0, 1, 2, 3, 7, 10**6, 10**20]),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 0.0, 0.5, 1.0, 2.9, 1e-50, 1e300]),
    st.sampled_from(["", "a", "half", "mrope", "bhld", "float32"]),
    st.lists(st.sampled_from([1, 2.5, "x", None]), max_size=3),
    st.builds(_tensor, st.sampled_from(_SHAPES), st.sampled_from(_DTYPES), st.sampled_from(_FILLS)),
    st.sampled_from([torch.int64, torch.float32, object(), {}, {"radius": "a"}]),
)


def _ang(L=5, half=4):
    return torch.rand(L, half, generator=torch.Generator().manual_seed(1)) * 6


def _planar(fn, qk):
    def valid():
        q, k = _qk(B=1, H=2, L=5, D=8)
        kw = dict(cos=_ang().cos(), sin=_ang().sin(), channels="half", seq_dim=-2)
        return dict(q=q, k=k, **kw) if qk else dict(x=q, **kw)
    return valid, fn


def _rope_rotate(**kw):
    return RoPE("rope2d", head_dim=8).rotate(kw["q"], kw["k"], kw["coords"], seq_dim=kw["seq_dim"])


def _mixed_rotate(**kw):
    return MixedFrequencies(**{k: v for k, v in kw.items() if k in ("rotary_dim", "num_heads", "num_axes", "theta",
                                                                     "seed")}).rotate(kw["q"], kw["k"], kw["coords"])


def _geope_rotate(**kw):
    return GeoPE(kw["head_dim"], lam=kw["lam"], freq_style=kw["freq_style"]).rotate(
        kw["q"], kw["k"], kw["coords"], seq_dim=kw["seq_dim"])


def _apply_geope(**kw):
    return apply_geope(kw["x"], geope_rotation(kw["coords"], 6), seq_dim=kw["seq_dim"])


def _qkv(L=5, D=6):
    q, k = _qk(B=1, H=2, L=L, D=D)
    return dict(q=q, k=k, v=k.clone())


ENTRIES = {
    "apply_rotary": _planar(apply_rotary, False),
    "apply_rotary_qk": _planar(apply_rotary_qk, True),
    "apply_rotary_fused": _planar(apply_rotary_fused, False),
    "apply_rotary_qk_fused": _planar(apply_rotary_qk_fused, True),
    "cos_sin": (lambda: dict(angles=_ang()), cos_sin),
    "angles": (lambda: dict(coords=torch.rand(5, 3) * 9, W=frequency_matrix("mrope", 16, 3)), angles),
    "frequency_matrix": (lambda: dict(allocation="mrope", rotary_dim=16, num_axes=3, base=100.0, sections=[2, 3, 3]),
                         frequency_matrix),
    "inv_freq": (lambda: dict(dim=16, base=100.0), inv_freq),
    "design_frequencies": (lambda: dict(design="circle", rotary_dim=16, num_axes=3, allocation=None, base=100.0,
                                        sections=None), design_frequencies),
    "RoPE": (lambda: dict(design="circle", head_dim=16, rotary_dim=None, allocation=None, base=100.0,
                          sections=None, channels="half", design_options={}),
             lambda **kw: RoPE(**kw).cos_sin(torch.rand(4, 3) * 5)),
    "RoPE.rotate": (lambda: dict(**_qkv(D=8), coords=torch.rand(5, 2) * 5, seq_dim=-2), _rope_rotate),
    "directional_matrix": (lambda: dict(rotary_dim=8, dims=2, method="sobol", base=100.0, seed=0, cf_terms=20,
                                        error=1e-4, dtype=torch.float32), directional_matrix),
    "nd_directions": (lambda: dict(num=4, dims=3, method="weyl", seed=0, cf_terms=20, error=1e-4), nd_directions),
    "MixedFrequencies": (lambda: dict(rotary_dim=8, num_heads=2, num_axes=2, theta=10.0, seed=0,
                                      **_qkv(D=8), coords=torch.rand(5, 2) * 5), _mixed_rotate),
    "GeoPE": (lambda: dict(head_dim=6, lam=100.0, freq_style="decreasing", **_qkv(D=6),
                           coords=torch.rand(5, 2) * 5, seq_dim=-2), _geope_rotate),
    "geope_rotation": (lambda: dict(coords=torch.rand(5, 3) * 5, head_dim=9, lam=100.0, freq_style="paper",
                                    freqs=None), geope_rotation),
    "apply_geope": (lambda: dict(x=_qk(B=1, H=2, L=5, D=6)[0], coords=torch.rand(5, 2) * 5, seq_dim=1), _apply_geope),
    "linear_geope_attention": (lambda: dict(**_qkv(), pos_q=torch.rand(5, 2) * 5, pos_k=None, attn_mask=None,
                                            is_causal=False, scale=None, block_size=2, lam=100.0,
                                            freq_style="decreasing", freqs=None, seq_dim=-2),
                               linear_geope_attention),
}

# an argument's error may name it through what it carries (x's last dim is head_dim, its length the sequence)
_ALSO = {
    "x": ("head_dim", "sequence length", "seq_dim"), "q": ("head_dim", "sequence length", "seq_dim", "heads"),
    "k": ("head_dim", "sequence length", "`q`"), "v": ("`q`", "`k`"), "cos": ("cos/sin", "`x`", "head_dim"),
    "sin": ("cos/sin", "`x`", "head_dim"), "rotary_dim": ("head_dim",), "head_dim": ("rotary_dim", "triple"),
    "num_axes": ("axes",), "design": ("allocation",), "allocation": ("design",), "coords": ("axes", "positions"),
    "W": ("axes",), "pos_q": ("positions",), "pos_k": ("positions",), "freq_style": ("lam",),
    "sections": ("allocation",), "dims": ("golden",), "method": ("dims",),
}


def _finite(out) -> bool:
    if isinstance(out, torch.Tensor):
        return not out.is_floating_point() or bool(torch.isfinite(out).all())
    if isinstance(out, (tuple, list)):
        return all(_finite(o) for o in out)
    return True


def _inputs_finite(kw) -> bool:
    return all(_finite(v) for v in kw.values() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bad_arguments_raise_value_or_type_errors_that_name_them(entry, data):
    valid, call = ENTRIES[entry]
    kw = valid()
    arg = data.draw(st.sampled_from(sorted(kw)), label="argument")
    kw[arg] = data.draw(JUNK, label="value")
    try:
        out = call(**kw)
    except (ValueError, TypeError) as e:
        names = (arg,) + _ALSO.get(arg, ())
        assert any(n in str(e) for n in names), f"{entry}({arg}=…) raised {e!r}, which does not name `{arg}`"
        return
    # accepted: the value was a valid one, so the result must be well formed
    if _inputs_finite(kw) and arg != "attn_mask":
        assert _finite(out), f"{entry}({arg}={kw[arg]!r}) returned non-finite values"


@settings(max_examples=40, deadline=None)
@given(
    design=st.sampled_from(["vanilla", "mrope", "circle", "rope2d", "compact", "vrope"]),
    channels=st.sampled_from(["half", "interleaved"]),
    rot=st.sampled_from([32, 16]),
    layout=st.sampled_from(["T3", "T2 I2x3 T1", "I3x3", "T1 V2x2x2 T2"]),
    blhd=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_valid_rotations_match_float64_and_keep_pair_norms(design, channels, rot, layout, blhd, seed):
    rope = RoPE(design, head_dim=32, rotary_dim=rot, channels=channels)
    coords = rope.coords(layout)
    L = coords.shape[0]
    q, k = _qk(B=2, H=2, L=L, D=32, seed=seed)
    if blhd:
        out_q, out_k = rope.rotate(q.transpose(1, 2), k.transpose(1, 2), layout, seq_dim=1)
        out_q, out_k = out_q.transpose(1, 2), out_k.transpose(1, 2)
    else:
        out_q, out_k = rope.rotate(q, k, layout)
    assert torch.isfinite(out_q).all() and torch.isfinite(out_k).all()
    ref = _planar_reference(q[..., :rot], coords, rope.frequencies(coords.shape[1]), channels)
    torch.testing.assert_close(out_q[..., :rot].double(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out_q[..., rot:], q[..., rot:], rtol=0, atol=0)  # partial rotary tail untouched
    pairs = (lambda t: torch.stack((t[..., : rot // 2], t[..., rot // 2 : rot]), -1)) if channels == "half" else (
        lambda t: t[..., :rot].unflatten(-1, (rot // 2, 2)))
    torch.testing.assert_close(pairs(out_k).norm(dim=-1), pairs(k).norm(dim=-1), rtol=1e-5, atol=1e-5)


def _rodrigues_reference(x, coords, head_dim, lam=100.0):
    """float64 GeoPE: explicit 3×3 rotation matrices from the axis-angle vector φ = ω_i · E p."""
    n = head_dim // 3
    w = lam ** (-torch.arange(n, dtype=torch.float64) / n)
    A = coords.shape[-1]
    c = coords.double()
    E = {1: lambda p: torch.stack((0 * p[:, 0], p[:, 0], 0 * p[:, 0]), -1), 2: lambda p: torch.cat((0 * p[:, :1], p / 2), -1),
         3: lambda p: p / 3}[A](c)
    out = x.double().clone()
    for i in range(n):
        phi = E * w[i]  # (L, 3)
        theta = phi.norm(dim=-1).clamp_min(1e-300)
        a = phi / theta[:, None]
        K = torch.zeros(len(c), 3, 3, dtype=torch.float64)
        K[:, 0, 1], K[:, 0, 2], K[:, 1, 2] = -a[:, 2], a[:, 1], -a[:, 0]
        K = K - K.transpose(1, 2)
        R = torch.eye(3, dtype=torch.float64) + theta.sin()[:, None, None] * K + (1 - theta.cos())[:, None, None] * K @ K
        out[..., 3 * i: 3 * i + 3] = (R @ x.double()[..., 3 * i: 3 * i + 3, None])[..., 0]
    return out


@settings(max_examples=30, deadline=None)
@given(axes=st.sampled_from([1, 2, 3]), head_dim=st.sampled_from([6, 8, 12]), grad=st.booleans(),
       scale=st.sampled_from([0.0, 1.0, 50.0]), seed=st.integers(0, 2**16))
def test_valid_geope_matches_float64_and_keeps_triple_norms(axes, head_dim, grad, scale, seed):
    g = torch.Generator().manual_seed(seed)
    coords = torch.rand(7, axes, generator=g) * scale
    x = torch.randn(2, 3, 7, head_dim, generator=g)
    geo = GeoPE(head_dim)
    with torch.set_grad_enabled(grad):
        out = geo.rotate(x.requires_grad_(grad), x, coords)[0].detach()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _rodrigues_reference(x.detach(), coords, head_dim), rtol=1e-4, atol=1e-4)
    R = 3 * (head_dim // 3)
    norms = (lambda t: t[..., :R].unflatten(-1, (-1, 3)).norm(dim=-1))
    torch.testing.assert_close(norms(out), norms(x.detach()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[..., R:], x.detach()[..., R:], rtol=0, atol=0)
