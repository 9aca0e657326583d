"""Where the spread of a metric comes from: the training seed or the evaluation sample.

:func:`variance_split` trains every design at each seed once and evaluates each trained model on ``draws``
independent evaluation sets of the preset's size (evaluation seed ``EVAL_SEED + r·7919``; ``r = 0`` is the
set every run uses). For a quantity ``x[s, r]`` (a metric of one design, or a claim's paired difference,
design and baseline evaluated on the same set ``r``) the nested random-effects split is

* evaluation variance ``σ²_eval`` = mean over seeds of the variance over the ``draws`` sets (ddof 1): the
  noise one evaluation set of this size adds to a run's number;
* seed variance ``σ²_seed`` = var over seeds of the per-seed mean over sets − σ²_eval / draws (floored
  at 0): what retraining with another seed changes;

and a run's number (one set) varies with ``σ²_total = σ²_seed + σ²_eval``. Because the evaluation noise of
a mean over n samples shrinks like 1/n, the evaluation size that brings ``sd_eval`` below a target follows
from one measurement (``eval_scale_for``). From each claim's ``sd_total`` come the seeds a preset needs
(:func:`ropekit.experiments.stats.seeds_for_power`, :func:`~ropekit.experiments.stats.seeds_to_decide`).

:func:`check_pairing` checks the paired design itself: that two designs at one seed get the same training
batches and the same evaluation inputs.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import torch
from torch import nn

from .base import Experiment
from .registry import get
from .stats import ALPHA, seeds_for_power, seeds_to_decide
from .train import draw

__all__ = ["split", "variance_split", "check_pairing", "eval_scale_for", "variance_table", "EVAL_STRIDE"]

EVAL_STRIDE = 7919  # evaluation set r uses seed EVAL_SEED + r * EVAL_STRIDE


def split(x: list[list[float]]) -> dict:
    """Nested split of ``x[seed][draw]``: ``{"mean", "sd_seed", "sd_eval", "sd_total", "eval_share", "seeds",
    "draws"}`` (``eval_share`` = σ²_eval / σ²_total, the part of a run's variance due to its evaluation set)."""
    S, R = len(x), len(x[0]) if x else 0
    if S < 2 or R < 2 or any(len(row) != R for row in x):
        raise ValueError(f"split: need >= 2 seeds x >= 2 evaluation draws in a full table, got {S} x {R}")
    means = [sum(row) / R for row in x]
    within = sum(sum((v - m) ** 2 for v in row) / (R - 1) for row, m in zip(x, means)) / S
    grand = sum(means) / S
    between = sum((m - grand) ** 2 for m in means) / (S - 1)
    seed = max(0.0, between - within / R)
    total = seed + within
    return {"mean": grand, "sd_seed": math.sqrt(seed), "sd_eval": math.sqrt(within), "sd_total": math.sqrt(total),
            "eval_share": within / total if total > 0 else 0.0, "seeds": S, "draws": R}


def eval_scale_for(sd_eval: float, sd_seed: float, share: float = 0.1) -> float:
    """Factor by which to enlarge the evaluation set so that it adds at most ``share`` of a run's variance,
    assuming evaluation variance ∝ 1/size: σ²_eval/f ≤ share/(1 − share) · σ²_seed. 1 when already there."""
    if sd_eval <= 0:
        return 1.0
    if sd_seed <= 0:
        return math.inf
    return max(1.0, sd_eval ** 2 * (1 - share) / (share * sd_seed ** 2))


def _scalars(metrics: dict) -> dict:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _eval_cfg(cfg: dict, exp_module_seed: int, r: int) -> dict:
    return {**cfg, "eval": {**cfg["eval"], "seed": exp_module_seed + r * EVAL_STRIDE}}


def _eval_seed(exp: Experiment) -> int:
    import sys

    return sys.modules[exp.evaluate.__module__].EVAL_SEED


def variance_split(name: str, *, designs: list[str] | None = None, seeds: list[int] | None = None, draws: int = 4,
                   preset: str = "quick", batch_seeds: int = 8, power: float = 0.8, alpha: float = ALPHA,
                   progress: bool = False, log=None) -> dict:
    """Train ``designs`` (default: those of the experiment's claims) at ``seeds`` (default 0–5), evaluate each
    model on ``draws`` evaluation sets and split every scalar metric's and every claim's variance (see the
    module docstring). Claims get the seeds a preset needs at their measured spread: ``seeds_for_power``
    (power ``power`` to detect δ at the first Holm level alpha/m) and ``seeds_to_decide``."""
    exp = get(name)
    cfg = exp.presets[preset]
    claims = [c for c in exp.claims if designs is None or (c.design in designs and c.baseline in designs)]
    if designs is None:
        designs = list(dict.fromkeys(d for c in claims for d in (c.design, c.baseline)))
    seeds = list(range(6)) if seeds is None else list(seeds)
    if len(seeds) < 2 or draws < 2:
        raise ValueError("variance_split needs at least 2 seeds and 2 evaluation draws")
    base_seed = _eval_seed(exp)
    dev = torch.device("cpu")
    values: dict[str, dict[str, list[list[float]]]] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    for d in designs:
        trained = _train(exp, d, seeds, cfg, dev, batch_seeds)
        table: dict[str, list[list[float]]] = {}
        for r in range(draws):
            ecfg = _eval_cfg(cfg, base_seed, r)
            per_seed = trained(ecfg)
            for i, m in enumerate(per_seed):
                for k, v in _scalars(m).items():
                    table.setdefault(k, [[None] * draws for _ in seeds])[i][r] = v
        values[d] = table
        if log:
            log(f"  {name} {d}: {len(seeds)} seeds x {draws} evaluation sets, "
                f"{time.process_time() - c0:.0f} s CPU so far")
    out = {"experiment": name, "preset": preset, "config": cfg, "designs": designs, "seed_list": seeds,
           "draws": draws, "eval_seeds": [base_seed + r * EVAL_STRIDE for r in range(draws)], "metrics": {},
           "claims": {}, "power": power, "alpha": alpha, "family": len(exp.claims),
           "cpu_s": round(time.process_time() - c0, 1), "wall_s": round(time.perf_counter() - t0, 1),
           "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for d, table in values.items():
        out["metrics"][d] = {k: split(x) for k, x in table.items() if all(v == v for row in x for v in row)}
    m = len(exp.claims)
    for c in claims:
        a, b = values[c.design].get(c.metric), values[c.baseline].get(c.metric)
        if a is None or b is None:
            continue
        sign = 1.0 if c.better == "higher" else -1.0
        diff = [[sign * (x - y) for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]
        if any(v != v for row in diff for v in row):
            continue
        s = split(diff)
        s.update({"metric": c.metric, "design": c.design, "baseline": c.baseline, "delta": c.delta,
                  "seeds_for_power": seeds_for_power(s["sd_total"], c.delta, power, alpha, m),
                  "seeds_to_decide": seeds_to_decide(s["sd_total"], c.delta, alpha, m),
                  "eval_scale_for_10pct": eval_scale_for(s["sd_eval"], s["sd_seed"])})
        out["claims"][c.id] = s
    return out


def _train(exp: Experiment, design: str, seeds: list[int], cfg: dict, dev, batch_seeds: int):
    """Train ``design`` at ``seeds``; returns ``evaluate(cfg) -> [metrics per seed]`` on the trained models."""
    from .ensemble import SharedEval, supported
    from .train import TrainConfig, train, train_stacked

    models = []
    for s in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(s)
            models.append(exp.make_model(design, cfg))
    tcfg = TrainConfig(**cfg["train"])
    if batch_seeds > 1 and supported(models[0]) is None:
        stacks = []
        for i in range(0, len(seeds), batch_seeds):
            res = train_stacked(models[i:i + batch_seeds], exp.sampler(cfg), tcfg, seeds=seeds[i:i + batch_seeds],
                                device=dev)
            stacks.append(res["stacked"])

        def evaluate(ecfg):
            out = []
            for st in stacks:
                record: list = []
                out += [exp.evaluate(SharedEval(st, k, record), ecfg, dev) for k in range(st.stacked_k)]
            return out
        return evaluate
    for s, m in zip(seeds, models):
        train(m, exp.sampler(cfg), tcfg, seed=s, device=dev)
    return lambda ecfg: [exp.evaluate(m, ecfg, dev) for m in models]


class _Recorder(nn.Module):
    """Stands in for a model: hashes every input it is given and answers with fixed logits of the right shape."""

    def __init__(self, classes: int, per_point: bool = False) -> None:
        super().__init__()
        self.classes, self.per_point, self.digest = classes, per_point, hashlib.sha256()

    def forward(self, x: torch.Tensor, layout=None) -> torch.Tensor:
        self.digest.update(str((tuple(x.shape), layout)).encode())
        self.digest.update(x.detach().cpu().contiguous().numpy().tobytes())
        g = torch.Generator().manual_seed(int(x.shape[0]))
        shape = (x.shape[0], self.classes, x.shape[1]) if self.per_point else (x.shape[0], self.classes)
        return torch.randn(shape, generator=g)


def check_pairing(name: str, designs: list[str], *, seed: int = 0, preset: str = "quick", steps: int = 50) -> dict:
    """Do ``designs`` at one seed see the same data? Hashes the first ``steps`` training batches each design's
    run would draw (its config's sampler, the run's seed) and every input its evaluation feeds the model
    (a recording stand-in model). ``{"train": {design: sha}, "eval": {design: sha}, "paired": bool}``."""
    exp = get(name)
    cfg = exp.presets[preset]
    out = {"train": {}, "eval": {}}
    for d in designs:
        h = hashlib.sha256()
        sample = exp.sampler(cfg)
        for step in range(min(steps, cfg["train"]["steps"])):
            b = draw(sample, seed, step, cfg["train"]["batch"])
            h.update(b.layout.encode())
            h.update(b.tokens.contiguous().numpy().tobytes())
            h.update(b.target.contiguous().numpy().tobytes())
        out["train"][d] = h.hexdigest()
        rec = _Recorder(exp.make_model(d, cfg).head.out_features, per_point=name == "pointcloud")
        exp.evaluate(rec, cfg, torch.device("cpu"))
        out["eval"][d] = rec.digest.hexdigest()
    out["paired"] = len(set(out["train"].values())) == 1 and len(set(out["eval"].values())) == 1
    return out


def variance_table(res: dict) -> str:
    """Plain-text summary of :func:`variance_split`: per claim the split of its paired difference and the seeds
    it needs, then the baseline metrics."""
    lines = [f"{res['experiment']} ({res['preset']}): {len(res['seed_list'])} seeds x {res['draws']} evaluation "
             f"sets; sd of one run's number split into seed and evaluation parts",
             f"{'claim':<9}{'metric':<18}{'mean':>8}{'sd_seed':>9}{'sd_eval':>9}{'eval%':>7}{'delta':>7}"
             f"{'n(power)':>10}{'n(decide)':>10}"]
    for cid, s in res["claims"].items():
        lines.append(f"{cid:<9}{s['metric']:<18}{s['mean']:>+8.3f}{s['sd_seed']:>9.4f}{s['sd_eval']:>9.4f}"
                     f"{100 * s['eval_share']:>6.0f}%{s['delta']:>7g}{str(s['seeds_for_power']):>10}"
                     f"{str(s['seeds_to_decide']):>10}")
    lines.append(f"n(power): seeds for {100 * res['power']:.0f} % power to detect delta at alpha/{res['family']} "
                 f"(Holm's first level); n(decide): seeds for an adjusted interval narrower than delta")
    return "\n".join(lines)


def write(res: dict, path: "str | Path") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    return path
