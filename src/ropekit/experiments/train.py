"""Training loop: AdamW, linear warm-up + cosine decay, gradient clipping, bf16 autocast on CUDA only,
atomic checkpoints with resume, and data drawn from an explicit per-step generator.

Determinism: the batch of step ``i`` comes from ``torch.Generator().manual_seed(data_seed(seed, i))``,
so a resumed run sees exactly the batches an uninterrupted run would; its *layout* (text gap, number of
images or frames, where a task varies it) comes from ``layout_seed(i)``, one stream shared by every seed,
so that all seeds of a design see the same sequence of layouts and can be trained together as one stacked
ensemble (:func:`train_stacked`) with the batches each would see alone. Under ``torch.distributed`` each
rank draws the same global batch and trains on its own contiguous slice; DistributedDataParallel
averages the gradients, which equals the gradient of the global-batch mean loss.
"""
from __future__ import annotations

import math
import os
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .tasks import Batch

__all__ = ["TrainConfig", "train", "train_stacked", "data_seed", "layout_seed", "draw", "dist_info"]


@dataclass
class TrainConfig:
    steps: int
    batch: int
    lr: float = 3e-3
    weight_decay: float = 0.01
    warmup: int = 50
    min_lr_ratio: float = 0.1
    clip: float = 1.0
    ckpt_every: int = 0

    def lr_at(self, step: int) -> float:
        """Learning-rate multiplier at ``step`` (0-based): linear warm-up, then cosine to ``min_lr_ratio``."""
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = (step - self.warmup) / max(1, self.steps - self.warmup)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def data_seed(seed: int, step: int) -> int:
    """Seed of the generator for training batch ``step`` of run ``seed`` (distinct streams per seed)."""
    return (seed * 1_000_003 + step * 7919 + 17) % (2**63 - 1)


def layout_seed(step: int) -> int:
    """Seed of the generator for the *layout* of training batch ``step``: the same for every run."""
    return data_seed(-7, step)


def draw(sample: Callable[..., Batch], seed: int, step: int, batch: int) -> Batch:
    """Training batch ``step`` of run ``seed``: content from the run's stream, layout from the shared one."""
    return sample(torch.Generator().manual_seed(data_seed(seed, step)), batch,
                  layout_g=torch.Generator().manual_seed(layout_seed(step)))


def dist_info() -> tuple[int, int]:
    """(rank, world size) of the current torch.distributed group, (0, 1) when not distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load(path: Path, device: torch.device) -> dict:
    """The checkpoint at ``path``, read with ``weights_only=True``: tensors, dicts, lists and numbers only.

    A checkpoint is a file an experiment folder carries to whoever receives it; full unpickling would run
    whatever code it names, so a checkpoint holding anything else is refused (a ``ValueError`` naming the
    file and what to do), before any of its objects is built."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message suggests weights_only=False; keep only the line that says what was found
        found = [ln.strip() for ln in str(error).splitlines() if "unsupported" in ln.lower() or "GLOBAL" in ln]
        raise ValueError(
            f"checkpoint '{path}' holds objects other than tensors, dicts, lists and numbers, which ropekit never "
            f"writes; refused to load it (unpickling it could run code it names). Delete the file to train that "
            f"run again from the start" + (f" ({found[0]})" if found else "")) from None
    if not isinstance(state, dict) or any(k not in state for k in ("model", "opt", "sched", "step", "losses")):
        raise ValueError(f"checkpoint '{path}' is not a ropekit training checkpoint (a dict with model, opt, "
                         f"sched, step, losses); delete it to train that run again from the start")
    return state


def train(model: nn.Module, sample: Callable[[torch.Generator, int], Batch], cfg: TrainConfig, *, seed: int,
          device: torch.device, ckpt: Path | None = None, progress: Callable[[int, int, float], None] | None = None,
          stop_after: int | None = None) -> dict:
    """Train ``model`` on ``sample(generator, global_batch)`` batches.

    Returns ``{"losses", "steps", "seconds", "cpu_seconds", "first_step_s", "first_step_cpu_s", "stopped"}``
    (``cpu_seconds``: this process's CPU time, which on a shared machine estimates the wall time the run
    would take alone; ``first_step_*``: the first step of this call alone, which carries one-off costs such
    as compiling a kernel, so that a per-step time can leave it out).

    With ``ckpt`` the state is saved every ``cfg.ckpt_every`` steps and a run finding the file resumes from
    it. ``stop_after`` ends the call after that many steps (having checkpointed) — a controlled stand-in
    for a killed process, used by the tests.
    """
    rank, world = dist_info()
    if cfg.batch % world:
        raise ValueError(f"global batch {cfg.batch} is not divisible by the world size {world}")
    model.to(device)
    net = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cfg.lr_at)
    start, losses, seconds, cpu = 0, [], 0.0, 0.0
    if ckpt is not None and ckpt.exists():
        state = _load(ckpt, device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start, losses, seconds, cpu = state["step"], state["losses"], state["seconds"], state.get("cpu_seconds", 0.0)
    share = cfg.batch // world
    t0, c0 = time.perf_counter() - seconds, time.process_time() - cpu
    model.train()
    first, ts, cs = None, time.perf_counter(), time.process_time()
    for step in range(start, cfg.steps):
        batch = draw(sample, seed, step, cfg.batch).slice(rank * share, (rank + 1) * share)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = net(batch.tokens.to(device), batch.layout)
        loss = F.cross_entropy(logits.float(), batch.target.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        sched.step()
        losses.append(_global_mean(loss.detach(), world))
        if first is None:
            first = {"first_step_s": time.perf_counter() - ts, "first_step_cpu_s": time.process_time() - cs}
        done = step + 1
        if progress is not None:
            progress(done, cfg.steps, losses[-1])
        if ckpt is not None and rank == 0 and (
            (cfg.ckpt_every and done % cfg.ckpt_every == 0) or (stop_after is not None and done - start >= stop_after)
        ):
            _save(ckpt, {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                         "step": done, "losses": losses, "seconds": time.perf_counter() - t0,
                         "cpu_seconds": time.process_time() - c0})
        if stop_after is not None and done - start >= stop_after and done < cfg.steps:
            return {"losses": losses, "steps": done, "seconds": time.perf_counter() - t0,
                    "cpu_seconds": time.process_time() - c0, **first, "stopped": True}
    model.eval()
    return {"losses": losses, "steps": cfg.steps, "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - c0, **(first or {"first_step_s": 0.0, "first_step_cpu_s": 0.0}),
            "stopped": False}


def train_stacked(models: list[nn.Module], sample: Callable[..., Batch], cfg: TrainConfig, *, seeds: list[int],
                  device: torch.device, ckpt: Path | None = None,
                  progress: Callable[[int, int, float], None] | None = None, stop_after: int | None = None,
                  compile: bool = False) -> dict:
    """Train K models (one per seed, same design) together as one stacked ensemble (:mod:`.ensemble`).

    Model k gets the batches :func:`train` would give it (:func:`draw` with its seed), its own mean loss, its
    own gradient clipping and the same AdamW; per model the optimisation is that of :func:`train`. Returns
    :func:`train`'s keys with ``losses`` as one list per model and ``stacked`` (the trained ensemble; give it
    to :func:`ropekit.experiments.ensemble.unstack` or :class:`~ropekit.experiments.ensemble.SharedEval`).
    ``compile`` runs the stacked forward through ``torch.compile``. Checkpoints and ``stop_after`` as in
    :func:`train` (one checkpoint for the ensemble)."""
    from .ensemble import clip_per_model, per_model_loss, stack

    if len(models) != len(seeds) or not seeds:
        raise ValueError(f"train_stacked: {len(models)} models for {len(seeds)} seeds")
    if dist_info()[1] > 1:
        raise ValueError("train_stacked runs in one process; under torchrun train each seed with train()")
    K = len(seeds)
    net = stack(models).to(device)
    params = list(net.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, cfg.lr_at)
    start, losses, seconds, cpu = 0, [[] for _ in seeds], 0.0, 0.0
    if ckpt is not None and ckpt.exists():
        state = _load(ckpt, device)
        if state.get("seeds") != list(seeds):
            raise ValueError(f"checkpoint '{ckpt}' holds seeds {state.get('seeds')}, not {list(seeds)}")
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start, losses, seconds, cpu = state["step"], state["losses"], state["seconds"], state["cpu_seconds"]
    forward = torch.compile(net) if compile else net
    t0, c0 = time.perf_counter() - seconds, time.process_time() - cpu
    net.train()
    first, ts, cs = None, time.perf_counter(), time.process_time()
    for step in range(start, cfg.steps):
        batches = [draw(sample, s, step, cfg.batch) for s in seeds]
        if any(b.layout != batches[0].layout for b in batches):
            raise ValueError("train_stacked: the seeds' batches of one step have different layouts; the sampler "
                             "must take the layout from `layout_g`")
        tokens = torch.cat([b.tokens for b in batches]).to(device)
        target = torch.cat([b.target for b in batches]).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = forward(tokens, batches[0].layout)
        loss = per_model_loss(logits, target, K)
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()
        clip_per_model(params, K, cfg.clip)
        opt.step()
        sched.step()
        for k, v in enumerate(loss.detach().tolist()):
            losses[k].append(v)
        if first is None:
            first = {"first_step_s": time.perf_counter() - ts, "first_step_cpu_s": time.process_time() - cs}
        done = step + 1
        if progress is not None:
            progress(done, cfg.steps, sum(v[-1] for v in losses) / K)
        if ckpt is not None and ((cfg.ckpt_every and done % cfg.ckpt_every == 0)
                                 or (stop_after is not None and done - start >= stop_after)):
            _save(ckpt, {"model": net.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                         "step": done, "losses": losses, "seeds": list(seeds), "seconds": time.perf_counter() - t0,
                         "cpu_seconds": time.process_time() - c0})
        if stop_after is not None and done - start >= stop_after and done < cfg.steps:
            return {"losses": losses, "steps": done, "seconds": time.perf_counter() - t0,
                    "cpu_seconds": time.process_time() - c0, **first, "stopped": True, "stacked": net}
    net.eval()
    return {"losses": losses, "steps": cfg.steps, "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - c0, **(first or {"first_step_s": 0.0, "first_step_cpu_s": 0.0}),
            "stopped": False, "stacked": net}


def _global_mean(loss: torch.Tensor, world: int) -> float:
    if world > 1:
        import torch.distributed as dist

        loss = loss.clone()
        dist.all_reduce(loss)
        loss /= world
    return float(loss)
