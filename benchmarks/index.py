"""Batch position ids: ``ropekit.index.rope_index`` against transformers' Qwen2-VL ``get_rope_index``.

Batches of long multimodal samples (32 of about 2.5k tokens, and 2k–8k tokens, several images and videos
each, right padded). The outputs are asserted identical before anything is timed. On the ~2.5k batch,
every design with a block rule is also timed in its own pair with transformers (:func:`bench_designs`).

Circle-RoPE (:func:`bench_circle`): a batch of 32 samples of at most 4k tokens with 2–3 images and one
video each, ropekit's ``circle`` against its own ``mrope`` and transformers' ``get_rope_index`` on the
same batch, and against the public Circle-RoPE index function of the Multimodal-RoPEs repository when
the environment variable ``ROPEKIT_PEER_MULTIMODAL_ROPES`` names a checkout of it (the directory that
holds its ``multimodal_ropes`` package). Nothing of that code is part of ropekit; without the variable
the peer column is left out.
"""
from __future__ import annotations

import os
import random
import sys
import warnings

import torch

from .common import timeit_many

MERGE = 2


def _hf_model():
    """A tiny randomly initialised Qwen2-VL model: only its ``get_rope_index`` is used."""
    from transformers import Qwen2VLConfig, Qwen2VLModel

    cfg = Qwen2VLConfig(
        text_config=dict(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, vocab_size=64, bos_token_id=None, eos_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]},
        ),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=16, num_heads=2, mlp_ratio=1,
                           spatial_merge_size=MERGE, patch_size=2, temporal_patch_size=2),
    )
    return Qwen2VLModel(cfg).eval()


def make_batch(batch: int, seed: int = 0, min_len: int = 2048, max_len: int = 8192) -> dict:
    """Random samples of text runs, images (1 × h × w patches) and videos (t × h × w), right padded."""
    rng = random.Random(seed)
    rows, images, videos = [], [], []
    for _ in range(batch):
        target = rng.randint(min_len, max_len)
        row = [0] * rng.randint(8, 64)
        while len(row) < target:
            if rng.random() < 0.6:
                grid = [1, 2 * rng.randint(4, 20), 2 * rng.randint(4, 20)]
                images.append(grid)
                row += [1] * (grid[0] * grid[1] * grid[2] // MERGE**2)
            else:
                grid = [rng.randint(2, 6), 2 * rng.randint(3, 10), 2 * rng.randint(3, 10)]
                videos.append(grid)
                row += [2] * (grid[0] * grid[1] * grid[2] // MERGE**2)
            row += [0] * rng.randint(4, 128)
        rows.append(row)
    length = max(map(len, rows))
    types = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.zeros(batch, length, dtype=torch.long)
    for b, row in enumerate(rows):
        types[b, : len(row)] = torch.tensor(row)
        mask[b, : len(row)] = 1
    return dict(
        input_ids=torch.randint(0, 50, (batch, length), generator=torch.Generator().manual_seed(seed)),
        mm_token_type_ids=types,
        attention_mask=mask,
        image_grid_thw=torch.tensor(images, dtype=torch.long),
        video_grid_thw=torch.tensor(videos, dtype=torch.long),
    )


#: The batch of the performance target: 32 right-padded samples of about 2.5k tokens (2048–2560 drawn, each
#: ending after its last vision item and text), 11 images and videos each on average.
TARGET = dict(batch=32, seed=32, min_len=2048, max_len=2560)


def bench_batch(batch: int, *, repeat: int, model=None, inputs: dict | None = None) -> dict:
    from ropekit.index import rope_index

    model = model or _hf_model()
    inputs = inputs if inputs is not None else make_batch(batch, seed=batch)
    ours = lambda: rope_index(**inputs, design="mrope", continuation="spatial", spatial_merge_size=MERGE)
    theirs = lambda: model.get_rope_index(**inputs)
    with torch.no_grad():
        (pos, delta), (want_pos, want_delta) = ours(), theirs()
        if not (torch.equal(pos, want_pos.to(pos.dtype)) and torch.equal(delta.to(want_delta.dtype), want_delta)):
            raise AssertionError(f"rope_index differs from transformers' get_rope_index on a batch of {batch}")
        t = timeit_many({"transformers": theirs, "ropekit": ours}, warmup=1, repeat=repeat)
        t_hf, t_ours = t["transformers"], t["ropekit"]
    lengths = inputs["attention_mask"].sum(1)
    return {
        "batch": batch,
        "tokens": int(lengths.sum()),
        "seq_len_min": int(lengths.min()),
        "seq_len_max": int(lengths.max()),
        "images": len(inputs["image_grid_thw"]),
        "videos": len(inputs["video_grid_thw"]),
        "identical_to_transformers": True,
        "transformers_get_rope_index": t_hf,
        "ropekit_rope_index": t_ours,
        "speedup": t_hf["median_s"] / t_ours["median_s"],
        "speedup_cpu": t_hf["cpu_median_s"] / t_ours["cpu_median_s"],
    }


def bench_designs(*, repeat: int, model=None) -> dict:
    """Every design with a block rule on the :data:`TARGET` batch, each timed in its own round-robin pair with
    transformers' ``get_rope_index`` (so that every design runs right after it, caches cold alike).

    ``rope_index`` keeps the blocks a rule placed for later calls (:mod:`ropekit.block_cache`), so from the
    second call on the same batch finds every block kept, as a training loop finds the block shapes it has
    seen. Each design is also timed with nothing kept (the cache emptied before every call: every block of
    the batch placed anew), in a second pair with transformers.

    Before timing, each design's positions are checked against one ``positions()`` call per sample, and
    M-RoPE's (``continuation="spatial"``) against transformers' positions and deltas."""
    from ropekit import block_cache
    from ropekit.designs.registry import designs, get_design
    from ropekit.index import rope_index

    model = model or _hf_model()
    inputs = make_batch(TARGET["batch"], seed=TARGET["seed"], min_len=TARGET["min_len"], max_len=TARGET["max_len"])
    theirs = lambda: model.get_rope_index(**inputs)
    out = {}
    with torch.no_grad():
        want_pos, want_delta = theirs()
        for name in designs():
            if get_design(name).block_rule is None:
                continue
            opts = {"continuation": "spatial"} if name == "mrope" else {}
            ours = lambda name=name, opts=opts: rope_index(**inputs, design=name, spatial_merge_size=MERGE, **opts)
            pos, delta = ours()
            check_positions(name, inputs, pos, **opts)
            if name == "mrope" and not (torch.equal(pos, want_pos.float()) and torch.equal(delta, want_delta.float())):
                raise AssertionError("rope_index(mrope) differs from transformers' get_rope_index")
            t = timeit_many({"transformers": theirs, name: ours}, warmup=1, repeat=repeat)
            # the same call with nothing kept from earlier calls (every block placed anew, as in a batch whose
            # block shapes were never seen before), in a pair of its own
            fresh = lambda ours=ours: (block_cache.clear(), ours())
            c = timeit_many({"transformers": theirs, name: fresh}, warmup=1, repeat=repeat)
            out[name] = {"options": opts, "transformers": t["transformers"], "ropekit": t[name],
                         "speedup": t["transformers"]["median_s"] / t[name]["median_s"],
                         "speedup_cpu": t["transformers"]["cpu_median_s"] / t[name]["cpu_median_s"],
                         "nothing_kept": {"transformers": c["transformers"], "ropekit": c[name],
                                          "speedup_cpu": c["transformers"]["cpu_median_s"] / c[name]["cpu_median_s"]}}
    lengths = inputs["attention_mask"].sum(1)
    return {"batch": TARGET, "tokens": int(lengths.sum()), "mean_len": float(lengths.float().mean()),
            "images": len(inputs["image_grid_thw"]), "videos": len(inputs["video_grid_thw"]), "designs": out}


PEER_ENV = "ROPEKIT_PEER_MULTIMODAL_ROPES"
VISION_START, IMAGE_ID, VIDEO_ID = 1, 2, 3  # token ids the peer looks for; ordinary text ids are 10–49
#: ropekit's circle options that match the peer's ``radius="auto"`` with ``move_to_origin=True``
CIRCLE_OPTIONS = dict(radius="auto", k=1.0, measure="max_abs", alpha=0.5)


def make_circle_batch(batch: int, seed: int = 0, max_len: int = 4096) -> dict:
    """``batch`` right-padded samples of at most ``max_len`` tokens: text runs, 2–3 images and one video in a
    random order. The video is laid out as Qwen3-VL does (and as the public Circle-RoPE code expects): each
    frame is a block of its own after a timestamp token; every block follows a vision-start token."""
    rng = random.Random(seed)
    rows, ids, images, videos = [], [], [], []
    while len(rows) < batch:
        grids = [("image", 1, 2 * rng.randint(6, 28), 2 * rng.randint(6, 28)) for _ in range(rng.randint(2, 3))]
        grids.append(("video", rng.randint(4, 16), 2 * rng.randint(4, 14), 2 * rng.randint(4, 14)))
        rng.shuffle(grids)
        row, tok, img, vid = [], [], [], []
        for kind, t, h, w in grids:
            row += [0] * rng.randint(8, 160)
            for f in range(t if kind == "video" else 1):
                if f:
                    row.append(0)  # the frame's timestamp
                row.append(0)  # vision start
                tok += [rng.randint(10, 49) for _ in range(len(row) - len(tok) - 1)] + [VISION_START]
                n = h * w // MERGE**2
                row += [1 if kind == "image" else 2] * n
                tok += [IMAGE_ID if kind == "image" else VIDEO_ID] * n
                (img if kind == "image" else vid).append([1, h, w])
        row += [0] * rng.randint(8, 160)
        tok += [rng.randint(10, 49) for _ in range(len(row) - len(tok))]
        if len(row) <= max_len:
            rows.append(row), ids.append(tok), images.extend(img), videos.extend(vid)
    length = max(map(len, rows))
    types, input_ids, mask = (torch.zeros(batch, length, dtype=torch.long) for _ in range(3))
    for b, (row, tok) in enumerate(zip(rows, ids)):
        types[b, : len(row)], input_ids[b, : len(row)], mask[b, : len(row)] = torch.tensor(row), torch.tensor(tok), 1
    return dict(input_ids=input_ids, mm_token_type_ids=types, attention_mask=mask,
                image_grid_thw=torch.tensor(images, dtype=torch.long), video_grid_thw=torch.tensor(videos, dtype=torch.long))


def _peer_circle():
    """The public Circle-RoPE index function bound to a minimal model stand-in, or None without a checkout."""
    root = os.environ.get(PEER_ENV)
    if not root:
        return None
    if not os.path.isdir(os.path.join(root, "multimodal_ropes")):
        raise SystemExit(f"{PEER_ENV}={root!r}: no multimodal_ropes package there; point it at a checkout of "
                         f"github.com/JJJYmmm/Multimodal-RoPEs")
    sys.path.insert(0, root)
    try:
        from multimodal_ropes.configs.circlerope import CircleRopeConfig
        from multimodal_ropes.pos_design.circlerope import get_circlerope_index
    finally:
        sys.path.remove(root)
    from types import SimpleNamespace

    cfg = CircleRopeConfig(dim=128, radius="auto", alpha=0.5, move_to_origin=True)
    model = SimpleNamespace(config=SimpleNamespace(
        vision_config=SimpleNamespace(spatial_merge_size=MERGE), image_token_id=IMAGE_ID,
        video_token_id=VIDEO_ID, vision_start_token_id=VISION_START))
    return lambda inputs: get_circlerope_index(model, extra_config=cfg, **inputs)


def bench_circle(*, repeat: int, model=None, batch: int = 32) -> dict:
    """rope_index(design="circle") against mrope and transformers on one batch, and the public code if given."""
    from ropekit.index import rope_index

    model = model or _hf_model()
    inputs = make_circle_batch(batch, seed=batch)
    cases = {
        "transformers_mrope": lambda: model.get_rope_index(**inputs),
        "ropekit_mrope": lambda: rope_index(**inputs, design="mrope", spatial_merge_size=MERGE),
        "ropekit_circle": lambda: rope_index(**inputs, design="circle", spatial_merge_size=MERGE, **CIRCLE_OPTIONS),
    }
    peer = _peer_circle()
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        ours = cases["ropekit_circle"]()[0]
        check_positions("circle", inputs, ours, **CIRCLE_OPTIONS)
        r = {"batch": batch, "tokens": int(mask.sum()), "seq_len_max": int(mask.sum(1).max()),
             "images": len(inputs["image_grid_thw"]), "video_frames": len(inputs["video_grid_thw"]),
             "circle_options": CIRCLE_OPTIONS, "peer": None}
        if peer is not None:
            cases["peer_circle"] = lambda: peer(inputs)
            theirs = cases["peer_circle"]()[0]
            r["peer"] = {"env": PEER_ENV, "max_abs_difference": float((theirs[:, mask] - ours[:, mask]).abs().max())}
        t = timeit_many(cases, warmup=1, repeat=repeat)
    circle = t["ropekit_circle"]["median_s"]
    r.update(times=t, circle_vs_mrope=circle / t["ropekit_mrope"]["median_s"],
             transformers_over_circle=t["transformers_mrope"]["median_s"] / circle)
    if peer is not None:
        r["peer_over_circle"] = t["peer_circle"]["median_s"] / circle
    return r


def check_positions(design: str, inputs: dict, pos: torch.Tensor, **options) -> None:
    """``rope_index``'s positions of every sample against one :func:`ropekit.positions` call on its layout."""
    from ropekit import Image, Layout, Text, Video, positions

    types, mask = inputs["mm_token_type_ids"], inputs["attention_mask"].bool()
    images, videos = iter(inputs["image_grid_thw"].tolist()), iter(inputs["video_grid_thw"].tolist())
    for b in range(types.shape[0]):
        kinds, counts = torch.unique_consecutive(types[b, mask[b]], return_counts=True)
        segs = []
        for kind, n in zip(kinds.tolist(), counts.tolist()):
            if kind == 0:
                segs.append(Text(n))
                continue
            grids = images if kind == 1 else videos
            while n > 0:  # a run may hold several blocks back to back
                t, h, w = next(grids)
                segs.append(Image(h // MERGE, w // MERGE) if kind == 1 and t == 1 else Video(t, h // MERGE, w // MERGE))
                n -= t * h * w // MERGE**2
        if not torch.equal(pos[:, b, mask[b]], positions(Layout(segs), design, **options).T):
            raise AssertionError(f"rope_index({design!r}) differs from positions() on sample {b}")


def _log_circle(r: dict, log) -> None:
    t = r["times"]
    ms = {k: v["median_s"] * 1e3 for k, v in t.items()}
    line = (f"rope_index circle batch {r['batch']} ({r['tokens']} tokens, {r['images']} images, "
            f"{r['video_frames']} video frames): circle {ms['ropekit_circle']:.1f} ms, mrope {ms['ropekit_mrope']:.1f} ms "
            f"(circle/mrope ×{r['circle_vs_mrope']:.2f}), transformers {ms['transformers_mrope']:.1f} ms "
            f"(×{r['transformers_over_circle']:.1f})")
    if r["peer"] is not None:
        line += f", public Circle-RoPE {ms['peer_circle']:.1f} ms (×{r['peer_over_circle']:.1f})"
    else:
        line += f"; set {PEER_ENV} to time the public Circle-RoPE code"
    log(line)


def run(*, quick: bool = False, repeat: int = 5, log=print) -> list[dict]:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _hf_model()
        target = make_batch(TARGET["batch"], seed=TARGET["seed"], min_len=TARGET["min_len"], max_len=TARGET["max_len"])
        runs = [("~2.5k", 32, target)] + [("2k-8k", b, None) for b in ((32,) if quick else (32, 128))]
        for label, batch, inputs in runs:
            r = bench_batch(batch, repeat=repeat, model=model, inputs=inputs)
            r["samples"] = label
            log(
                f"rope_index batch {batch} of {label} tokens ({r['tokens']} tokens, {r['images']} images, "
                f"{r['videos']} videos): transformers {r['transformers_get_rope_index']['median_s'] * 1e3:.1f} ms, "
                f"ropekit {r['ropekit_rope_index']['median_s'] * 1e3:.1f} ms, ×{r['speedup']:.1f} "
                f"(CPU time ×{r['speedup_cpu']:.1f})"
            )
            out.append(r)
        r = bench_designs(repeat=repeat, model=model)
        for name, d in r["designs"].items():
            fresh = d["nothing_kept"]
            log(f"rope_index {name:<9} ~2.5k batch: {d['ropekit']['cpu_median_s'] * 1e3:.2f} ms CPU, transformers "
                f"{d['transformers']['cpu_median_s'] * 1e3:.1f} ms: ×{d['speedup_cpu']:.1f} (wall ×{d['speedup']:.1f}); "
                f"nothing kept {fresh['ropekit']['cpu_median_s'] * 1e3:.2f} ms: ×{fresh['speedup_cpu']:.1f}")
        out.append({"designs": r})
        r = bench_circle(repeat=repeat, model=model)
        _log_circle(r, log)
        out.append({"circle": r})
    return out
