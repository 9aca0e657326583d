"""M-RoPE and RoPE-Compact designs: blocks against transformers' Qwen2-VL code, continuation rules, compact's per-axis rule."""
import math
import random

import pytest
import torch
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

import ropekit
from ropekit import Image, Layout, Text, Video, positions
from ropekit.designs.mrope import vision_block


def hf_block(start, t, h, w, interval):
    """transformers' own block placement (the method reads no model state, so it is called unbound)."""
    grid = torch.tensor([t, h, w])
    return Qwen2VLModel.get_vision_position_ids(None, start, grid, 1, 1, interval).T.double()


@pytest.mark.parametrize("interval", [1.0, 0.5, 0.7, 1.5, 2.5, 0.1, 3.3, 0.0])
def test_block_matches_transformers(interval):
    for start, (t, h, w) in [(0, (1, 3, 5)), (7, (4, 2, 2)), (13, (11, 1, 3)), (2, (17, 2, 1))]:
        ours = vision_block(Video(t, h, w, interval), float(start))
        assert torch.equal(ours, hf_block(start, t, h, w, torch.tensor(interval, dtype=torch.float32)))


def test_temporal_rounding_follows_float32_like_transformers():
    # Qwen2.5-VL intervals come from float32 tensors: float32(0.7) = 0.69999999; 10 x that is
    # 6.99999988 in float64 but rounds to 7.0 in float32, which is what transformers computes
    interval = float(torch.tensor(0.7, dtype=torch.float32))
    assert math.floor(10 * interval) == 6
    col = positions(Layout([Video(11, 1, 1, interval)]), "mrope")[:, 0]
    assert col[10] == 7.0
    assert col[10] == hf_block(0, 11, 1, 1, torch.tensor(0.7))[10, 0]


def test_text_only_is_arange_on_every_axis():
    for design in ("mrope", "compact"):
        pos = positions("T9", design)
        assert torch.equal(pos, torch.arange(9.0)[:, None].expand(9, 3))


def test_aliases_resolve_to_mrope():
    lay = "T2 I3x4 T2 V2x2x3 T1"
    for alias in ("spatial", "rope3d"):
        assert torch.equal(positions(lay, alias), positions(lay, "mrope"))
    assert ropekit.get_design("mrope").allocation == "mrope"
    assert ropekit.get_design("compact").allocation == "mrope"


def walk_reference(layout, rule):
    """float64 per-token walk: each vision token from its block start, text resumes by ``rule``."""
    out, p = [], 0
    for seg in layout:
        if isinstance(seg, Text):
            for _ in range(seg.n):
                out.append((p, p, p))
                p += 1
            continue
        t, h, w, dt = (1, seg.h, seg.w, 0.0) if isinstance(seg, Image) else (seg.t, seg.h, seg.w, seg.interval)
        s, top = p, -math.inf
        for f in range(t):
            for i in range(h):
                for j in range(w):
                    c = (s + math.floor(f * dt), s + i, s + j)
                    top = max(top, *c)
                    out.append(c)
        p = top + 1 if rule == "max" else s + max(h, w)
    return torch.tensor(out, dtype=torch.float64)


def random_layout(rng):
    segs = [Text(rng.randint(1, 4))]
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.5:
            segs.append(Image(rng.randint(1, 5), rng.randint(1, 5)))
        else:
            segs.append(Video(rng.randint(1, 6), rng.randint(1, 3), rng.randint(1, 3), rng.choice([1.0, 0.5, 2.0, 1.5])))
        if rng.random() < 0.8:
            segs.append(Text(rng.randint(1, 4)))
    return Layout(segs)


@pytest.mark.parametrize("rule", ["max", "spatial"])
def test_mrope_matches_per_token_walk(rule):
    rng = random.Random(3)
    for _ in range(40):
        lay = random_layout(rng)
        ours = positions(lay, "mrope", continuation=rule).double()
        assert torch.equal(ours, walk_reference(lay, rule)), str(lay)


def test_continuations_differ_only_for_long_videos():
    # spatial: text after a 6-frame 2x2 video resumes at s + 2; max: after the last frame, s + 6
    assert positions("T1 V6x2x2 T1", "mrope", continuation="spatial")[-1].tolist() == [3.0] * 3
    assert positions("T1 V6x2x2 T1", "mrope")[-1].tolist() == [7.0] * 3
    a, b = positions("T2 I3x5 T2", "mrope"), positions("T2 I3x5 T2", "mrope", continuation="spatial")
    assert torch.equal(a, b)


def test_compact_text_resumes_per_axis_after_block():
    # VRoPE §5: after a T x H x W video started at s, the next text is s + (T, H, W) on (t, h, w)
    pos = positions("T3 V4x2x5 T2", "compact")
    assert pos[3 + 40].tolist() == [3 + 4, 3 + 2, 3 + 5]
    assert pos[-1].tolist() == [3 + 5, 3 + 3, 3 + 6]


def test_compact_per_axis_invariant_on_random_layouts():
    """Every token: text = previous token + 1 (or per-axis max so far + 1 right after a block);
    a block = per-axis running start + the M-RoPE offsets; the first block is exactly M-RoPE's."""
    rng = random.Random(5)
    for _ in range(40):
        lay = random_layout(rng)
        pos = positions(lay, "compact").double()
        mr = positions(lay, "mrope").double()
        k, prev_vision, first = 0, False, True
        for seg in lay:
            n = seg.num_tokens
            start = pos[:k].amax(dim=0) + 1 if k else torch.zeros(3, dtype=torch.float64)
            if isinstance(seg, Text):
                want = start + torch.arange(n, dtype=torch.float64)[:, None]
                if not prev_vision and k:
                    assert torch.equal(start, pos[k - 1] + 1)
                assert torch.equal(pos[k:k + n], want)
            else:
                if first:
                    assert torch.equal(pos[k:k + n], mr[k:k + n])
                    first = False
                assert torch.equal(pos[k:k + n] - start, mr[k:k + n] - mr[k])
            prev_vision = not isinstance(seg, Text)
            k += n


def test_grids_are_read_as_images_and_videos():
    assert torch.equal(positions("T1 G3x4 T1", "mrope"), positions("T1 I3x4 T1", "mrope"))
    assert torch.equal(positions("T1 G2x3x4 T1", "compact"), positions("T1 V2x3x4 T1", "compact"))


def test_bad_options_and_segments_fail_clearly():
    with pytest.raises(ValueError, match="continuation"):
        positions("T1 I2x2", "mrope", continuation="diagonal")
    with pytest.raises(ValueError, match="not supported"):
        positions("T1 G5", "mrope")
    with pytest.raises(TypeError, match="accepts"):
        positions("T1 I2x2", "compact", continuation="max")
