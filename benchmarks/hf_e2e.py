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

Shapes (:data:`SHAPES`): ``tiny`` (2 layers of hidden 64, 96 tokens: where the patch's fixed cost per forward
weighs most) and ``small`` (4 layers of hidden 256, 320 tokens with one image of 144 tokens) for every family at
batch 1 and 4; Qwen2-VL also at the scaled ``quick`` one (4 layers of hidden 512, L = 1024) and, unless
``--quick``, the full one (8 layers of hidden 1024 at L = 4096), at batch 1. A batch is that many prompts of the
same layout (ids and pixels of their own). By default only stock and the stock-equivalent patch are timed
(``--all-states``: every state).

Measured per state, each with its own KV cache: ``prefill`` (one forward over the prompt, vision tower included,
``logits_to_keep=1`` as ``generate`` does), ``decode`` (greedy steps of one token from that prefill's cache, the
row being the time of one step; no attention mask, the positions continuing the prompt the cache holds) and
``generate`` (``model.generate`` of as many new tokens, prefill included: the position tensor carried as data).
The ``stages`` rows time only what the patch replaces on the Qwen-VL-shaped families (a 1-D family has no
separate position stage): stock ``compute_3d_position_ids`` + ``rotary_emb`` against the patch's placement (the
prompt) or continuation (a decoding step) + its rotary. Times are wall and process CPU time (the CPU time is the
steadier number on a loaded machine); rows are medians over interleaved rounds, with their ratio to stock's.
Before timing, the stock-equivalent patch must give stock's logits bit for bit: the prefill's, those of every
decoding step, and the tokens of ``generate``.
"""
from __future__ import annotations

import functools
import os
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
    "small": (4, 256, 4, 2, 704, 320, 12),  # one image of 144 tokens in a 320-token prompt
    "tiny": (2, 64, 2, 1, 128, 96, 4),  # where the patch's fixed cost per forward weighs most
}


@functools.cache
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

    def inputs(self, shape: str, batch: int = 1) -> dict:
        """``batch`` prompts of the same layout (ids and pixels drawn from seeds 0, 1, ...), concatenated."""
        *_, tokens, side = SHAPES[shape]
        parts = [self.prompt(self, tokens, side, seed) for seed in range(batch)]
        return {k: torch.cat([p[k] for p in parts], dim=0) for k in parts[0]}


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
    """Stands in for a KV cache of ``n`` tokens where only its length is read (position stages); a patched state's
    carries the continuation its placement made, as the cache of a patched prefill does."""

    def __init__(self, n: int, continuation=None):
        self.n = n
        if continuation is not None:
            from ropekit.hf.hooks import CONTINUATION
            self.__dict__[CONTINUATION] = continuation

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.n


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _load() -> float:
    return os.getloadavg()[0]


def _interleaved(model, states: dict, phases: dict, repeat: int, log) -> dict:
    """``{state: {phase: {"wall": [...], "cpu": [...]}}}``: every phase of every state, round-robin, the order of
    the states reversed every other round (so no state always runs right after the same one).

    ``phases`` maps a phase name to ``fn(carry) -> carry``, run in order within a state (so a decode
    phase gets its own prefill's cache). The first round warms up and is not kept.
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


def _rows(times: dict, kind: str, family: Family, shape: str, info: dict, log, per: dict | None = None) -> list[dict]:
    """One row per state and phase: medians over rounds and their ratio to stock's, and the median of the ratios
    within a round (``cpu_paired_vs_stock``: stock and the state ran back to back, so a swing of the machine's load
    between rounds cancels out). ``per`` divides a phase's times by its count of steps (the time of one step)."""
    out = []
    per = per or {}
    for ph in next(iter(times.values())):
        n = per.get(ph, 1)
        stock = {c: statistics.median(times["stock"][ph][c]) / n for c in ("wall", "cpu")}
        for s in times:
            t = {c: [v / n for v in times[s][ph][c]] for c in ("wall", "cpu")}
            med = {c: statistics.median(t[c]) for c in ("wall", "cpu")}
            paired = statistics.median(a / b for a, b in zip(times[s][ph]["cpu"], times["stock"][ph]["cpu"]))
            out.append({"family": family.name, "kind": kind, "phase": ph, "state": s, "shape": shape, **info,
                        "steps": n, "median_s": med["wall"], "min_s": min(t["wall"]), "max_s": max(t["wall"]),
                        "cpu_median_s": med["cpu"], "repeat": len(t["wall"]),
                        "vs_stock": med["wall"] / stock["wall"], "cpu_vs_stock": med["cpu"] / stock["cpu"],
                        "cpu_paired_vs_stock": paired, "cpu_s": t["cpu"]})
            log(f"{family.name:8s} {kind:6s} {shape:5s} b{info['batch']} {ph:8s} {s:10s} cpu "
                f"{med['cpu'] * 1e3:9.3f} ms ({med['cpu'] / stock['cpu']:.3f}x stock, paired {paired:.3f}x)  wall "
                f"{med['wall'] * 1e3:9.3f} ms ({med['wall'] / stock['wall']:.3f}x)")
    return out


def _setup(family: Family, shape: str, batch: int = 1) -> tuple:
    """A random model of ``family`` at ``shape``, its prompt of ``batch`` samples and the rows' shape description."""
    layers, hidden = SHAPES[shape][:2]
    model, inputs = family.model(shape), family.inputs(shape, batch)
    images = int((inputs["input_ids"][0] == family.image_id).sum()) // SHAPES[shape][-1] ** 2
    return model, inputs, {"layers": layers, "hidden": hidden, "tokens": inputs["input_ids"].shape[1],
                           "images": images, "batch": batch}


def _grid_args(inputs: dict) -> dict:
    return {k: inputs[k] for k in ("image_grid_thw", "attention_mask", "mm_token_type_ids")}


def _stages_stock(model, inputs: dict, ids, emb, past):
    """What the patch replaces in a Qwen-VL-shaped family: the positions and the cos/sin tables."""
    inner = model.model
    pos = inner.compute_3d_position_ids(input_ids=ids, inputs_embeds=emb, **{_cache(): past}, **inputs)
    return inner.language_model.rotary_emb(emb, pos if pos is not None else torch.zeros(3, 1, emb.shape[1]))


def _stages_patched(model, given: dict, emb, past):
    """What replaces them in a patched model: its bare forward's placement (or the continuation of the prompt a
    cache holds) and its rotary's cos/sin, for every geometry (an AGE patch: two)."""
    from ropekit.hf import hooks
    inner = model.model
    pos, _ = hooks._positions_of_call(inner, inner.forward.state, given, past)
    return inner.language_model.rotary_emb(emb, pos)


def stages(shape: str, repeat: int, log=print, family: Family = QWEN2_VL, batch: int = 1,
           states: Optional[dict] = None) -> list[dict]:
    """Only what the patch replaces: positions and cos/sin, a prompt's and one decoding step's.

    Stock: ``compute_3d_position_ids`` and ``rotary_emb``. Patched: the bare forward's placement (the prompt) or
    the continuation a patched prefill keeps with its cache (the step), then the hooked ``rotary_emb``."""
    if not family.positions:
        raise ValueError(f"{family.name} places its tokens inside the bare model's forward: no stages to time")
    model, inputs, info = _setup(family, shape, batch)
    embed = model.model.get_input_embeddings()
    emb = embed(inputs["input_ids"]).detach()
    step_ids = torch.full((batch, 1), 1234)
    step_emb = embed(step_ids).detach()
    kw = _grid_args(inputs)
    n = info["tokens"]

    def prefill(_):
        if model.model.forward.__class__.__name__ != "Hook":
            _stages_stock(model, kw, inputs["input_ids"], emb, None)
            return None
        from ropekit.hf import hooks
        pos, record = hooks.placement(model.model, model.model.forward.state, dict(inputs))
        model.model.language_model.rotary_emb(emb, pos)
        return record

    def decode(record):
        if record is None:
            return _stages_stock(model, {}, step_ids, step_emb, _Past(n))
        given = dict(input_ids=step_ids)
        return _stages_patched(model, given, step_emb, _Past(n, record))

    with torch.no_grad():
        times = _interleaved(model, states or family.states, {"prefill": prefill, "decode": decode}, repeat, log)
    return _rows(times, "stages", family, shape, info, log)


def _greedy(model, inputs: dict, steps: int, keep: bool = False):
    """A prefill over the prompt, then ``steps`` cached steps of one token each (the argmax of the last logits; no
    mask, as a hand-written loop over unpadded prompts passes: stock Qwen2-VL builds its positions over the whole
    mask in a cached step without ``position_ids``); returns every step's logits when ``keep``."""
    out = model(**inputs, use_cache=True, logits_to_keep=1)
    cache, logits = getattr(out, _cache()), [out.logits[:, -1]]
    for _ in range(steps):
        tok = logits[-1].argmax(-1, keepdim=True)
        step = model(input_ids=tok, **{_cache(): cache}, use_cache=True).logits[:, -1]
        logits = logits + [step] if keep else [step]
    return logits


def _generate(model, inputs: dict, steps: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(**inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)


def _check_equivalent(model, family: Family, inputs: dict, steps: int, generate: bool = True) -> None:
    """The stock-equivalent patch must give the stock model's logits bit for bit: the prefill's and those of every
    cached step of a greedy decode, and (``generate``) the same tokens from ``generate``."""
    gen = (lambda: _generate(model, inputs, steps)) if generate else (lambda: torch.zeros(()))
    _set_state(model, None)
    ref, ref_gen = _greedy(model, inputs, steps, keep=True), gen()
    _set_state(model, family.states[family.equivalent])
    got, got_gen = _greedy(model, inputs, steps, keep=True), gen()
    _set_state(model, None)
    for i, (a, b) in enumerate(zip(got, ref)):
        if not torch.equal(a, b):
            what = "prefill" if i == 0 else f"decode step {i}"
            raise AssertionError(f"{family.name}: patched {family.equivalent} {what} logits differ from the stock model's")
    if not torch.equal(got_gen, ref_gen):
        raise AssertionError(f"{family.name}: patched {family.equivalent} generate differs from the stock model's")


def forward(shape: str, repeat: int, log=print, family: Family = QWEN2_VL, batch: int = 1, steps: int = 32,
            states: Optional[dict] = None, generate: bool = True) -> list[dict]:
    """The whole model, each state with its own KV cache: ``prefill`` (vision tower included), then ``decode``
    (``steps`` cached steps of greedy decoding from that prefill's cache, as :func:`_greedy`; the row is the time
    of one step) and, with ``generate``, ``model.generate`` of ``steps``
    new tokens (prefill included; the row is the whole call)."""
    model, inputs, info = _setup(family, shape, batch)
    info["load_start"] = _load()

    def prefill(_):
        out = model(**inputs, use_cache=True, logits_to_keep=1)
        return getattr(out, _cache()), out.logits[:, -1]

    def decode(carry):
        cache, logits = carry
        for _ in range(steps):
            tok = logits.argmax(-1, keepdim=True)
            logits = model(input_ids=tok, **{_cache(): cache}, use_cache=True).logits[:, -1]
        return None

    phases = {"prefill": prefill, "decode": decode}
    if generate:
        phases["generate"] = lambda _: _generate(model, inputs, steps)
    with torch.no_grad():
        _check_equivalent(model, family, inputs, steps, generate)
        times = _interleaved(model, states or family.states, phases, repeat, log)
    info["load_end"] = _load()
    return _rows(times, "model", family, shape, info, log, per={"decode": steps})


def equivalent_states(family: Family) -> dict:
    """Stock and the family's stock-equivalent patch: the pair the ≤ 1.02× bar is about."""
    return {"stock": None, family.equivalent: family.states[family.equivalent]}


def run(*, quick: bool = False, repeat: int = 5, shape: str | None = None, families=None, batches=(1, 4),
        steps: int = 32, all_states: bool = False, log=print) -> list[dict]:
    """Per family (all by default), at each of its shapes and ``batches``: the patched stages alone
    (Qwen-VL-shaped families) and the whole model (prefill, decode steps from each state's own cache, generate).
    Every family runs at the ``tiny`` and ``small`` shapes; Qwen2-VL also at ``quick`` and, unless ``quick``, at
    ``full`` (batch 1 there). ``shape`` picks one. Stock and the stock-equivalent patch only, unless
    ``all_states``."""
    out = []
    for fam in [FAMILIES[f] for f in families or FAMILIES]:
        states = fam.states if all_states else equivalent_states(fam)
        names = [n for n in SHAPES if n in fam.shapes + ("tiny", "small")]
        wanted = [shape] if shape else (["tiny", "small", "quick"] if quick else ["tiny", "small", "quick", "full"])
        for name in [n for n in wanted if n in names]:
            big = name in ("quick", "full")
            for b in ((1,) if big else batches):
                rounds = max(3, repeat if name == "full" else 4 * repeat)
                if fam.positions:
                    out += stages(name, rounds, log, family=fam, batch=b, states=states)
                out += forward(name, rounds, log, family=fam, batch=b, steps=8 if big else steps, states=states,
                               generate=not big)
    return out


def markdown(results: list[dict]) -> str:
    """The rows of ``results`` as a Markdown table: CPU-time median and ratio to stock, wall median."""
    lines = ["| family | what | shape (layers, hidden, tokens) | batch | phase | state | CPU time | vs stock "
             "| paired | wall time | vs stock |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        phase = r["phase"] + (f" (per step of {r['steps']})" if r.get("steps", 1) > 1 else "")
        lines.append(f"| {r.get('family', 'qwen2_vl')} | {r['kind']} | {r['shape']} ({r['layers']}, {r['hidden']}, "
                     f"{r['tokens']}) | {r.get('batch', 1)} | {phase} | "
                     f"{r['state']} | {r['cpu_median_s'] * 1e3:.3f} ms | {r['cpu_vs_stock']:.3f}x | "
                     f"{r.get('cpu_paired_vs_stock', r['cpu_vs_stock']):.3f}x | "
                     f"{r['median_s'] * 1e3:.3f} ms | {r['vs_stock']:.3f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    import json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default=None, help="only this shape (default: all of a family's)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="leave out the full shape")
    p.add_argument("--family", choices=FAMILIES, action="append", help="only this family (repeatable)")
    p.add_argument("--batch", type=int, action="append", help="batch sizes at the tiny and small shapes (default 1, 4)")
    p.add_argument("--steps", type=int, default=32, help="decoding steps at the tiny and small shapes")
    p.add_argument("--all-states", action="store_true", help="every state (default: stock and the equivalent patch)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="write the rows here")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    res = run(quick=a.quick, shape=a.shape, repeat=a.repeat, families=a.family, batches=tuple(a.batch or (1, 4)),
              steps=a.steps, all_states=a.all_states)
    print(markdown(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": torch.get_num_threads(), "torch": torch.__version__, "results": res}, f, indent=1)
