"""RoPE-Mixed: initial structure (rope-vit's recipe re-derived here), gradients, relative property."""
import math

import pytest
import torch

from ropekit import apply_rotary, cos_sin
from ropekit.apply.mixed import MixedFrequencies
from ropekit.rotations.mixed import mixed_init


def _rope_vit_style(angle, dim, theta=10.0):
    """rope-vit's 2-D recipe for one head: directions at `angle` and `angle + π/2`, magnitudes θ^(−4j/D)."""
    mag = [theta ** (-(4 * j) / dim) for j in range(dim // 4)]
    fx = [m * math.cos(angle) for m in mag] + [m * math.cos(math.pi / 2 + angle) for m in mag]
    fy = [m * math.sin(angle) for m in mag] + [m * math.sin(math.pi / 2 + angle) for m in mag]
    return torch.tensor([fx, fy], dtype=torch.float32)


def test_2d_init_is_rope_vit_recipe_with_a_random_angle_per_head():
    W = mixed_init(32, 4, seed=0)
    assert W.shape == (4, 2, 16) and W.dtype == torch.float32
    angles_seen = []
    for h in range(4):
        a = math.atan2(float(W[h, 1, 0]), float(W[h, 0, 0]))
        angles_seen.append(a)
        torch.testing.assert_close(W[h], _rope_vit_style(a, 32), rtol=1e-6, atol=1e-7)
    assert len({round(a, 4) for a in angles_seen}) == 4  # every head has its own rotation


@pytest.mark.parametrize("axes", [1, 3])
def test_nd_init_groups_are_orthonormal_directions_with_full_spectrum(axes):
    R, H = 12 * axes, 3
    W = mixed_init(R, H, axes, theta=10.0, seed=1).double()
    n = R // (2 * axes)
    mag = torch.tensor([10.0 ** (-j / n) for j in range(n)], dtype=torch.float64)
    for h in range(H):
        groups = W[h].reshape(axes, axes, n)  # (axis, group, pair)
        dirs = groups[:, :, 0]  # pair 0 has magnitude 1: the group's unit direction
        torch.testing.assert_close(dirs.T @ dirs, torch.eye(axes, dtype=torch.float64), atol=1e-6, rtol=0)
        assert torch.det(dirs) > 0
        torch.testing.assert_close(groups, dirs[:, :, None] * mag, atol=1e-6, rtol=0)


def test_seed_reproducible():
    assert torch.equal(mixed_init(16, 2, seed=3), mixed_init(16, 2, seed=3))
    assert not torch.equal(mixed_init(16, 2, seed=3), mixed_init(16, 2, seed=4))


def test_forward_shapes_and_per_head_angles():
    m = MixedFrequencies(16, 3, seed=0)
    coords = torch.tensor([[0.0, 0.0], [1.0, 2.0], [-3.0, 0.5]])
    a = m(coords)
    assert a.shape == (3, 3, 8)
    ref = torch.einsum("la,har->hlr", coords.double(), m.freqs.detach().double())
    torch.testing.assert_close(a.double(), ref, rtol=1e-6, atol=1e-6)
    assert m(coords.expand(2, 3, 2)).shape == (2, 3, 3, 8)


def _explicit(p, W, channels):
    half = W.shape[-1]
    R = torch.zeros(2 * half, 2 * half, dtype=torch.float64)
    for j in range(half):
        phi = float((p * W[:, j]).sum())
        c1, c2 = (j, j + half) if channels == "half" else (2 * j, 2 * j + 1)
        R[c1, c1], R[c1, c2], R[c2, c1], R[c2, c2] = math.cos(phi), -math.sin(phi), math.sin(phi), math.cos(phi)
    return R


@pytest.mark.parametrize("channels", ["half", "interleaved"])
def test_relative_property_per_head(channels):
    g = torch.Generator().manual_seed(0)
    H, L, R = 2, 4, 8
    W = mixed_init(R, H, seed=2).double()
    pos = torch.randn(L, 2, generator=g, dtype=torch.float64) * 5
    q = torch.randn(1, H, L, R, generator=g, dtype=torch.float64)
    k = torch.randn(1, H, L, R, generator=g, dtype=torch.float64)

    def scores(p):
        cos, sin = cos_sin(torch.einsum("la,har->hlr", p, W)[None])
        rq = apply_rotary(q, cos, sin, channels=channels)
        rk = apply_rotary(k, cos, sin, channels=channels)
        return rq @ rk.transpose(-1, -2)

    s = scores(pos)
    torch.testing.assert_close(s, scores(pos + torch.tensor([3.5, -7.25], dtype=torch.float64)))
    for h in range(H):
        for m_ in range(L):
            for n_ in range(L):
                ref = q[0, h, m_] @ _explicit(pos[n_] - pos[m_], W[h], channels) @ k[0, h, n_]
                torch.testing.assert_close(s[0, h, m_, n_], ref)


def test_gradients_reach_the_frequencies():
    torch.manual_seed(0)
    m = MixedFrequencies(8, 2, seed=0)
    coords = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [2.0, 3.0]])
    q, k = torch.randn(1, 2, 4, 12), torch.randn(1, 2, 4, 12)
    cos, sin = cos_sin(m(coords)[None])
    loss = (apply_rotary(q, cos, sin) @ apply_rotary(k, cos, sin).transpose(-1, -2)).softmax(-1)[..., 0].sum()
    loss.backward()
    grad = m.freqs.grad
    assert grad is not None and grad.shape == (2, 2, 4)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0

    # the gradient is the true derivative (finite differences in float64)
    qd, kd, cd = q.double(), k.double(), coords.double()

    def f(W):
        c, s = cos_sin(torch.einsum("la,har->hlr", cd, W)[None])
        return (apply_rotary(qd, c, s) @ apply_rotary(kd, c, s).transpose(-1, -2)).softmax(-1)[..., 0].sum()

    W0 = m.freqs.detach().double().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (W0,))


def test_bad_input():
    with pytest.raises(ValueError, match="`rotary_dim` must be a positive even number"):
        mixed_init(7, 2)
    with pytest.raises(ValueError, match="choose rotary_dim divisible by 4"):
        mixed_init(10, 2)
    with pytest.raises(ValueError, match="`num_heads` must be >= 1"):
        mixed_init(8, 0)
    with pytest.raises(TypeError, match="`num_axes` must be an int"):
        mixed_init(8, 2, 2.0)
    with pytest.raises(ValueError, match="`theta` must be a finite number > 1"):
        mixed_init(8, 2, theta=0)
    m = MixedFrequencies(8, 2)
    with pytest.raises(ValueError, match=r"\(L, A\) or \(B, L, A\)"):
        m(torch.zeros(4))
    with pytest.raises(ValueError, match="coords have 3 axes but W expects 2"):
        m(torch.zeros(4, 3))
    with pytest.raises(TypeError, match="must be a tensor"):
        m([[0.0, 0.0]])
