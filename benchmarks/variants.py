"""Batched indexing of the published multimodal variants: ``rope_index`` per design against transformers'
Qwen2-VL ``get_rope_index`` (M-RoPE, the same kind of work) on the same batch.

The public Multimodal-RoPEs code is not a package, so it is not timed here; its index functions walk
each sample block by block like transformers' does. Before timing, each design's batched result is
checked against one :func:`ropekit.positions` call per sample.
"""
from __future__ import annotations

import warnings

import torch

from .common import timeit_many
from .index import MERGE, _hf_model, make_batch

DESIGNS = ("mrope-i", "mhrope", "ilrope", "omnirope", "videorope", "hope", "v2pe", "mmrope")


def _check(design: str, inputs: dict, pos: torch.Tensor) -> None:
    from ropekit import Image, Layout, Text, Video, positions

    types, mask = inputs["mm_token_type_ids"], inputs["attention_mask"].bool()
    images, videos = iter(inputs["image_grid_thw"].tolist()), iter(inputs["video_grid_thw"].tolist())
    for b in range(types.shape[0]):
        row = types[b, mask[b]]
        kinds, counts = torch.unique_consecutive(row, return_counts=True)
        segs = []
        for kind, n in zip(kinds.tolist(), counts.tolist()):
            if kind == 0:
                segs.append(Text(n))
            else:
                t, h, w = next(images) if kind == 1 else next(videos)
                segs.append(Image(h // MERGE, w // MERGE) if kind == 1 else Video(t, h // MERGE, w // MERGE))
        if not torch.equal(pos[:, b, mask[b]], positions(Layout(segs), design).T):
            raise AssertionError(f"rope_index({design!r}) differs from positions() on sample {b}")


def run(*, quick: bool = False, repeat: int = 5, log=print) -> list[dict]:
    from ropekit.index import rope_index

    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _hf_model()
        inputs = make_batch(32, seed=32)
        tokens = int(inputs["attention_mask"].sum())
        cases = {"transformers_mrope": lambda: model.get_rope_index(**inputs),
                 "mrope": lambda: rope_index(**inputs, design="mrope", spatial_merge_size=MERGE)}
        for d in DESIGNS[:2] if quick else DESIGNS:
            fn = (lambda d=d: rope_index(**inputs, design=d, spatial_merge_size=MERGE))
            _check(d, inputs, fn()[0])
            cases[d] = fn
        with torch.no_grad():
            t = timeit_many(cases, warmup=1, repeat=repeat)
        hf = t["transformers_mrope"]["median_s"]
        for name, v in t.items():
            if name == "transformers_mrope":
                continue
            r = {"design": name, "batch": 32, "tokens": tokens, "images": len(inputs["image_grid_thw"]),
                 "videos": len(inputs["video_grid_thw"]), "ropekit_rope_index": v,
                 "transformers_get_rope_index": t["transformers_mrope"], "speedup": hf / v["median_s"]}
            log(f"rope_index {name:<9} batch 32 ({tokens} tokens): {v['median_s'] * 1e3:.1f} ms, "
                f"transformers M-RoPE {hf * 1e3:.1f} ms, ×{r['speedup']:.1f}")
            out.append(r)
    return out
