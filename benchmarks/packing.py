"""Training throughput of packed (padding-free) rows against padded batches on a tiny patched Qwen2-VL.

The same long-tailed mix of multimodal samples (fixed seed) is trained on both ways, with the same batches of
``batch`` samples and the same number of optimizer steps (AdamW) from the same initial weights:

- ``padded``: each batch padded to its longest sample (right padding by default, ``--pad left``), with its
  ``attention_mask``, labels ``-100`` on the pads; the patched model places the tokens from the mask.
- ``packed``: the same samples laid end to end in one row by :func:`ropekit.hf.pack` (no padding, the position
  tensor's text row restarting per sample, each sample's first label ``-100``).

A timed step is collation (padding, or :func:`~ropekit.hf.pack`, which places every sample) + forward with loss +
backward + ``optimizer.step()``. Per design (``circle`` with ``age="alternate"``, and the stock-equivalent
``mrope`` with ``continuation="spatial"``), the two modes run interleaved round-robin (order reversed every other
round; each round restarts from the initial weights and a fresh optimizer; the first round warms up and is not
kept). Reported: real (non-pad) tokens per second of each (wall, and process CPU time, the steadier number on a
loaded machine), medians over rounds, their ratio, and the share of padding (pad tokens / all tokens of the padded
batches) that packing removes. Before its numbers count, every round checks that the two modes' first-step losses
(sum of token losses / token count, from the same weights) agree to ``LOSS_RTOL``, so both time the same
computation.

The samples: text lengths log-normal (median ``TEXT_MEDIAN``, sigma ``TEXT_SIGMA``, clipped), 0-3 images per
sample (grids of 4-16 patches a side, merged 2 × 2 into 4-64 tokens each) placed between the text runs.

Run: ``python -m benchmarks.packing [--quick] [--threads 1]`` (writes ``benchmarks/results/packing-<date>/
packing.json`` unless ``--out``), or ``python -m benchmarks.run --only packing`` with the other suites' options.
"""
from __future__ import annotations

import math
import os
import statistics
import time
import warnings
from typing import Optional

import torch

# the tiny model: text hidden 128, 4 layers of 4 heads (head_dim 32, 16 rotary pairs), 2 KV heads
LAYERS, HIDDEN, HEADS, KV, INTER, VOCAB = 4, 128, 4, 2, 384, 4096
SECTIONS = [4, 6, 6]  # M-RoPE's 2:3:3 split of the 16 pairs
IMG, VID, PAD = VOCAB - 2, VOCAB - 1, 0
PATCH, TEMPORAL, MERGE = 2, 2, 2
PATCH_DIM = 3 * TEMPORAL * PATCH * PATCH
# the sample mix
TEXT_MEDIAN, TEXT_SIGMA, TEXT_MIN, TEXT_MAX = 64, 1.0, 8, 1536
IMAGES_P = (0.2, 0.4, 0.25, 0.15)  # P(0, 1, 2, 3 images)
SIDES = (4, 8, 12, 16)  # image grid side in patches (merged 2 x 2: 2-8 tokens a side)
SEED = 0
LOSS_RTOL = 1e-5
DESIGNS = {"circle_age": dict(design="circle", age="alternate"),
           "mrope": dict(design="mrope", continuation="spatial")}
SIZES = {"full": dict(batch=8, steps=8), "quick": dict(batch=4, steps=3)}


def build_model():
    """The tiny random Qwen2-VL (sdpa attention, no dropout), in train mode."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    cfg = Qwen2VLConfig(
        text_config=dict(hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=HEADS,
                         num_key_value_heads=KV, num_hidden_layers=LAYERS, vocab_size=VOCAB, bos_token_id=None,
                         eos_token_id=None, pad_token_id=PAD,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": SECTIONS}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=HIDDEN, num_heads=2, mlp_ratio=1,
                           spatial_merge_size=MERGE, patch_size=PATCH, temporal_patch_size=TEMPORAL),
        image_token_id=IMG, video_token_id=VID,
    )
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Qwen2VLForConditionalGeneration(cfg).train()


def make_samples(n: int, seed: int = SEED) -> list[dict]:
    """``n`` per-sample processor outputs (``input_ids (1, L)``, all-ones ``attention_mask``,
    ``mm_token_type_ids``, and, with images, ``image_grid_thw`` and ``pixel_values``) of the long-tailed mix."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.tensor(IMAGES_P)
    out = []
    for _ in range(n):
        text = math.exp(math.log(TEXT_MEDIAN) + TEXT_SIGMA * float(torch.randn((), generator=g)))
        text = int(min(max(round(text), TEXT_MIN), TEXT_MAX))
        images = int(torch.multinomial(probs, 1, generator=g))
        # text split into images + 1 runs at random cut points (a run may be empty)
        cuts = sorted(torch.randint(0, text + 1, (images,), generator=g).tolist())
        runs = [b - a for a, b in zip([0, *cuts], [*cuts, text])]
        ids, types, grids = [], [], []
        for i, r in enumerate(runs):
            ids += torch.randint(1, IMG, (r,), generator=g).tolist()
            types += [0] * r
            if i < images:
                h, w = (SIDES[int(j)] for j in torch.randint(0, len(SIDES), (2,), generator=g))
                ids += [IMG] * (h * w // MERGE ** 2)
                types += [1] * (h * w // MERGE ** 2)
                grids.append([1, h, w])
        ids_t = torch.tensor([ids])
        s = dict(input_ids=ids_t, attention_mask=torch.ones_like(ids_t), mm_token_type_ids=torch.tensor([types]))
        if grids:
            grid = torch.tensor(grids)
            s.update(image_grid_thw=grid, pixel_values=torch.randn(int(grid.prod(1).sum()), PATCH_DIM, generator=g))
        out.append(s)
    return out


def pad_batch(samples: list[dict], side: str = "right") -> dict:
    """The samples as one batch padded to the longest: ids (``PAD``), ``attention_mask``, ``mm_token_type_ids``,
    labels (the ids, ``-100`` on pads and on each sample's first token, as :func:`ropekit.hf.pack` sets them, so
    both modes count the same tokens), and the images stacked in sample order."""
    lengths = [s["input_ids"].shape[1] for s in samples]
    B, L = len(samples), max(lengths)
    ids = torch.full((B, L), PAD, dtype=torch.long)
    mask = torch.zeros(B, L, dtype=torch.long)
    types = torch.zeros(B, L, dtype=torch.long)
    labels = torch.full((B, L), -100, dtype=torch.long)
    for b, (s, n) in enumerate(zip(samples, lengths)):
        sl = slice(L - n, L) if side == "left" else slice(0, n)
        ids[b, sl] = s["input_ids"][0]
        mask[b, sl] = 1
        types[b, sl] = s["mm_token_type_ids"][0]
        labels[b, sl] = s["input_ids"][0]
        labels[b, sl.start] = -100
    out = dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=types, labels=labels)
    with_images = [s for s in samples if "image_grid_thw" in s]
    if with_images:
        out["image_grid_thw"] = torch.cat([s["image_grid_thw"] for s in with_images])
        out["pixel_values"] = torch.cat([s["pixel_values"] for s in with_images])
    return out


def _counted(labels: torch.Tensor) -> int:
    """Tokens the shifted next-token loss counts (labels after the first position that are not -100)."""
    return int((labels[..., 1:] != -100).sum())


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _train(model, init: dict, batches: list[list[dict]], collate, lr: float = 1e-4) -> dict:
    """``len(batches)`` optimizer steps from ``init`` with a fresh AdamW; per step wall and CPU seconds (collation
    included) and the loss as (sum of token losses, token count)."""
    model.load_state_dict(init)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    wall, cpu, losses, collate_s = [], [], [], []
    for samples in batches:
        w0, c0 = _clock()
        batch = collate(samples)
        w1, _ = _clock()
        out = model(**batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        w2, c2 = _clock()
        wall.append(w2 - w0)
        cpu.append(c2 - c0)
        collate_s.append(w1 - w0)
        n = _counted(batch["labels"])
        losses.append((float(out.loss.detach()) * n, n))
    return {"wall": wall, "cpu": cpu, "collate": collate_s, "losses": losses}


def _stats(samples: list[dict], batches: list[list[dict]]) -> dict:
    lengths = [s["input_ids"].shape[1] for s in samples]
    real = sum(lengths)
    padded = sum(len(b) * max(s["input_ids"].shape[1] for s in b) for b in batches)
    images = [0 if "image_grid_thw" not in s else s["image_grid_thw"].shape[0] for s in samples]
    return {"samples": len(samples), "real_tokens": real, "padded_tokens": padded, "pad_tokens": padded - real,
            "pad_share": (padded - real) / padded,
            "length_min": min(lengths), "length_median": statistics.median(lengths), "length_max": max(lengths),
            "length_mean": real / len(lengths), "images": sum(images),
            "image_tokens": sum(int((s["input_ids"] == IMG).sum()) for s in samples),
            # query-key pairs an unblocked attention computes per head and layer: padded batches, and the packed
            # row (sdpa on CPU computes the whole row x row product under a block-diagonal mask)
            "attention_pairs_padded": sum(len(b) * max(s["input_ids"].shape[1] for s in b) ** 2 for b in batches),
            "attention_pairs_packed": sum(sum(s["input_ids"].shape[1] for s in b) ** 2 for b in batches),
            "attention_pairs_needed": sum(n * n for n in lengths)}


def run_design(name: str, patch: dict, *, batch: int, steps: int, repeat: int, pad: str = "right",
               log=print) -> dict:
    """One design: ``repeat`` kept rounds (plus one warm-up) of both modes over the same ``steps`` batches."""
    from ropekit.hf import pack, patch_model

    samples = make_samples(batch * steps)
    batches = [samples[i * batch:(i + 1) * batch] for i in range(steps)]
    stats = _stats(samples, batches)
    model = build_model()
    patch_model(model, **patch)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    modes = {"padded": lambda s: pad_batch(s, pad), "packed": lambda s: pack(model, s)}
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    runs: dict = {m: [] for m in modes}
    first: list[dict] = []
    for r in range(repeat + 1):
        this = {}
        for m in (list(modes) if r % 2 else list(modes)[::-1]):
            this[m] = _train(model, init, batches, modes[m])
            if r:
                runs[m].append(this[m])
        (sp, np_), (sq, nq) = this["padded"]["losses"][0], this["packed"]["losses"][0]
        if np_ != nq:
            raise AssertionError(f"{name}: padded and packed count different tokens ({np_} vs {nq})")
        lp, lq = sp / np_, sq / nq
        rel = abs(lp - lq) / abs(lp)
        first.append({"round": r, "padded": lp, "packed": lq, "abs_diff": abs(lp - lq), "rel_diff": rel})
        if rel > LOSS_RTOL:
            raise AssertionError(f"{name}: first-step losses differ: padded {lp:.8f}, packed {lq:.8f} (rel {rel:.2e} "
                                 f"> {LOSS_RTOL}); the two modes do not compute the same thing")
        if r:
            log(f"  {name} round {r}/{repeat}: " + ", ".join(
                f"{m} {sum(runs[m][-1]['cpu']):.2f} s CPU / {sum(runs[m][-1]['wall']):.2f} s wall" for m in modes)
                + f"; load {os.getloadavg()[0]:.2f}")
    load1 = os.getloadavg()
    out = {"design": name, "patch": {k: v for k, v in patch.items()}, "batch": batch, "steps": steps, "pad": pad,
           "rounds": repeat, "started": started, "load_before": load0, "load_after": load1, **stats,
           "first_step_loss": first, "modes": {}}
    for m in modes:
        wall = [sum(x["wall"]) for x in runs[m]]
        cpu = [sum(x["cpu"]) for x in runs[m]]
        coll = [sum(x["collate"]) for x in runs[m]]
        out["modes"][m] = {
            "tokens_total": stats["padded_tokens"] if m == "padded" else stats["real_tokens"],
            "run_wall_median_s": statistics.median(wall), "run_wall_min_s": min(wall), "run_wall_max_s": max(wall),
            "run_cpu_median_s": statistics.median(cpu), "collate_wall_median_s": statistics.median(coll),
            "real_tokens_per_s": statistics.median(stats["real_tokens"] / w for w in wall),
            "real_tokens_per_cpu_s": statistics.median(stats["real_tokens"] / c for c in cpu),
            "step_wall_median_s": statistics.median(t for x in runs[m] for t in x["wall"]),
            "last_step_loss": runs[m][-1]["losses"][-1][0] / runs[m][-1]["losses"][-1][1],
            "round_wall_s": wall, "round_cpu_s": cpu,
        }
    pk, pd = out["modes"]["packed"], out["modes"]["padded"]
    out["speedup_wall"] = pk["real_tokens_per_s"] / pd["real_tokens_per_s"]
    out["speedup_cpu"] = pk["real_tokens_per_cpu_s"] / pd["real_tokens_per_cpu_s"]
    # per-round paired ratios (each round's packed run against the same round's padded run)
    out["speedup_wall_paired_median"] = statistics.median(
        a / b for a, b in zip(pd["round_wall_s"], pk["round_wall_s"]))
    out["speedup_cpu_paired_median"] = statistics.median(
        a / b for a, b in zip(pd["round_cpu_s"], pk["round_cpu_s"]))
    log(f"{name}: {stats['real_tokens']} real tokens in {steps} steps of {batch} samples; padded batches "
        f"{stats['padded_tokens']} tokens ({stats['pad_share']:.1%} padding); real tokens/s (CPU time): padded "
        f"{pd['real_tokens_per_cpu_s']:.0f}, packed {pk['real_tokens_per_cpu_s']:.0f} -> {out['speedup_cpu']:.2f}x "
        f"(wall {pd['real_tokens_per_s']:.0f} vs {pk['real_tokens_per_s']:.0f}, {out['speedup_wall']:.2f}x); "
        f"first-step loss padded {first[0]['padded']:.6f} packed {first[0]['packed']:.6f} "
        f"(max rel diff {max(f['rel_diff'] for f in first):.1e}); load {load0[0]:.2f} -> {load1[0]:.2f}")
    return out


def run(*, quick: bool = False, repeat: int = 5, pad: str = "right", designs=None, batch: Optional[int] = None,
        steps: Optional[int] = None, log=print) -> list[dict]:
    """Both modes for each design (all of :data:`DESIGNS` by default); ``quick``: smaller batches, fewer steps,
    at most 2 rounds. ``batch``/``steps`` override the size's samples per batch and optimizer steps."""
    size = dict(SIZES["quick" if quick else "full"])
    size.update({k: v for k, v in (("batch", batch), ("steps", steps)) if v is not None})
    rounds = min(repeat, 2) if quick else repeat
    return [run_design(d, DESIGNS[d], **size, repeat=rounds, pad=pad, log=log) for d in designs or DESIGNS]


def markdown(results: list[dict]) -> str:
    """The rows as the Markdown table of docs/benchmarks.md."""
    lines = ["| design | padding removed | padded: real tokens/s (CPU) | packed: real tokens/s (CPU) | packed ÷ padded "
             "(CPU) | packed ÷ padded (wall) | first-step loss, padded / packed | load |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        pd, pk = r["modes"]["padded"], r["modes"]["packed"]
        f = r["first_step_loss"][0]
        lines.append(f"| {r['design']} | {r['pad_share']:.1%} | {pd['real_tokens_per_cpu_s']:.0f} | "
                     f"{pk['real_tokens_per_cpu_s']:.0f} | **{r['speedup_cpu']:.2f}×** | {r['speedup_wall']:.2f}× | "
                     f"{f['padded']:.6f} / {f['packed']:.6f} | {r['load_before'][0]:.1f}–{r['load_after'][0]:.1f} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    import argparse
    import json
    from pathlib import Path

    from .common import ALLOCATOR_MODES, machine, pin_allocator

    p = argparse.ArgumentParser(prog="python -m benchmarks.packing", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 samples a batch, 3 steps, at most 2 rounds")
    p.add_argument("--repeat", type=int, default=5, help="kept rounds per design (default 5, plus one warm-up)")
    p.add_argument("--pad", choices=("right", "left"), default="right", help="padding side of the padded batches")
    p.add_argument("--batch", type=int, default=None, help="samples per batch (default 8; --quick 4)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 8; --quick 3)")
    p.add_argument("--design", choices=DESIGNS, action="append", help="only this design (repeatable)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads before running")
    p.add_argument("--allocator", choices=ALLOCATOR_MODES, default="steady")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for packing.json (default benchmarks/results/packing-<date>)")
    a = p.parse_args(argv)
    if a.repeat < 1 or (a.batch is not None and a.batch < 1) or (a.steps is not None and a.steps < 1):
        p.error("--repeat, --batch and --steps must be >= 1")
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    out = a.out or Path(__file__).resolve().parent / "results" / f"packing-{time.strftime('%Y-%m-%d')}"
    info = machine()
    info["allocator"] = pin_allocator(a.allocator)
    header = {"machine": info, "quick": a.quick, "repeat": a.repeat, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    res = run(quick=a.quick, repeat=a.repeat, pad=a.pad, designs=a.design, batch=a.batch, steps=a.steps,
              log=lambda s: print(s, flush=True))
    print(markdown(res))
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("packing-quick.json" if a.quick else "packing.json")
    path.write_text(json.dumps({**header, "finished_load_average": os.getloadavg(), "results": res}, indent=1,
                               default=str) + "\n")
    print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
