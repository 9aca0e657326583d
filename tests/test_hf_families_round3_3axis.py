"""ropekit designs inside the 3-axis families added in coverage round 3 (tiny random models built from configs),
with the matrix of tests/test_hf_families_3axis.py run on each: the stock-equivalent patch gives the stock
positions, logits and ``generate`` output bit for bit on padded image and video batches and on text; every design
runs and every layer rotates with ``ropekit.positions`` of the layout; cached generation (plain and AGE) equals a
teacher-forced forward; checkpointed training keeps the gradients; packed rows equal per-sample runs (or are
refused where linear-attention layers carry state across a row); save and reload restore the patch. Family
specifics follow the matrix.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
import transformers as T

from hf_compat import restore
from test_hf_families_3axis import IMG, PAD, QWEN_VISION, TEXT, VID, Family, _seeded
from test_hf_families_3axis import (  # noqa: F401  (the shared matrix, run here on this file's `fam`)
    test_cached_generation_equals_a_teacher_forced_forward, test_checkpointed_training_step,
    test_every_design_places_its_positions, test_packed_rows_equal_per_sample_runs,
    test_save_pretrained_and_reload_restore_the_patch, test_stock_equivalent_forward_matches_stock,
    test_stock_equivalent_generate_matches_stock)
from ropekit.hf import supported_models


def _qwen4_exp():
    # Qwen3.5-MoE's text rotary and position code; sparse (QSA-indexed) attention over blocks of 2 cached tokens
    # with a budget of 4, so the indexer's block choice (keys rotated at their block's first position) matters
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5,
            "mrope_interleaved": True}
    return T.Qwen4ExpForConditionalGeneration(T.Qwen4ExpConfig(
        text_config=dict(TEXT, head_dim=16, rope_parameters=rope, layer_types=["linear_attention", "indexed_attention"],
                         linear_num_value_heads=2, linear_num_key_heads=1, linear_key_head_dim=8,
                         linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                         shared_expert_intermediate_size=16, hc_count=2, hc_lowrank=8, indexer_n_heads=2,
                         indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4, indexer_compress_ratio=2),
        vision_config=QWEN_VISION, image_token_id=IMG, video_token_id=VID))


#: (builder, the transformers class it needs)
FAMILIES = {
    "qwen4_exp": (Family(_qwen4_exp, (24,), "frames"), "Qwen4ExpForConditionalGeneration"),
}
#: for tests/test_hf_boundary.py: the families this transformers has
BUILDERS = {name: f.build for name, (f, cls) in FAMILIES.items() if hasattr(T, cls)}


@pytest.fixture(scope="module", params=list(FAMILIES))
def fam(request):
    """(family name, its spec, a stock model); the model is unpatched after every test."""
    family, cls = FAMILIES[request.param]
    if not hasattr(T, cls):
        pytest.skip(f"transformers {T.__version__} has no {cls}")
    model = _seeded(family.build)
    yield request.param, family, model
    restore(model)


@pytest.fixture(autouse=True)
def _unpatched_after(request):
    yield
    if "fam" in request.fixturenames:
        restore(request.getfixturevalue("fam")[2])


def test_supported_models_lists_the_families():
    assert {name for name, (_, cls) in FAMILIES.items() if hasattr(T, cls)} <= set(supported_models())
