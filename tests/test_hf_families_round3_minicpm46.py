"""ropekit designs inside MiniCPM-V 4.6 (a tiny random model built from its config): every crop (the thumbnail and
each slice) and every video frame a grid of its own, placed like LLaVA's images, in a Qwen3.5 text model the stock
model hands no positions.

The matrix is tests/test_hf_families_1d.py's, run on this family: its tests are collected here too, on this module's
``fam`` fixture, with the family added to its table. References: the stock transformers model with the same weights
(``vanilla`` gives its logits and ``generate`` output bit for bit), each design's ``ropekit.positions`` on the layout
the model sees, the model's own window merger and merger (which patches each image token holds), one teacher-forced
forward (cached generation), per-sample runs (packing, with the samples' NaViT-packed pixels joined), save and
reload.
"""
import sys

import pytest
import torch
import transformers as T

import ropekit.hf

import test_hf_families_1d as base
from hf_compat import restore, runs_alone
from ropekit import Image, Layout, Text, Video
from ropekit.hf import is_patched, last_positions, patch_model
from test_hf_families_1d import _unpatched_after, family_fixture  # noqa: F401  (autouse: unpatch after each test)
from test_hf_families_1d import (  # noqa: F401  (the shared matrix, collected on this module's family)
    IMG, TEXT, Family, _logits, _seeded,
    test_cached_generation_equals_a_teacher_forced_forward,
    test_checkpointed_training_step, test_every_design_places_its_positions,
    test_save_pretrained_and_reload_restore_the_patch, test_vanilla_is_the_stock_model)
from test_hf_llava import reference_positions

IS, IE, SS, SE, NL, VID = 61, 62, 63, 64, 65, 75  # <image>, </image>, <slice>, </slice>, "\n", video token
ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5,
        "mrope_interleaved": True}


def _minicpmv4_6(layers=("full_attention", "full_attention"), downsample_mode="4x", **kw):
    """A tiny MiniCPM-V 4.6: two full-attention Qwen3.5 layers for the matrix (the checkpoints interleave
    linear-attention layers, which take no positions: ``layers`` builds them, slower on CPU), in ``"4x"`` mode (the
    tower's window merger, which ``"16x"`` adds, runs one attention call per 2 x 2 window on CPU: slow; it is
    checked on its own below)."""
    cls = getattr(T, "MiniCPMV4_6ForConditionalGeneration", None)
    if cls is None:
        pytest.skip(f"transformers {T.__version__} has no MiniCPMV4_6ForConditionalGeneration")
    return cls(T.MiniCPMV4_6Config(
        text_config=dict(TEXT, model_type="qwen3_5_text", head_dim=16, rope_parameters=ROPE, pad_token_id=0,
                         layer_types=list(layers), linear_num_value_heads=2,
                         linear_num_key_heads=1, linear_key_head_dim=8, linear_value_head_dim=8),
        vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=16, patch_size=2),
        image_token_id=IMG, video_token_id=VID, insert_layer_id=0, downsample_mode=downsample_mode, **kw))


def _picture(spec, token=IMG):
    """A picture as the processor writes it: ``<image>`` thumbnail ``</image>``, then its slices row by row (each
    ``<slice>`` tokens ``</slice>``, rows joined by newlines). ``spec``: (thumbnail grid, slice rows, slice cols,
    slice grid), grids in tokens."""
    (th, tw), rows, cols, (sh, sw) = spec
    ids, lay, grids = [IS] + [token] * th * tw + [IE], [Text(1), Image(th, tw), Text(1)], [(th, tw)]
    for r in range(rows):
        for _ in range(cols):
            ids, lay, grids = ids + [SS] + [token] * sh * sw + [SE], lay + [Text(1), Image(sh, sw), Text(1)], \
                grids + [(sh, sw)]
        if r < rows - 1:
            ids, lay = ids + [NL], lay + [Text(1)]
    return ids, lay, grids


def _packed_pixels(grids, g, factor=2):
    """NaViT-packed pixels of crops of ``grids`` tokens (``factor`` patches per token side, 2 x 2 pixel patches)
    and their target sizes in patches."""
    sizes = torch.tensor([[factor * h, factor * w] for h, w in grids])
    return torch.rand(1, 3, 2, 2 * int(sizes.prod(1).sum()), generator=g), sizes


def _pixels(images, per_sample, g):
    pixels, sizes = _packed_pixels([grid for image in images for grid in image], g)
    return {"pixel_values": pixels, "target_sizes": sizes}


MINICPM46 = {
    "minicpmv4_6": Family(_minicpmv4_6, _picture, [[("T", 2), ("I", ((2, 3), 1, 2, (2, 2))), ("T", 2)],
                                                   [("T", 3), ("I", ((3, 2), 0, 0, (0, 0))), ("T", 1),
                                                    ("I", ((2, 2), 0, 0, (0, 0))), ("T", 1)]],
                          pixels=_pixels),
}
base.FAMILIES.update(MINICPM46)  # the shared tests read the families from that table


fam = family_fixture(MINICPM46)


# ---------------------------------------------------------------------------------------------------------------
# MiniCPM-V 4.6 specifics


def test_minicpmv4_6_with_linear_attention_layers_is_the_stock_model():
    """As the checkpoints are built (layer 0 a linear-attention layer, without rotary; layer 1 full attention on
    half of each head): ``vanilla`` gives the stock logits and ``generate`` output bit for bit. Packed rows are
    refused there, naming the layer type, under flash attention too (which reads the boundaries off the positions):
    the stock linear-attention layer run over two samples end to end gives the second other outputs than alone, and
    its short convolution, which takes no boundaries, does so on the second sample's first tokens even where it is
    handed flash attention's ``cu_seq_lens_q``."""
    model = _seeded(lambda: _minicpmv4_6(layers=("linear_attention", "full_attention")))
    inputs, _ = base.make_batch("minicpmv4_6")
    keep = inputs["attention_mask"].bool()
    stock_pos = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    kw = dict(max_new_tokens=2, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        ref = model(**inputs, position_ids=stock_pos).logits
        gref = model.generate(**inputs, **kw)
        patch_model(model, "vanilla")
        assert torch.equal(_logits(model, inputs)[keep], ref[keep])
        got = model.generate(**inputs, **kw)
    assert torch.equal(got.sequences, gref.sequences)
    assert all(torch.equal(a, b) for a, b in zip(got.logits, gref.logits))
    samples = base._one_sample_batches("minicpmv4_6")
    with pytest.raises(ValueError, match=r"packed rows are not supported with attention layer types "
                                         r"\['linear_attention'\]"):
        _logits(model, ropekit.hf.pack(model, samples))
    text = model.model.language_model
    text.config._attn_implementation = "flash_attention_2"  # refused before any attention runs
    with pytest.raises(ValueError, match=r"types \['linear_attention'\]"):
        _logits(model, ropekit.hf.pack(model, samples, return_flash_attn_kwargs=True))
    text.config._attn_implementation = "sdpa"
    restore(model)
    layer = text.layers[0].linear_attn
    a, b = torch.randn(1, 5, TEXT["hidden_size"]), torch.randn(1, 4, TEXT["hidden_size"])
    conv = sys.modules[type(layer).__module__].causal_conv1d_fn
    channels = layer.conv1d.weight.shape[0]
    xa, xb = torch.randn(1, channels, 5), torch.randn(1, channels, 4)
    with torch.no_grad():
        assert not torch.allclose(layer(torch.cat([a, b], 1))[:, 5:], layer(b), atol=1e-3)
        args = (layer.conv1d.weight.squeeze(1), layer.conv1d.bias)
        after = conv(torch.cat([xa, xb], 2), *args, activation=layer.activation, cu_seq_lens_q=torch.tensor([0, 5, 9]))
        alone = conv(xb, *args, activation=layer.activation)
    assert not torch.allclose(after[..., 5], alone[..., 0], atol=1e-3)  # the first token saw the tokens before it


def _video_sample(g):
    """One sample with a two-frame video (each frame ``<image>`` a 2 x 3 token grid ``</image>``) between text, as
    the processor gives it alone: the frames' pixels one NaViT-packed row, one size row per frame."""
    frame = [IS] + [VID] * 6 + [IE]
    ids = torch.tensor([[5, 6] + frame + frame + [7]])
    video, sizes = _packed_pixels([(2, 3), (2, 3)], g)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values_videos=video,
                target_sizes_videos=sizes)


@pytest.mark.parametrize("patch", [dict(design="vanilla"), dict(design=("circle", "mrope"), age="alternate")],
                         ids=["stock-equivalent", "circle-mrope-age"])
def test_minicpmv4_6_packed_rows_equal_per_sample_runs(patch):
    """Samples packed into one padding-free row (``PackingCollator``): a picture with slices, two pictures, a video,
    each as the processor gives it alone (its crops one NaViT-packed pixel row). The packed row joins the pixel rows
    along the patches and the size rows in sample order, as the processor lays out a batch; each sample's logits and
    the loss equal its own run: the stock model's for ``vanilla``, the patched model's for an AGE patch."""
    model = _seeded(_minicpmv4_6)
    samples = base._one_sample_batches("minicpmv4_6") + [_video_sample(torch.Generator().manual_seed(5))]
    stock = runs_alone(model, samples)
    patch_model(model, **patch)
    want, want_loss = stock if patch["design"] == "vanilla" else runs_alone(model, samples)
    row = ropekit.hf.PackingCollator(model)(samples)
    assert row["pixel_values"].shape[:3] == (1, 3, 2) and row["target_sizes"].shape == (5, 2)
    with torch.no_grad():
        out = model(**row)
    torch.testing.assert_close(out.logits[0], want, rtol=1e-5, atol=1e-5)
    tokens = sum(s["input_ids"].shape[1] - 1 for s in samples)  # every sample's first token predicts nothing
    torch.testing.assert_close(out.loss, want_loss / tokens, rtol=1e-5, atol=1e-6)
    restore(model)


def test_minicpmv4_6_pack_refuses_what_it_cannot_join():
    """Pixels that are not one NaViT-packed row per sample, and samples that ask for different merges
    (``downsample_mode``, which changes every crop's token grid), are refused by name."""
    model = _seeded(_minicpmv4_6)
    patch_model(model, "vanilla")
    samples = base._one_sample_batches("minicpmv4_6")
    two_rows = dict(samples[0], pixel_values=samples[0]["pixel_values"].expand(2, -1, -1, -1))
    with pytest.raises(ValueError, match="`pixel_values` have shapes"):
        ropekit.hf.pack(model, [two_rows, samples[1]])
    with pytest.raises(ValueError, match="disagree on `downsample_mode`"):
        ropekit.hf.pack(model, [dict(samples[0], downsample_mode="4x"), samples[1]])
    restore(model)


def test_minicpmv4_6_packs_16x_crops_of_several_sizes_where_the_window_merger_takes_them():
    """``"16x"`` (the tower's window merger on): two samples, each one crop, 4 x 8 and 8 x 4 patches. From
    transformers 5.24 the stock window merger run on both crops in one call gives each crop what it gives alone, and
    the packed row's logits equal the per-sample runs; 5.18's reads every crop of a call as the first one's size
    (the second crop's windows come out wrong), and there such a row is refused by name."""
    from ropekit.hf.adapters.minicpmv4_6 import PER_CROP_WINDOW_MERGER
    from ropekit.hf.boundary import _release

    model = _seeded(_minicpmv4_6)
    g = torch.Generator().manual_seed(6)
    samples = []
    for grid in ((1, 2), (2, 1)):
        ids, _, _ = _picture((grid, 0, 0, (0, 0)))
        ids = torch.tensor([[5] + ids + [7]])
        pixels, sizes = _packed_pixels([grid], g, factor=4)
        samples.append(dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels,
                            target_sizes=sizes, downsample_mode="16x"))
    merger = model.model.vision_tower.vit_merger
    x, sizes = torch.randn(1, 64, merger.embed_dim, generator=g), torch.tensor([[4, 8], [8, 4]])
    with torch.no_grad():
        joint = merger(x, sizes)
        apart = torch.cat([merger(x[:, :32], sizes[:1]), merger(x[:, 32:], sizes[1:])], 1)
    patch_model(model, "circle")
    if _release(T.__version__) >= _release(PER_CROP_WINDOW_MERGER):
        torch.testing.assert_close(joint, apart, rtol=1e-5, atol=1e-5)
        alone = torch.cat([_logits(model, s)[0] for s in samples])
        torch.testing.assert_close(_logits(model, ropekit.hf.pack(model, samples))[0], alone, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(joint[:, :8], apart[:, :8]) and not torch.allclose(joint[:, 8:], apart[:, 8:])
        with pytest.raises(ValueError, match=r"crops have 2 sizes \(target_sizes \[\(4, 8\), \(8, 4\)\]\)"):
            ropekit.hf.pack(model, samples)
    restore(model)


def test_minicpmv4_6_tokens_hold_the_patches_of_their_grid_cell():
    """One-hot patch markers through the model's own window merger (its attention and MLP outputs zeroed, so each
    feature is the mean of its window) and merger (its MLPs the identity, so each token lists its windows), on an
    8 x 12 patch crop in 16x mode: token k holds the 4 x 4 patches at row k // 3, column k % 3 of the 2 x 3 grid
    ropekit places."""
    model = _seeded(_minicpmv4_6)
    h, w = 8, 12
    vcfg = T.MiniCPMV4_6VisionConfig(**dict(model.config.vision_config.to_dict(), hidden_size=h * w))
    window = type(model.model.vision_tower.vit_merger)(vcfg)  # the tower's merger, one channel per patch
    with torch.no_grad():
        for linear in (window.self_attn.out_proj, window.linear_2):
            linear.weight.zero_()
            linear.bias.zero_()
        sizes = torch.tensor([[h, w]])
        windows = window(torch.eye(h * w)[None], sizes)  # (1, windows, patches)
        merger = model.model.merger
        merger.mlp = torch.nn.ModuleList([torch.nn.Identity()])  # the merger's reshaping alone
        tokens = merger(windows, sizes // 2)[0]  # (tokens, 4 windows x patches)
    got = [sorted(set((t.reshape(-1, h * w).sum(0) > 0).nonzero().flatten().tolist())) for t in tokens]
    want = [sorted(r * w + c for r in range(4 * i, 4 * i + 4) for c in range(4 * j, 4 * j + 4))
            for i in range(2) for j in range(3)]
    assert got == want


def test_minicpmv4_6_video_frames_and_16x_mode():
    """A video as the processor writes it (per frame ``<image>`` its tokens ``</image>``), beside a picture,
    under a per-call ``downsample_mode="16x"`` (the window merger on: 4 x 4 patches per token): ``vanilla`` gives the
    stock logits, and a design places each frame as a one-frame block of its grid, each crop as its image grid.
    (transformers 5.18's window merger takes crops of one size per call: the picture and the frames are encoded
    apart, each of one size.)"""
    model = _seeded(_minicpmv4_6)
    g = torch.Generator().manual_seed(3)
    frame = [IS] + [VID] * 6 + [IE]  # a 2 x 3 token frame (8 x 12 patches in 16x mode)
    pic, pic_lay, _ = _picture(((2, 2), 0, 0, (0, 0)))
    ids = torch.tensor([[5, 6] + pic + [40] + frame + frame + [7, 8]])
    pixels, sizes = _packed_pixels([(2, 2)], g, factor=4)
    video, vsizes = _packed_pixels([(2, 3), (2, 3)], g, factor=4)
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels, target_sizes=sizes,
                  pixel_values_videos=video, target_sizes_videos=vsizes, downsample_mode="16x")
    stock = _logits(model, inputs)
    patch_model(model, "vanilla")
    assert torch.equal(_logits(model, inputs), stock)
    patch_model(model, "circle")
    _logits(model, inputs)
    vframe = [Text(1), Video(1, 2, 3), Text(1)]
    layout = Layout([Text(2), *pic_lay, Text(1), *vframe, *vframe, Text(2)])
    want = reference_positions(inputs, [layout], "circle")
    for pos in last_positions(model).values():
        assert torch.equal(pos, want)
    restore(model)


def test_minicpmv4_6_crops_need_their_target_sizes():
    """The encoded features carry each crop's token count, not its shape (2 x 3 and 3 x 2 fill the same count):
    pictures without ``target_sizes`` are refused, as are crops that are no whole number of merged windows."""
    model = _seeded(_minicpmv4_6)
    inputs, _ = base.make_batch("minicpmv4_6")
    patch_model(model, "circle")
    with pytest.raises(ValueError, match="without `target_sizes`"):
        model(**{k: v for k, v in inputs.items() if k != "target_sizes"})
    odd = inputs["target_sizes"].clone()
    odd[0] = torch.tensor([3, 8])  # 24 patches, as 4 x 6, but 3 rows are no whole number of 2-patch windows
    with pytest.raises(ValueError, match="crop 0 has 3 x 8 patches"):
        model(**dict(inputs, target_sizes=odd))
    restore(model)
    assert not is_patched(model)
