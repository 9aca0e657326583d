"""nn modules: rotary attention is translation-invariant in position; the tiny ViT trains."""
import torch

import ropekit
from ropekit.nn import RotaryAttention, TinyViT


def test_rotary_attention_depends_only_on_relative_positions():
    torch.manual_seed(0)
    attn = RotaryAttention(32, 4, ropekit.RoPE("vanilla", head_dim=8, allocation="axial")).double()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    coords = torch.rand(12, 2, dtype=torch.float64) * 10
    a = attn(x, coords)
    b = attn(x, coords + torch.tensor([37.0, -5.0], dtype=torch.float64))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    # … but it does depend on the positions themselves
    assert not torch.allclose(a, attn(x, coords.flip(0)))


def test_tiny_vit_forward_backward():
    torch.manual_seed(0)
    vit = TinyViT(image_size=16, patch=4, dim=32, depth=2, heads=2, num_classes=3,
                  rotary_factory=lambda i: ropekit.RoPE("vanilla", head_dim=16, allocation="axial", base=100.0))
    x = torch.randn(2, 3, 16, 16)
    loss = torch.nn.functional.cross_entropy(vit(x), torch.tensor([0, 2]))
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in vit.parameters())


def test_geope_and_mixed_plug_into_the_vit():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    geo = TinyViT(image_size=16, patch=4, dim=48, depth=1, heads=2, num_classes=3,
                  rotary_factory=lambda i: ropekit.GeoPE(24))
    geo(x).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in geo.parameters())
    # GeoPE object == functional path
    q, k = torch.randn(1, 2, 9, 24), torch.randn(1, 2, 9, 24)
    c = torch.rand(9, 2) * 5
    ref = ropekit.apply_geope(q, ropekit.geope_rotation(c, 24))
    torch.testing.assert_close(ropekit.GeoPE(24).rotate(q, k, c)[0], ref, rtol=0, atol=0)
