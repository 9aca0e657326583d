"""The stock-equivalent patch behaves as the stock transformers model in the scenarios of transformers'
own Qwen2-VL / Qwen2.5-VL / Qwen3-VL test suites.

Reference: the unpatched transformers model (same weights) on tiny random configs. The patch under test
is ``patch_model(model, "mrope", continuation="spatial")``, which reproduces transformers 5.x M-RoPE.
"""
import copy
import os
import pickle

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch
from transformers import (
    CompileConfig,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from ropekit.hf.boundary import cache_keyword
import ropekit
from ropekit.hf import is_patched, last_positions, patch_model, unpatch_model

IMG, VID, PAD = 70, 71, 0
CACHE = cache_keyword(Qwen2VLForConditionalGeneration.forward)  # "cache" since transformers 5.24
PATCH_DIM = 3 * 2 * 2 * 2  # channels · temporal patch · patch²
TEXT = dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1, vocab_size=80,
            num_hidden_layers=2)
ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}


def _qwen2():
    return Qwen2VLForConditionalGeneration(Qwen2VLConfig(
        text_config=dict(TEXT, rope_parameters=ROPE),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=1, spatial_merge_size=2,
                           patch_size=2, temporal_patch_size=2),
        image_token_id=IMG, video_token_id=VID,
    ))


def _qwen25():
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(
        text_config=dict(TEXT, rope_parameters=ROPE),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, tokens_per_second=2, fullatt_block_indexes=[0], patch_size=2,
                           temporal_patch_size=2, window_size=8),
        image_token_id=IMG, video_token_id=VID,
    ))


def _qwen3(head_dim=16, sections=(2, 3, 3)):
    rope = dict(ROPE, mrope_section=list(sections), mrope_interleaved=True)
    heads = TEXT["hidden_size"] // head_dim
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(
        text_config=dict(TEXT, head_dim=head_dim, num_attention_heads=heads, rope_parameters=rope),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, patch_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0],
                           num_position_embeddings=16),
        image_token_id=IMG, video_token_id=VID,
    ))


BUILDERS = {
    "qwen2_vl": _qwen2,
    "qwen2_5_vl": _qwen25,
    "qwen3_vl": _qwen3,
    # transformers' Qwen3-VL suite: mrope_section [16, 8, 8] is longer than head_dim 8 has pairs
    "qwen3_vl_small_head": lambda: _qwen3(head_dim=8, sections=(16, 8, 8)),
}
FAMILIES = list(BUILDERS)


def _pair(family):
    """(stock model, patched copy with the same weights)."""
    torch.manual_seed(0)
    stock = BUILDERS[family]().eval()
    stock.generation_config.pad_token_id = PAD
    stock.generation_config.eos_token_id = None
    patched = patch_model(copy.deepcopy(stock), "mrope", continuation="spatial")
    return stock, patched


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    return _pair(request.param)


@pytest.fixture(scope="module", params=FAMILIES[:3])
def compiled_pair(request):
    """The three families for the compile tests (the small-head config adds nothing to graph safety)."""
    return _pair(request.param)


@pytest.fixture(autouse=True)
def _fresh_deltas(request):
    """Every test starts with no cached rope_deltas on either model (stock reads them)."""
    for name in ("pair", "compiled_pair"):
        if name in request.fixturenames:
            for m in request.getfixturevalue(name):
                m.model.rope_deltas = None
    yield


def image_batch(hidden_image=False, seed=0):
    """Two samples "T3 I4x4 T2" and "T2 I4x8 T3" (patch grids; 4 and 8 tokens after merging).

    ``hidden_image``: the second sample's image is masked out (its grid row and pixels still passed).
    """
    g = torch.Generator().manual_seed(seed)
    rows = [[("T", 3), ("I", 4), ("T", 2)], [("T", 2), ("I", 8), ("T", 3)]]
    ids, types = [], []
    for segs in rows:
        r, t = [], []
        for kind, n in segs:
            r += [IMG] * n if kind == "I" else torch.randint(1, 60, (n,), generator=g).tolist()
            t += [int(kind == "I")] * n
        ids.append([PAD] * (13 - len(r)) + r)  # left padding, as generate expects
        types.append([0] * (13 - len(t)) + t)
    input_ids, mm = torch.tensor(ids), torch.tensor(types)
    mask = (torch.arange(13) >= torch.tensor([[4], [0]])).long()
    if hidden_image:
        mask[1, 2:10] = 0
    grids = torch.tensor([[1, 4, 4], [1, 4, 8]])
    return dict(input_ids=input_ids, mm_token_type_ids=mm, attention_mask=mask, image_grid_thw=grids,
                pixel_values=torch.randn(int(grids.prod(1).sum()), PATCH_DIM, generator=g))


def _logits(model, **inputs):
    with torch.no_grad():
        return model(**inputs).logits


def test_patch_accepts_what_stock_accepts(pair):
    stock, patched = pair
    assert is_patched(patched) and not is_patched(stock)


def test_multimodal_forward_matches_stock(pair):
    stock, patched = pair
    inputs = image_batch()
    keep = inputs["attention_mask"].bool()
    assert torch.equal(_logits(patched, **inputs)[keep], _logits(stock, **inputs)[keep])
    assert patched.model.rope_deltas is None  # the patched model keeps nothing between calls


def test_image_tokens_without_grids_are_text_as_in_stock(pair):
    stock, patched = pair
    inputs = image_batch()
    ids = inputs["input_ids"][:1]  # holds the image token; no pixels, no grids
    assert torch.equal(_logits(patched, input_ids=ids), _logits(stock, input_ids=ids))
    mm = inputs["mm_token_type_ids"][:1]
    assert torch.equal(_logits(patched, input_ids=ids, mm_token_type_ids=mm), _logits(stock, input_ids=ids))
    with torch.no_grad():
        want = stock.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
        got = patched.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(got, want)


def test_text_only_matches_stock(pair):
    stock, patched = pair
    ids = torch.randint(1, 60, (2, 6), generator=torch.Generator().manual_seed(3))
    assert torch.equal(_logits(patched, input_ids=ids), _logits(stock, input_ids=ids))


def test_masked_image_tokens_are_skipped_as_in_stock(pair):
    stock, patched = pair
    inputs = image_batch(hidden_image=True)
    keep = inputs["attention_mask"].bool()
    assert torch.equal(_logits(patched, **inputs)[keep], _logits(stock, **inputs)[keep])


def test_generate_matches_stock_and_keeps_no_rope_deltas(pair):
    stock, patched = pair
    inputs = image_batch()
    inputs = {k: v[:1] if k != "pixel_values" else v[:16] for k, v in inputs.items()}
    inputs["image_grid_thw"] = inputs["image_grid_thw"][:1]
    with torch.no_grad():
        want = stock.generate(**inputs, max_new_tokens=4, do_sample=False)
        got = patched.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)
    assert patched.model.rope_deltas is None  # generate carries the positions as data
    ids = torch.randint(1, 60, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = stock.generate(input_ids=ids, max_new_tokens=2, do_sample=False)
        got = patched.generate(input_ids=ids, max_new_tokens=2, do_sample=False)
    assert torch.equal(got, want) and patched.model.rope_deltas is None


def _generate_logits(model, inputs, **kw):
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=3, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **kw)
    return out.logits


def test_uncached_generate_matches_stock_and_the_cached_design(pair):
    """generate(use_cache=False) re-reads the whole sequence at every step but passes the grids only once."""
    stock, patched = pair
    inputs = image_batch()
    want, got = (_generate_logits(m, inputs, use_cache=False) for m in (stock, patched))
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    circle = patch_model(copy.deepcopy(stock), "circle")
    cached = _generate_logits(circle, inputs)
    for w, g in zip(cached, _generate_logits(circle, inputs, use_cache=False)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _decode_steps(model, inputs, forward, steps=3):
    """Eager prefill, then ``steps`` greedy cached steps through ``forward``; the logits of each step.

    No attention mask: stock 5.x decodes a 2-D mask only through ``generate`` (which passes positions).
    """
    inputs = {k: v for k, v in inputs.items() if k != "attention_mask"}
    with torch.no_grad():
        out = model(**inputs, use_cache=True)
        cache, seen = out.past_key_values, []
        for _ in range(steps):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            text = torch.zeros_like(nxt)  # declared text: a random model may emit the image token id
            out = forward(input_ids=nxt, mm_token_type_ids=text, use_cache=True, **{CACHE: cache})
            cache = out.past_key_values
            seen.append(out.logits[:, -1])
    return seen


def _unpadded(inputs):
    """The second sample alone (no padding): pixels and grid of its image only."""
    out = {k: inputs[k][1:] for k in ("input_ids", "mm_token_type_ids", "attention_mask", "image_grid_thw")}
    out["pixel_values"] = inputs["pixel_values"][16:]
    return out


def test_compiled_fullgraph_decoding_matches_stock(compiled_pair):
    """Decoding is graph-safe: ``torch.compile(forward, fullgraph=True)`` raises on any graph break."""
    stock, patched = compiled_pair
    inputs = _unpadded(image_batch())
    torch._dynamo.reset()
    want = _decode_steps(stock, inputs, stock.forward)  # stock compiles too; its eager steps are the reference
    got = _decode_steps(patched, inputs, torch.compile(patched.forward, fullgraph=True, backend="eager"))
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_compiled_generate_with_static_cache_matches_stock(compiled_pair):
    """``generate`` with a static cache compiles the decoding forward with fullgraph=True."""
    stock, patched = compiled_pair
    inputs = image_batch()
    config = CompileConfig(fullgraph=True, backend="eager")
    config._compile_all_devices = True  # compile on the CPU too
    torch._dynamo.reset()
    kw = dict(max_new_tokens=3, do_sample=False, cache_implementation="static", compile_config=config,
              output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        want = stock.generate(**inputs, **dict(kw, compile_config=None))
        got = patched.generate(**inputs, **kw)
    assert hasattr(patched, "_compiled_call")  # the decoding steps did run compiled
    assert torch.equal(got.sequences, want.sequences)
    for w, g in zip(want.logits, got.logits):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def _perturb(model):
    with torch.no_grad():
        for layer in model.model.language_model.layers:
            layer.self_attn.q_proj.weight.mul_(1.5)


def test_deepcopy_is_an_independent_patched_model(pair):
    stock, patched = pair
    inputs = image_batch()
    keep = inputs["attention_mask"].bool()
    ref = _logits(patched, **inputs)
    twin = copy.deepcopy(patched)
    assert is_patched(twin) and torch.equal(_logits(twin, **inputs), ref)
    _perturb(twin)
    moved = _logits(twin, **inputs)
    assert not torch.allclose(moved, ref)  # the copy's hooks run the copy's layers
    assert torch.equal(_logits(patched, **inputs), ref)  # and the original is untouched
    unpatch_model(twin)
    _perturb(stock_twin := copy.deepcopy(stock))
    assert torch.equal(_logits(twin, **inputs)[keep], _logits(stock_twin, **inputs)[keep])
    assert is_patched(patched) and torch.equal(_logits(patched, **inputs), ref)


def test_pickle_and_save_pretrained(pair, tmp_path):
    stock, patched = pair
    inputs = image_batch()
    ref = _logits(patched, **inputs)
    for m in (stock, patched):  # a compiled generate leaves a compiled call behind, which never pickles
        m.__dict__.pop("_compiled_call", None)
    loaded = pickle.loads(pickle.dumps(patched))
    assert is_patched(loaded) and torch.equal(_logits(loaded, **inputs), ref)
    _perturb(loaded)
    assert torch.equal(_logits(patched, **inputs), ref)
    patched.save_pretrained(tmp_path)
    reloaded = ropekit.hf.load_stock(str(tmp_path), type(stock)).eval()  # the stock model only on purpose
    assert not is_patched(reloaded)
    keep = inputs["attention_mask"].bool()
    assert torch.equal(_logits(reloaded, **inputs)[keep], _logits(stock, **inputs)[keep])


# ---------------------------------------------------------------------------------------------------------------
# decoding step by step, assisted decoding, a compiled whole forward, get_rope_index, rope scaling: as stock


def _capture_positions(model):
    """Record the positions ``(3, B, L)`` every forward of ``model``'s language model rotates with: the stock
    rotary's ``position_ids`` argument, or what the patch placed (:func:`ropekit.hf.last_positions`)."""
    seen, text = [], model.model.language_model

    def stock_rotary(module, args, kwargs):
        seen.append(kwargs.get("position_ids", args[1] if len(args) > 1 else None).float())

    def patched_forward(module, args, kwargs, out):
        seen.append(last_positions(model)[0])

    if is_patched(model):
        handle = text.register_forward_hook(patched_forward, with_kwargs=True)
    else:
        handle = text.rotary_emb.register_forward_pre_hook(stock_rotary, with_kwargs=True)
    return seen, handle


def _stepwise(model, inputs, **kw):
    """(logits per step, positions per forward) of a greedy ``generate``."""
    seen, handle = _capture_positions(model)
    try:
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=4, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, **kw)
    finally:
        handle.remove()
    return out, seen


def _one(inputs, row):
    """Sample ``row`` of :func:`image_batch` alone (its image's pixels and grid only)."""
    out = {k: inputs[k][row:row + 1] for k in ("input_ids", "mm_token_type_ids", "attention_mask", "image_grid_thw")}
    out["pixel_values"] = inputs["pixel_values"][:16] if row == 0 else inputs["pixel_values"][16:]
    return out


def _text_batch():
    ids = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return dict(input_ids=ids, attention_mask=mask)


STEP_CASES = {"images, left padding": lambda: image_batch(), "image, no padding": lambda: _one(image_batch(), 1),
              "text, left padding": _text_batch}


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_every_decoding_step_places_and_scores_as_stock(pair, case):
    """Positions of the prompt (its unpadded tokens) and of every generated token, and every step's logits,
    equal stock's: a decoding step that lost track of the cache (5.24's `cache` rename put every new token at
    position 0) changes them, even where a tiny model's greedy tokens stay the same."""
    stock, patched = pair
    inputs = STEP_CASES[case]()
    want, want_pos = _stepwise(stock, inputs)
    got, got_pos = _stepwise(patched, inputs)
    assert torch.equal(got.sequences, want.sequences)
    assert len(got_pos) == len(want_pos) == len(want.logits)
    keep = inputs["attention_mask"].bool()
    torch.testing.assert_close(got_pos[0][:, keep], want_pos[0][:, keep], rtol=0, atol=0)
    for w, g in zip(want_pos[1:], got_pos[1:]):
        assert torch.equal(g, w)
    for w, g in zip(want.logits, got.logits):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_beam_search_and_several_sequences_per_prompt_match_stock(pair):
    """Beams and num_return_sequences expand the placed batch; every beam decodes at stock's positions."""
    stock, patched = pair
    inputs = image_batch()
    kw = dict(num_beams=3, num_return_sequences=2, output_scores=True)
    want, want_pos = _stepwise(stock, inputs, **kw)
    got, got_pos = _stepwise(patched, inputs, **kw)
    assert torch.equal(got.sequences, want.sequences)
    torch.testing.assert_close(got.sequences_scores, want.sequences_scores, rtol=1e-6, atol=1e-6)
    for w, g in zip(want_pos[1:], got_pos[1:]):
        assert torch.equal(g, w)


ASSISTED = {"same instance": lambda m: dict(assistant_model=m),
            "separate copy": lambda m: dict(assistant_model=copy.deepcopy(m)),
            "prompt lookup": lambda m: dict(prompt_lookup_num_tokens=2)}


@pytest.mark.parametrize("mode", list(ASSISTED))
@pytest.mark.parametrize("row", [0, 1], ids=["left padding", "no padding"])
def test_assisted_decoding_equals_greedy_decoding(pair, mode, row):
    """Assisted and prompt-lookup decoding verify candidates in one uncached forward over prompt + candidates
    (token types cover the prompt only), and an assistant sharing the instance re-reads the prompt without
    its grids: the result is stock's greedy decoding, and so is the cached design's own for circle."""
    stock, patched = pair
    inputs = _one(image_batch(), row)
    want, _ = _stepwise(stock, inputs)
    for model, reference in ((patched, want), (circle := patch_model(copy.deepcopy(stock), "circle"), None)):
        reference = reference or _stepwise(circle, inputs)[0]
        got, _ = _stepwise(model, inputs, **ASSISTED[mode](model))
        assert torch.equal(got.sequences, reference.sequences)
        for w, g in zip(reference.logits, got.logits):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def pairs():
    """``pairs(family)``: (stock, patched) built once per module."""
    built = {}

    def get(family):
        if family not in built:
            built[family] = _pair(family)
        for m in built[family]:
            m.model.rope_deltas = None
        return built[family]
    return get


# each whole-forward compile costs ~10 s on 2 cores: Qwen2-VL (the case) with and without images,
# Qwen3-VL's interleaved sections on text
@pytest.mark.parametrize("family,case", [("qwen2_vl", "text, left padding"), ("qwen2_vl", "images, left padding"),
                                         ("qwen3_vl", "text, left padding")])
def test_whole_forward_compiled_fullgraph_then_generate_matches_stock(pairs, family, case):
    """torch.compile(model.forward, fullgraph=True, dynamic=True) and then generate: the prefill runs inside
    the graph too, so the patch must place generate's prompt without a data-dependent branch."""
    stock, patched = pairs(family)
    inputs = STEP_CASES[case]()
    want, _ = _stepwise(stock, inputs)
    torch._dynamo.reset()
    patched.forward = torch.compile(patched.forward, fullgraph=True, dynamic=True, backend="eager")
    try:
        with torch.no_grad():
            got = patched.generate(**inputs, max_new_tokens=4, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True)
    finally:
        del patched.forward
    assert torch.equal(got.sequences, want.sequences)
    for w, g in zip(want.logits, got.logits):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_get_rope_index_of_a_patched_model_is_the_designs(pair):
    """A direct get_rope_index call answers with the design's positions and deltas (stock's own for the
    stock-equivalent design); an AGE patch, with two geometries, is refused."""
    stock, patched = pair
    inputs = image_batch()
    args = dict(input_ids=inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                image_grid_thw=inputs["image_grid_thw"], attention_mask=inputs["attention_mask"])
    want, want_deltas = stock.model.get_rope_index(**args)
    got, got_deltas = patched.model.get_rope_index(**args)
    keep = inputs["attention_mask"].bool()
    assert got.dtype == want.dtype and torch.equal(got[:, keep], want[:, keep])
    assert torch.equal(got_deltas, want_deltas)
    circle = patch_model(copy.deepcopy(stock), "circle")
    pos, _ = circle.model.get_rope_index(**args)
    with torch.no_grad():
        circle(**inputs)
    assert torch.equal(pos[:, keep].float(), last_positions(circle)[0][:, keep])  # what its forward uses
    age = patch_model(copy.deepcopy(stock), "circle", age="alternate")
    with pytest.raises(ValueError, match="2 geometries"):
        age.model.get_rope_index(**args)


@pytest.mark.parametrize("rope", [
    {"rope_type": "default", "original_max_position_embeddings": 8},
    {"rope_type": "linear", "factor": 2.0, "original_max_position_embeddings": 8},
    {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8},
], ids=lambda r: r["rope_type"])
def test_rope_parameters_stock_accepts_are_accepted_and_used_as_stock(rope):
    """Configs may carry the pretraining length on rope types that ignore it; stock accepts them, and so does
    the stock-equivalent patch, with stock's numbers (max_position_embeddings 8: dynamic NTK grows its base)."""
    torch.manual_seed(0)
    params = dict(ROPE, **rope)
    stock = Qwen2VLForConditionalGeneration(Qwen2VLConfig(
        text_config=dict(TEXT, rope_parameters=params, max_position_embeddings=8),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, mlp_ratio=1, spatial_merge_size=2,
                           patch_size=2, temporal_patch_size=2),
        image_token_id=IMG, video_token_id=VID,
    )).eval()
    stock.generation_config.pad_token_id, stock.generation_config.eos_token_id = PAD, None
    patched = patch_model(copy.deepcopy(stock), "mrope", continuation="spatial")
    inputs = _one(image_batch(), 1)
    assert torch.equal(_logits(patched, **inputs), _logits(stock, **inputs))
    want, got = _stepwise(stock, inputs)[0], _stepwise(patched, inputs)[0]
    assert torch.equal(got.sequences, want.sequences)
    for w, g in zip(want.logits, got.logits):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def _right_padded(inputs):
    """The same two prompts with their padding moved after the prompt (attention mask 0 there)."""
    shift = (1 - inputs["attention_mask"]).sum(1)  # left pads per sample
    out = dict(inputs)
    for key in ("input_ids", "mm_token_type_ids", "attention_mask"):
        out[key] = torch.stack([row.roll(-int(s)) for row, s in zip(inputs[key], shift)])
    return out


def test_right_padded_generate_follows_the_stock_full_forward(pair):
    """Cached generation after a right-padded prompt equals transformers' own forward over the whole sequence.

    The reference is the stock model's teacher-forced forward (it skips the masked pads when it places the
    generated tokens). Stock ``generate`` itself is not the reference: it counts the pads in its decoding
    positions and so drifts from that forward (docs/hf.md, "Right padding").
    """
    stock, patched = pair
    inputs = _right_padded(image_batch())
    new = 4
    with torch.no_grad():
        out = patched.generate(**inputs, max_new_tokens=new, do_sample=False, output_logits=True,
                               return_dict_in_generate=True, suppress_tokens=[IMG, VID])
    ones = torch.ones(2, new, dtype=torch.long)
    full = dict(inputs, input_ids=out.sequences,
                attention_mask=torch.cat([inputs["attention_mask"], ones], 1),
                mm_token_type_ids=torch.cat([inputs["mm_token_type_ids"], 0 * ones], 1))
    stock.model.rope_deltas = None
    want = _logits(stock, **full)[:, inputs["input_ids"].shape[1] - 1:-1]
    # the first step's logits are a pad's output (the prompt's last column), at another place in each; every token
    # generate feeds back sits where the forward puts it
    for j, got in enumerate(out.logits[1:], start=1):
        torch.testing.assert_close(got, want[:, j], rtol=1e-5, atol=1e-5)


def test_patch_inside_a_meta_device_context_then_load_weights(pair):
    """Built and patched under `with torch.device("meta")` (how large checkpoints are initialised), then
    materialised and loaded: the same logits as the stock model (the patch's tables live on the CPU)."""
    stock, _ = pair
    with torch.device("meta"):
        empty = patch_model(type(stock)(copy.deepcopy(stock.config)), "mrope", continuation="spatial")
    empty = empty.to_empty(device="cpu")
    empty.load_state_dict(stock.state_dict())
    for name, buf in stock.named_buffers():  # non-persistent buffers (inv_freq) are not in the state dict
        empty.get_buffer(name).copy_(buf)
    inputs = image_batch()
    keep = inputs["attention_mask"].bool()
    assert is_patched(empty)
    assert torch.equal(_logits(empty.eval(), **inputs)[keep], _logits(stock, **inputs)[keep])
