"""ropekit designs inside Qwen2.5-Omni's and Qwen3-Omni-MoE's thinkers (tiny random models built from configs): text,
images, videos and audio.

References: the stock transformers model with the same weights (the stock-equivalent patch, ``tmrope`` with the
family's ``temporal_rounding``, must give
its logits, positions, ``rope_deltas`` and ``generate`` output bit for bit), each design's ``ropekit.positions`` on
the layout the model sees (audio as ``A{n}``), and one teacher-forced forward over the whole sequence (cached
generation must reproduce its logits).
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import transformers as T
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

import ropekit
from ropekit import Audio, Image, Text, Video, VideoAudio
from ropekit.hf import boundary, last_positions, layer_designs, patch_model, supported_models

from hf_compat import (assert_checkpointing_keeps_gradients, left_padded, processor_video_with_audio,
                       ready_to_generate, restore)
from test_hf_families_3axis import _logits, assert_every_design_places_its_positions, reference_positions

IMG, VID, AUD, V_START, V_END, A_START, A_END, PAD = 70, 71, 72, 73, 74, 75, 76, 0
SPECIAL = [IMG, VID, AUD, V_START, V_END, A_START, A_END]
MEL, PIXEL = 8, 24  # mel bins of an audio frame; values of one video/image patch (3 channels × 2 × 2 × 2)
DESIGNS = [d for d in ropekit.designs() if ropekit.get_design(d).allocation != "mhrope"]


def _thinker():
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}
    return T.Qwen2_5OmniThinkerForConditionalGeneration(T.Qwen2_5OmniThinkerConfig(
        text_config=dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                         vocab_size=80, num_hidden_layers=2, rope_parameters=rope),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, patch_size=2, temporal_patch_size=2, window_size=8,
                           fullatt_block_indexes=[0]),
        audio_config=dict(num_mel_bins=MEL, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16,
                          d_model=16, output_dim=32, n_window=8, max_source_positions=64),
        audio_token_index=AUD, image_token_index=IMG, video_token_index=VID, audio_start_token_id=A_START,
        audio_end_token_id=A_END, vision_start_token_id=V_START, vision_end_token_id=V_END))


def _qwen3_thinker():
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3], "mrope_interleaved": True}
    return T.Qwen3OmniMoeThinkerForConditionalGeneration(T.Qwen3OmniMoeThinkerConfig(
        text_config=dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                         vocab_size=80, num_hidden_layers=2, head_dim=16, rope_parameters=rope, num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=16),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, patch_size=2, temporal_patch_size=2, num_position_embeddings=16,
                           deepstack_visual_indexes=[0]),
        audio_config=dict(num_mel_bins=MEL, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16,
                          d_model=16, output_dim=32, n_window=50, n_window_infer=100, downsample_hidden_size=8,
                          max_source_positions=200),
        audio_token_id=AUD, image_token_id=IMG, video_token_id=VID, audio_start_token_id=A_START,
        audio_end_token_id=A_END, vision_start_token_id=V_START, vision_end_token_id=V_END))


def _frames_25(n):
    """Mel frames Qwen2.5-Omni's audio encoder turns into ``n`` tokens (two stride-2 stages)."""
    return 4 * n + 1


def _frames_3(n):
    """Mel frames Qwen3-Omni's audio encoder turns into ``n`` tokens: the shortest its own length formula maps to n."""
    return next(f for f in range(1, 2000) if int(_get_feat_extract_output_lengths(torch.tensor(f), 50)) == n)


@dataclass(frozen=True)
class Family:
    build: Callable
    frames: Callable  # audio tokens -> mel frames
    stock: dict  # the stock-equivalent design's options
    order: str  # VideoAudio order of a video with its audio


FAMILIES = {
    "qwen2_5_omni_thinker": Family(_thinker, _frames_25, {}, "chunks"),
    "qwen3_omni_moe_thinker": Family(_qwen3_thinker, _frames_3, {"temporal_rounding": "exact"}, "time"),
}
BUILDERS = {name: f.build for name, f in FAMILIES.items()}  # for tests/test_hf_boundary.py

# transformers 5.21 split the thinker: before, the thinker was itself the bare model (the position code and its
# rope_deltas on it) with its text model at ``thinker.model``; since, ``thinker.model`` is the bare model, its text
# model at ``language_model``. The stock position code the tests compare with is found accordingly.
SPLIT = boundary._release(T.__version__) >= boundary._release("5.21.0")


def _bare(model):
    return model.model if SPLIT else model


def _text_model(model):
    return model.model.language_model if SPLIT else model.model


@pytest.fixture(scope="module", params=list(FAMILIES))
def fam(request):
    """(family spec, a stock model); the model is unpatched after every test."""
    torch.manual_seed(0)
    m = ready_to_generate(FAMILIES[request.param].build(), PAD, SPECIAL)
    yield FAMILIES[request.param], m
    restore(m)


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    yield
    if "fam" in request.fixturenames:
        restore(request.getfixturevalue("fam")[1])


# ---------------------------------------------------------------------------------------------------------------
# inputs: ("T", n) text, ("A", n) audio tokens, ("I", h, w) image patch grid, ("V", t, h, w, seconds) video


def _processor_block(family, t, h, w, n, seconds):
    """The family's processor's tokens for a video with its audio (patch grid t × h × w, n audio tokens): '<'
    audio start, 'v' video, 'a' audio, '>' audio end; the vision start and end tokens go around it."""
    cls = T.Qwen2_5OmniProcessor if family.order == "chunks" else T.Qwen3OmniMoeProcessor
    return processor_video_with_audio(cls, t, h, w, n, seconds)


def make_batch(family, samples, seed=0):
    """Left-padded thinker inputs and, per sample, the layout its language model sees (spatial merge 2)."""
    g = torch.Generator().manual_seed(seed)
    rows, layouts, img, vid, seconds, audio = [], [], [], [], [], []
    for segs in samples:
        ids, lay = [], []

        def text(n):
            ids.extend(torch.randint(1, 60, (n,), generator=g).tolist())
            lay.append(Text(n))

        def wrapped(start, token, n, seg, end):
            ids.extend([start] + [token] * n + [end])
            lay.extend([Text(1), seg, Text(1)])

        for s in segs:
            if s[0] == "T":
                text(s[1])
            elif s[0] == "A":
                audio.append(family.frames(s[1]))
                wrapped(A_START, AUD, s[1], Audio(s[1]), A_END)
            elif s[0] == "I":
                img.append([1, s[1], s[2]])
                wrapped(V_START, IMG, s[1] * s[2] // 4, Image(s[1] // 2, s[2] // 2), V_END)
            elif s[0] == "VA":  # a video with its audio track, in the family's processor's order
                t, h, w, sec, n = s[1:]
                vid.append([t, h, w])
                audio.append(family.frames(n))
                s32 = float(torch.tensor(sec, dtype=torch.float32))
                block = _processor_block(family, t, h, w, n, sec)
                ids.extend([V_START] + [{"<": A_START, ">": A_END, "v": VID, "a": AUD}[c] for c in block] + [V_END])
                lay.append(VideoAudio(t, h // 2, w // 2, n, family.order, 25 * s32))
                seconds.append(sec)
            else:
                t, h, w, sec = s[1:]
                vid.append([t, h, w])
                s32 = float(torch.tensor(sec, dtype=torch.float32))
                wrapped(V_START, VID, t * h * w // 4, Video(t, h // 2, w // 2, 25 * s32), V_END)
                seconds.append(sec)
        rows.append(ids)
        layouts.append(lay)
    input_ids, mask = left_padded(rows, PAD)
    inputs = dict(input_ids=input_ids, attention_mask=mask)
    if img:
        grids = torch.tensor(img)
        inputs.update(image_grid_thw=grids, pixel_values=torch.randn(int(grids.prod(1).sum()), PIXEL, generator=g))
    if vid:
        grids = torch.tensor(vid)
        inputs.update(video_grid_thw=grids, video_second_per_grid=torch.tensor(seconds),
                      pixel_values_videos=torch.randn(int(grids.prod(1).sum()), PIXEL, generator=g))
    if audio:
        frames = max(audio)
        inputs.update(input_features=torch.randn(len(audio), MEL, frames, generator=g),
                      feature_attention_mask=(torch.arange(frames)[None] < torch.tensor(audio)[:, None]).long())
    return inputs, layouts


# 1.4 s per grid: (f·1.4)·25 truncates to 104 at frame 3 where f·35 gives 105 (tmrope's float32 order)
MIXED = [[("T", 3), ("A", 2), ("T", 1), ("I", 4, 4), ("T", 2), ("V", 4, 2, 4, 1.4), ("T", 2)],
         [("T", 2), ("V", 2, 4, 4, 0.5), ("T", 1), ("A", 3), ("I", 4, 8), ("T", 3)]]
AUDIO_ONLY = [[("T", 2), ("A", 3), ("T", 2)], [("T", 4), ("A", 2), ("T", 1), ("A", 1), ("T", 1)]]


def _batches(family):
    return [make_batch(family, MIXED), make_batch(family, AUDIO_ONLY, seed=1)]


def _stock_positions(model, inputs):
    audio = inputs.get("feature_attention_mask")
    return _bare(model).get_rope_index(
        inputs["input_ids"], inputs.get("image_grid_thw"), inputs.get("video_grid_thw"), inputs["attention_mask"],
        False, None if audio is None else audio.sum(1), inputs.get("video_second_per_grid"))


# ---------------------------------------------------------------------------------------------------------------


def test_supported_models_lists_the_thinkers():
    assert set(FAMILIES) <= set(supported_models())
    assert ropekit.hf.SUPPORTED_MODEL_TYPES["qwen2_5_omni_thinker"][0] == "mrope"  # chunked sections
    assert ropekit.hf.SUPPORTED_MODEL_TYPES["qwen3_omni_moe_thinker"][0] == "interleaved"


def test_stock_equivalent_forward_matches_stock(fam):
    """Audio, images and videos with left padding, and audio with text only: tmrope gives the stock positions,
    rope_deltas and logits bit for bit, and the positions are ``ropekit.positions`` of the layout (audio as A{n})."""
    family, model = fam
    text = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(3))
    want = []
    for inputs, _ in _batches(family):
        ref = _logits(model, inputs)
        want.append((ref, *_stock_positions(model, inputs)))
    want_text = _logits(model, dict(input_ids=text))
    patch_model(model, "tmrope", **family.stock)
    for (inputs, layouts), (ref, pos, deltas) in zip(_batches(family), want):
        keep = inputs["attention_mask"].bool()
        out = _logits(model, inputs)
        assert torch.equal(out[keep], ref[keep])
        assert _bare(model).rope_deltas is None  # the patched model keeps nothing between calls
        own = reference_positions(inputs, layouts, "tmrope", **family.stock)
        assert torch.equal(pos[:, keep].float(), own[:, keep])
        for p in last_positions(model).values():
            assert torch.equal(p[:, keep], own[:, keep])
        got, got_deltas = _stock_positions(model, inputs)  # the patched get_rope_index: the stock one here
        assert torch.equal(got[:, keep], pos[:, keep]) and torch.equal(got_deltas, deltas)
    assert torch.equal(_logits(model, dict(input_ids=text)), want_text)
    patch_model(model, "circle")  # text is the diagonal in every design
    assert torch.equal(_logits(model, dict(input_ids=text)), want_text)


def test_tmrope_is_not_mrope_here(fam):
    """The mixed batch's video at 1.4 s per grid is where TMRoPE's float32 order matters (and Qwen3-Omni keeps
    fractional times): M-RoPE with the same Δt places frames elsewhere, so it is no stock-equivalent patch here."""
    family, model = fam
    inputs, layouts = make_batch(family, MIXED)
    keep = inputs["attention_mask"].bool()
    ref = _logits(model, inputs)
    patch_model(model, "mrope")
    stock = reference_positions(inputs, layouts, "tmrope", **family.stock)
    assert not torch.equal(reference_positions(inputs, layouts, "mrope"), stock)
    assert not torch.equal(_logits(model, inputs)[keep], ref[keep])


def test_stock_equivalent_generate_matches_stock(fam):
    family, model = fam
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    batches = [inputs for inputs, _ in _batches(family)]
    with torch.no_grad():
        want = [model.generate(**inputs, **kw) for inputs in batches]
        patch_model(model, "tmrope", **family.stock)
        for inputs, ref in zip(batches, want):
            got = model.generate(**inputs, **kw)
            assert torch.equal(got.sequences, ref.sequences)
            for w, g in zip(ref.logits, got.logits):
                assert torch.equal(g, w)
            assert _bare(model).rope_deltas is None


def test_every_design_places_its_positions(fam):
    """Every design runs on audio, images and videos, and every layer rotates with ``ropekit.positions`` of the
    layout (audio placed as the design's rule says: a text run)."""
    family, model = fam
    assert_every_design_places_its_positions(model, _batches(family), DESIGNS)


@pytest.mark.parametrize("age", [None, "alternate"])
def test_cached_generation_equals_a_teacher_forced_forward(fam, age):
    family, model = fam
    inputs, layouts = make_batch(family, MIXED)
    patch_model(model, "circle", age=age)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        n = out.sequences.shape[1] - inputs["input_ids"].shape[1]
        full = dict(inputs, input_ids=out.sequences,
                    attention_mask=torch.cat([inputs["attention_mask"], torch.ones(2, n, dtype=torch.long)], 1))
        logits = model(**full).logits
    keep = full["attention_mask"].bool()
    for layer, p in last_positions(model).items():
        want = reference_positions(full, layouts, layer_designs(model)[layer], extra=n)
        assert torch.equal(p[:, keep], want[:, keep])
    start = inputs["input_ids"].shape[1] - 1
    for k, step in enumerate(out.logits):
        torch.testing.assert_close(step, logits[:, start + k], rtol=1e-5, atol=1e-5)


def test_checkpointed_training_step(fam):
    """AGE training: the loss backpropagates, and gradient checkpointing gives the same gradients."""
    family, model = fam
    inputs, _ = make_batch(family, MIXED)
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    patch_model(model, "circle", age="alternate")

    assert_checkpointing_keeps_gradients(model, inputs, labels, _text_model(model))


def test_save_pretrained_and_reload_restore_the_patch(fam, tmp_path):
    family, model = fam
    inputs, _ = make_batch(family, MIXED)
    patch_model(model, "circle", age="alternate", alpha=0.5)
    ref = _logits(model, inputs)
    model.save_pretrained(tmp_path)
    loaded = ropekit.hf.from_pretrained(tmp_path, type(model)).eval()  # the family's class, patched from the record
    assert layer_designs(loaded) == layer_designs(model)
    assert torch.equal(_logits(loaded, inputs), ref)


@pytest.mark.parametrize("patch", ["stock-equivalent", "circle-age"])
def test_packed_rows_equal_per_sample_runs(fam, patch):
    """Samples packed into one padding-free row (ropekit.hf.pack), audio, images and videos, and with the
    stock-equivalent patch videos with their audio interleaved: each sample's logits equal its own run. The audio
    features are padded to one length, as the processors pad them (``padding="max_length"``)."""
    family, model = fam
    patch_model(model, **(dict(design="tmrope", **family.stock) if patch == "stock-equivalent"
                           else dict(design="circle", age="alternate")))
    for kind in [MIXED] + ([AUDIO_IN_VIDEO] if patch == "stock-equivalent" else []):
        samples = [make_batch(family, [segs], seed=i)[0] for i, segs in enumerate(kind)]
        frames = max(s["input_features"].shape[-1] for s in samples)
        for s in samples:
            pad = frames - s["input_features"].shape[-1]
            s["input_features"] = torch.nn.functional.pad(s["input_features"], (0, pad))
            s["feature_attention_mask"] = torch.nn.functional.pad(s["feature_attention_mask"], (0, pad))
            s["use_audio_in_video"] = kind is AUDIO_IN_VIDEO
        row = ropekit.hf.pack(model, samples)
        alone = torch.cat([_logits(model, s)[0] for s in samples])
        torch.testing.assert_close(_logits(model, row)[0], alone, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# audio in video (use_audio_in_video=True)

# 0.5 s per grid (12.5 positions a frame): 2-second chunks of 4 frames; 3 s per grid (75): a frame past the next
# chunk; 1.4 s: TMRoPE's float32 frame times; audio longer and shorter than the video
AUDIO_IN_VIDEO = [[("T", 2), ("VA", 6, 2, 4, 0.5, 60), ("T", 2), ("A", 2), ("T", 1)],
                  [("T", 1), ("I", 4, 4), ("T", 1), ("VA", 2, 4, 2, 3.0, 9), ("T", 3), ("VA", 4, 2, 2, 1.4, 70),
                   ("T", 1)]]


def test_audio_in_video_matches_stock(fam):
    """A video with its audio interleaved (the family's processor's order), with images, audio and left padding:
    tmrope gives the stock logits, positions, rope_deltas and generate output bit for bit, and the positions are
    ``ropekit.positions`` of the layout (a VideoAudio segment)."""
    family, model = fam
    inputs, layouts = make_batch(family, AUDIO_IN_VIDEO, seed=2)
    inputs["use_audio_in_video"] = True
    keep = inputs["attention_mask"].bool()
    kw = dict(max_new_tokens=3, do_sample=False, output_logits=True, return_dict_in_generate=True)
    audio = inputs["feature_attention_mask"].sum(1)
    args = (inputs["input_ids"], inputs.get("image_grid_thw"), inputs["video_grid_thw"], inputs["attention_mask"],
            True, audio, inputs["video_second_per_grid"])
    with torch.no_grad():
        ref = _logits(model, inputs)
        pos, deltas = _bare(model).get_rope_index(*args)
        _bare(model).rope_deltas = None
        gen = model.generate(**inputs, **kw)
        patch_model(model, "tmrope", **family.stock)
        out = _logits(model, inputs)
        assert torch.equal(out[keep], ref[keep])
        assert _bare(model).rope_deltas is None  # the patched model keeps nothing between calls
        own = reference_positions(inputs, layouts, "tmrope", **family.stock)
        assert torch.equal(pos[:, keep].float(), own[:, keep])
        for p in last_positions(model).values():
            assert torch.equal(p[:, keep], own[:, keep])
        got, got_deltas = _bare(model).get_rope_index(*args)
        assert torch.equal(got[:, keep], pos[:, keep]) and torch.equal(got_deltas, deltas)
        got = model.generate(**inputs, **kw)
        assert torch.equal(got.sequences, gen.sequences)
        for w, g in zip(gen.logits, got.logits):
            assert torch.equal(g, w)


def test_audio_in_video_with_other_designs(fam):
    """Designs other than tmrope define no place for interleaved audio: the patched model refuses, naming the
    design; without use_audio_in_video the same tokens are placed as the design places text and video."""
    family, model = fam
    inputs, _ = make_batch(family, AUDIO_IN_VIDEO, seed=2)
    patch_model(model, "mrope")
    with pytest.raises(ValueError, match="design 'mrope'.* defines no place for a video with its audio track"):
        _logits(model, dict(inputs, use_audio_in_video=True))


def test_audio_in_video_with_a_video_without_audio_is_refused(fam):
    """With use_audio_in_video=True the stock code pairs every video with the next audio; a video without audio
    tokens would take another's: the patch refuses it."""
    family, model = fam
    inputs, _ = make_batch(family, [[("T", 2), ("V", 2, 2, 2, 0.5), ("T", 1), ("A", 2), ("T", 1)]])
    patch_model(model, "tmrope", **family.stock)
    with pytest.raises(ValueError, match="a video without audio tokens while use_audio_in_video=True"):
        _logits(model, dict(inputs, use_audio_in_video=True))


def test_audio_in_video_out_of_the_processors_order_is_refused(fam):
    """The patch places the processor's order only: ids in another order are refused, not misplaced."""
    family, model = fam
    inputs, _ = make_batch(family, [[("T", 2), ("VA", 2, 2, 2, 0.5, 30), ("T", 1)]])
    ids = inputs["input_ids"]
    first_audio = int((ids[0] == AUD).nonzero()[0])
    ids[0, first_audio - 1], ids[0, first_audio] = AUD, VID  # one audio token before the last video token
    patch_model(model, "tmrope", **family.stock)
    with pytest.raises(ValueError, match="are not in .* order"):
        _logits(model, dict(inputs, use_audio_in_video=True))


# ---------------------------------------------------------------------------------------------------------------
# what the patch refuses


@pytest.mark.parametrize("name", list(FAMILIES))
def test_image_grids_of_several_frames_are_refused(name):
    """The processors make single-frame image grids; a grid of t > 1 would be placed one position per frame
    where the stock model puts position_id_per_seconds between them, so it is refused, not misplaced."""
    from ropekit.hf.adapters import ADAPTERS
    adapter = ADAPTERS[name]
    with pytest.raises(ValueError, match=r"image_grid_thw\[:, 0\] > 1"):
        adapter.position_arguments({"image_grid_thw": torch.tensor([[1, 4, 4], [2, 4, 4]])})
    adapter.position_arguments({"image_grid_thw": torch.tensor([[1, 4, 4], [1, 2, 6]])})  # single frames pass


def test_videos_need_their_seconds(fam):
    family, model = fam
    inputs, _ = make_batch(family, MIXED)
    inputs.pop("video_second_per_grid")
    patch_model(model, "tmrope", **family.stock)
    with pytest.raises(ValueError, match="video_grid_thw without video_second_per_grid"):
        _logits(model, inputs)


def test_embeddings_without_ids_are_refused_with_grids(fam):
    """The thinkers take no mm_token_type_ids: with images given as embeddings only, nothing tells the patch which
    tokens they are (the stock model then places every token as text); the patch asks for input_ids."""
    family, model = fam
    inputs, _ = make_batch(family, MIXED)
    ids = inputs.pop("input_ids")
    inputs.pop("input_features"), inputs.pop("feature_attention_mask")
    inputs.pop("pixel_values"), inputs.pop("pixel_values_videos")
    embeds = model.get_input_embeddings()(ids)
    patch_model(model, "tmrope", **family.stock)
    with pytest.raises(ValueError, match="no `input_ids`; .* takes no mm_token_type_ids, so only input_ids"):
        _logits(model, dict(inputs, inputs_embeds=embeds))
