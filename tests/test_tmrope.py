"""TMRoPE (``tmrope``) against transformers' own position code of Qwen2.5-Omni and Qwen3-Omni, on padded batches.

The reference is transformers' ``get_rope_index`` of each family, run on token ids built from random layouts
(text, images, videos with random seconds per grid, audio); ropekit places the same batch with
``rope_index(design="tmrope")`` from token types and grids alone, and each sample with ``positions`` of the
layout the model sees.
"""
import random
from types import SimpleNamespace

import pytest
import torch

from ropekit import Audio, Image, Layout, Text, Video, positions, rope_index

import transformers.models.qwen2_5_omni.modeling_qwen2_5_omni as omni25
import transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe as omni3

IMAGE, VIDEO, AUDIO, V_START, V_END, A_START, A_END = 901, 902, 903, 904, 905, 906, 907
MERGE, RATE = 2, 25


def _reference(family):
    """An object with the family's ``get_rope_index`` (and the helpers it calls) bound to a small config."""
    cls = (omni25.Qwen2_5OmniPreTrainedModelForConditionalGeneration if family == "2.5"
           else omni3.Qwen3OmniMoePreTrainedModelForConditionalGeneration)
    ref = type("Reference", (), {name: getattr(cls, name) for name in
                                 ("get_rope_index", "get_llm_pos_ids_for_vision", "get_chunked_index")})()
    ref.config = SimpleNamespace(image_token_id=IMAGE, video_token_id=VIDEO, audio_token_id=AUDIO,
                                 vision_start_token_id=V_START, audio_start_token_id=A_START,
                                 position_id_per_seconds=RATE, seconds_per_chunk=2,
                                 audio_config=SimpleNamespace(n_window=50))
    ref.spatial_merge_size = MERGE
    return ref


def _audio_features(family, n):
    """An audio feature length the family's encoder turns into ``n`` tokens (found by search)."""
    for length in range(1, 8 * n + 16):
        if family == "2.5":
            tokens = ((length - 1) // 2 + 1 - 2) // 2 + 1
        else:
            tokens = int(omni3._get_feat_extract_output_lengths(torch.tensor(length), 50))
        if tokens == n:
            return length
    raise AssertionError(n)


def _sample(rng, family):
    """Token ids, token types, grids, seconds, audio feature lengths and the layout of one random sample."""
    ids, types, segs, images, videos, seconds, audio = [], [], [], [], [], [], []

    def text(n):
        ids.extend(rng.randrange(10, 800) for _ in range(n))
        types.extend([0] * n)
        segs.append(Text(n))

    def marker(token):
        ids.append(token)
        types.append(0)
        segs.append(Text(1))

    text(rng.randint(1, 3))
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice("IVA")
        if kind == "A":
            n = rng.randint(1, 6)
            marker(A_START)
            ids.extend([AUDIO] * n)
            types.extend([0] * n)  # audio tokens are no image/video token: text to rope_index
            segs.append(Audio(n))
            audio.append(_audio_features(family, n))
            marker(A_END)
        else:
            t = 1 if kind == "I" else rng.randint(1, 4)
            h, w = rng.randint(1, 3), rng.randint(1, 3)
            marker(V_START)
            ids.extend([IMAGE if kind == "I" else VIDEO] * (t * h * w))
            types.extend([1 if kind == "I" else 2] * (t * h * w))
            if kind == "I":
                images.append([1, h * MERGE, w * MERGE])
                segs.append(Image(h, w))
            else:
                # 1.4 and 1.8: (f·s)·25 and f·(25·s) truncate differently at some frame (see below)
                s = rng.choice([0.5, 1.0, 2.0, 1.4, 1.8, float(torch.rand(1) * 3)])
                s32 = float(torch.tensor(s, dtype=torch.float32))  # what the processor's float32 tensor holds
                videos.append([t, h * MERGE, w * MERGE])
                seconds.append(s32)
                segs.append(Video(t, h, w, RATE * s32))  # Δt in positions, formed in float64 (exact)
            marker(V_END)
        if rng.random() < 0.7:
            text(rng.randint(1, 3))
    return ids, types, images, videos, seconds, audio, Layout(segs)


def _batch(seed, family, batch=3):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    samples = [_sample(rng, family) for _ in range(batch)]
    length = max(len(s[0]) for s in samples) + rng.randint(0, 2)
    ids = torch.zeros(batch, length, dtype=torch.long)
    types = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s[0])
        at = slice(length - n, length) if rng.random() < 0.5 else slice(0, n)  # left or right padding
        ids[b, at], types[b, at], mask[b, at] = torch.tensor(s[0]), torch.tensor(s[1]), 1
    grids = lambda k: torch.tensor([g for s in samples for g in s[k]], dtype=torch.long).reshape(-1, 3)  # noqa: E731
    seconds = torch.tensor([x for s in samples for x in s[4]], dtype=torch.float32)
    audio = torch.tensor([x for s in samples for x in s[5]], dtype=torch.long)
    return ids, types, mask, grids(2), grids(3), seconds, audio, [s[6] for s in samples]


FAMILIES = {"2.5": "floor", "3": "exact"}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", range(40))
def test_tmrope_equals_transformers_get_rope_index(family, seed):
    ids, types, mask, images, videos, seconds, audio, layouts = _batch(seed, family)
    has_grids = images.shape[0] + videos.shape[0] > 0
    want, want_delta = _reference(family).get_rope_index(
        ids, images if images.shape[0] else None, videos if videos.shape[0] else None, mask, False,
        audio if audio.shape[0] else None, seconds if seconds.shape[0] else None)
    got, delta = rope_index(None, types, images, videos, mask, design="tmrope", spatial_merge_size=MERGE,
                            tokens_per_second=RATE, second_per_grid_ts=seconds.double(),
                            temporal_rounding=FAMILIES[family])
    valid = mask.bool()
    assert torch.equal(got[:, valid], want[:, valid].to(torch.float32)), (seed, [str(x) for x in layouts])
    assert torch.equal(delta.double().reshape(-1), want_delta.double().reshape(-1))
    if has_grids:
        assert bool((got[:, ~valid] == 0).all())
    for b, lay in enumerate(layouts):  # the layout the model sees, placed on its own
        own = positions(lay, "tmrope", temporal_rounding=FAMILIES[family])
        assert torch.equal(own.T, got[:, b, valid[b]])


def test_audio_is_one_position_per_token_whatever_its_seconds():
    """transformers places audio tokens one apart on every axis (the model's time unit is its 40 ms token)."""
    for seconds in (0.04, 0.02, 1.0):
        got = positions(Layout([Text(2), Audio(5, seconds), Text(1)]), "tmrope")
        assert torch.equal(got, torch.arange(8, dtype=torch.float32)[:, None].expand(8, 3))


def test_time_follows_the_families_float32_order():
    """τ_f = (f · seconds) · rate in float32, not f · (rate · seconds): for seconds = 1.4 (float32) frame 3 sits
    at floor(104.99999) = 104 under Qwen2.5-Omni, where M-RoPE's single product gives 105; Qwen3-Omni keeps the
    float32 value itself."""
    s32 = torch.tensor(1.4, dtype=torch.float32)
    lay = Layout([Video(4, 1, 1, RATE * float(s32))])
    frames = torch.arange(4)
    want = (frames * s32) * RATE
    assert torch.equal(positions(lay, "tmrope")[:, 0], torch.floor(want))
    assert torch.equal(positions(lay, "tmrope", temporal_rounding="exact")[:, 0], want)
    assert positions(lay, "tmrope")[3, 0] == 104.0 and positions(lay, "mrope")[3, 0] == 105.0


@pytest.mark.parametrize("options,error,match", [
    ({"temporal_rounding": "round"}, ValueError, "tmrope: `temporal_rounding` must be 'floor' .* or 'exact'"),
    ({"position_id_per_seconds": 0}, ValueError, "tmrope: `position_id_per_seconds` must be a finite number > 0"),
    ({"position_id_per_seconds": "25"}, TypeError, "tmrope: `position_id_per_seconds` must be a finite number"),
    ({"position_id_per_seconds": 0.1}, ValueError, "must be a float32 number"),
])
def test_bad_options_are_refused(options, error, match):
    with pytest.raises(error, match=match):
        positions("T1 V2x1x1@25", "tmrope", **options)
