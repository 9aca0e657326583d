"""A patched model saved with save_pretrained and reloaded is patched again by ``patch_model(model)``.

References: the original patched model's logits (the reloaded model, patched from its record, must give the
same bits), the stock model's logits (``load_stock`` loads the folder as the stock model on purpose), and the
config.json file itself. tests/test_hf_checkpoint_load.py loads saved folders in fresh interpreters.
"""
import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from transformers import AutoModelForImageTextToText

from ropekit.hf import is_patched, layer_designs, load_stock, patch_model, unpatch_model
from ropekit.hf.persist import CONFIG_KEY

IMG, VID = 70, 71
TEXT = dict(
    hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, vocab_size=80,
    num_hidden_layers=4, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
)
VISION = dict(depth=1, num_heads=2, spatial_merge_size=2, patch_size=2, temporal_patch_size=2)


def _build(family):
    if family == "qwen2_vl":
        cfg = Qwen2VLConfig(text_config=TEXT, vision_config=dict(VISION, embed_dim=16, hidden_size=32, mlp_ratio=1),
                            image_token_id=IMG, video_token_id=VID)
        cls = Qwen2VLForConditionalGeneration
    else:
        cfg = Qwen2_5_VLConfig(
            text_config=TEXT, image_token_id=IMG, video_token_id=VID,
            vision_config=dict(VISION, hidden_size=16, out_hidden_size=32, intermediate_size=16, tokens_per_second=2,
                               fullatt_block_indexes=[0], window_size=8),
        )
        cls = Qwen2_5_VLForConditionalGeneration
    torch.manual_seed(0)
    return cls, cls(cfg).eval()


def _inputs():
    """Text, a 4×6 patch image (2×3 tokens after merging), text."""
    g = torch.Generator().manual_seed(1)
    ids = torch.cat([torch.randint(1, 60, (3,), generator=g), torch.full((6,), IMG), torch.randint(1, 60, (4,), generator=g)])
    return dict(input_ids=ids[None], attention_mask=torch.ones(1, ids.numel(), dtype=torch.long),
                mm_token_type_ids=(ids == IMG).long()[None],
                image_grid_thw=torch.tensor([[1, 4, 6]]), pixel_values=torch.randn(24, 3 * 2 * 2 * 2, generator=g))


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_save_reload_restores_the_patch(tmp_path, family):
    cls, model = _build(family)
    model.config.text_config.bos_token_id = model.config.text_config.eos_token_id = None
    inputs = _inputs()
    stock = _logits(model, inputs)
    patch_model(model, "circle", age="alternate", alpha=0.5, options={"mrope": {}})
    patched = _logits(model, inputs)
    assert not torch.allclose(patched, stock)  # the patch changes the image tokens' positions
    model.save_pretrained(tmp_path)

    saved = json.loads((tmp_path / "config.json").read_text())[CONFIG_KEY]
    assert saved["design"] == "circle" and saved["age"] == "alternate"
    assert saved["options"]["circle"] == {"alpha": 0.5}
    assert saved["layers"] == ["circle", "mrope", "circle", "mrope"]
    assert saved["sections"] == [2, 3, 3]

    # the stock model only on purpose: the family's config without the record
    plain = load_stock(str(tmp_path)).eval()
    assert not is_patched(plain) and type(plain) is cls
    assert torch.equal(_logits(plain, inputs), stock)

    again = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()  # patched from the record
    assert layer_designs(again) == ["circle", "mrope", "circle", "mrope"]
    assert torch.equal(_logits(again, inputs), patched)
    unpatch_model(again)
    patch_model(again, "circle", age="alternate", alpha=0.5, options={"mrope": {}})  # as recorded: the same
    assert torch.equal(_logits(again, inputs), patched)


def test_unpatch_removes_the_record_and_nothing_to_restore_is_an_error(tmp_path):
    cls, model = _build("qwen2_vl")
    with pytest.raises(ValueError, match="holds no ropekit patch.*pass a design"):
        patch_model(model)
    patch_model(model, "vrope")
    assert getattr(model.config, CONFIG_KEY)["design"] == "vrope"
    unpatch_model(model)
    assert not hasattr(model.config, CONFIG_KEY)
    model.save_pretrained(tmp_path)
    assert CONFIG_KEY not in json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match="holds no ropekit patch"):
        patch_model(cls.from_pretrained(tmp_path))


def test_repatching_replaces_the_record_and_restore_keeps_it():
    _, model = _build("qwen2_vl")
    patch_model(model, "circle", age="alternate")
    patch_model(model, "vrope", allocation="vrope")
    rec = getattr(model.config, CONFIG_KEY)
    assert (rec["design"], rec["age"], rec["allocation"]) == ("vrope", None, "vrope")
    patch_model(model)  # restoring a patched model patches it the same way again
    assert layer_designs(model) == ["vrope"] * 4 and getattr(model.config, CONFIG_KEY) == rec


def test_bad_records_and_arguments_are_refused():
    _, model = _build("qwen2_vl")
    with pytest.raises(TypeError, match="without a design"):
        patch_model(model, age="alternate")
    patch_model(model, "circle", age="alternate")
    rec = dict(getattr(model.config, CONFIG_KEY))
    unpatch_model(model)
    setattr(model.config, CONFIG_KEY, dict(rec, layers=["circle"] * 4))  # edited: does not match the schedule
    with pytest.raises(ValueError, match="does not resolve to the same geometry"):
        patch_model(model)
    assert not is_patched(model)
    setattr(model.config, CONFIG_KEY, "circle")
    with pytest.raises(ValueError, match="not a ropekit patch record"):
        patch_model(model)
    setattr(model.config, CONFIG_KEY, dict(rec, format=99))
    with pytest.raises(ValueError, match="newer than this ropekit reads"):
        patch_model(model)
    delattr(model.config, CONFIG_KEY)
    with pytest.raises(TypeError, match="cannot be recorded.*JSON"):
        patch_model(model, "circle", alpha=torch.tensor(0.5))


@pytest.mark.parametrize("bad", [
    dict(design="circl"),  # a typo in the design name
    dict(design="vrope", allocation="no-such-allocation"),
    dict(design="circle", sections=[1, 1]),
    dict(design="circle", no_such_option=3),
    dict(design="circle", age=[True]),  # one entry for a 4-layer model
    dict(design="circle", radius=object()),  # not JSON-able: cannot be recorded
])
def test_a_refused_repatch_keeps_the_previous_patch(bad):
    """Patching again with a bad argument raises and leaves the model as it was: still patched, with the
    same per-layer designs, record and logits (it used to come back silently stock)."""
    _, model = _build("qwen2_vl")
    inputs = _inputs()
    patch_model(model, "circle", age="alternate", alpha=0.5)
    before, record = _logits(model, inputs), dict(getattr(model.config, CONFIG_KEY))
    bad = dict(bad)
    with pytest.raises((ValueError, TypeError)):
        patch_model(model, bad.pop("design"), **bad)
    assert is_patched(model) and layer_designs(model) == ["circle", "mrope", "circle", "mrope"]
    assert getattr(model.config, CONFIG_KEY) == record
    assert torch.equal(_logits(model, inputs), before)
