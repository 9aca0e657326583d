"""Experiment ``shape-bias``: does GeoPE make a ViT rely on shape rather than texture (GeoPE §4, shape bias)?

Training images show a shape filled with "its" texture 80 % of the time (another texture otherwise), so
both cues predict the label. The test shows cue-conflict images (shape of one class, texture of another):
the shape-bias is the fraction of decisions that follow the shape among those that follow either cue
(the measure of Geirhos et al. that GeoPE reports), with clean accuracy (texture agreeing) beside it.
"""
from __future__ import annotations

import torch

from .base import Claim, Experiment, accuracy, claim_designs
from .geope_sweep import SWEEP
from .registry import register
from .tasks.shapes import SHAPES, shape_batch
from .vision import FAMILIES, HYPERPARAMETERS_NOTE, MODEL, TRAIN, check_family, make_vision_model

EVAL_SEED = 20250303
DESIGNS = tuple(f for f in FAMILIES if f != "linear-geope")
_TASK = {"grid": 8, "agree": 0.8}
PRESETS = {p: {"model": MODEL[p], "task": _TASK, "train": TRAIN[p], "eval": {"n": n}}
           for p, n in (("micro", 16), ("quick", 512), ("standard", 4096), ("full", 4096))}


def sampler(cfg: dict):
    t = cfg["task"]
    return lambda g, B, layout_g=None: shape_batch(B, t["grid"], g=g, agree=t["agree"])


def shape_fraction(pred: torch.Tensor, shape: torch.Tensor, texture: torch.Tensor) -> float:
    """Decisions following the shape among those following shape or texture (NaN when none follows either)."""
    s, t = (pred == shape).sum().item(), (pred == texture).sum().item()
    return s / (s + t) if s + t else float("nan")


@torch.no_grad()
def evaluate(model, cfg: dict, device: torch.device) -> dict:
    t, n = cfg["task"], cfg["eval"]["n"]
    g = torch.Generator().manual_seed(cfg["eval"].get("seed", EVAL_SEED))
    clean = shape_batch(n, t["grid"], g=g, agree=1.0)
    conflict = shape_batch(n, t["grid"], g=g, conflict=True)
    pred = model(conflict.tokens.to(device)).argmax(-1).cpu()
    return {"clean_acc": accuracy(model, [clean], device),
            "shape_bias": shape_fraction(pred, conflict.info["shape"], conflict.info["texture"]),
            "conflict_shape_acc": float((pred == conflict.info["shape"]).float().mean()),
            "conflict_texture_acc": float((pred == conflict.info["texture"]).float().mean())}


CLAIMS = (
    Claim("S1", "GeoPE raises shape bias over axial 2-D RoPE", "GeoPE §4 (shape bias)", "shape_bias", "geope", "axial",
          delta=0.02, delta_reason="shape bias is a fraction of decisions (0-1, like accuracy): 2 points"),
    Claim("S2", "GeoPE keeps clean accuracy at least as high as axial 2-D RoPE", "GeoPE §4 (classification)",
          "clean_acc", "geope", "axial",
          delta=0.02, delta_reason="accuracy: 2 points (\"at least as high\" is read as: not 2 points lower)"),
    Claim("S3", "RoPE-Mixed raises shape bias over axial 2-D RoPE", "RoPE-Mixed (Heo et al. 2024), by analogy",
          "shape_bias", "mixed", "axial",
          delta=0.02, delta_reason="shape bias is a fraction of decisions: 2 points"),
)

EXPERIMENT = register(Experiment(
    name="shape-bias",
    summary=__doc__.split("\n\n", 1)[1].strip().replace("\n", " "),
    designs=DESIGNS, presets=PRESETS, make_model=make_vision_model(len(SHAPES)), sampler=sampler,
    evaluate=evaluate, claims=CLAIMS, check_design=check_family, hyperparameters_note=HYPERPARAMETERS_NOTE,
    figures={"bars": ["shape_bias", "clean_acc"], "lambda": ["shape_bias", "clean_acc"]},
    preset_designs={"full": SWEEP},
    designs_at={"standard": claim_designs(CLAIMS)}, seeds={"standard": 60},
))
