"""What an experiment is: a task, a model factory, presets, an evaluation and the paper claims it tests.

An experiment is one small file that builds an :class:`Experiment` and registers it
(:func:`ropekit.experiments.registry.register`). Metrics returned by ``evaluate`` are floats (scalars),
``{label: float}`` dicts (curves, e.g. accuracy per gap) or nested lists (heat maps); the runner
aggregates each over seeds.

The training loop only needs ``model(batch.tokens, batch.layout) -> (B, classes)`` logits and
``batch.target``: a vision task can put image tensors in ``tokens`` and ignore ``layout``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from .tasks import Batch

__all__ = ["Claim", "Experiment", "accuracy", "correct", "cell_map", "spread", "claim_designs"]


@dataclass(frozen=True)
class Claim:
    """"``design`` beats ``baseline`` on ``metric``" (``better``: higher or lower), citing the paper.

    ``delta`` is the smallest difference of interest (in the metric's units, declared before any run): a
    paired interval lying inside ±delta is the verdict ``no effect``, and seeds are sized to decide at this
    resolution. ``delta_reason`` says in one line why that value (required with it)."""

    id: str
    text: str
    source: str
    metric: str
    design: str
    baseline: str
    better: str = "higher"
    delta: float | None = None
    delta_reason: str = ""

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(f"claim {self.id}: `better` must be 'higher' or 'lower', got {self.better!r}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) or not 0 < self.delta < float("inf"):
            raise ValueError(f"claim {self.id}: declare `delta`, the smallest effect of interest (> 0), got "
                             f"{self.delta!r}")
        if not self.delta_reason.strip():
            raise ValueError(f"claim {self.id}: say why delta = {self.delta} (`delta_reason`)")


@dataclass
class Experiment:
    name: str
    summary: str
    designs: tuple[str, ...]
    presets: dict[str, dict]
    make_model: Callable[[str, dict], nn.Module]
    # sampler(cfg)(g, B, layout_g=None) -> Batch: content from g (the run's stream), the batch's layout (when it
    # varies) from layout_g (a stream shared by every seed; see ropekit.experiments.train.layout_seed)
    sampler: Callable[[dict], Callable[..., Batch]]
    evaluate: Callable[[nn.Module, dict, torch.device], dict]
    claims: tuple[Claim, ...] = ()
    figures: dict = field(default_factory=dict)
    hyperparameters_note: str = ""
    # raises a clear ValueError for a design name this experiment cannot build (default: the decoder's names)
    check_design: Callable[[str], object] | None = None
    # designs run by default at one preset on top of ``designs`` (e.g. GeoPE's λ sweep in ``full``)
    preset_designs: dict = field(default_factory=dict)
    # designs run by default at a preset *instead of* ``designs`` (``standard`` runs the claims' designs only)
    designs_at: dict = field(default_factory=dict)
    # seeds per design by default at a preset (``standard`` sizes its own from a measured variance budget)
    seeds: dict = field(default_factory=dict)
    # seeds of a design trained together as one stacked ensemble at a preset (default 1: one at a time)
    batch_seeds: dict = field(default_factory=dict)


def claim_designs(claims) -> tuple[str, ...]:
    """The designs the claims compare, in order of first mention."""
    return tuple(dict.fromkeys(d for c in claims for d in (c.design, c.baseline)))


@torch.no_grad()
def correct(model: nn.Module, batch: Batch, device: torch.device) -> torch.Tensor:
    """Boolean ``(B,)``: is the arg-max next token the answer?"""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(batch.tokens.to(device), batch.layout)
    return (logits.argmax(-1).cpu() == batch.target)


def accuracy(model: nn.Module, batches: list[Batch], device: torch.device) -> float:
    hits = torch.cat([correct(model, b, device) for b in batches])
    return float(hits.float().mean())


def cell_map(hits: torch.Tensor, cells: torch.Tensor, h: int, w: int) -> list[list[float]]:
    """Accuracy per cell ``(h, w)`` from per-sample hits and target cells (NaN-free: empty cells get 0)."""
    n = torch.bincount(cells, minlength=h * w).float()
    k = torch.bincount(cells, weights=hits.float(), minlength=h * w)
    return (k / n.clamp(min=1)).view(h, w).tolist()


def spread(grid: list[list[float]]) -> float:
    """Standard deviation of a heat map's cells: 0 when accuracy does not depend on the location."""
    return float(torch.tensor(grid).std(unbiased=False))
