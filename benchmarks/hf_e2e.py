"""End to end: multimodal models with random weights, stock against ropekit-patched, prefill and decode.

Three families (:data:`FAMILIES`): Qwen2-VL and GLM-4.1V (3-axis, M-RoPE placed in ``compute_3d_position_ids``)
and Gemma 3 (1-D, two rotary tables, placed in the bare model's forward). One model instance per family is
timed in its states, interleaved round-robin (patching between timed calls, never inside them) so load
from other processes falls on every state alike. Qwen2-VL:

- ``stock``: transformers' own M-RoPE (``get_rope_index`` + its rotary embedding);
- ``mrope``: ``patch_model(model, "mrope")`` — the same positions through ropekit (bar: ≤ 1.02× stock);
- ``circle_age``: ``patch_model(model, "circle", age="alternate")`` — two geometries per forward;
- ``vrope``: ``patch_model(model, "vrope")`` — its own (6-axis) allocation.

GLM-4.1V: ``stock`` and ``mrope`` (``continuation="spatial"``, its stock-equivalent patch); Gemma 3: ``stock``
and ``vanilla`` (its stock-equivalent patch). The bar for a stock-equivalent patch is ≤ 1.02× stock.

Qwen2-VL runs at the scaled ``quick`` shape and, unless ``--quick``, at the full one (8 layers of hidden
1024 at L = 4096; a whole prefill there takes tens of seconds on a small CPU); GLM-4.1V and Gemma 3 at the
scaled one only. Measured: the patched stages alone (positions + cos/sin; Qwen-VL-shaped families only, a
1-D family has no separate position stage), the whole model's prefill with the decode step right after it,
and decode steps timed on their own over more rounds. Times are wall and process CPU time (the CPU time is
the steadier number on a loaded machine).

``prefill`` is one forward over the whole prompt (text and images, vision tower included,
``logits_to_keep=1`` as ``generate`` does); ``decode_first`` is one cached forward of one new text token
right after it (each timed prefill gives the cache its decode step reads); ``decode`` is the mean of a few
such steps, timed over more rounds than the prefills (the steadier decode number). Before timing, the
stock-equivalent patched model's prefill logits must equal the stock model's.
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

MERGE = 2
PATCH = 14

SHAPES = {  # name -> (layers, hidden, heads, kv heads, intermediate, tokens, image token grid side)
    "full": (8, 1024, 8, 2, 2816, 4096, 28),
    "quick": (4, 512, 4, 2, 1408, 1024, 14),
}


def _cache() -> str:
    """The KV-cache keyword of the installed transformers (``cache`` since 5.24, ``past_key_values`` before); a
    model output holds its cache under the same name."""
    from transformers import Qwen2VLForConditionalGeneration

    from ropekit.hf.boundary import cache_keyword
    return cache_keyword(Qwen2VLForConditionalGeneration.forward)


def _text_config(layers: int, hidden: int, heads: int, kv: int, inter: int, **kw) -> dict:
    return dict(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads, num_key_value_heads=kv,
                num_hidden_layers=layers, vocab_size=32000, bos_token_id=None, eos_token_id=None, **kw)


def build_qwen2_vl(layers: int, hidden: int, heads: int, kv: int, inter: int):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    head_dim = hidden // heads
    q = head_dim // 2 // 8  # mrope_section in Qwen2-VL's 2:3:3 proportion of the head_dim/2 pairs
    sections = [2 * q, 3 * q, head_dim // 2 - 5 * q]
    cfg = Qwen2VLConfig(
        text_config=_text_config(layers, hidden, heads, kv, inter, rope_parameters={
            "rope_type": "default", "rope_theta": 1e6, "mrope_section": sections}),
        vision_config=dict(depth=1, embed_dim=64, hidden_size=hidden, num_heads=2, mlp_ratio=1, spatial_merge_size=MERGE,
                           patch_size=PATCH, temporal_patch_size=2),
        image_token_id=QWEN2_VL.image_id, video_token_id=QWEN2_VL.image_id + 1,
    )
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(cfg).eval()


def build_glm4v(layers: int, hidden: int, heads: int, kv: int, inter: int):
    """GLM-4.1V's text model (half of each head rotates, chunked ``mrope_section`` t 1 : h 1.5 : w 1.5 of the
    rotated pairs, as the released [8, 12, 12] of 32) under a one-block GLM vision tower."""
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration

    pairs = hidden // heads // 4  # rotated pairs: partial_rotary_factor 0.5 of head_dim / 2
    sections = [pairs // 4, 3 * pairs // 8, pairs - pairs // 4 - 3 * pairs // 8]
    cfg = Glm4vConfig(
        text_config=_text_config(layers, hidden, heads, kv, inter, rope_parameters={
            "rope_type": "default", "rope_theta": 1e4, "mrope_section": sections, "partial_rotary_factor": 0.5}),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                           spatial_merge_size=MERGE, patch_size=PATCH, temporal_patch_size=2, image_size=336),
        image_token_id=GLM4V.image_id, image_start_token_id=GLM4V.markers[0], image_end_token_id=GLM4V.markers[1],
        video_token_id=GLM4V.image_id + 3, video_start_token_id=GLM4V.image_id + 4,
        video_end_token_id=GLM4V.image_id + 5,
    )
    torch.manual_seed(0)
    return Glm4vForConditionalGeneration(cfg).eval()


def build_gemma3(layers: int, hidden: int, heads: int, kv: int, inter: int, side: int):
    """Gemma 3's text model (sliding-window and global layers alternating, each type with its own rotary table, the
    global one linearly scaled as on the larger checkpoints) under a one-layer SigLIP tower whose patch grid is
    pooled by 2 to ``side × side`` tokens per image."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    cfg = Gemma3Config(
        text_config=_text_config(layers, hidden, heads, kv, inter, head_dim=hidden // heads, pad_token_id=0,
                                 sliding_window=512, rope_parameters=rope,
                                 layer_types=["sliding_attention", "full_attention"] * (layers // 2)),
        vision_config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=2 * side * PATCH, patch_size=PATCH),
        mm_tokens_per_image=side * side, image_token_index=GEMMA3.image_id, boi_token_index=GEMMA3.markers[0],
        eoi_token_index=GEMMA3.markers[1],
    )
    torch.manual_seed(0)
    return Gemma3ForConditionalGeneration(cfg).eval()


def _ids(tokens: int, side: int, image_id: int, markers: tuple, seed: int) -> tuple:
    """One sequence of ``tokens``: text runs around as many images of ``side × side`` tokens (each between the
    family's begin/end tokens, if it has them) as fit in 3/4 of it; ``(input_ids, token types, images, the
    generator, to draw the pixels from next)``."""
    g = torch.Generator().manual_seed(seed)
    per_image = side * side + len(markers)
    images = max(1, (3 * tokens // 4) // per_image)
    text = tokens - images * per_image
    runs = [text // (images + 1)] * images + [text - images * (text // (images + 1))]
    ids, types = [], []
    for i, n in enumerate(runs):
        ids.append(torch.randint(100, 30000, (n,), generator=g))
        types.append(torch.zeros(n, dtype=torch.long))
        if i < images:
            block = [*markers[:1], *[image_id] * (side * side), *markers[1:]]
            ids.append(torch.tensor(block))
            types.append((torch.tensor(block) == image_id).long())
    return torch.cat(ids)[None], torch.cat(types)[None], images, g


def prompt_grid(family: "Family", tokens: int, side: int, seed: int = 0) -> dict:
    """A prompt for a Qwen-VL-shaped family: ids, mask, ``mm_token_type_ids``, one ``(1, h, w)`` grid and its
    flattened patches per image."""
    ids, types, images, g = _ids(tokens, side, family.image_id, family.markers, seed)
    grid = torch.tensor([[1, side * MERGE, side * MERGE]]).repeat(images, 1)
    pixels = torch.randn(int(grid.prod(1).sum()), 3 * 2 * PATCH * PATCH, generator=g)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types,
                image_grid_thw=grid, pixel_values=pixels)


def prompt_gemma3(family: "Family", tokens: int, side: int, seed: int = 0) -> dict:
    """A Gemma 3 prompt: ids, mask, ``token_type_ids`` (1 on image tokens) and one pixel image per image."""
    ids, types, images, g = _ids(tokens, side, family.image_id, family.markers, seed)
    pixels = torch.randn(images, 3, 2 * side * PATCH, 2 * side * PATCH, generator=g)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=types, pixel_values=pixels)


@dataclass(frozen=True)
class Family:
    """How the benchmark builds and drives one transformers family.

    ``states`` maps a state name to ``patch_model``'s arguments (``None``: stock); ``equivalent`` names the
    stock-equivalent one, whose prefill logits must equal stock's. ``positions`` says whether the family places
    its tokens in ``compute_3d_position_ids`` (then the ``stages`` rows time that plus ``rotary_emb``, and
    ``decode_only`` places the prompt through them); 1-D families place them inside the bare model's forward,
    so they get no stage rows and ``decode_only`` runs a prefill for its cache and placement.
    """

    name: str
    build: Callable
    prompt: Callable
    image_id: int
    states: dict
    equivalent: str
    markers: tuple = ()  # the image's begin / end tokens (text), if the processor writes them
    positions: bool = True
    side_in_build: bool = False  # the build takes the image grid side (the pooled grid is in the config)
    shapes: tuple = ("quick",)  # the shapes it runs at

    def model(self, shape: str):
        layers, hidden, heads, kv, inter, tokens, side = SHAPES[shape]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.build(layers, hidden, heads, kv, inter, *([side] if self.side_in_build else []))

    def inputs(self, shape: str) -> dict:
        *_, tokens, side = SHAPES[shape]
        return self.prompt(self, tokens, side)


QWEN2_VL = Family("qwen2_vl", build_qwen2_vl, prompt_grid, 31990, equivalent="mrope", shapes=("full", "quick"),
                  states={"stock": None, "mrope": dict(design="mrope"),
                          "circle_age": dict(design="circle", age="alternate"), "vrope": dict(design="vrope")})
GLM4V = Family("glm4v", build_glm4v, prompt_grid, 31990, markers=(31991, 31992), equivalent="mrope",
               states={"stock": None, "mrope": dict(design="mrope", continuation="spatial")})
GEMMA3 = Family("gemma3", build_gemma3, prompt_gemma3, 31990, markers=(31991, 31992), equivalent="vanilla",
                positions=False, side_in_build=True, states={"stock": None, "vanilla": dict(design="vanilla")})
FAMILIES = {f.name: f for f in (QWEN2_VL, GLM4V, GEMMA3)}
#: Qwen2-VL's states, for callers of the single-family benchmark
STATES = QWEN2_VL.states


def _set_state(model, state) -> None:
    from ropekit.hf import is_patched, patch_model, unpatch_model

    if state is None:
        if is_patched(model):
            unpatch_model(model)
    else:
        patch_model(model, **state)


class _Past:
    """Stands in for a KV cache of ``n`` tokens where only its length is read (position stages)."""

    def __init__(self, n: int):
        self.n = n

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.n


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _interleaved(model, states: dict, phases: dict, repeat: int, log) -> dict:
    """``{state: {phase: {"wall": [...], "cpu": [...]}}}``: every phase of every state, round-robin, the order of
    the states reversed every other round (so no state always runs right after the same one).

    ``phases`` maps a phase name to ``fn(carry) -> carry``, run in order within a state (so a decode
    phase gets its prefill's cache). The first round warms up and is not kept.
    """
    times = {s: {ph: {"wall": [], "cpu": []} for ph in phases} for s in states}
    for r in range(repeat + 1):
        for s in (list(states) if r % 2 else list(states)[::-1]):
            _set_state(model, states[s])
            carry = None
            for ph, fn in phases.items():
                w0, c0 = _clock()
                carry = fn(carry)
                w1, c1 = _clock()
                if r:
                    times[s][ph]["wall"].append(w1 - w0)
                    times[s][ph]["cpu"].append(c1 - c0)
        if r:
            first = next(iter(phases))
            log(f"  round {r}/{repeat} {first}: " + ", ".join(f"{s} {times[s][first]['cpu'][-1]:.4f}s" for s in states))
    _set_state(model, None)
    return times


def _rows(times: dict, kind: str, family: Family, shape: str, info: dict, log) -> list[dict]:
    out = []
    for ph in next(iter(times.values())):
        stock = {c: statistics.median(times["stock"][ph][c]) for c in ("wall", "cpu")}
        for s in times:
            t = times[s][ph]
            med = {c: statistics.median(t[c]) for c in ("wall", "cpu")}
            out.append({"family": family.name, "kind": kind, "phase": ph, "state": s, "shape": shape, **info,
                        "median_s": med["wall"], "min_s": min(t["wall"]), "max_s": max(t["wall"]),
                        "cpu_median_s": med["cpu"], "repeat": len(t["wall"]),
                        "vs_stock": med["wall"] / stock["wall"], "cpu_vs_stock": med["cpu"] / stock["cpu"]})
            log(f"{family.name:8s} {kind:6s} {ph:7s} {s:10s} cpu {med['cpu'] * 1e3:9.2f} ms "
                f"({med['cpu'] / stock['cpu']:.3f}x stock)  wall {med['wall'] * 1e3:9.2f} ms "
                f"({med['wall'] / stock['wall']:.3f}x)")
    return out


def _setup(family: Family, shape: str) -> tuple:
    """A random model of ``family`` at ``shape``, its prompt and the rows' shape description."""
    layers, hidden = SHAPES[shape][:2]
    model, inputs = family.model(shape), family.inputs(shape)
    images = int((inputs["input_ids"] == family.image_id).sum()) // SHAPES[shape][-1] ** 2
    return model, inputs, {"layers": layers, "hidden": hidden, "tokens": inputs["input_ids"].shape[1],
                           "images": images}


def _grid_args(inputs: dict) -> dict:
    return {k: inputs[k] for k in ("image_grid_thw", "attention_mask", "mm_token_type_ids")}


def _place(model, inputs: dict, ids, emb, past):
    """What the patch replaces in a Qwen-VL-shaped family: the positions and the cos/sin tables."""
    inner = model.model
    pos = inner.compute_3d_position_ids(input_ids=ids, inputs_embeds=emb, **{_cache(): past}, **inputs)
    return inner.language_model.rotary_emb(emb, pos if pos is not None else torch.zeros(3, 1, emb.shape[1]))


def stages(shape: str, repeat: int, log=print, family: Family = QWEN2_VL) -> list[dict]:
    """Only what the patch replaces: positions (``compute_3d_position_ids``) and cos/sin (``rotary_emb``)."""
    if not family.positions:
        raise ValueError(f"{family.name} places its tokens inside the bare model's forward: no stages to time")
    model, inputs, info = _setup(family, shape)
    embed = model.model.get_input_embeddings()
    emb = embed(inputs["input_ids"]).detach()
    step_ids = torch.tensor([[1234]])
    step_emb = embed(step_ids).detach()
    kw = _grid_args(inputs)
    phases = {"prefill": lambda _: _place(model, kw, inputs["input_ids"], emb, None),
              "decode": lambda _: _place(model, {}, step_ids, step_emb, _Past(info["tokens"]))}
    with torch.no_grad():
        times = _interleaved(model, family.states, phases, repeat, log)
    return _rows(times, "stages", family, shape, info, log)


def _check_equivalent(model, family: Family, inputs: dict) -> None:
    """The stock-equivalent patch's prefill logits must be the stock model's, bit for bit."""
    _set_state(model, None)
    ref = model(**inputs, logits_to_keep=1).logits
    _set_state(model, family.states[family.equivalent])
    same = torch.equal(model(**inputs, logits_to_keep=1).logits, ref)
    _set_state(model, None)
    if not same:
        raise AssertionError(f"{family.name}: patched {family.equivalent} prefill logits differ from the stock model's")


def forward(shape: str, repeat: int, log=print, family: Family = QWEN2_VL) -> list[dict]:
    """The whole model: prefill (vision tower included) and one cached decode step."""
    model, inputs, info = _setup(family, shape)
    step = dict(input_ids=torch.tensor([[1234]]))  # no mask: stock transformers then places it at past + delta
    phases = {"prefill": lambda _: getattr(model(**inputs, use_cache=True, logits_to_keep=1), _cache()),
              "decode_first": lambda cache: model(**step, **{_cache(): cache}, use_cache=True)}
    with torch.no_grad():
        _check_equivalent(model, family, inputs)
        times = _interleaved(model, family.states, phases, repeat, log)
    return _rows(times, "model", family, shape, info, log)


def decode_only(shape: str, repeat: int, log=print, steps: int = 5, family: Family = QWEN2_VL) -> list[dict]:
    """One cached decode step of the whole model after a prompt of ``shape``: per round, the mean of
    ``steps`` consecutive steps (each at the same cache length).

    Qwen-VL-shaped families: the KV cache comes from one stock prefill (its values do not change the time of a
    step); each state places the prompt through its own ``compute_3d_position_ids`` and rotary embedding
    (untimed, as in its prefill) so the step reads that state's positions. 1-D families place the prompt in the
    bare model's forward, so each state runs a whole prefill (untimed) for its placement and its own cache. The
    shared cache is cut back by the step's token after each step; an own one grows by one token a step.
    """
    model, inputs, info = _setup(family, shape)
    step = dict(input_ids=torch.tensor([[1234]]))
    with torch.no_grad():
        _set_state(model, None)
        if family.positions:
            cache = getattr(model(**inputs, use_cache=True, logits_to_keep=1), _cache())
            emb = model.model.get_input_embeddings()(inputs["input_ids"]).detach()
            kw = _grid_args(inputs)

            def place(_):
                _place(model, kw, inputs["input_ids"], emb, None)
                return cache
        else:
            def place(_):
                return getattr(model(**inputs, use_cache=True, logits_to_keep=1), _cache())

        def some_steps(cache):
            for _ in range(steps):
                model(**step, **{_cache(): cache}, use_cache=True)
                if family.positions:  # the shared cache (sliding-window caches cannot be cut back)
                    cache.crop(-1)

        times = _interleaved(model, family.states, {"place": place, "decode": some_steps}, repeat, log)
    times = {s: {"decode": {c: [v / steps for v in t["decode"][c]] for c in t["decode"]}} for s, t in times.items()}
    return _rows(times, "model", family, shape, info, log)


def run(*, quick: bool = False, repeat: int = 5, shape: str | None = None, families=None, log=print) -> list[dict]:
    """Per family (all by default), at each of its shapes: the patched stages alone (Qwen-VL-shaped families) and
    the whole model (prefill, then decode steps timed on their own). Qwen2-VL runs at the scaled shape and, unless
    ``quick``, at the full one (``shape`` picks one of them); the other families at the scaled one."""
    out = []
    for fam in [FAMILIES[f] for f in families or FAMILIES]:
        names = [n for n in SHAPES if n in fam.shapes]
        rounds = 4 * repeat * 4 // len(fam.states)  # 4 per repeat with Qwen2-VL's 4 states: the same time per family
        for name in [n for n in ([shape] if shape else ["quick"] if quick else reversed(SHAPES)) if n in names]:
            if fam.positions:
                out += stages(name, rounds, log, family=fam)
            out += forward(name, repeat if name == "full" else rounds, log, family=fam)  # scaled: more rounds
            out += decode_only(name, rounds, log, family=fam)
    return out


def markdown(results: list[dict]) -> str:
    """The rows of ``results`` as a Markdown table: CPU-time median and ratio to stock, wall median."""
    lines = ["| family | what | shape (layers, hidden, tokens) | phase | state | CPU time | vs stock | wall time "
             "| vs stock |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.get('family', 'qwen2_vl')} | {r['kind']} | {r['shape']} ({r['layers']}, {r['hidden']}, "
                     f"{r['tokens']}) | {r['phase']} | "
                     f"{r['state']} | {r['cpu_median_s'] * 1e3:.2f} ms | {r['cpu_vs_stock']:.3f}x | "
                     f"{r['median_s'] * 1e3:.2f} ms | {r['vs_stock']:.3f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default=None, help="only this shape (default: both)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the scaled (quick) shape only")
    p.add_argument("--family", choices=FAMILIES, action="append", help="only this family (repeatable)")
    a = p.parse_args()
    run(quick=a.quick, shape=a.shape, repeat=a.repeat, families=a.family)
