"""patch_model refuses arguments that no layer would use, instead of silently ignoring them.

Reference: what the patched model actually rotates with (the frequency matrix of each layer's geometry)
— an argument that changes none of them must be an error naming it, not a no-op the user believes in.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from transformers import Qwen2VLForConditionalGeneration

from ropekit.hf import is_patched, patch_model, unpatch_model

from test_hf import IMG, _qwen2_cfg  # the tiny Qwen2-VL config the HF tests share


@pytest.fixture(scope="module")
def qwen2():
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(_qwen2_cfg(2)).eval()


@pytest.fixture(autouse=True)
def _stock_before(qwen2):
    if is_patched(qwen2):
        unpatch_model(qwen2)


@pytest.mark.parametrize("design,kw", [
    ("vrope", {}),  # VRoPE's own allocation has no sections
    ("vanilla", {}),  # 1-D RoPE
    ("circle", dict(allocation="mrope-interleave")),  # a published layout: patch_model passes it no sections
])
def test_sections_no_layer_uses_are_refused(qwen2, design, kw):
    with pytest.raises(ValueError, match="`sections`"):
        patch_model(qwen2, design, sections=[4, 2, 2], **kw)
    assert not is_patched(qwen2)


def test_sections_used_by_one_geometry_of_an_age_pair_are_accepted(qwen2):
    patch_model(qwen2, ("circle", "vrope"), age="alternate", sections=[4, 2, 2])
    assert is_patched(qwen2)


def test_an_allocation_for_a_design_no_layer_uses_is_refused(qwen2):
    with pytest.raises(ValueError, match="`allocation`.*vrope"):
        patch_model(qwen2, "circle", allocation={"vrope": "axial"})
    assert not is_patched(qwen2)
    patch_model(qwen2, ("circle", "vrope"), age="alternate", allocation={"vrope": "axial"})  # used: fine
    assert is_patched(qwen2)


def _image_inputs():
    ids = torch.tensor([[5, 6] + [IMG] * 4 + [7, 8]])
    return dict(input_ids=ids, mm_token_type_ids=(ids == IMG).long(), attention_mask=torch.ones_like(ids),
                image_grid_thw=torch.tensor([[1, 4, 4]]), pixel_values=torch.randn(16, 24))


def test_generate_through_an_unpatched_wrapper_of_a_patched_bare_model(qwen2):
    """Patching only ``model.model`` leaves ``model.generate`` stock: it asks the patched ``get_rope_index`` for the
    prompt's positions and carries them as data, so it generates what the patched generation model generates; with
    AGE one position tensor in transformers' form cannot stand for the patch, and that is refused."""
    inputs = _image_inputs()
    kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        stock = qwen2.generate(**inputs, **kw).sequences
        patch_model(qwen2, "circle")
        want = qwen2.generate(**inputs, **kw)
        unpatch_model(qwen2)
        patch_model(qwen2.model, "circle")
        got = qwen2.generate(**inputs, **kw)
        assert torch.equal(got.sequences, want.sequences)
        for g, w in zip(got.logits, want.logits):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        patch_model(qwen2.model, "circle", age="alternate")
        with pytest.raises(ValueError, match="get_rope_index cannot describe this patch"):
            qwen2.generate(**inputs, **kw)
        unpatch_model(qwen2.model)
        kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert torch.equal(qwen2.generate(**inputs, **kw), stock)  # the stock method is back


@pytest.mark.parametrize("design,kw", [
    ("mhrope", {}),  # MHRoPE's own allocation: whole KV heads per axis
    ("mrope", dict(allocation="mhrope")),  # any design given the per-head allocation
    (("circle", "mhrope"), dict(age="alternate")),  # one geometry of an AGE pair is enough
])
def test_per_head_allocations_are_refused(qwen2, design, kw):
    """The patched layers share one cos/sin table across heads, so a per-head frequency table cannot apply."""
    with pytest.raises(ValueError, match="per-head allocation 'mhrope'"):
        patch_model(qwen2, design, **kw)
    assert not is_patched(qwen2)


def test_mhrope_positions_with_a_shared_allocation_are_accepted(qwen2):
    patch_model(qwen2, "mhrope", allocation="mrope-interleave")
    assert is_patched(qwen2)
