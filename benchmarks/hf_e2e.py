"""End to end: a Qwen2-VL-shaped model with random weights, stock against ropekit-patched, prefill and decode.

One model instance is timed in four states, interleaved round-robin (patching between timed calls, never
inside them) so load from other processes falls on every state alike:

- ``stock``: transformers' own M-RoPE (``get_rope_index`` + its rotary embedding);
- ``mrope``: ``patch_model(model, "mrope")`` — the same positions through ropekit (bar: ≤ 1.02× stock);
- ``circle_age``: ``patch_model(model, "circle", age="alternate")`` — two geometries per forward;
- ``vrope``: ``patch_model(model, "vrope")`` — its own (6-axis) allocation.

Every measurement runs at the scaled ``quick`` shape and, unless ``--quick``, at the full one (8 layers of
hidden 1024 at L = 4096; a whole prefill there takes tens of seconds on a small CPU): the patched stages
alone (positions + cos/sin), the whole model's prefill with the decode step right after it, and decode
steps timed on their own over more rounds. Times are wall and process CPU time (the CPU time is the
steadier number on a loaded machine).

``prefill`` is one forward over the whole prompt (text and images, vision tower included,
``logits_to_keep=1`` as ``generate`` does); ``decode_first`` is one cached forward of one new text token
right after it (each timed prefill gives the cache its decode step reads); ``decode`` is the mean of a few
such steps, timed over more rounds than the prefills (the steadier decode number). Before timing, the patched ``mrope``
model's prefill logits must equal the stock model's.
"""
from __future__ import annotations

import statistics
import time
import warnings

import torch

IMG, VID = 31990, 31991  # inside the 32000-token vocabulary
MERGE = 2
PATCH = 14

SHAPES = {  # name -> (layers, hidden, heads, kv heads, intermediate, tokens, image token grid side)
    "full": (8, 1024, 8, 2, 2816, 4096, 28),
    "quick": (4, 512, 4, 2, 1408, 1024, 14),
}
STATES = {
    "stock": None,
    "mrope": dict(design="mrope"),
    "circle_age": dict(design="circle", age="alternate"),
    "vrope": dict(design="vrope"),
}


def _cache() -> str:
    """The KV-cache keyword of the installed transformers (``cache`` since 5.24, ``past_key_values`` before)."""
    from transformers import Qwen2VLForConditionalGeneration

    from ropekit.hf.boundary import cache_keyword
    return cache_keyword(Qwen2VLForConditionalGeneration.forward)


def build(layers: int, hidden: int, heads: int, kv: int, inter: int):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    head_dim = hidden // heads
    q = head_dim // 2 // 8  # mrope_section in Qwen2-VL's 2:3:3 proportion of the head_dim/2 pairs
    sections = [2 * q, 3 * q, head_dim // 2 - 5 * q]
    cfg = Qwen2VLConfig(
        text_config=dict(hidden_size=hidden, intermediate_size=inter, num_attention_heads=heads,
                         num_key_value_heads=kv, num_hidden_layers=layers, vocab_size=32000, bos_token_id=None,
                         eos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                              "mrope_section": sections}),
        vision_config=dict(depth=1, embed_dim=64, hidden_size=hidden, num_heads=2, mlp_ratio=1, spatial_merge_size=MERGE,
                           patch_size=PATCH, temporal_patch_size=2),
        image_token_id=IMG, video_token_id=VID,
    )
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(cfg).eval()


def prompt(tokens: int, side: int, seed: int = 0) -> dict:
    """One sequence of ``tokens``: text runs of 64 around as many ``side × side`` images as fit in 3/4 of it."""
    g = torch.Generator().manual_seed(seed)
    per_image = side * side
    images = max(1, (3 * tokens // 4) // per_image)
    text = tokens - images * per_image
    runs = [text // (images + 1)] * images + [text - images * (text // (images + 1))]
    ids, types = [], []
    for i, n in enumerate(runs):
        ids.append(torch.randint(100, 30000, (n,), generator=g))
        types.append(torch.zeros(n, dtype=torch.long))
        if i < images:
            ids.append(torch.full((per_image,), IMG))
            types.append(torch.ones(per_image, dtype=torch.long))
    ids = torch.cat(ids)[None]
    grid = torch.tensor([[1, side * MERGE, side * MERGE]]).repeat(images, 1)
    pixels = torch.randn(int(grid.prod(1).sum()), 3 * 2 * PATCH * PATCH, generator=g)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=torch.cat(types)[None],
                image_grid_thw=grid, pixel_values=pixels)


def _set_state(model, state) -> None:
    from ropekit.hf import is_patched, patch_model, unpatch_model

    if state is None:
        if is_patched(model):
            unpatch_model(model)
    else:
        patch_model(model, state["design"], age=state.get("age"))


class _Past:
    """Stands in for a KV cache of ``n`` tokens where only its length is read (position stages)."""

    def __init__(self, n: int):
        self.n = n

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.n


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _interleaved(model, phases: dict, repeat: int, log) -> dict:
    """``{state: {phase: {"wall": [...], "cpu": [...]}}}``: every phase of every state, round-robin.

    ``phases`` maps a phase name to ``fn(carry) -> carry``, run in order within a state (so a decode
    phase gets its prefill's cache). The first round warms up and is not kept.
    """
    times = {s: {ph: {"wall": [], "cpu": []} for ph in phases} for s in STATES}
    for r in range(repeat + 1):
        for s, state in STATES.items():
            _set_state(model, state)
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
            log(f"  round {r}/{repeat} {first}: " + ", ".join(f"{s} {times[s][first]['cpu'][-1]:.4f}s" for s in STATES))
    _set_state(model, None)
    return times


def _rows(times: dict, kind: str, shape: str, info: dict, log) -> list[dict]:
    out = []
    for ph in next(iter(times.values())):
        stock = {c: statistics.median(times["stock"][ph][c]) for c in ("wall", "cpu")}
        for s in STATES:
            t = times[s][ph]
            med = {c: statistics.median(t[c]) for c in ("wall", "cpu")}
            out.append({"kind": kind, "phase": ph, "state": s, "shape": shape, **info,
                        "median_s": med["wall"], "min_s": min(t["wall"]), "max_s": max(t["wall"]),
                        "cpu_median_s": med["cpu"], "repeat": len(t["wall"]),
                        "vs_stock": med["wall"] / stock["wall"], "cpu_vs_stock": med["cpu"] / stock["cpu"]})
            log(f"{kind:6s} {ph:7s} {s:10s} cpu {med['cpu'] * 1e3:9.2f} ms ({med['cpu'] / stock['cpu']:.3f}x stock)  "
                f"wall {med['wall'] * 1e3:9.2f} ms ({med['wall'] / stock['wall']:.3f}x)")
    return out


def _model_and_prompt(shape: str):
    """A random Qwen2-VL-shaped model of ``shape`` and its image prompt: ``(model, inputs, layers, hidden)``."""
    layers, hidden, heads, kv, inter, tokens, side = SHAPES[shape]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build(layers, hidden, heads, kv, inter)
    return model, prompt(tokens, side), layers, hidden


def stages(shape: str, repeat: int, log=print) -> list[dict]:
    """Only what the patch replaces: positions (``compute_3d_position_ids``) and cos/sin (``rotary_emb``)."""
    model, inputs, layers, hidden = _model_and_prompt(shape)
    inner, text = model.model, model.model.language_model
    L = inputs["input_ids"].shape[1]
    emb = inner.get_input_embeddings()(inputs["input_ids"]).detach()
    step_ids = torch.tensor([[1234]])
    step_emb = inner.get_input_embeddings()(step_ids).detach()

    def positions_and_tables(ids, x, past, **kw):
        pos = inner.compute_3d_position_ids(input_ids=ids, inputs_embeds=x, **{_cache(): past}, **kw)
        return text.rotary_emb(x, pos if pos is not None else torch.zeros(3, 1, x.shape[1]))

    kw = {k: inputs[k] for k in ("image_grid_thw", "attention_mask", "mm_token_type_ids")}
    phases = {"prefill": lambda _: positions_and_tables(inputs["input_ids"], emb, None, **kw),
              "decode": lambda _: positions_and_tables(step_ids, step_emb, _Past(L))}
    with torch.no_grad():
        times = _interleaved(model, phases, repeat, log)
    info = {"layers": layers, "hidden": hidden, "tokens": L, "images": len(inputs["image_grid_thw"])}
    return _rows(times, "stages", shape, info, log)


def forward(shape: str, repeat: int, log=print) -> list[dict]:
    """The whole model: prefill (vision tower included) and one cached decode step."""
    model, inputs, layers, hidden = _model_and_prompt(shape)
    L = inputs["input_ids"].shape[1]
    step = dict(input_ids=torch.tensor([[1234]]))  # no mask: stock transformers then places it at past + delta
    phases = {"prefill": lambda _: model(**inputs, use_cache=True, logits_to_keep=1).past_key_values,
              "decode_first": lambda cache: model(**step, **{_cache(): cache}, use_cache=True)}
    with torch.no_grad():
        _set_state(model, None)
        ref = model(**inputs, logits_to_keep=1).logits
        _set_state(model, STATES["mrope"])
        if not torch.equal(model(**inputs, logits_to_keep=1).logits, ref):
            raise AssertionError("patched mrope prefill logits differ from the stock model's")
        times = _interleaved(model, phases, repeat, log)
    info = {"layers": layers, "hidden": hidden, "tokens": L, "images": len(inputs["image_grid_thw"])}
    return _rows(times, "model", shape, info, log)


def decode_only(shape: str, repeat: int, log=print, steps: int = 5) -> list[dict]:
    """One cached decode step of the whole model after a prompt of ``shape``: per round, the mean of
    ``steps`` consecutive steps (each at the same cache length).

    The KV cache comes from one stock prefill (its values do not change the time of a step); each state
    places the prompt through its own ``compute_3d_position_ids`` and rotary embedding (untimed, as in
    its prefill) so the step reads that state's positions, and the cache is cut back by the step's token
    after each step.
    """
    model, inputs, layers, hidden = _model_and_prompt(shape)
    L = inputs["input_ids"].shape[1]
    inner = model.model
    emb = inner.get_input_embeddings()(inputs["input_ids"]).detach()
    kw = {k: inputs[k] for k in ("image_grid_thw", "attention_mask", "mm_token_type_ids")}
    step = dict(input_ids=torch.tensor([[1234]]))
    with torch.no_grad():
        _set_state(model, None)
        cache = model(**inputs, use_cache=True, logits_to_keep=1).past_key_values

        def place(_):
            pos = inner.compute_3d_position_ids(input_ids=inputs["input_ids"], inputs_embeds=emb,
                                                **{_cache(): None}, **kw)
            inner.language_model.rotary_emb(emb, pos if pos is not None else torch.zeros(3, 1, L))

        def some_steps(_):
            for _ in range(steps):
                model(**step, **{_cache(): cache}, use_cache=True)
                cache.crop(-1)

        times = _interleaved(model, {"place": place, "decode": some_steps}, repeat, log)
    times = {s: {"decode": {c: [v / steps for v in t["decode"][c]] for c in t["decode"]}} for s, t in times.items()}
    info = {"layers": layers, "hidden": hidden, "tokens": L, "images": len(inputs["image_grid_thw"])}
    return _rows(times, "model", shape, info, log)


def run(*, quick: bool = False, repeat: int = 5, shape: str | None = None, log=print) -> list[dict]:
    """The patched stages alone and the whole model (prefill, then decode steps timed on their own) at
    the scaled shape, and unless ``quick`` the same at the full one (``shape`` picks one of them)."""
    out = []
    for name in [shape] if shape else ["quick"] if quick else list(reversed(SHAPES)):
        out += stages(name, 4 * repeat, log)
        out += forward(name, repeat if name == "full" else 4 * repeat, log)  # a scaled prefill is cheap: more rounds
        out += decode_only(name, 4 * repeat, log)
    return out


def markdown(results: list[dict]) -> str:
    """The rows of ``results`` as a Markdown table: CPU-time median and ratio to stock, wall median."""
    lines = ["| what | shape (layers, hidden, tokens) | phase | state | CPU time | vs stock | wall time | vs stock |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['kind']} | {r['shape']} ({r['layers']}, {r['hidden']}, {r['tokens']}) | {r['phase']} | "
                     f"{r['state']} | {r['cpu_median_s'] * 1e3:.2f} ms | {r['cpu_vs_stock']:.3f}x | "
                     f"{r['median_s'] * 1e3:.2f} ms | {r['vs_stock']:.3f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default=None, help="only this shape (default: both)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the scaled (quick) shape only")
    a = p.parse_args()
    run(quick=a.quick, shape=a.shape, repeat=a.repeat)
