"""Batch position ids: ``ropekit.index.rope_index`` against transformers' Qwen2-VL ``get_rope_index``.

Batches of long multimodal samples (2k–8k tokens, several images and videos each, right padded).
The outputs are asserted identical before anything is timed.
"""
from __future__ import annotations

import random
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


def bench_batch(batch: int, *, repeat: int, model=None) -> dict:
    from ropekit.index import rope_index

    model = model or _hf_model()
    inputs = make_batch(batch, seed=batch)
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
    }


def run(*, quick: bool = False, repeat: int = 5, log=print) -> list[dict]:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _hf_model()
        for batch in ((32,) if quick else (32, 128)):
            r = bench_batch(batch, repeat=repeat, model=model)
            log(
                f"rope_index batch {batch} ({r['tokens']} tokens, {r['images']} images, {r['videos']} videos): "
                f"transformers {r['transformers_get_rope_index']['median_s'] * 1e3:.1f} ms, "
                f"ropekit {r['ropekit_rope_index']['median_s'] * 1e3:.1f} ms, ×{r['speedup']:.1f}"
            )
            out.append(r)
    return out
