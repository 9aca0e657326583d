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
