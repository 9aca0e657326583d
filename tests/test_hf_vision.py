"""patch_vision_model: ropekit rotary families inside transformers' vision encoders with 2-D RoPE.

The reference is transformers itself: the stock encoders (DINOv3 ViT, Pixtral, Qwen2-VL and Qwen2.5-VL
vision towers, tiny random configs) give the outputs the "axial, stock frequencies" patch must reproduce.
"""
import copy
import re
from pathlib import Path

import pytest
import torch
from transformers import (
    DINOv3ViTConfig, DINOv3ViTModel, PixtralVisionConfig, PixtralVisionModel, Qwen2_5_VLConfig, Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

import ropekit
from ropekit.rotations.directional import METHODS
from ropekit.hf import VISION_FAMILIES, patch_vision_model, unpatch_vision_model

from hf_compat import checkpointing_on

ROOT = Path(__file__).resolve().parents[1]
_QWEN_VISION = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=1, spatial_merge_size=2,
                    patch_size=2, temporal_patch_size=2, intermediate_size=40, window_size=8,
                    fullatt_block_indexes=[1], out_hidden_size=32)


def _dinov3(**extra):
    cfg = DINOv3ViTConfig(hidden_size=32, num_attention_heads=2, intermediate_size=40, num_hidden_layers=2,
                          patch_size=4, image_size=16, num_register_tokens=2, **extra)
    return DINOv3ViTModel(cfg).eval()


def _pixtral():
    cfg = PixtralVisionConfig(hidden_size=32, num_attention_heads=2, intermediate_size=40, num_hidden_layers=2,
                              patch_size=4, image_size=64, head_dim=16)
    return PixtralVisionModel(cfg).eval()


def _qwen(config_cls, model_cls):
    return model_cls._from_config(config_cls(vision_config=_QWEN_VISION).vision_config).eval()


def _qwen_inputs(h, w):
    return dict(hidden_states=torch.randn(h * w, 3 * 2 * 2 * 2), grid_thw=torch.tensor([[1, h, w]]))


# each encoder: (builder, inputs seen in training, larger inputs never seen: more patches)
ENCODERS = {
    "dinov3": (_dinov3, lambda: dict(pixel_values=torch.randn(2, 3, 16, 16)),
               lambda: dict(pixel_values=torch.randn(1, 3, 24, 32))),
    "pixtral": (_pixtral, lambda: dict(pixel_values=torch.randn(1, 3, 16, 24), image_sizes=torch.tensor([[16, 24]])),
                lambda: dict(pixel_values=torch.randn(1, 3, 32, 40), image_sizes=torch.tensor([[32, 40]]))),
    "qwen2_vl": (lambda: _qwen(Qwen2VLConfig, Qwen2VisionTransformerPretrainedModel),
                 lambda: _qwen_inputs(4, 8), lambda: _qwen_inputs(8, 12)),
    "qwen2_5_vl": (lambda: _qwen(Qwen2_5_VLConfig, Qwen2_5_VisionTransformerPretrainedModel),
                   lambda: _qwen_inputs(4, 8), lambda: _qwen_inputs(8, 12)),
}
OTHER_FAMILIES = [("axial", dict(frequencies="axial", base=50.0)), ("directional", {}), ("mixed", {}),
                  ("geope", {}), ("liere", {}), ("comrope", {}), ("grape", {})]


def _out(model, inputs):
    return model(**inputs).last_hidden_state


@pytest.fixture(params=sorted(ENCODERS))
def encoder(request):
    torch.manual_seed(0)
    build, seen, unseen = ENCODERS[request.param]
    return request.param, build(), seen(), unseen()


def test_axial_with_stock_frequencies_reproduces_the_stock_encoder(encoder):
    name, model, inputs, unseen = encoder
    stock = _out(model, inputs)
    stock_big = _out(model, unseen)
    patch_vision_model(model, "axial")
    assert torch.equal(_out(model, inputs), stock), name
    assert torch.equal(_out(model, unseen), stock_big), name


def test_several_images_in_one_call_reproduce_the_stock_encoder():
    """Pixtral concatenates the patches of images of different sizes; Qwen the grids of several images."""
    torch.manual_seed(0)
    pixtral = _pixtral()
    images = dict(pixel_values=torch.randn(2, 3, 24, 32), image_sizes=torch.tensor([[24, 32], [16, 8]]))
    qwen = _qwen(Qwen2_5_VLConfig, Qwen2_5_VisionTransformerPretrainedModel)
    grids = dict(hidden_states=torch.randn(32 + 48, 24), grid_thw=torch.tensor([[1, 4, 8], [1, 8, 6]]))
    for model, inputs in ((pixtral, images), (qwen, grids)):
        stock = _out(model, inputs)
        patch_vision_model(model, "axial")
        assert ropekit.hf.vision.is_vision_patched(model)
        assert torch.equal(_out(model, inputs), stock)
        unpatch_vision_model(model)
        assert not ropekit.hf.vision.is_vision_patched(model)


@pytest.mark.parametrize("family,options", [("axial", {})] + [f for f in OTHER_FAMILIES if f[0] in
                                                               ("axial", "directional", "mixed", "grape")],
                         ids=lambda v: str(v))
def test_inference_rotates_in_place_with_the_same_results(encoder, family, options):
    """Without autograd the patch rotates the projections' outputs where they lie (no new tensors); the
    results are those of the functional rotation autograd gets, bit for bit, and stock's for stock axial."""
    name, model, inputs, unseen = encoder
    with torch.no_grad():
        stock = _out(model, inputs)
    patch_vision_model(model, family, **options)
    for x in (inputs, unseen):
        functional = _out(model, x).detach()
        with torch.no_grad():
            in_place = _out(model, x)
        with torch.inference_mode():
            inference = _out(model, x)
        assert torch.equal(in_place, functional) and torch.equal(inference, functional), (name, family)
    if (family, options) == ("axial", {}):
        with torch.no_grad():
            assert torch.equal(_out(model, inputs), stock), name


def test_the_patch_is_live_other_frequencies_change_the_outputs(encoder):
    name, model, inputs, _ = encoder
    stock = _out(model, inputs)
    patch_vision_model(model, "axial", frequencies="axial", base=3.0)
    assert not torch.allclose(_out(model, inputs), stock, atol=1e-4), name


def test_ropekit_axial_allocation_is_the_stock_layout_of_dinov3_and_qwen_not_pixtral(encoder):
    """DINOv3 and Qwen give rows and columns the same θ^(-4j/D); Pixtral gives columns θ^(-(4j+2)/D)."""
    name, model, inputs, _ = encoder
    stock = _out(model, inputs)
    patch_vision_model(model, "axial", frequencies="axial")
    same = torch.allclose(_out(model, inputs), stock, atol=1e-6, rtol=0)
    assert same == (name != "pixtral"), name


def test_dinov3_training_augmentations_place_the_same_coordinates_as_stock():
    torch.manual_seed(0)
    model = _dinov3(pos_embed_shift=0.2, pos_embed_jitter=1.5, pos_embed_rescale=2.0).train()
    x = torch.randn(2, 3, 16, 16)
    torch.manual_seed(7)
    stock = _out(model, dict(pixel_values=x))
    patch_vision_model(model, "axial")
    torch.manual_seed(7)
    assert torch.equal(_out(model, dict(pixel_values=x)), stock)
    torch.manual_seed(8)  # another draw of the augmentation gives other outputs: the coordinates are live
    assert not torch.equal(_out(model, dict(pixel_values=x)), stock)


@pytest.mark.parametrize("family,options", OTHER_FAMILIES, ids=lambda v: str(v))
def test_every_family_trains_and_runs_at_an_unseen_resolution(encoder, family, options):
    name, model, inputs, unseen = encoder
    patch_vision_model(model, family, **options)
    model.train()
    loss = _out(model, inputs).square().mean()
    loss.backward()
    assert torch.isfinite(loss)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}  # (DINOv3's mask token: none)
    assert all(torch.isfinite(g).all() for g in grads.values()), name
    own = {n: g for n, g in grads.items() if "ropekit_rotary" in n}
    assert len(own) == len([n for n, _ in model.named_parameters() if "ropekit_rotary" in n])
    learned = family in ("mixed", "liere", "comrope", "grape")
    assert bool(own) == learned, sorted(own)
    assert all(g.abs().sum() > 0 for g in own.values()), [n for n, g in own.items() if not g.abs().sum() > 0]
    model.eval()
    with torch.no_grad():
        big, small = _out(model, unseen), _out(model, inputs)
    assert big.shape[-2] > small.shape[-2] and torch.isfinite(big).all()


@pytest.mark.parametrize("family,options", [("directional", dict(method=m)) for m in METHODS]
                         + [("comrope", dict(variant="ap")), ("grape", dict(mode="interleaved", learned=False))],
                         ids=str)
def test_family_variants_train_in_dinov3(family, options):
    torch.manual_seed(0)
    model, x = patch_vision_model(_dinov3(), family, **options).train(), dict(pixel_values=torch.randn(2, 3, 16, 16))
    out = _out(model, x)
    out.square().mean().backward()
    assert torch.isfinite(out).all() and model.model.layer[0].attention.q_proj.weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert torch.isfinite(_out(model.eval(), dict(pixel_values=torch.randn(1, 3, 24, 32)))).all()


def test_learned_parameters_reach_an_optimizer_and_move_one_per_layer():
    torch.manual_seed(0)
    model = patch_vision_model(_dinov3(), "liere")
    names = [n for n, _ in model.named_parameters() if "ropekit_rotary" in n]
    assert len(names) == model.config.num_hidden_layers  # one generator set per layer
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "ropekit_rotary" in n}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _out(model, dict(pixel_values=torch.randn(2, 3, 16, 16))).square().mean().backward()
    opt.step()
    after = dict(model.named_parameters())
    assert all(not torch.equal(before[n], after[n]) for n in before)
    shared = patch_vision_model(_dinov3(), "liere", shared=True)
    assert len([p for n, p in shared.named_parameters() if "ropekit_rotary" in n]) == 1


def test_unpatch_restores_stock_outputs_and_removes_the_parameters(encoder):
    name, model, inputs, _ = encoder
    stock = _out(model, inputs)
    patch_vision_model(model, "mixed")
    assert not torch.allclose(_out(model, inputs), stock, atol=1e-4)
    unpatch_vision_model(model)
    assert torch.equal(_out(model, inputs), stock), name
    assert not any("ropekit" in n for n, _ in model.named_parameters())
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_second_instance_is_unaffected(encoder):
    name, model, inputs, _ = encoder
    build = ENCODERS[name][0]
    other = build()
    other.load_state_dict(model.state_dict())
    stock = _out(other, inputs)
    patch_vision_model(model, "geope")
    assert torch.equal(_out(other, inputs), stock), name
    assert not torch.allclose(_out(model, inputs), stock, atol=1e-4)


def test_repatching_replaces_the_previous_patch_and_a_copy_keeps_it():
    torch.manual_seed(0)
    model, x = _dinov3(), dict(pixel_values=torch.randn(2, 3, 16, 16))
    stock = _out(model, x)
    patch_vision_model(model, "comrope")
    patch_vision_model(model, "axial")
    assert torch.equal(_out(model, x), stock)
    patch_vision_model(model, "liere", init_scale=1.0)
    twin = copy.deepcopy(model)
    assert torch.equal(_out(twin, x), _out(model, x))
    unpatch_vision_model(twin)  # the copy's hooks are its own
    assert torch.equal(_out(twin, x), stock) and not torch.equal(_out(model, x), stock)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    x = dict(pixel_values=torch.randn(2, 3, 16, 16))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = patch_vision_model(_dinov3(), "liere", init_scale=1.0)
        if checkpointing:
            checkpointing_on(model)
        model.train()
        _out(model, x).square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if "ropekit_rotary" in n})
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n])


def test_the_vision_tower_of_a_qwen2_vl_model_is_patched_and_its_language_model_left_alone():
    torch.manual_seed(0)
    config = Qwen2VLConfig(
        text_config=dict(hidden_size=32, intermediate_size=40, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=80,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=1, spatial_merge_size=2,
                           patch_size=2, temporal_patch_size=2), image_token_id=70)
    model = Qwen2VLForConditionalGeneration(config).eval()
    ids = torch.tensor([[5, 6, 70, 70, 70, 70, 7]])
    batch = dict(input_ids=ids, mm_token_type_ids=(ids == 70).long(), image_grid_thw=torch.tensor([[1, 4, 4]]),
                 pixel_values=torch.randn(16, 24))
    text = dict(input_ids=torch.tensor([[5, 6, 7]]))
    stock, stock_text = model(**batch).logits, model(**text).logits
    patch_vision_model(model, "axial")
    assert torch.equal(model(**batch).logits, stock)
    patch_vision_model(model, "geope")
    assert not torch.allclose(model(**batch).logits, stock, atol=1e-5)
    assert torch.equal(model(**text).logits, stock_text)
    assert not any("ropekit" in n for n, _ in model.model.language_model.named_parameters())


@pytest.mark.parametrize("call,argument", [
    (lambda m: patch_vision_model(m, "nope"), "family"),
    (lambda m: patch_vision_model(m, 3), "family"),
    (lambda m: patch_vision_model(m, "linear-geope"), "linear-geope"),
    (lambda m: patch_vision_model(m, "axial", frequencies="bad"), "frequencies"),
    (lambda m: patch_vision_model(m, "axial", methd="sobol"), "methd"),
    (lambda m: patch_vision_model(m, "directional", method="nope"), "method"),
    (lambda m: patch_vision_model(m, "geope", lam=-1.0), "lam"),
    (lambda m: patch_vision_model(m, "liere", num_axes=3), "num_axes"),
    (lambda m: patch_vision_model(m, "comrope", variant="zz"), "variant"),
    (lambda m: patch_vision_model(m, "liere", bogus=1), "bogus"),
    (lambda m: patch_vision_model(m, "geope", shared=True), "shared"),
    (lambda m: patch_vision_model(m, "geope", base=10.0), "base"),
    (lambda m: patch_vision_model(m, "axial", base=10.0), "base"),
    (lambda m: patch_vision_model(m, "mixed", theta=-1.0), "theta"),
    (lambda m: patch_vision_model(torch.nn.Linear(2, 2), "axial"), "model"),
])
def test_bad_arguments_raise_naming_the_argument_and_leave_the_model_stock(call, argument):
    torch.manual_seed(0)
    model, x = _dinov3(), dict(pixel_values=torch.randn(1, 3, 16, 16))
    stock = _out(model, x)
    with pytest.raises((ValueError, TypeError), match=re.escape(argument)):
        call(model)
    assert torch.equal(_out(model, x), stock)


def test_families_listed_and_exported():
    assert set(VISION_FAMILIES) == {"axial", "directional", "mixed", "geope", "liere", "comrope", "grape"}
    assert ropekit.patch_vision_model is patch_vision_model and ropekit.unpatch_vision_model is unpatch_vision_model


def test_docs_vision_example_runs():
    text = (ROOT / "docs" / "hf.md").read_text().split("## Vision encoders", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/hf.md", "exec"), namespace)


def test_geope_thirds_layout_is_the_interleaved_layout_on_permuted_projection_rows():
    """channels="thirds" is the same model as the default layout once each head's q/k projection rows are
    reordered so that triple i moves from channels (3i, 3i+1, 3i+2) to (i, n+i, 2n+i)."""
    torch.manual_seed(0)
    model, x = _dinov3(), dict(pixel_values=torch.randn(2, 3, 16, 16))
    twin = copy.deepcopy(model)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    n = head_dim // 3
    perm = torch.cat((torch.arange(3 * n).view(n, 3).t().reshape(-1), torch.arange(3 * n, head_dim)))
    rows = torch.cat([h * head_dim + perm for h in range(model.config.num_attention_heads)])
    with torch.no_grad():
        for layer in twin.model.layer:
            for proj in (layer.attention.q_proj, layer.attention.k_proj):
                proj.weight.copy_(proj.weight[rows])
                if proj.bias is not None:
                    proj.bias.copy_(proj.bias[rows])
    patch_vision_model(model, "geope")
    patch_vision_model(twin, "geope", channels="thirds")
    torch.testing.assert_close(_out(twin, x), _out(model, x), atol=1e-5, rtol=1e-5)
    patch_vision_model(twin, "geope")  # and the layouts do differ on the same weights
    assert not torch.allclose(_out(twin, x), _out(model, x), atol=1e-3)
