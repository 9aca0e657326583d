"""ropekit designs inside more 1-D families placed like LLaVA (every image or tile a grid of its own): Command A
Vision (tiny random models built from their configs).

The matrix is tests/test_hf_families_1d.py's, run on these families: its tests are collected here too, on this
module's ``fam`` fixture, with these families added to its table. References: the stock transformers model with the
same weights (``vanilla`` gives its logits and ``generate`` output bit for bit), each design's ``ropekit.positions``
on the layout the model sees, the family's own feature merging (which patches each image token holds), one
teacher-forced forward (cached generation), gradient checkpointing, per-sample runs (packing), save and reload.
"""
import pytest
import torch
import transformers as T

import test_hf_families_1d as base
from hf_compat import assert_refused_by_name, ready_to_generate, restore
from ropekit import Image, Text, Video
from ropekit.hf import is_patched, patch_model, supported_models
from test_hf_families_1d import IMG, PAD, TEXT, VISION, S, Family, _internvl_image, _row_major, _seeded, _windows
from test_hf_families_1d import _unpatched_after, family_fixture  # noqa: F401  (autouse: unpatch after each test)
from test_hf_families_1d import (  # noqa: F401  (the shared matrix, collected on this module's families)
    test_cached_generation_equals_a_teacher_forced_forward, test_checkpointed_training_step,
    test_every_design_places_its_positions, test_packed_rows_equal_per_sample_runs,
    test_save_pretrained_and_reload_restore_the_patch, test_vanilla_is_the_stock_model)


def _tiles(images, per_sample, g):  # one pixel row per tile
    return {"pixel_values": torch.randn(sum(images), 3, 8, 8, generator=g)}


# ---------------------------------------------------------------------------------------------------------------
# Command A Vision: SigLIP tiles pixel-shuffled by 2, a Cohere 2 language model


def _cohere2_vision():
    return T.Cohere2VisionForConditionalGeneration(T.Cohere2VisionConfig(
        vision_config=dict(VISION, model_type="siglip_vision_model"),
        text_config=dict(TEXT, model_type="cohere2", head_dim=16, sliding_window=4,
                         layer_types=["sliding_attention", "full_attention"], eos_token_id=1),
        image_token_id=IMG, downsample_factor=2, alignment_intermediate_size=32))


def _cohere2_vision_image(tiles):  # <|START_OF_IMG|>, per tile (then the thumbnail) its tokens + line break, <|END|>
    ids, lay = [61], [Text(1)]
    for _ in range(tiles):
        ids, lay = ids + [IMG] * S * S + [63], lay + [Image(S, S), Text(1)]
    return ids + [62], lay + [Text(1)], tiles


# ---------------------------------------------------------------------------------------------------------------
# Qianfan-OCR: InternVL's model (InternViT tiles pixel-shuffled by 0.5) with a Qwen3 language model


def _qianfan_ocr():
    return T.QianfanOCRForConditionalGeneration(T.QianfanOCRConfig(
        vision_config=VISION, text_config=dict(TEXT, model_type="qwen3", head_dim=16), image_token_id=IMG,
        image_seq_length=S * S))


# ---------------------------------------------------------------------------------------------------------------
# EXAONE 4.5: Qwen2.5-VL's vision tower (2 x 2 merge) in a 1-D EXAONE 4 language model; images and videos


VID, VSTART, VEND = 71, 72, 73  # video token, <vision_start>, <vision_end>


def _exaone4_5():
    return T.Exaone4_5_ForConditionalGeneration(T.Exaone4_5_Config(
        text_config=dict(TEXT, model_type="exaone4", head_dim=16, sliding_window=4, sliding_window_pattern=2),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, num_key_value_heads=1,
                           out_hidden_size=32, patch_size=2, spatial_merge_size=2, temporal_patch_size=2,
                           window_size=8, fullatt_block_indexes=[0]),
        image_token_id=IMG, video_token_id=VID))


def _exaone4_5_item(spec):  # <vision_start>, the merged tokens (frame by frame, row by row), <vision_end>
    kind, t, h, w = spec
    block = Image(h, w) if kind == "image" else Video(t, h, w)
    return [VSTART] + [IMG if kind == "image" else VID] * (t * h * w) + [VEND], [Text(1), block, Text(1)], spec


def _exaone4_5_pixels(items, per_sample, g):  # flattened patches (3 channels x 2 frames x 2 x 2) and the grids
    out = {}
    for kind, key in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        grids = torch.tensor([[t, 2 * h, 2 * w] for k, t, h, w in items if k == kind]).reshape(-1, 3)
        if len(grids):
            out[key] = torch.randn(int(grids.prod(-1).sum()), 24, generator=g)
            out[f"{kind}_grid_thw"] = grids
    return out


# ---------------------------------------------------------------------------------------------------------------
# Janus: one SigLIP-style patch grid per image (no merging) in a Llama language model


def _janus():
    return T.JanusForConditionalGeneration(T.JanusConfig(
        text_config=dict(TEXT, model_type="llama"),
        vision_config=dict(VISION, patch_size=4, num_image_tokens=S * S, projection_dim=32),
        vq_config=dict(embed_dim=4, num_embeddings=32, latent_channels=32, base_channels=32, channel_multiplier=[1, 1],
                       num_res_blocks=1, projection_dim=32, image_token_embed_dim=32),
        image_token_id=IMG))


def _janus_image(_):  # <begin_of_image>, the patch grid, <end_of_image>
    ids, lay = [IMG] * S * S, [Image(S, S)]
    return [61] + ids + [62], [Text(1)] + lay + [Text(1)], 1


# ---------------------------------------------------------------------------------------------------------------
# MiniMax-M3-VL: a Qwen-style vision tower (2 x 2 merged by the projector) in a 1-D MiniMax M3 language model with a
# block-sparse layer; a video frame is a block of its own, its timestamp text before it. The samples are of one
# length: the sparse layers' indexer places key blocks by cache slot and masks by position, so a left-padded row's
# logits depend on the batch's length in the stock model itself (transformers notes it), and cached generation
# would not equal a teacher-forced pass there under any patch.


def _minimax_m3_vl():
    text = dict(TEXT, head_dim=16, num_local_experts=2, num_experts_per_tok=1, dense_intermediate_size=48,
                shared_intermediate_size=16, index_n_heads=1, index_head_dim=8, index_block_size=4,
                index_topk_blocks=2, index_local_blocks=1, layer_types=["full_attention", "minimax_m3_sparse"],
                mlp_layer_types=["dense", "sparse"], bos_token_id=1, eos_token_id=1)
    vision = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, patch_size=2,
                  temporal_patch_size=2, spatial_merge_size=2)
    return T.MiniMaxM3SparseForConditionalGeneration(T.MiniMaxM3VLConfig(
        text_config=text, vision_config=vision, image_token_index=IMG, video_token_index=VID, projector_hidden_size=32))


def _minimax_m3_vl_item(spec):  # an image: <vision_start> tokens <vision_end>; a video: that per frame after a time
    kind, t, h, w = spec
    if kind == "image":
        return [VSTART] + [IMG] * (h * w) + [VEND], [Text(1), Image(h, w), Text(1)], spec
    ids, lay = [], []
    for _ in range(t):
        ids, lay = ids + [64, VSTART] + [VID] * (h * w) + [VEND], lay + [Text(2), Video(1, h, w), Text(1)]
    return ids, lay, spec


ROUND3 = {
    "cohere2_vision": Family(_cohere2_vision, _cohere2_vision_image,
                             [[("T", 2), ("I", 3), ("T", 2)], [("T", 3), ("I", 1), ("T", 1), ("I", 2), ("T", 1)]],
                             pixels=_tiles),
    "qianfan_ocr": Family(_qianfan_ocr, _internvl_image,
                          [[("T", 3), ("I", 3), ("T", 2)], [("T", 2), ("I", 1), ("T", 2)]], pixels=_tiles),
    "exaone4_5": Family(_exaone4_5, _exaone4_5_item,
                        [[("T", 2), ("I", ("image", 1, 2, 3)), ("T", 2), ("I", ("video", 2, 2, 2)), ("T", 1)],
                         [("T", 3), ("I", ("image", 1, 3, 2)), ("T", 1)]], pixels=_exaone4_5_pixels,
                        counts_padding=True),
    "janus": Family(_janus, _janus_image, [[("T", 3), ("I", 0), ("T", 2), ("I", 0), ("T", 1)], [("T", 2), ("I", 0),
                                                                                              ("T", 3)]],
                    pixels=_tiles),
    "minimax_m3_vl": Family(_minimax_m3_vl, _minimax_m3_vl_item,
                            [[("T", 2), ("I", ("image", 1, 2, 3)), ("T", 2), ("I", ("video", 2, 2, 2)), ("T", 1)],
                             [("T", 3), ("I", ("image", 1, 3, 2)), ("T", 16)]], pixels=_exaone4_5_pixels),
}
base.FAMILIES.update(ROUND3)  # the shared tests read the families from that table
base.UNPACKED.add("minimax_m3_vl")  # its sparse layers pick key blocks by cache slot: packing is refused


fam = family_fixture(ROUND3, lambda family: ready_to_generate(_seeded(family.build), PAD, [IMG, VID]))


def test_supported_models_lists_the_families():
    assert set(ROUND3) <= set(supported_models())


def test_cohere2_vision_tokens_hold_the_patches_of_their_grid_cell():
    """Marker features through the model's own pixel shuffle: token k of a tile holds the 2 x 2 patch window at row
    k // S, column k % S, the grid ropekit places."""
    model = _seeded(_cohere2_vision)
    side = 4
    f = torch.arange(side * side, dtype=torch.float32).view(1, side * side, 1)
    out = model.model.multi_modal_projector.pixel_shuffle(f).reshape(-1, 4)
    assert _windows(out, side) == _row_major(S, 2)


def test_qianfan_ocr_tokens_hold_the_patches_of_their_grid_cell():
    """As on InternVL, through Qianfan-OCR's own pixel shuffle (0.5: 2 x 2 windows)."""
    model = _seeded(_qianfan_ocr)
    side = 4
    f = torch.arange(side * side, dtype=torch.float32).view(1, side, side, 1)
    out = model.model.pixel_shuffle(f, model.config.downsample_ratio).reshape(-1, 4)
    assert _windows(out, side) == _row_major(S, 2)


def test_qianfan_ocr_refuses_a_cls_keeping_strategy():
    """Under strategy 'full' a tile's features keep the tower's CLS output: no square grid; refused by name."""
    model = _seeded(_qianfan_ocr)
    model.config.vision_feature_select_strategy = "full"
    with pytest.raises(ValueError, match="Qianfan-OCR with vision_feature_select_strategy='full' keeps the tower"):
        patch_model(model, "circle")
    assert not is_patched(model)


# ---------------------------------------------------------------------------------------------------------------
# families refused (docs/hf.md, "Families ropekit refuses"): the refusal, and the facts it rests on, on the stock
# transformers models


def _aria():
    return T.AriaForConditionalGeneration(T.AriaConfig(  # config objects: transformers 5.18 takes no dicts here
        vision_config=T.Idefics3VisionConfig(**VISION),
        text_config=T.AriaTextConfig(**TEXT, moe_num_experts=2, moe_topk=1, moe_num_shared_experts=1),
        projector_patch_to_query_dict={16: S * S}, image_token_id=IMG))


def _mistral_large4_text():
    return dict(TEXT, model_type="mistral_large4_text", num_key_value_heads=2, moe_intermediate_size=16,
                n_routed_experts=2, num_experts_per_tok=1, kv_lora_rank=8, qk_rope_head_dim=8, qk_nope_head_dim=8,
                v_head_dim=8, index_topk=4, index_head_dim=16, index_n_heads=2)


def _mistral_large4():
    if not hasattr(T, "MistralLarge4ForConditionalGeneration"):
        pytest.skip(f"transformers {T.__version__} has no Mistral Large 4")
    return T.MistralLarge4ForConditionalGeneration(T.MistralLarge4Config(
        text_config=_mistral_large4_text(), image_token_id=IMG,
        vision_config=dict(VISION, model_type="pixtral", image_size=16, head_dim=8)))


REFUSED = {"aria": _aria, "mistral_large4": _mistral_large4}


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_families_say_why_and_list_the_supported_ones(name):
    assert_refused_by_name(_seeded(REFUSED[name]), name)


def test_aria_image_tokens_are_learned_queries_with_no_grid_cell():
    """Why Aria is refused: the projector's image tokens are its learned queries attending to every patch without
    positions, so permuting the tower's patch features leaves every image token as it was (no token holds a patch
    window), and the released token counts (128 for 35 x 35 patches) are no square grid either."""
    model = _seeded(_aria)
    projector = model.model.multi_modal_projector
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        projector.query.copy_(torch.randn(projector.query.shape, generator=g))  # distinct queries (stock init: zeros)
        patches = torch.randn(1, 16, VISION["hidden_size"], generator=g)
        tokens = projector(patches)
        shuffled = projector(patches[:, torch.randperm(16, generator=g)])
    assert tokens.shape[1] == S * S and not torch.allclose(tokens[0, 0], tokens[0, 1])
    torch.testing.assert_close(shuffled, tokens, rtol=1e-5, atol=1e-6)
    released = T.AriaConfig().projector_patch_to_query_dict
    assert released[35 * 35] == 128 and round(128 ** 0.5) ** 2 != 128


# ---------------------------------------------------------------------------------------------------------------
# EXAONE 4.5 specifics


@pytest.mark.parametrize("name", ["exaone4_5", "minimax_m3_vl"])
def test_qwen_style_tokens_hold_the_patches_of_their_grid_cell(name):
    """The merger (EXAONE 4.5) or projector (MiniMax-M3-VL) joins each run of m² consecutive patches into one token;
    the vision tower's own rotary position ids (with the tower's own flags) say where those patches sit: token k of
    a frame holds the m x m window at row k // (w/m), column k % (w/m), frame after frame (the ``h/m x w/m`` grid
    ropekit places per image or frame)."""
    from transformers.vision_utils import get_vision_position_ids

    model = _seeded(ROUND3[name].build)
    tower = getattr(model.model, "visual", None) or model.model.vision_tower
    m = model.config.vision_config.spatial_merge_size
    t, h, w = 2, 4, 6
    temporal = getattr(tower, "include_temporal", False)
    rows_cols = get_vision_position_ids(torch.tensor([[t, h, w]]), m, include_temporal=temporal)[:, -2:]
    rows_cols = rows_cols.reshape(-1, m * m, 2)
    want = [([m * r, m * r + 1], [m * c, m * c + 1]) for _ in range(t) for r in range(h // m) for c in range(w // m)]
    assert [(sorted(set(g[:, 0].tolist())), sorted(set(g[:, 1].tolist()))) for g in rows_cols] == want


def test_exaone4_5_refuses_pixels_without_grids_and_unpatches_generate():
    """Pixels without ``image_grid_thw`` have no token grid (the tower needs the grids too): a ValueError naming
    the argument. Unpatching gives generate its stock input preparation back."""
    model = ready_to_generate(_seeded(_exaone4_5), PAD, [IMG, VID])
    inputs, _ = base.make_batch("exaone4_5")
    patch_model(model, "circle")
    assert "prepare_inputs_for_generation" in model.__dict__
    with pytest.raises(ValueError, match="without `image_grid_thw`"):
        model(**{k: v for k, v in inputs.items() if k != "image_grid_thw"})
    restore(model)
    assert "prepare_inputs_for_generation" not in model.__dict__ and not is_patched(model)


def test_mistral_large4_rotary_scales_its_frequencies_by_a_trained_parameter():
    """Why Mistral Large 4 is refused: its stock cos/sin follow a learned parameter, not the config alone. With
    ``alpha`` 0 the table is the config's; with another ``alpha`` (a trained checkpoint) it differs, and a loss on
    the table sends a gradient into ``alpha`` (fine-tuning trains it)."""
    rotary = _mistral_large4().model.language_model.rotary_emb
    assert isinstance(rotary.alpha, torch.nn.Parameter) and rotary.alpha.requires_grad
    x, pos = torch.zeros(1, 1, 8), torch.arange(6.0)[None]
    config_only = rotary.inv_freq.float()[None, :] * pos[0, :, None]
    with torch.no_grad():
        cos, _ = rotary(x, pos)
        assert torch.allclose(cos[0, :, : config_only.shape[1]], config_only.cos() * rotary.attention_scaling)
        rotary.alpha.fill_(0.5)
        trained, _ = rotary(x, pos)
    assert not torch.allclose(trained, cos)
    rotary(x, pos)[0].sum().backward()
    assert rotary.alpha.grad is not None and bool(rotary.alpha.grad.abs().sum() > 0)


# ---------------------------------------------------------------------------------------------------------------
# Janus specifics


def test_janus_image_tokens_are_the_patch_grid_row_by_row():
    """The tower's own embeddings of an image whose patch (r, c) is filled with r * s + c (the conv averaging each
    patch, no position embedding): token k is patch k, the ``s x s`` grid ropekit places, unmerged."""
    model = _seeded(_janus)
    emb = model.model.vision_model.embeddings
    p = emb.patch_size
    image = torch.arange(S * S, dtype=torch.float32).view(S, S).repeat_interleave(p, 0).repeat_interleave(p, 1)
    with torch.no_grad():
        emb.patch_embedding.weight.fill_(1.0 / (3 * p * p))
        emb.patch_embedding.bias.zero_()
        emb.position_embedding.weight.zero_()
        out = emb(image.expand(1, 3, S * p, S * p))
    assert torch.allclose(out[0, :, 0], torch.arange(S * S, dtype=torch.float32), atol=1e-5)


def test_janus_image_generation_is_the_stock_models_under_every_design():
    """Image generation runs the language model on VQ-code embeddings, no image tokens: the patched model sees text,
    so under vanilla and under a multimodal design alike it generates the stock model's codes."""
    model = ready_to_generate(_seeded(_janus), PAD, [IMG])
    model.generation_config.generation_kwargs = {"boi_token_id": 61}
    model.generation_config.bos_token_id = 1
    ids = torch.tensor([[1, 5, 6, 7, 61]])
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), generation_mode="image", do_sample=False,
              guidance_scale=2.0)
    with torch.no_grad():
        stock = model.generate(**kw)
        for design in ("vanilla", "circle"):
            patch_model(model, design)
            assert torch.equal(model.generate(**kw), stock), design
