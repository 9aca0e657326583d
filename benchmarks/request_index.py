"""Positions one request at a time, as a server builds them: ``python -m benchmarks.request_index [--repeat R]
[--threads N] [--out FILE]``.

The 32 samples of the :data:`benchmarks.index.TARGET` batch (about 2.5k tokens, 11 images and videos each) as
32 requests, each given as a server has it: the prompt length and every image and video with its offset. Timed
per request, in round-robin over the 32 requests (CPU time, ``time.process_time``, one torch thread):

- ``ropekit.request_positions``, M-RoPE (``design="mrope"``, the rule servers use: text resumes after a block's
  largest coordinate + 1), float32 positions, and the same with ``dtype=torch.int64``;
- ``ropekit.rope_index`` on each request as a batch of one (token types and grids);
- vLLM's own ``Qwen2VLForConditionalGeneration.get_mrope_input_positions``, when vLLM is importable: called
  as vLLM's model runner calls it, with the request's token ids and its multimodal features
  (``MultiModalFeatureSpec`` with their placeholder offsets and grids), on a stand-in that holds only the
  model config the method reads. Nothing of vLLM is copied into ropekit; without vLLM its column is left out.

Before timing, every request's positions and delta are asserted equal across all of them (vLLM's int64 ones
included). Run it with a Python that has vLLM (``make test-vllm`` builds one, docs/serving.md) for the peer.
"""
from __future__ import annotations

import argparse
import json
import os
import warnings
from types import SimpleNamespace

import torch

from .common import machine, pin_allocator, timeit_many
from .index import MERGE, TARGET, make_batch


def requests() -> list[dict]:
    """The TARGET batch as requests: ``num_tokens``, ``items`` [(offset, modality, grid)], and the batch of one."""
    inputs = make_batch(TARGET["batch"], seed=TARGET["seed"], min_len=TARGET["min_len"], max_len=TARGET["max_len"])
    types, mask = inputs["mm_token_type_ids"], inputs["attention_mask"]
    images, videos = iter(inputs["image_grid_thw"].tolist()), iter(inputs["video_grid_thw"].tolist())
    out = []
    for b in range(types.shape[0]):
        n = int(mask[b].sum())
        kinds, counts = torch.unique_consecutive(types[b, :n], return_counts=True)
        items, at, grids = [], 0, {1: [], 2: []}
        for kind, count in zip(kinds.tolist(), counts.tolist()):
            if kind:  # make_batch puts text between any two items: one run is one item
                grid = next(images if kind == 1 else videos)
                items.append((at, "image" if kind == 1 else "video", grid))
                grids[kind].append(grid)
            at += count
        out.append(dict(num_tokens=n, items=items, token_ids=inputs["input_ids"][b, :n].tolist(),
                        batch=dict(input_ids=inputs["input_ids"][b:b + 1, :n], mm_token_type_ids=types[b:b + 1, :n],
                                   image_grid_thw=torch.tensor(grids[1]).reshape(-1, 3),
                                   video_grid_thw=torch.tensor(grids[2]).reshape(-1, 3))))
    return out


def vllm_peer(requests: list[dict]):
    """vLLM's Qwen2-VL ``get_mrope_input_positions`` as ``f(request) -> (positions, delta)``, or None without vLLM."""
    try:
        from vllm.model_executor.models.qwen2_vl import Qwen2VLForConditionalGeneration as Qwen2VL
        from vllm.multimodal.inputs import (MultiModalBatchedField, MultiModalFeatureSpec, MultiModalFieldElem,
                                            MultiModalKwargsItem, PlaceholderRange)
    except ImportError:
        return None, None

    class Model:  # the two methods as vLLM's class defines them, on an object that holds only the config they read
        iter_mm_grid_thw = Qwen2VL.iter_mm_grid_thw
        get_mrope_input_positions = Qwen2VL.get_mrope_input_positions

        def __init__(self):
            self.config = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=MERGE))

    model = Model()

    def features(request):
        out = []
        for k, (offset, modality, grid) in enumerate(request["items"]):
            elem = MultiModalFieldElem(data=torch.tensor(grid), field=MultiModalBatchedField())
            out.append(MultiModalFeatureSpec(
                data=MultiModalKwargsItem({f"{modality}_grid_thw": elem}), modality=modality, identifier=str(k),
                mm_position=PlaceholderRange(offset=offset, length=grid[0] * grid[1] * grid[2] // MERGE**2)))
        return out

    import vllm

    for r in requests:
        r["mm_features"] = features(r)
    return (lambda r: model.get_mrope_input_positions(r["token_ids"], r["mm_features"])), vllm.__version__


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.request_index", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=21)
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    from ropekit import request_positions, rope_index

    info = machine()
    info["allocator"] = pin_allocator("steady")
    reqs = requests()
    peer, version = vllm_peer(reqs)
    cases = {
        "ropekit_request_positions": lambda r: request_positions(r["num_tokens"], r["items"], design="mrope"),
        "ropekit_request_positions_int64": lambda r: request_positions(r["num_tokens"], r["items"], design="mrope",
                                                                       dtype=torch.int64),
        "ropekit_rope_index_batch_of_one": lambda r: rope_index(**r["batch"], design="mrope", spatial_merge_size=MERGE),
    }
    if peer is not None:
        cases["vllm_get_mrope_input_positions"] = peer
    with torch.no_grad():
        for k, r in enumerate(reqs):
            pos, delta = cases["ropekit_request_positions"](r)
            whole, whole_delta = cases["ropekit_request_positions_int64"](r)
            batch_pos, batch_delta = cases["ropekit_rope_index_batch_of_one"](r)
            same = (torch.equal(pos, batch_pos[:, 0]) and torch.equal(delta, batch_delta[0])
                    and torch.equal(whole, pos.long()) and torch.equal(whole_delta, delta.long()))
            if peer is not None:
                theirs, their_delta = peer(r)
                same = same and torch.equal(whole, theirs) and whole_delta.item() == their_delta
            if not same:
                raise AssertionError(f"request {k}: the positions differ between the cases")
        per_call = {name: (lambda fn=fn: [fn(r) for r in reqs]) for name, fn in cases.items()}
        print(f"{len(reqs)} requests, {sum(r['num_tokens'] for r in reqs)} tokens, "
              f"{sum(len(r['items']) for r in reqs)} items; vLLM {version or 'not importable: no peer'}; "
              f"threads {args.threads}, load {os.getloadavg()}", flush=True)
        times = timeit_many(per_call, warmup=2, repeat=args.repeat)
    n = len(reqs)
    out = {"machine": info, "vllm": version, "requests": n, "repeat": args.repeat,
           "tokens": sum(r["num_tokens"] for r in reqs), "items": sum(len(r["items"]) for r in reqs),
           "per_request_cpu_us": {k: v["cpu_median_s"] / n * 1e6 for k, v in times.items()},
           "per_request_wall_us": {k: v["median_s"] / n * 1e6 for k, v in times.items()}, "times": times}
    base = out["per_request_cpu_us"].get("vllm_get_mrope_input_positions")
    for name, us in out["per_request_cpu_us"].items():
        ratio = f"  vLLM / this ×{base / us:.2f}" if base else ""
        print(f"{name:<34} {us:8.1f} µs CPU per request (wall {out['per_request_wall_us'][name]:.1f}){ratio}")
    out["load_after"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
