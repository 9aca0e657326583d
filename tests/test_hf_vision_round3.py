"""patch_vision_model on more encoders: V-JEPA 2 (3-D), Gemma 4, Llama 4, SAM 3, VideoLLaMA 3, EXAONE 4.5.

The reference is transformers itself: each stock encoder (tiny random config) gives the outputs the
"axial, stock frequencies" patch must reproduce; the coordinates the other families see are checked against
``ropekit.positions`` of the patch grid.
"""
import re

import pytest
import torch

import ropekit
from ropekit.hf import patch_vision_model, unpatch_vision_model
from ropekit.hf import vision as hf_vision

from test_hf_vision import OTHER_FAMILIES, _out

# one family of each rotation kind (LieRE's block rotation is ComRoPE's, directional's planar one axial's)
FAMILIES = [("axial", dict(frequencies="axial"))] + [f for f in OTHER_FAMILIES
                                                     if f[0] not in ("axial", "liere", "directional")]
# 2-D encoders: the hook paths differ per encoder, the rotations not (GeoPE's and GRAPE's 2-D rotations run on
# the encoders of test_hf_vision.py); a shared planar, a per-head and a learned block family
FAMILIES_2D = [f for f in FAMILIES if f[0] in ("axial", "mixed", "comrope")]


def _record(monkeypatch) -> list:
    """The coordinates each attention call hands the patch's rotation (one entry per call)."""
    seen, begin = [], hf_vision._Context.begin

    def spy(self, coords):
        seen.append(coords.clone())
        return begin(self, coords)

    monkeypatch.setattr(hf_vision._Context, "begin", spy)
    return seen


def _trains(model, run, attentions: int, name: str, families=None) -> None:
    """Each family: one training step is finite and reaches the family's own parameters, one module per attention."""
    for family, options in families or FAMILIES_2D:
        patch_vision_model(model, family, **options)
        model.train()
        model.zero_grad()
        loss = run(model).square().mean()
        loss.backward()
        own = {n: p.grad for n, p in model.named_parameters() if "ropekit_rotary" in n}
        learned = family in ("mixed", "liere", "comrope", "grape")
        assert torch.isfinite(loss) and bool(own) == learned, (name, family)
        assert all(g is not None and g.abs().sum() > 0 for g in own.values()), (name, family)
        if learned:
            assert len({n.split(".ropekit_rotary")[0] for n in own}) == attentions, (name, family)
    unpatch_vision_model(model)


# ---------------------------------------------------------------------------------------------------
# V-JEPA 2: (frame, row, column) RoPE in the encoder and the predictor

def _vjepa2(model_cls=None):
    from transformers import VJEPA2Config, VJEPA2Model
    cfg = VJEPA2Config(hidden_size=48, num_attention_heads=2, num_hidden_layers=2, mlp_ratio=1.0, crop_size=16,
                       patch_size=4, frames_per_clip=4, tubelet_size=2, pred_hidden_size=32,
                       pred_num_attention_heads=2, pred_num_hidden_layers=1, pred_num_mask_tokens=2,
                       num_pooler_layers=1, pred_zero_init_mask_tokens=False)
    return (model_cls or VJEPA2Model)(cfg).eval()


_CONTEXT = [torch.tensor([[0, 2, 5, 7, 9, 16, 20, 31], [1, 3, 4, 8, 12, 17, 22, 30]])]
_TARGET = [torch.tensor([[1, 6, 18, 25], [0, 10, 19, 28]])]


def _vjepa2_outputs(model, video):
    full = model(pixel_values_videos=video)
    masked = model(pixel_values_videos=video, context_mask=_CONTEXT, target_mask=_TARGET)
    return full.last_hidden_state, full.predictor_output.last_hidden_state, masked.predictor_output.last_hidden_state


def test_vjepa2_stock_map_reproduces_encoder_and_predictor_bit_for_bit():
    """Encoder and predictor, all tokens and per-sample context/target masks (each sample its own positions)."""
    torch.manual_seed(0)
    model, video = _vjepa2(), torch.randn(2, 4, 3, 16, 16)
    stock = _vjepa2_outputs(model, video)
    patch_vision_model(model, "axial")
    assert ropekit.hf.vision.is_vision_patched(model)
    for got, want in zip(_vjepa2_outputs(model, video), stock):
        assert torch.equal(got, want)
    patch_vision_model(model, "axial", frequencies="axial")  # a true rotation: other outputs
    assert not torch.allclose(_vjepa2_outputs(model, video)[0], stock[0], atol=1e-4)
    unpatch_vision_model(model)
    assert torch.equal(_vjepa2_outputs(model, video)[1], stock[1])


def test_vjepa2_stock_map_is_not_a_rotation():
    """The fact docs/hf.md states: the stock tables are tiled, so the two channels of a pair turn at different
    frequencies and the map changes lengths (a rotation would keep them)."""
    from transformers.models.vjepa2.modeling_vjepa2 import rotate_queries_or_keys
    x = torch.randn(1, 1, 5, 8, dtype=torch.float64)
    y = rotate_queries_or_keys(x, torch.arange(5))
    assert not torch.allclose(y.norm(dim=-1)[..., 1:], x.norm(dim=-1)[..., 1:], rtol=1e-6)
    # ropekit's axial 3-D rotation of the same head keeps every length
    from ropekit.rotations.planar import frequency_matrix, angles
    from ropekit.apply.planar import cos_sin
    from ropekit.apply.fused import apply_rotary_fused
    coords = ropekit.positions("V1x1x5", "mrope").double()
    rotated = apply_rotary_fused(x, *cos_sin(angles(coords, frequency_matrix("axial", 6, 3).double())))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)


def test_vjepa2_patches_sit_on_the_video_grid(monkeypatch):
    """Encoder tokens at ropekit.positions of the (frames/tubelet) x g x g video block; predictor tokens at the
    positions of the context and target patches they stand for, per sample."""
    torch.manual_seed(0)
    model = patch_vision_model(_vjepa2(), "directional")
    seen = _record(monkeypatch)
    with torch.no_grad():
        model(pixel_values_videos=torch.randn(2, 4, 3, 16, 16), context_mask=_CONTEXT, target_mask=_TARGET)
    grid = ropekit.positions("V2x4x4", "mrope")
    encoder, predictor = seen[:4], seen[4:]  # 2 layers x (k, q), then 1 layer x (k, q)
    assert len(seen) == 6 and all(torch.equal(c, grid) for c in encoder)
    ids = torch.cat((_CONTEXT[0], _TARGET[0]), dim=1).sort(dim=1).values  # the predictor sorts its tokens
    assert all(torch.equal(c, grid[ids]) for c in predictor)


def test_vjepa2_families_train_in_encoder_and_predictor():
    torch.manual_seed(0)
    video = torch.randn(2, 4, 3, 16, 16)
    _trains(_vjepa2(), lambda m: m(pixel_values_videos=video, context_mask=_CONTEXT,
                                   target_mask=_TARGET).predictor_output.last_hidden_state, 3, "vjepa2", FAMILIES)


def test_vjepa2_other_input_sizes_are_refused_with_the_stock_fact():
    """The stock splits token indices by the config's grid: a wider video's patch (row 0, column 4) would sit
    at (row 1, column 0). The patch refuses such inputs rather than place them wrongly."""
    torch.manual_seed(0)
    model = _vjepa2()
    attention = model.encoder.layer[0].attention
    frame, row, col = attention.get_position_ids(torch.zeros(1, 2 * 4 * 6, 48))
    assert (frame[4].item(), row[4].item(), col[4].item()) == (0, 1, 0)
    patch_vision_model(model, "geope")
    with pytest.raises(ValueError, match="pixel_values_videos.*16 x 24"):
        model(pixel_values_videos=torch.randn(1, 4, 3, 16, 24))
    with torch.no_grad():  # more frames are placed: their frame index grows
        assert torch.isfinite(model(pixel_values_videos=torch.randn(1, 8, 3, 16, 16)).last_hidden_state).all()


def test_vjepa2_classifier_and_a_lone_encoder():
    """A classifier's V-JEPA 2 model is patched whole; patching the encoder alone leaves the predictor stock."""
    from transformers import VJEPA2ForVideoClassification
    torch.manual_seed(0)
    classifier, video = _vjepa2(VJEPA2ForVideoClassification), torch.randn(1, 4, 3, 16, 16)
    stock = classifier(pixel_values_videos=video).logits
    patch_vision_model(classifier, "axial")
    assert torch.equal(classifier(pixel_values_videos=video).logits, stock)
    model = _vjepa2()
    patch_vision_model(model.encoder, "liere")
    assert ropekit.hf.vision.is_vision_patched(model.encoder)
    assert not ropekit.hf.vision.is_vision_patched(model.predictor)
    assert len([n for n, _ in model.named_parameters() if "ropekit_rotary" in n]) == 2
    patch_vision_model(model, "liere", shared=True)  # one per head size: the encoder's (24) and the predictor's (16)
    sizes = {p.shape for n, p in model.named_parameters() if "ropekit_rotary" in n}
    assert len({id(p) for n, p in model.named_parameters() if "ropekit_rotary" in n}) == len(sizes) == 2


# ---------------------------------------------------------------------------------------------------
# Gemma 4: per-sample (x, y) patch positions with padding, q/k normalised before they turn


def _gemma4():
    from transformers import Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionModel
    cfg = Gemma4VisionConfig(hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=2, head_dim=16, pooling_kernel_size=2, patch_size=2,
                             position_embedding_size=16)
    return Gemma4VisionModel(cfg).eval()


def _xy(h, w, length):
    """Gemma 4's (x, y) positions of an h x w image, padded with (-1, -1) to ``length`` patches."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    xy = torch.stack((cols.flatten(), rows.flatten()), dim=-1)
    return torch.cat((xy, torch.full((length - h * w, 2), -1)))


def _gemma4_inputs(*grids, length=24):
    return dict(pixel_values=torch.rand(len(grids), length, 12),
                pixel_position_ids=torch.stack([_xy(h, w, length) for h, w in grids]))


def test_gemma4_stock_map_reproduces_the_encoder_bit_for_bit():
    """Images of different sizes in one batch (each sample its own grid, the smaller one padded)."""
    torch.manual_seed(0)
    model = _gemma4()
    mixed, same, bigger = _gemma4_inputs((4, 6), (4, 4)), _gemma4_inputs((4, 6), (6, 4)), _gemma4_inputs((6, 8), length=48)
    stock = [_out(model, x) for x in (mixed, same, bigger)]
    patch_vision_model(model, "axial")
    for x, want in zip((mixed, same, bigger), stock):
        assert torch.equal(_out(model, x), want)
        with torch.no_grad():
            assert torch.equal(_out(model, x), want)
    patch_vision_model(model, "axial", frequencies="axial", base=model.config.rope_parameters["rope_theta"])
    assert not torch.allclose(_out(model, mixed), stock[0], atol=1e-4)  # the stock layout is its own


def test_gemma4_patches_sit_on_the_image_grid(monkeypatch):
    """(row, column) of each image, as ropekit.positions places an image block; padding stays at (-1, -1)."""
    torch.manual_seed(0)
    model = patch_vision_model(_gemma4(), "grape")
    seen = _record(monkeypatch)
    with torch.no_grad():
        _out(model, _gemma4_inputs((4, 6), (4, 4)))
    assert len(seen) == 2
    for coords in seen:
        assert torch.equal(coords[0], ropekit.positions("I4x6", "rope2d"))
        assert torch.equal(coords[1, :16], ropekit.positions("I4x4", "rope2d"))
        assert (coords[1, 16:] == -1).all()


def test_gemma4_families_train_and_rotate_in_place_alike():
    torch.manual_seed(0)
    model, x = _gemma4(), _gemma4_inputs((4, 6), (4, 4))
    _trains(model, lambda m: _out(m, x), 2, "gemma4")
    patch_vision_model(model, "directional")
    functional = _out(model, x).detach()
    with torch.no_grad():
        assert torch.equal(_out(model, x), functional)
    table = model.patch_embedder.position_embedding_table  # the learned x/y table stays the model's
    assert table.requires_grad and "ropekit" not in repr(type(table))


def test_refusals_name_the_argument():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=re.escape("num_axes") + ".*3"):
        patch_vision_model(_vjepa2(), "liere", num_axes=2)
    with pytest.raises(ValueError, match="linear-geope"):
        patch_vision_model(_gemma4(), "linear-geope")


# ---------------------------------------------------------------------------------------------------
# VideoLLaMA 3 (unbatched images of several sizes) and EXAONE 4.5 (Qwen2.5-VL windows, grouped-query qkv)


def _video_llama_3():
    from transformers import VideoLlama3VisionConfig
    from transformers.models.video_llama_3.modeling_video_llama_3 import VideoLlama3VisionModel
    cfg = VideoLlama3VisionConfig(hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                                  patch_size=2)
    return VideoLlama3VisionModel(cfg).eval()


def _video_llama_3_inputs(*grids):
    return dict(pixel_values=torch.randn(sum(h * w for h, w in grids), 12),
                grid_thw=torch.tensor([[1, h, w] for h, w in grids]), merge_sizes=torch.tensor([2] * len(grids)))


def _exaone4_5():
    from transformers.models.exaone4_5.configuration_exaone4_5 import Exaone4_5_VisionConfig
    from transformers.models.exaone4_5.modeling_exaone4_5 import Exaone4_5_VisionModel
    cfg = Exaone4_5_VisionConfig(depth=2, hidden_size=32, num_heads=2, num_key_value_heads=1, intermediate_size=40,
                                 out_hidden_size=32, patch_size=2, spatial_merge_size=2, temporal_patch_size=2,
                                 window_size=8, fullatt_block_indexes=[1])
    return Exaone4_5_VisionModel._from_config(cfg).eval()


def _exaone_inputs(*grids):
    return dict(hidden_states=torch.randn(sum(h * w for h, w in grids), 24),
                grid_thw=torch.tensor([[1, h, w] for h, w in grids]))


QWEN_LIKE = {"video_llama_3": (_video_llama_3, _video_llama_3_inputs), "exaone4_5": (_exaone4_5, _exaone_inputs)}


@pytest.mark.parametrize("name", sorted(QWEN_LIKE))
def test_qwen_like_towers_reproduce_stock_and_place_every_image_grid(name, monkeypatch):
    """Stock map bit for bit on two images of different sizes (and a larger one); every patch of each image at
    its (row, column) as ropekit.positions places an image (the towers order them in merge windows)."""
    torch.manual_seed(0)
    build, inputs = QWEN_LIKE[name]
    model, x, bigger = build(), inputs((4, 6), (4, 4)), inputs((8, 12))
    stock = [_out(model, i) for i in (x, bigger)]
    patch_vision_model(model, "axial")
    for i, want in zip((x, bigger), stock):
        assert torch.equal(_out(model, i), want), name
        with torch.no_grad():
            assert torch.equal(_out(model, i), want), name
    patch_vision_model(model, "directional")
    seen = _record(monkeypatch)
    with torch.no_grad():
        _out(model, x)
    first, second = seen[0][:24], seen[0][24:]
    for got, grid in ((first, "I4x6"), (second, "I4x4")):
        want = ropekit.positions(grid, "rope2d")
        assert torch.equal(got[torch.argsort(got[:, 0] * 100 + got[:, 1])], want), (name, grid)


@pytest.mark.parametrize("name", sorted(QWEN_LIKE))
def test_qwen_like_towers_train_the_families(name):
    torch.manual_seed(0)
    build, inputs = QWEN_LIKE[name]
    model, x = build(), inputs((4, 6), (4, 4))
    if name == "exaone4_5":  # per-head frequencies cannot pair a query head with its grouped key head
        with pytest.raises(ValueError, match="family='mixed'.*fewer heads"):
            patch_vision_model(model, "mixed")
        assert not ropekit.hf.vision.is_vision_patched(model)
        families = [f for f in FAMILIES_2D if f[0] != "mixed"]
    else:
        families = FAMILIES_2D
    for family, options in families:
        patch_vision_model(model, family, **options)
        model.train()
        model.zero_grad()
        _out(model, x).square().mean().backward()
        own = [p.grad for n, p in model.named_parameters() if "ropekit_rotary" in n]
        assert all(g is not None and g.abs().sum() > 0 for g in own), (name, family)
        assert bool(own) == (family in ("mixed", "comrope", "grape")), (name, family)


# ---------------------------------------------------------------------------------------------------
# Llama 4: a complex rotary table, the class token last and unrotated


def _llama4():
    from transformers import Llama4VisionConfig
    from transformers.models.llama4.modeling_llama4 import Llama4VisionModel
    cfg = Llama4VisionConfig(hidden_size=32, num_attention_heads=2, intermediate_size=128, num_hidden_layers=2,
                             image_size=16, patch_size=4, vision_output_dim=32, projector_input_dim=32,
                             projector_output_dim=32, pixel_shuffle_ratio=0.5)
    return Llama4VisionModel(cfg).eval()


def test_llama4_stock_map_reproduces_the_encoder_and_places_the_grid_after_the_class_token(monkeypatch):
    """Bit for bit (autograd and in-place inference); the patches at ropekit.positions of "T1 I4x4" under rope2d,
    the class token being the unrotated origin (it stands last in the sequence and keeps its values)."""
    torch.manual_seed(0)
    model, x = _llama4(), dict(pixel_values=torch.randn(2, 3, 16, 16))
    stock = _out(model, x)
    patch_vision_model(model, "axial")
    assert torch.equal(_out(model, x), stock)
    with torch.no_grad():
        assert torch.equal(_out(model, x), stock)
    patch_vision_model(model, "axial", frequencies="axial")  # the stock pairs adjacent channels: other outputs
    assert not torch.allclose(_out(model, x), stock, rtol=1e-5, atol=0)
    seen = _record(monkeypatch)
    with torch.no_grad():
        _out(model, x)
    assert len(seen) == 2 and all(torch.equal(c, ropekit.positions("T1 I4x4", "rope2d")[1:]) for c in seen)


def test_llama4_families_train():
    torch.manual_seed(0)
    x = dict(pixel_values=torch.randn(2, 3, 16, 16))
    _trains(_llama4(), lambda m: _out(m, x), 2, "llama4")


# ---------------------------------------------------------------------------------------------------
# SAM 3: a rotary per layer, windowed and global layers with positions of their own


def _sam3():
    from transformers.models.sam3.configuration_sam3 import Sam3ViTConfig
    from transformers.models.sam3.modeling_sam3 import Sam3ViTModel
    cfg = Sam3ViTConfig(hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
                        image_size=32, patch_size=4, window_size=4, global_attn_indexes=[1], pretrain_image_size=16)
    return Sam3ViTModel(cfg).eval()


def test_sam3_stock_map_reproduces_the_backbone_and_places_windows_and_the_global_grid(monkeypatch):
    """Bit for bit; the windowed layer sees each 4 x 4 window at ropekit.positions("I4x4", "rope2d"), the global
    layer the 8 x 8 image's positions scaled by window / grid = 1/2, as the stock places them."""
    torch.manual_seed(0)
    model, x = _sam3(), dict(pixel_values=torch.randn(2, 3, 32, 32))
    stock = _out(model, x)
    patch_vision_model(model, "axial")
    assert torch.equal(_out(model, x), stock)
    with torch.no_grad():
        assert torch.equal(_out(model, x), stock)
    patch_vision_model(model, "axial", frequencies="axial")
    assert not torch.allclose(_out(model, x), stock, rtol=1e-5, atol=0)
    seen = _record(monkeypatch)
    with torch.no_grad():
        _out(model, x)
    assert [c.shape[0] for c in seen] == [16, 64]
    assert torch.equal(seen[0], ropekit.positions("I4x4", "rope2d"))
    assert torch.equal(seen[1], ropekit.positions("I8x8", "rope2d") * 0.5)


def test_sam3_families_train_one_module_per_layer():
    torch.manual_seed(0)
    x = dict(pixel_values=torch.randn(1, 3, 32, 32))
    _trains(_sam3(), lambda m: _out(m, x), 2, "sam3")
