"""ropekit designs inside Step 3.7 (a tiny random model built from its config): a global view and local tiles, each
its own grid, in a 1-D language model whose layer types rotate different parts of the head.

The matrix is tests/test_hf_families_1d.py's, collected here on this module's ``fam`` fixture with the family added
to its table. References: the stock transformers model with the same weights (``vanilla`` gives its logits and
``generate`` output bit for bit, through both layer types' partial tables), each design's ``ropekit.positions`` on
the layout the model sees, the model's own vision tower (how many tokens, in which grid, each view gives), one
teacher-forced forward (cached generation), gradient checkpointing, per-sample runs (packing), save and reload.
"""
import pytest
import torch
import transformers as T

import test_hf_families_1d as base
from hf_compat import ready_to_generate, restore
from ropekit import Image, Text
from ropekit.hf import is_patched, last_positions, patch_model, position_ids, supported_models
from test_hf_families_1d import IMG, PAD, DESIGNS, Family, _logits, _seeded, expected, make_batch
from test_hf_families_1d import _unpatched_after, family_fixture  # noqa: F401  (autouse: unpatch after each test)
from test_hf_families_1d import (  # noqa: F401  (the shared matrix, collected on this module's family)
    test_cached_generation_equals_a_teacher_forced_forward, test_checkpointed_training_step,
    test_packed_rows_equal_per_sample_runs, test_save_pretrained_and_reload_restore_the_patch,
    test_vanilla_is_the_stock_model)

if not hasattr(T, "Step3p7ForConditionalGeneration"):
    pytest.skip(f"transformers {T.__version__} has no Step 3.7", allow_module_level=True)

GLOBAL, TILE = (16, 24), (16, 8)  # pixels: 8 x 12 patches -> a 2 x 3 token grid; 8 x 4 patches -> 2 x 1


def _step3p7():
    # sliding layers rotate all 16 channels of a head with base 1e4 (4 heads), full ones 8 with base 1e6 (2 heads)
    text = dict(base.TEXT, head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                num_sliding_attention_heads=4, rope_theta=[1e4, 1e6], partial_rotary_factors=[1.0, 0.5],
                mlp_layer_types=["dense", "dense"], moe_intermediate_size=16, share_expert_dim=16, n_routed_experts=2,
                num_experts_per_tok=1, pad_token_id=PAD, eos_token_id=1)
    vision = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=2)
    return T.Step3p7ForConditionalGeneration(T.Step3p7Config(text_config=text, vision_config=vision,
                                                             image_token_id=IMG))


def _step3p7_image(spec):  # per tile <patch_start> tokens <patch_end> (+ <patch_newline>); <im_start> view <im_end>
    tiles, per_row = spec
    ids, lay = [], []
    for i in range(tiles):
        ids, lay = ids + [61] + [IMG] * 2 + [62], lay + [Text(1), Image(2, 1), Text(1)]
        if per_row and i % per_row == per_row - 1 and i < tiles - 1:
            ids, lay = ids + [65], lay + [Text(1)]
    return ids + [63] + [IMG] * 6 + [64], lay + [Text(1), Image(2, 3), Text(1)], tiles


def _step3p7_pixels(images, per_sample, g):
    out = {"pixel_values": torch.randn(len(images), 3, *GLOBAL, generator=g), "num_local_patches": list(images)}
    if sum(images):
        out["pixel_values_local"] = torch.randn(sum(images), 3, *TILE, generator=g)
    return out


FAMILY = {"step3p7": Family(_step3p7, _step3p7_image,
                            [[("T", 2), ("I", (4, 2)), ("T", 2)], [("T", 3), ("I", (0, 0)), ("T", 1),
                                                                   ("I", (1, 1)), ("T", 1)]],
                            pixels=_step3p7_pixels)}
base.FAMILIES.update(FAMILY)  # the shared tests read the families from that table


fam = family_fixture(FAMILY)


def test_supported_models_lists_the_family():
    assert "step3p7" in supported_models()


def test_every_design_places_its_positions(fam):
    """Every design runs, and every layer rotates with ``ropekit.positions`` of the layout read off the pixels: in a
    forward given the pixels, and (as ``generate`` runs) given the encoded images with ``ropekit.hf.position_ids`` of
    the pixel inputs. Those encoded images carry only token counts: a forward given them alone is refused, naming the
    fix."""
    name, model = fam
    inputs, layouts = make_batch(name)
    keep = inputs["attention_mask"].bool()
    layers = len(model.model.language_model.layers)
    pixels = {k: inputs[k] for k in ("pixel_values", "pixel_values_local", "num_local_patches")}
    with torch.no_grad():  # as generate encodes them before the first forward
        features = model.model.get_image_features(**pixels, return_dict=True)
    encoded = dict({k: v for k, v in inputs.items() if k not in pixels}, mm_encoder_outputs={"image": features})
    for i, design in enumerate(DESIGNS):
        patch_model(model, design)
        given = inputs if i == 0 else dict(encoded, position_ids=position_ids(model, **inputs))
        out = _logits(model, given)
        assert torch.isfinite(out[keep]).all(), design
        want = expected(name, inputs, layouts, design)
        got = last_positions(model)
        assert sorted(got) == list(range(layers))
        for p in got.values():
            assert torch.equal(p[:, keep], want[:, keep]), design
        if i == 0:
            with pytest.raises(ValueError, match=r"mm_encoder_outputs\) without their pixels.*ropekit.hf.position_ids"):
                _logits(model, encoded)
            pixel_run = out
    patch_model(model, DESIGNS[0])
    got = _logits(model, dict(encoded, position_ids=position_ids(model, **inputs)))
    torch.testing.assert_close(got[keep], pixel_run[keep], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size", [(16, 24), (10, 14)])
def test_each_view_gives_the_grid_ropekit_places(size):
    """The model's own tower on a view of ``size`` pixels (patch 2): its downsampled feature map, flattened row by row,
    is the grid the patch places: ``⌈⌈rows/2⌉/2⌉ x ⌈⌈cols/2⌉/2⌉`` (odd sides included)."""
    from ropekit.hf.adapters import ADAPTERS

    model = _seeded(_step3p7)
    tower = model.model.vision_model
    pixels = torch.randn(1, 3, *size)
    with torch.no_grad():
        hidden = tower.embeddings(pixels, interpolate_pos_encoding=True)
        maps = tower.downsampler2(tower.downsampler1(hidden.permute(0, 2, 1).reshape(1, 16, size[0] // 2,
                                                                                      size[1] // 2)))
        flat = tower(pixels).last_hidden_state
    (item,) = ADAPTERS["step3p7"].items(model.model, {"pixel_values": pixels})
    assert item == [(1, maps.shape[2], maps.shape[3])]
    assert flat.shape[1] == maps.shape[2] * maps.shape[3]


def test_per_layer_type_tables_rotate_their_own_channels():
    """The stock rotary gives the sliding layers 16 channels per head and the full ones 8; the patched rotary hands
    each layer type a table of its own width (and vanilla's tables are the stock ones)."""
    model = _seeded(_step3p7)
    text = model.model.language_model
    x, pos = torch.zeros(1, 3, 32), torch.arange(3)[None]
    stock = {t: text.rotary_emb(x, pos, t) for t in ("sliding_attention", "full_attention")}
    assert stock["sliding_attention"][0].shape[-1] == 16 and stock["full_attention"][0].shape[-1] == 8
    patch_model(model, "vanilla")
    for t, (cos, sin) in stock.items():
        got = text.rotary_emb(x, pos[None].expand(4, 1, 3), layer_type=t)
        assert torch.equal(got[0], cos) and torch.equal(got[1], sin), t


def test_inconsistent_tile_counts_are_refused():
    model = ready_to_generate(_seeded(_step3p7), PAD, [IMG])
    inputs, _ = make_batch("step3p7")
    patch_model(model, "circle")
    for counts in ([4, 0], [4, 0, 2]):
        with pytest.raises(ValueError, match="num_local_patches .* does not match"):
            model(**dict(inputs, num_local_patches=counts))
    restore(model)
    assert not is_patched(model)
