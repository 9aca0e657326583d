"""RoPE-2D design: per-token walk, continuation, Pixtral's rotary embedding from transformers, errors."""
import random

import pytest
import torch
from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig
from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding

import ropekit
from ropekit import Grid, Image, Layout, RoPE, Text, Video, frequency_matrix, positions
from ropekit.designs.rope2d import rope2d_pixtral_permutation
from ropekit.rotations.planar import angles


def walk(layout):
    """Per-token float64 placement: frame f at s + f·max(H, W), (row, col) offsets, text on the diagonal."""
    rows, p = [], 0
    for seg in layout:
        if isinstance(seg, Text):
            rows += [[p + n, p + n] for n in range(seg.n)]
            p += seg.n
            continue
        if isinstance(seg, Grid):
            T, H, W = (1, *seg.sizes) if len(seg.sizes) == 2 else seg.sizes
        elif isinstance(seg, Video):
            T, H, W = seg.t, seg.h, seg.w
        else:
            T, H, W = 1, seg.h, seg.w
        stride = H if H > W else W
        for f in range(T):
            base = p + f * stride
            rows += [[base + i, base + j] for i in range(H) for j in range(W)]
        p += T * stride
    return torch.tensor(rows, dtype=torch.float64)


def random_layout(rng):
    segs = []
    for _ in range(rng.randint(1, 4)):
        segs.append(Text(rng.randint(1, 3)))
        kind = rng.randrange(4)
        if kind == 0:
            segs.append(Image(rng.randint(1, 5), rng.randint(1, 5)))
        elif kind == 1:
            segs.append(Video(rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 4), rng.choice([1.0, 2.5])))
        elif kind == 2:
            segs.append(Grid(rng.randint(1, 4), rng.randint(1, 4)))
        else:
            segs.append(Grid(rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 3)))
    if rng.random() < 0.7:
        segs.append(Text(rng.randint(1, 3)))
    return Layout(segs)


@pytest.mark.parametrize("seed", range(8))
def test_matches_per_token_walk(seed):
    lay = random_layout(random.Random(seed))
    pos = positions(lay, "rope2d")
    assert pos.dtype == torch.float32 and pos.shape == (lay.num_tokens, 2)
    assert torch.equal(pos.double(), walk(lay))


@pytest.mark.parametrize("layout,after", [("T3 I2x5 T2", 3 + 5), ("T3 V4x3x2 T2", 3 + 4 * 3), ("T1 G2x3x3 T1", 1 + 2 * 3)])
def test_text_continues_right_after_the_block(layout, after):
    pos = positions(layout, "rope2d").double()
    lay = Layout.parse(layout)
    n0, nb = lay.segments[0].num_tokens, lay.segments[1].num_tokens
    block = pos[n0 : n0 + nb]
    assert torch.equal(block.amin(0), torch.full((2,), float(n0)))  # the block starts where text left off
    assert float(block.max()) + 1 == after  # s_T = s + T·max(H, W) = the block's max + 1
    assert torch.equal(pos[n0 + nb], torch.full((2,), float(after)))


def test_frames_step_by_the_longer_side():
    H, W, T = 2, 5, 3
    frames = positions(Video(T, H, W), "rope2d").double().reshape(T, H * W, 2)
    for f in range(T):
        assert torch.equal(frames[f] - frames[0], torch.full((H * W, 2), float(f * max(H, W))))
    # within a frame: rows on axis 0, columns on axis 1
    assert frames[0][:, 0].reshape(H, W).tolist() == [[i] * W for i in range(H)]
    assert frames[0][:, 1].reshape(H, W).tolist() == [list(range(W))] * H


def test_text_only_is_1d_rope_with_its_allocation():
    # the registered allocation splits the ordinary spectrum over the two axes, so text on the
    # diagonal gets exactly 1-D RoPE angles (VRoPE paper eq. 5)
    assert ropekit.get_design("rope2d").allocation == "interleaved"
    D = 32
    pos = positions("T11", "rope2d")
    assert torch.equal(pos, torch.arange(11.0)[:, None].expand(11, 2))
    two = angles(pos, frequency_matrix("interleaved", D, 2))
    one = angles(torch.arange(11.0)[:, None], frequency_matrix("1d", D))
    assert torch.equal(two, one)


@pytest.mark.parametrize("h,w", [(3, 4), (5, 2), (1, 6)])
def test_image_matches_transformers_pixtral(h, w):
    # Pixtral's vision rotary embedding (transformers) for one image: same angles, its channel-pair order
    D = 16
    cfg = PixtralVisionConfig(hidden_size=32, num_attention_heads=2, head_dim=D, intermediate_size=8, num_hidden_layers=1)
    emb = PixtralVisionRotaryEmbedding(cfg)
    hh, ww = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pid = torch.stack([hh.flatten(), ww.flatten()], dim=-1)
    cos_hf, sin_hf = emb(torch.zeros(1, dtype=torch.float32), pid)
    pos = positions(Layout([Image(h, w)]), "rope2d")
    ang = angles(pos, frequency_matrix("interleaved", D, 2))
    perm = rope2d_pixtral_permutation(D)
    assert torch.allclose(torch.cos(ang)[:, perm], cos_hf[:, : D // 2], atol=1e-6, rtol=0)
    assert torch.allclose(torch.sin(ang)[:, perm], sin_hf[:, : D // 2], atol=1e-6, rtol=0)


def test_rotate_end_to_end_is_relative():
    rope = RoPE("rope2d", head_dim=16)
    lay_a, lay_b = "T4 V2x3x3 T2", "T1 V2x3x3 T2"
    q = torch.randn(1, 2, 4 + 18 + 2, 16, dtype=torch.float64)
    k = torch.randn_like(q)
    qa, ka = rope.rotate(q, k, positions(lay_a, "rope2d").double())
    qb, kb = rope.rotate(q[:, :, 3:], k[:, :, 3:], positions(lay_b, "rope2d").double())
    assert torch.allclose(qa.norm(dim=-1), q.norm(dim=-1))
    assert torch.allclose(qa[:, :, 3:] @ ka[:, :, 3:].transpose(-1, -2), qb @ kb.transpose(-1, -2), atol=1e-9)


def test_bad_inputs():
    with pytest.raises(ValueError, match="design 'rope2d' places images and videos"):
        positions("T1 G5", "rope2d")
    with pytest.raises(ValueError, match="design 'rope2d'"):
        positions("G2x2x2x2", "rope2d")
    with pytest.raises(ValueError, match="multiple of 4"):
        rope2d_pixtral_permutation(6)
    with pytest.raises(TypeError, match="unknown option"):
        positions("T1 I2x2", "rope2d", continuation="max")
