"""A patched vision tower in inference: rotating the q/k projections in place vs functionally, vs stock.

``python -m benchmarks.vision_inplace [--rounds 8] [--side 64]``

One random Qwen2-VL vision tower (4 layers, width 512, 8 heads) encodes one ``side × side`` patch grid
under ``torch.no_grad`` in three states, interleaved round-robin so that machine load falls on each
alike: ``stock``; ``patch_vision_model(model, "axial")`` with its default in-place rotation; and the same
patch made to rotate functionally (new tensors, as with autograd). Medians of process CPU time, the first
round dropped. Prints the ratios to stock and writes ``benchmarks/results/vision_inplace.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch

from .common import machine

RESULTS = Path(__file__).resolve().parent / "results"


def run(rounds: int = 8, side: int = 64, log=print) -> dict:
    from transformers import Qwen2VLConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    import ropekit.hf.vision as vision

    cfg = Qwen2VLConfig(vision_config=dict(depth=4, embed_dim=512, hidden_size=512, num_heads=8, mlp_ratio=2,
                                           spatial_merge_size=2, patch_size=14, temporal_patch_size=2)).vision_config
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Qwen2VisionTransformerPretrainedModel._from_config(cfg).eval()
    pixels, grid = torch.randn(side * side, 3 * 2 * 14 * 14), torch.tensor([[1, side, side]])
    states = {"stock": None, "in_place": True, "functional": False}
    cpu = {s: [] for s in states}
    outs = {}
    try:
        for r in range(rounds + 1):
            for s, in_place in states.items():
                if vision.is_vision_patched(model):
                    vision.unpatch_vision_model(model)
                if in_place is not None:
                    vision._Planar.writes_in_place = in_place
                    vision.patch_vision_model(model, "axial")
                c0 = time.process_time()
                with torch.no_grad():
                    out = model(hidden_states=pixels, grid_thw=grid).last_hidden_state
                if r:
                    cpu[s].append(time.process_time() - c0)
                outs[s] = out
    finally:
        vision._Planar.writes_in_place = True
    if not (torch.equal(outs["in_place"], outs["stock"]) and torch.equal(outs["functional"], outs["stock"])):
        raise AssertionError("patched stock-frequency axial outputs differ from the stock encoder's")
    med = {s: statistics.median(v) for s, v in cpu.items()}
    res = {"machine": machine(), "side": side, "rounds": rounds,
           "cpu_median_s": med, "vs_stock": {s: med[s] / med["stock"] for s in states}}
    for s in states:
        log(f"{s:10s} {med[s] * 1e3:8.1f} ms CPU  {res['vs_stock'][s]:.3f}x stock")
    return res


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--side", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    out = run(a.rounds, a.side)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "vision_inplace.json").write_text(json.dumps(out, indent=1))
