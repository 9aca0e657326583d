"""TMRoPE (``tmrope``) on a video with its audio track interleaved (``VideoAudio``; the Omni families'
``use_audio_in_video=True``), against transformers' own code of Qwen2.5-Omni and Qwen3-Omni.

Two independent references, both transformers': the token order of the block comes from the family's processor
(its own code, bound to single-character tokens: tests/hf_compat.py), and the positions of padded batches of
random samples (text, images, audio, videos with their audio) from the family's
``get_rope_index(..., use_audio_in_video=True)``. ropekit places each sample with ``positions`` of its layout.
"""
import random

import pytest
import torch

from ropekit import Audio, Image, Layout, Text, VideoAudio, positions
from ropekit.layout import AUDIO, TEXT, VIDEO

# the families' audio length formulas (searched backwards), get_rope_index bound to a small config, its token ids
from test_tmrope import _audio_features, _reference, A_END, A_START, IMAGE, MERGE, RATE, V_END, V_START
from test_tmrope import AUDIO as AUDIO_ID, VIDEO as VIDEO_ID

import transformers.models.qwen2_5_omni.processing_qwen2_5_omni as proc25
import transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe as proc3

from hf_compat import processor_video_with_audio

CHUNK_SECONDS = 2  # the seconds_per_chunk of test_tmrope's reference config
FAMILIES = {"2.5": ("floor", "chunks"), "3": ("exact", "time")}


def _processor_block(family, t, h, w, n, seconds):
    """The family's processor's placeholder of a video with its audio (t frames of h × w tokens, n audio tokens):
    '<' audio start, 'v' video, 'a' audio, '>' audio end (the vision start and end tokens go around it)."""
    cls = proc25.Qwen2_5OmniProcessor if family == "2.5" else proc3.Qwen3OmniMoeProcessor
    return processor_video_with_audio(cls, t, h * MERGE, w * MERGE, n, seconds, MERGE, RATE, CHUNK_SECONDS)


SECONDS = [0.5, 1.0, 2.0, 1.4, 1.8, 0.28, 2.6]


def _sample(rng, family):
    """Token ids, grids, seconds, audio feature lengths and the layout of one random sample."""
    ids, segs, images, videos, seconds, audio = [], [], [], [], [], []

    def text(n):
        ids.extend(rng.randrange(10, 800) for _ in range(n))
        segs.append(Text(n))

    text(rng.randint(1, 3))
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice("IAVV")
        if kind == "A":
            n = rng.randint(1, 6)
            ids.extend([A_START] + [AUDIO_ID] * n + [A_END])
            segs.extend([Text(1), Audio(n), Text(1)])
            audio.append(_audio_features(family, n))
        elif kind == "I":
            h, w = rng.randint(1, 3), rng.randint(1, 3)
            ids.extend([V_START] + [IMAGE] * (h * w) + [V_END])
            segs.extend([Text(1), Image(h, w), Text(1)])
            images.append([1, h * MERGE, w * MERGE])
        else:
            t, h, w, n = rng.randint(1, 6), rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 130)
            s32 = float(torch.tensor(rng.choice(SECONDS + [rng.random() * 3 + 0.05]), dtype=torch.float32))
            block = _processor_block(family, t, h, w, n, s32)
            char = {"<": A_START, ">": A_END, "v": VIDEO_ID, "a": AUDIO_ID}
            ids.extend([V_START] + [char[c] for c in block] + [V_END])
            seg = VideoAudio(t, h, w, n, FAMILIES[family][1], RATE * s32)
            # the segment's token types are the processor's order
            want = [TEXT, TEXT] + [VIDEO if c == "v" else AUDIO for c in block[1:-1]] + [TEXT, TEXT]
            assert seg.token_types().tolist() == want, (str(seg), block)
            segs.append(seg)
            videos.append([t, h * MERGE, w * MERGE])
            seconds.append(s32)
            audio.append(_audio_features(family, n))
        if rng.random() < 0.7:
            text(rng.randint(1, 3))
    return ids, images, videos, seconds, audio, Layout(segs)


def _batch(seed, family, batch=3):
    rng = random.Random(seed)
    samples = [_sample(rng, family) for _ in range(batch)]
    length = max(len(s[0]) for s in samples) + rng.randint(0, 2)
    ids = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s[0])
        at = slice(length - n, length) if rng.random() < 0.5 else slice(0, n)  # left or right padding
        ids[b, at], mask[b, at] = torch.tensor(s[0]), 1
    grids = lambda k: torch.tensor([g for s in samples for g in s[k]], dtype=torch.long).reshape(-1, 3)  # noqa: E731
    seconds = torch.tensor([x for s in samples for x in s[3]], dtype=torch.float32)
    audio = torch.tensor([x for s in samples for x in s[4]], dtype=torch.long)
    return ids, mask, grids(1), grids(2), seconds, audio, [s[5] for s in samples]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(30))
def test_tmrope_equals_transformers_with_audio_in_video(family, seed):
    ids, mask, images, videos, seconds, audio, layouts = _batch(seed, family)
    want, want_delta = _reference(family).get_rope_index(
        ids, images if images.shape[0] else None, videos if videos.shape[0] else None, mask, True,
        audio if audio.shape[0] else None, seconds if seconds.shape[0] else None)
    valid = mask.bool()
    for b, lay in enumerate(layouts):
        assert lay.num_tokens == int(valid[b].sum())
        got = positions(lay, "tmrope", temporal_rounding=FAMILIES[family][0])
        assert torch.equal(got.T, want[:, b, valid[b]].to(torch.float32)), (seed, str(lay))
        assert float(got.max()) + 1 - lay.num_tokens == float(want_delta.reshape(-1)[b])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_frame_beyond_the_next_chunk_follows_transformers(family):
    """Frames 3 seconds apart (75 positions, more than a 50-position chunk): Qwen2.5-Omni's chunking opens
    one-token chunks there, and the end markers follow the last piece appended rather than the block's maximum."""
    s32 = 3.0
    block = _processor_block(family, 3, 2, 2, 40, s32)
    seg = VideoAudio(3, 2, 2, 40, FAMILIES[family][1], RATE * s32)
    assert seg.token_types().tolist()[2:-2] == [VIDEO if c == "v" else AUDIO for c in block[1:-1]]
    ids = torch.tensor([[7, V_START] + [{"<": A_START, ">": A_END, "v": VIDEO_ID, "a": AUDIO_ID}[c] for c in block]
                        + [V_END, 8]])
    want, _ = _reference(family).get_rope_index(
        ids, None, torch.tensor([[3, 2 * MERGE, 2 * MERGE]]), torch.ones_like(ids), True,
        torch.tensor([_audio_features(family, 40)]), torch.tensor([s32]))
    got = positions(Layout([Text(1), seg, Text(1)]), "tmrope", temporal_rounding=FAMILIES[family][0])
    assert torch.equal(got.T, want[:, 0].to(torch.float32))


def test_layout_round_trip_and_parse():
    for text in ("T2 V4x2x2@25+A100:chunks50 T1", "V1x1x1+A1:time", "T1 V3x2x1@12.5+A7:chunks30 A4 T2",
                 "V2x3x3@0.3333333333333333+A9:time", "V2x1x1@1e+20+A3:time"):
        lay = Layout.parse(text)
        assert str(lay) == text and Layout.parse(str(lay)) == lay
    assert Layout.parse("V2x1x1@25+A3:chunks").segments[0] == VideoAudio(2, 1, 1, 3, "chunks", 25.0, 50)
    assert Layout.parse("V2x1x1+A3:time").num_tokens == 2 + 3 + 4


@pytest.mark.parametrize("text,match", [
    ("V2x1x1@25+A3", "has no order after ':', which is required"),
    ("V2x1x1@25+A3:merged", "segment 'V2x1x1@25\\+A3:merged': cannot read it"),
    ("V2x1x1@x+A3:time", "cannot read it; a video with its audio interleaved is written"),
    ("V2x1x1@25+A0:time", "`n` must be >= 1"),
    ("V2x1x1@1.2.3+A3:time", "not a number"),
    ("V2x1x1@25+A3:chunks0", "`chunk` must be >= 1"),
])
def test_bad_strings_are_refused(text, match):
    with pytest.raises(ValueError, match=match):
        Layout.parse(text)


def test_bad_segments_are_refused():
    with pytest.raises(ValueError, match="`order` must be 'chunks' .* or 'time'"):
        VideoAudio(2, 1, 1, 3, "chunked")
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'order'"):
        VideoAudio(2, 1, 1, 3)
    with pytest.raises(ValueError, match="order='time' merges by time and takes no chunk"):
        VideoAudio(2, 1, 1, 3, "time", 25.0, 50)
    with pytest.raises(ValueError, match="`interval` must be a finite number >= 0"):
        VideoAudio(2, 1, 1, 3, "time", -1.0)


def test_tmrope_refuses_an_order_of_the_other_family():
    with pytest.raises(ValueError, match="interleaves in order 'time' .*temporal_rounding='exact'"):
        positions("T1 V2x1x1@25+A3:time", "tmrope")
    with pytest.raises(ValueError, match="interleaves in order 'chunks' .*temporal_rounding='floor'"):
        positions("T1 V2x1x1@25+A3:chunks50", "tmrope", temporal_rounding="exact")


@pytest.mark.parametrize("design", ["mrope", "vanilla", "videorope", "hope", "circle", "v2pe"])
def test_other_designs_refuse_it_naming_the_fix(design):
    with pytest.raises(ValueError, match=f"design '{design}' defines no place for a video with its audio track "
                                         f"interleaved.*use design 'tmrope'.*V2x1x1@25 A3"):
        positions("T1 V2x1x1@25+A3:time", design)


def test_qwen3_absolute_rounding_is_refused_not_guessed():
    """Qwen3-Omni merges by absolute float32 times: a frame at 7.0000024 after the block's start goes after audio
    token 7 near position 0 but ties with it (and so goes first) near 100. ropekit matches transformers at the
    first start and refuses the second."""
    s32 = float(torch.tensor(0.2800001, dtype=torch.float32))
    seg = VideoAudio(2, 1, 1, 10, "time", RATE * s32)
    block = _processor_block("3", 2, 1, 1, 10, s32)
    char = {"<": A_START, ">": A_END, "v": VIDEO_ID, "a": AUDIO_ID}
    ids = torch.tensor([[5] * 3 + [V_START] + [char[c] for c in block] + [V_END]])
    want, _ = _reference("3").get_rope_index(ids, None, torch.tensor([[2, MERGE, MERGE]]), torch.ones_like(ids),
                                             True, torch.tensor([_audio_features("3", 10)]), torch.tensor([s32]))
    got = positions(Layout([Text(3), seg]), "tmrope", temporal_rounding="exact")
    assert torch.equal(got.T, want[:, 0])
    with pytest.raises(ValueError, match="starts at position 98.0, where float32 rounding .* changes which"):
        positions(Layout([Text(98), seg]), "tmrope", temporal_rounding="exact")


def test_vision_blocks_give_each_frames_video_tokens():
    from ropekit.analysis.metrics import vision_blocks

    lay = Layout.parse("T2 V3x1x2@25+A60:chunks50 T1")
    blocks = vision_blocks(lay)
    assert [label.split(" (")[0] for label, _ in blocks] == ["video 1 frame 0", "video 1 frame 1", "video 1 frame 2"]
    # the processor's chunks: frames 0 and 1 (times 0, 25), 50 audio tokens, frame 2 (time 50), 10 audio tokens
    assert [idx.tolist() for _, idx in blocks] == [[4, 5], [6, 7], [58, 59]]
    block = _processor_block("2.5", 3, 1, 2, 60, 1.0)
    assert [i + 3 for i, c in enumerate(block) if c == "v"] == [4, 5, 6, 7, 58, 59]


def test_huge_segments_are_described_but_not_built():
    seg = VideoAudio(10**6, 100, 100, 5, "time")
    assert str(seg) == "V1000000x100x100+A5:time" and seg.num_tokens == 10**10 + 9
    with pytest.raises(ValueError, match="exceed the limit"):
        seg.token_types()
    with pytest.raises(ValueError, match="exceed the limit"):
        positions(Layout([seg]), "tmrope", temporal_rounding="exact")


def test_rope_index_refuses_the_audio_code_pointing_at_positions():
    """The batched index takes Hugging Face token types, which have no audio code: it cannot express the
    interleaving, and says where it is placed instead."""
    from ropekit import rope_index

    types = Layout.parse("T1 V2x1x1@25+A3:chunks50 T1").token_types()[None]
    assert 4 in types.tolist()[0]
    with pytest.raises(ValueError, match="cannot be given as token types: .*ropekit.positions\\(layout, 'tmrope'\\)"):
        rope_index(None, types, None, torch.tensor([[2, MERGE, MERGE]]), None, design="tmrope",
                   spatial_merge_size=MERGE, tokens_per_second=RATE, second_per_grid_ts=torch.tensor([1.0]))
