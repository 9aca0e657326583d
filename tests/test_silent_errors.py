"""Inputs a user plausibly passes that once gave silently wrong results, checked against a float64 brute force.

The reference rotates channel pair j of a token at coordinates c by the angle ``Σ_a c_a W[a, j]`` with the
documented pairing (``"half"``: channels j and j + R/2), computed here in float64 from the formulas in
docs/conventions.md, never from ropekit's own apply code.
"""
import pytest
import torch

import ropekit


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _inv_freq(rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    return torch.tensor([base ** (-2 * j / rotary_dim) for j in range(rotary_dim // 2)], dtype=torch.float64)


def _rotate_half(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """float64 rotation of x (..., L, D) by angles theta broadcastable to (..., L, R/2), pairs (j, j + R/2)."""
    x = x.double()
    half = theta.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    c, s = torch.cos(theta), torch.sin(theta)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, rest), dim=-1)


def _mhrope_reference(x: torch.Tensor, coords: torch.Tensor, heads_per_axis, kv_heads: int) -> torch.Tensor:
    """MHRoPE (docs/designs.md): KV head g rotates every pair by one axis (t, h, w by whole heads, in order);
    query head i uses KV head i // (H / kv_heads)."""
    axis_of_kv = [a for a, n in enumerate(heads_per_axis) for _ in range(n)]
    H, inv = x.shape[1], _inv_freq(x.shape[-1])
    out = []
    for h in range(H):
        axis = axis_of_kv[h // (H // kv_heads)]
        out.append(_rotate_half(x[:, h], coords.double()[..., axis:axis + 1] * inv))
    return torch.stack(out, dim=1)


def test_rotary_embedding_with_per_head_frequencies_rotates_each_head_by_its_axis():
    # RotaryEmbedding(design="mhrope") has a per-head W (H, A, R/2); its (H, L, R/2) tables were applied as
    # per-sample (B, L, R/2) tables: with batch == heads every head of sample b got head b's angles.
    coords = ropekit.positions("T2 I4x4 T3", "mhrope")
    rot = ropekit.RotaryEmbedding(64, design="mhrope")  # default sections [2, 3, 3]: 8 KV heads
    q, k = _randn(8, 8, 21, 64, seed=1), _randn(8, 8, 21, 64, seed=2)
    qr, kr = rot.rotate(q, k, "T2 I4x4 T3")
    torch.testing.assert_close(qr.double(), _mhrope_reference(q, coords, [2, 3, 3], 8), rtol=0, atol=1e-5)
    torch.testing.assert_close(kr.double(), _mhrope_reference(k, coords, [2, 3, 3], 8), rtol=0, atol=1e-5)
    # grouped-query attention: 16 query heads over the 8 KV heads' tables, and (B, L, H, D) tensors
    q16 = _randn(2, 16, 21, 64, seed=3)
    qr, kr = rot.rotate(q16.transpose(1, 2), k[:2].transpose(1, 2), coords, seq_dim=1)
    torch.testing.assert_close(qr.transpose(1, 2).double(), _mhrope_reference(q16, coords, [2, 3, 3], 8),
                               rtol=0, atol=1e-5)
    # text positions (rotate_queries_or_keys) go through the same per-head tables
    text = torch.arange(5.0)[:, None].expand(5, 3)
    x = _randn(1, 8, 5, 64, seed=4)
    torch.testing.assert_close(rot.rotate_queries_or_keys(x).double(), _mhrope_reference(x, text, [2, 3, 3], 8),
                               rtol=0, atol=1e-5)


def test_per_head_frequencies_accept_three_dimensional_heads_first_tensors():
    # (H, L, D) q/k are documented for seq_dim=-2; with per-head tables their head count was read from the
    # sequence axis ("q has 21 heads")
    coords = ropekit.positions("T2 I4x4 T3", "mhrope")
    q = _randn(8, 21, 64, seed=5)
    for rotary in (ropekit.RoPE("mhrope", head_dim=64), ropekit.RotaryEmbedding(64, design="mhrope")):
        qr, _ = rotary.rotate(q, q, coords)
        assert qr.shape == q.shape
        torch.testing.assert_close(qr.double(), _mhrope_reference(q[None], coords, [2, 3, 3], 8)[0],
                                   rtol=0, atol=1e-5)


def _rotaries():
    return {
        "RoPE": ropekit.RoPE("rope2d", head_dim=24),
        "DirectionalRoPE": ropekit.DirectionalRoPE(24),
        "RotaryEmbedding": ropekit.RotaryEmbedding(24, design="rope2d"),
        "MixedFrequencies": ropekit.MixedFrequencies(24, num_heads=4, seed=0),
        "LieRE": ropekit.LieRE(24, block_size=8, seed=0),
        "ComRoPE": ropekit.ComRoPE(24, seed=0),
        "GRAPE": ropekit.GRAPE(24, 2, mode="interleaved", init_scale=0.5, seed=0),
        "GeoPE": ropekit.GeoPE(24),
    }


@pytest.mark.parametrize("name", list(_rotaries()))
def test_coordinates_of_another_batch_are_refused_not_broadcast(name):
    # q of batch 1 with coordinates of 3 samples used to come back as a batch of 3 (a 3-D (H, L, D) q as a
    # 4-D tensor), and batch 2 against 3 failed deep inside torch with a broadcast RuntimeError
    rotary = _rotaries()[name]
    coords = _randn(3, 5, 2, seed=6)
    for q in (_randn(1, 4, 5, 24), _randn(2, 4, 5, 24)):
        with pytest.raises(ValueError, match="`coords`.*3 samples"):
            rotary.rotate(q, q, coords)
    if name in ("RoPE", "DirectionalRoPE", "RotaryEmbedding", "GeoPE"):
        with pytest.raises(ValueError, match="`coords`.*3 samples"):
            rotary.rotate(_randn(4, 5, 24), _randn(4, 5, 24), coords)
        q3 = _randn(4, 5, 24, seed=7)  # one shared sample (1, L, A) is the (L, A) of a 3-D q
        out = rotary.rotate(q3, q3, coords[:1])[0]
        assert out.shape == q3.shape
        torch.testing.assert_close(out, rotary.rotate(q3, q3, coords[0])[0], rtol=0, atol=0)
    # what stays accepted: one row per sample, or one shared row, and the result is per sample
    q = _randn(3, 4, 5, 24, seed=8)
    per_sample = rotary.rotate(q, q, coords)[0]
    for b in range(3):
        torch.testing.assert_close(per_sample[b:b + 1], rotary.rotate(q[b:b + 1], q[b:b + 1], coords[b])[0],
                                   rtol=0, atol=1e-6)
    assert rotary.rotate(q, q, coords[:1])[0].shape == q.shape


def test_readme_per_head_tables_apply_to_every_head_of_every_sample():
    # the README built RoPE-Mixed's cos/sin as (H, L, R/2); apply_rotary reads a 3-D table as per sample
    # (B, L, R/2), so a batch of 8 with 8 heads silently rotated sample b's heads all by head b's angles
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "MixedFrequencies" in b)
    lines = [ln for ln in block.splitlines() if ln.startswith(("grid =", "mixed =", "cos_h, sin_h ="))]
    namespace = {"torch": torch, "ropekit": ropekit}
    exec("\n".join(lines), namespace)
    mixed, grid, cos_h, sin_h = (namespace[n] for n in ("mixed", "grid", "cos_h", "sin_h"))
    x = _randn(8, 8, 64, 96, seed=9)
    W = mixed.freqs.detach().double()  # (H, A, R/2)
    want = torch.stack([_rotate_half(x[:, h], grid.double() @ W[h]) for h in range(8)], dim=1)
    torch.testing.assert_close(ropekit.apply_rotary(x, cos_h, sin_h).double(), want, rtol=0, atol=1e-5)


def test_tiny_vit_docstring_names_only_arguments_it_takes():
    # the docstring promised coordinates "of ``design``", an argument TinyViT never had
    import inspect
    import re

    vit = ropekit.nn.TinyViT
    named = set(re.findall(r"``(\w+)``", vit.__doc__))
    params = set(inspect.signature(vit.__init__).parameters)
    assert named <= params | {"coords"}, named - params  # coords: the buffer of patch coordinates
    model = vit(image_size=8, patch=2, dim=8, depth=1, heads=2)
    g = torch.arange(4.0)
    assert torch.equal(model.coords, torch.stack(torch.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2))


def test_relative_command_keeps_its_columns_aligned(capsys):
    # names longer than 36 characters (the LieRE row) pushed that row's number and verdict out of column
    import re

    from ropekit.cli import main

    assert main(["relative", "--head-dim", "48", "--trials", "4"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines()[1:] if ln.strip()]
    assert any("LieRE" in r for r in rows)
    number_ends = {re.search(r"\de[+-]\d\d", r).end() for r in rows}
    assert len(number_ends) == 1, rows


def test_context_extension_applies_to_per_head_frequencies():
    # docs/scaling.md: "every design and every allocation … can use any of them"; MHRoPE's per-head W
    # (H, A, R/2) was refused by scale_frequencies. Reference: transformers' own YaRN spectrum and factor.
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    config = LlamaConfig(hidden_size=128, num_attention_heads=2, head_dim=64, max_position_embeddings=64)
    config.rope_parameters = dict(yarn, rope_theta=10000.0)
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    coords = ropekit.positions("T2 I4x4 T3", "mhrope")
    rope = ropekit.RoPE("mhrope", head_dim=64, scaling=yarn)
    q = _randn(1, 8, 21, 64, seed=10)
    axis_of_kv = [0, 0, 1, 1, 1, 2, 2, 2]  # default sections [2, 3, 3]
    want = torch.stack([factor * _rotate_half(q[:, h], coords.double()[:, axis_of_kv[h]:axis_of_kv[h] + 1]
                                              * inv.double()) for h in range(8)], dim=1)
    # the attention factor multiplies cos and sin, so the rotated vector is scaled by it (as in transformers)
    torch.testing.assert_close(rope.rotate(q, q, coords)[0].double(), want, rtol=0, atol=1e-5)
    W, attn = ropekit.scale_frequencies(ropekit.frequency_matrix("mhrope", 64, 3), yarn)
    assert W.shape == (8, 3, 32) and attn == pytest.approx(factor)


def _triton_interpreted(x, cos, sin):
    from ropekit.apply import triton_rope

    return triton_rope.apply_rotary_triton(x, cos, sin)


_APPLY = {"apply_rotary": ropekit.apply_rotary, "apply_rotary_fused": ropekit.apply_rotary_fused,
          "apply_rotary_triton": _triton_interpreted}


@pytest.mark.parametrize("name", list(_APPLY))
def test_cos_sin_tables_of_another_batch_are_refused_not_broadcast(name, monkeypatch):
    # tables for 3 samples against x of batch 1 came back as a batch of 3; a one-sample (H, L, D) x with
    # (3, L, R/2) tables came back 4-D, and with partial rotary failed inside torch.cat
    if name == "apply_rotary_triton":  # the Triton kernel, run on CPU tensors by Triton's interpreter
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    apply = _APPLY[name]
    for x in (_randn(1, 8, 21, 64), _randn(2, 8, 21, 64), _randn(8, 21, 64)):
        for shape in ((3, 21, 32), (3, 21, 16), (3, 1, 21, 32), (3, 8, 21, 32)):
            t = _randn(*shape, seed=1)
            with pytest.raises(ValueError, match=r"`cos`/`sin`.*3 samples"):
                apply(x, t, t)
    # a one-sample (H, L, D) x takes tables of one sample, and keeps its shape: against a float64 reference
    x = _randn(8, 21, 64, seed=2)
    theta = _randn(21, 24, seed=3).double()
    want = _rotate_half(x, theta)
    c, s = torch.cos(theta).float(), torch.sin(theta).float()
    for tables in ((c, s), (c[None], s[None]), (c[None, None], s[None, None]),
                   (c.expand(8, 21, 24)[None], s.expand(8, 21, 24)[None])):
        out = apply(x, *tables)
        assert out.shape == x.shape
        torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5)
    # per-head tables (1, H, L, R/2) rotate head h of the one sample by table h
    theta_h = _randn(8, 21, 32, seed=4).double()
    out = apply(x, torch.cos(theta_h)[None].float(), torch.sin(theta_h)[None].float())
    torch.testing.assert_close(out.double(), _rotate_half(x, theta_h), rtol=0, atol=1e-5)
    # what stays accepted for (B, H, L, D): one table per sample, or one shared, each sample by its own
    xb = _randn(3, 8, 21, 64, seed=5)
    theta_b = _randn(3, 21, 32, seed=6).double()
    out = apply(xb, torch.cos(theta_b).float(), torch.sin(theta_b).float())
    torch.testing.assert_close(out.double(), _rotate_half(xb, theta_b[:, None]), rtol=0, atol=1e-5)


def test_apply_geope_refuses_a_rotation_of_another_batch():
    """The functional GeoPE apply must not broadcast x (batch 1 or one 3-D sample) to the rotation's batch."""
    from ropekit.apply.geope import apply_geope
    from ropekit.rotations.geope import geope_rotation

    rot3 = geope_rotation(torch.randn(3, 6, 2), 24)
    for x in (torch.randn(1, 2, 6, 24), torch.randn(2, 2, 6, 24), torch.randn(2, 6, 24)):
        with pytest.raises(ValueError, match="rotation holds 3 samples"):
            apply_geope(x, rot3)
    # accepted: the rotation's batch equals x's, or is shared; each sample rotated by its own coordinates
    coords = torch.randn(3, 6, 2)
    x = torch.randn(3, 2, 6, 24)
    out = apply_geope(x, geope_rotation(coords, 24))
    for b in range(3):
        torch.testing.assert_close(out[b], apply_geope(x[b:b + 1], geope_rotation(coords[b], 24))[0])
    assert apply_geope(torch.randn(2, 6, 24), geope_rotation(torch.randn(1, 6, 2), 24)).shape == (2, 6, 24)
