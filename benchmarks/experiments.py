"""Training throughput of the experiments' decoder: ropekit rotary designs vs the same model with plain
``F.scaled_dot_product_attention`` and no position embedding (design ``none``).

One case = 10 optimisation steps (forward, backward, clip, AdamW) of the ``quick`` crossmodal model on
its training batches; the ratio is time with rotary / time without. The bar is ≤ 1.5×: the rotary must
never be the bottleneck.
"""
from __future__ import annotations

import torch

from ropekit.experiments import get
from ropekit.experiments.train import TrainConfig, train

from .common import timeit_many

DESIGNS = ("none", "vanilla", "mrope", "circle", "vrope")


def _case(design: str, cfg: dict, steps: int):
    exp = get("crossmodal")
    sample = exp.sampler(cfg)
    tcfg = TrainConfig(**{**cfg["train"], "steps": steps})

    def run():
        torch.manual_seed(0)
        train(exp.make_model(design, cfg), sample, tcfg, seed=0, device=torch.device("cpu"))

    return run


def run(*, quick: bool = False, repeat: int = 3, log=print) -> list[dict]:
    cfg = get("crossmodal").presets["quick"]
    steps = 5 if quick else 10
    res = timeit_many({d: _case(d, cfg, steps) for d in DESIGNS}, repeat=repeat)
    base = res["none"]["median_s"]
    ratios = {d: res[d]["median_s"] / base for d in DESIGNS}
    log("experiment decoder training, time relative to plain SDPA without rotary: "
        + ", ".join(f"{d} {r:.2f}x" for d, r in ratios.items()))
    return [{"model": cfg["model"], "batch": cfg["train"]["batch"], "steps": steps, "cases": res,
             "ratio_vs_plain_sdpa": ratios}]
