"""Run an experiment over designs × seeds, one JSON line per run, then aggregate with 95 % intervals.

Files written under ``out/<experiment>/``: ``runs.jsonl`` (one line per finished run: config, metrics,
wall time, versions), ``aggregate.json`` (per design and metric the mean and t-interval over seeds,
plus a verdict per paper claim) and ``ckpt/`` (checkpoints of unfinished runs; a rerun resumes them
and skips finished runs; a last line of ``runs.jsonl`` cut off by a killed run is removed, with a
warning, and its run trained again). Under ``torchrun`` every rank trains its share of each global
batch and rank 0 writes the files.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .base import Experiment
from .registry import get
from .stats import ALPHA, adjusted_verdicts, below_delta, mean_interval, paired_verdict, seeds_to_decide
from .train import TrainConfig, dist_info, train, train_stacked

__all__ = ["run_experiment", "read_runs", "aggregate", "verdicts", "step_costs", "default_designs", "summary_table",
           "init_distributed", "seed_sets", "default_seeds", "attach_replication", "run_one", "run_group", "REPLICATION_OFFSET"]

PRESETS = ("micro", "quick", "standard", "full")
# seeds of a design trained together by default (a stacked ensemble gives each seed the numbers it gets alone,
# to float32 rounding, and the same numbers whatever the group size; see ropekit.experiments.ensemble)
BATCH_SEEDS = {"quick": 8, "standard": 8}
# replication seeds are the discovery seeds plus this offset: disjoint from any discovery set below it
REPLICATION_OFFSET = 10_000


def init_distributed(device: str) -> torch.device:
    """Join the torchrun process group when ``WORLD_SIZE`` > 1 (gloo on CPU, NCCL on CUDA); pick the device."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available; use --device cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _versions() -> dict:
    from .. import __version__

    return {"ropekit": __version__, "torch": torch.__version__, "python": platform.python_version()}


def _bar(label: str) -> Callable[[int, int, float], None]:
    """Training progress on stderr: a bar redrawn in place on a terminal, else a plain line every tenth of the
    run (a CI log or a file gets no ``\\r``)."""
    from .._terminal import is_terminal

    t0 = time.time()

    def show(i: int, n: int, loss: float) -> None:
        if not is_terminal(sys.stderr):
            if i == n or i % max(1, n // 10) == 0:
                sys.stderr.write(f"  {label}: step {i}/{n} loss {loss:.3f} {time.time() - t0:.1f}s\n")
                sys.stderr.flush()
            return
        if i != n and i % max(1, n // 50):
            return
        done = int(24 * i / n)
        sys.stderr.write(f"\r  {label:<28} [{'#' * done}{'-' * (24 - done)}] {i}/{n} loss {loss:.3f} "
                         f"{time.time() - t0:5.1f}s")
        if i == n:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def _comparable(cfg: dict) -> dict:
    """The config without settings that cannot change a result (checkpoint frequency)."""
    return {**cfg, "train": {k: v for k, v in cfg["train"].items() if k != "ckpt_every"}}


_RUN_KEYS = ("preset", "design", "seed", "config")


def _rerun(path: Path) -> str:
    """The command that trains again the runs missing from ``path`` (written as ``DIR/NAME/runs.jsonl``)."""
    if path.name == "runs.jsonl":
        return f"`ropekit experiment {path.parent.name} --out {path.parent.parent}` with the same options"
    return "`ropekit experiment NAME --out DIR` with the same options (DIR/NAME holding this file)"


def _scan_runs(path: Path) -> tuple[list[dict], int, bytes, "tuple[int, str] | None"]:
    """``(records, end, rest, damaged)`` of a ``runs.jsonl``: its whole records, the byte offset just past the
    last of them, the bytes after that, and ``(line number, reason)`` of a damaged last line (None when there
    is none). A damaged line with records after it raises a ``ValueError`` naming the file and the line."""
    data = path.read_bytes()
    records, end, bad, start = [], 0, None, 0
    for number, raw in enumerate(data.split(b"\n"), 1):
        stop, start = start + len(raw), start + len(raw) + 1
        if not raw.strip():
            continue
        if bad is not None:  # whole lines follow the damaged one: no crash cut it off
            raise ValueError(f"'{path}' line {bad[0]} is damaged ({bad[1]}) and is not the last line, so it is "
                             f"not a run cut off by a crash; repair or delete line {bad[0]} (a deleted run is "
                             f"trained again by the next {_rerun(path)})")
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as error:
            bad = (number, f"{error.msg}: column {error.colno}")
            continue
        except ValueError as error:  # bytes that are not UTF-8
            bad = (number, str(error))
            continue
        if not isinstance(rec, dict) or any(k not in rec for k in _RUN_KEYS):
            bad = (number, f"not a run record with {', '.join(_RUN_KEYS)}")
            continue
        records.append(rec)
        end = stop
    return records, end, data[end:], bad


def _warn(message: str) -> None:
    print("ropekit: warning: " + " ".join(message.split()), file=sys.stderr)


def read_runs(path: "str | Path", *, warn: bool = True) -> list[dict]:
    """The run records of a ``runs.jsonl``, in file order.

    A damaged *last* line (the record of a run killed while writing it) is skipped, with a warning on stderr
    naming the file and the line: that run counts as unfinished, and the next ``ropekit experiment NAME
    --out DIR`` of this folder trains it again. A damaged line before the last raises a ``ValueError``
    naming both.
    """
    path = Path(path)
    records, _, _, damaged = _scan_runs(path)
    if damaged is not None and warn:
        _warn(f"'{path}' line {damaged[0]} is cut off ({damaged[1]}), as when a run is killed while writing its "
              f"record; skipped it. That run counts as unfinished: the next {_rerun(path)} trains it again")
    return records


def _repair_runs(path: Path) -> list[dict]:
    """:func:`read_runs` for the runner, which appends to the file next: a cut-off last line is removed (else
    the next record would be glued onto it), with a warning, and the last record ends with a newline."""
    records, end, rest, damaged = _scan_runs(path)
    if damaged is not None:
        _warn(f"'{path}' line {damaged[0]} is cut off ({damaged[1]}), as when a run is killed while writing its "
              "record; removed it. The run it held counts as unfinished, so it is trained again (now, if this "
              "command includes it)")
    if rest != (b"\n" if end else b""):
        with path.open("r+b") as f:
            f.truncate(end)
            if end:
                f.seek(end)
                f.write(b"\n")
    return records


def _done_runs(path: Path, preset: str, cfg: dict, *, repair: bool = False, warn: bool = True) -> dict:
    """Finished runs of this preset *and configuration* (a changed preset runs again, never mixes).

    A cut-off last line is skipped (see :func:`read_runs`); ``repair`` (for the one process that appends to
    the file) also removes it from the file."""
    if not path.exists():
        return {}
    runs = {}
    for r in (_repair_runs(path) if repair else read_runs(path, warn=warn)):
        if r["preset"] == preset and _comparable(r["config"]) == _comparable(cfg):
            runs[(r["design"], r["seed"])] = r
    return runs


def default_designs(exp: Experiment, preset: str) -> list[str]:
    """The designs run when none are named: the experiment's own (or the preset's own list, ``designs_at``),
    then those its preset adds (in order, once)."""
    own = tuple(exp.designs_at.get(preset, exp.designs))
    return list(dict.fromkeys(own + tuple(exp.preset_designs.get(preset, ()))))


def run_one(exp: Experiment, design: str, seed: int, cfg: dict, device: torch.device, *, ckpt: Path | None = None,
            progress: bool = False, stop_after: int | None = None) -> dict | None:
    """Train and evaluate one (design, seed); the run's record, or None when ``stop_after`` interrupted it."""
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = exp.make_model(design, cfg)
    tcfg = TrainConfig(**cfg["train"])
    bar = _bar(f"{design} seed {seed}") if progress else None
    res = train(model, exp.sampler(cfg), tcfg, seed=seed, device=device, ckpt=ckpt, progress=bar,
                stop_after=stop_after)
    if res["stopped"]:
        return None
    metrics = exp.evaluate(model, cfg, device)
    tail = res["losses"][-max(1, len(res["losses"]) // 10):]
    return {"experiment": exp.name, "design": design, "seed": seed, "config": cfg,
            "hyperparameters": exp.hyperparameters_note, "metrics": metrics,
            "final_loss": sum(tail) / len(tail), "losses": res["losses"], "steps": res["steps"],
            "train_s": round(res["seconds"], 3), "train_cpu_s": round(res["cpu_seconds"], 3),
            "first_step_s": round(res["first_step_s"], 4), "first_step_cpu_s": round(res["first_step_cpu_s"], 4),
            "wall_s": round(time.perf_counter() - t0, 3), "cpu_s": round(time.process_time() - c0, 3),
            "device": str(device), "world_size": dist_info()[1], "threads": torch.get_num_threads(),
            "versions": _versions(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def seed_sets(n_seeds: int, seed_start: int = 0) -> tuple[list[int], list[int]]:
    """``(discovery, replication)`` seeds: ``seed_start … seed_start + n_seeds − 1`` and the same numbers plus
    :data:`REPLICATION_OFFSET` (disjoint as long as discovery seeds stay below the offset)."""
    for name, v, low in (("seeds", n_seeds, 1), ("seed_start", seed_start, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"`{name}` must be an int >= {low}, got {v!r}")
    if seed_start + n_seeds > REPLICATION_OFFSET:
        raise ValueError(f"discovery seeds must stay below {REPLICATION_OFFSET} (the replication seeds start there); "
                         f"got seeds {seed_start}..{seed_start + n_seeds - 1}")
    discovery = list(range(seed_start, seed_start + n_seeds))
    return discovery, [REPLICATION_OFFSET + s for s in discovery]


def default_seeds(exp: Experiment, preset: str) -> int:
    """Seeds per design when none are given: the preset's own count (``standard``), else 1 for micro, 3 else."""
    return exp.seeds.get(preset, 1 if preset == "micro" else 3)


def run_experiment(name: str, *, designs: list[str] | None = None, seeds: int | None = None, seed_start: int = 0,
                   replicate: bool = False, preset: str = "quick", device: str = "cpu", out: "str | Path" = "experiments",
                   progress: bool = True, batch_seeds: int | None = None, compile: bool = False,
                   jobs: int = 1) -> dict:
    """Run (or resume) every design × seed of experiment ``name``; write and return the aggregate.

    Seeds are ``seed_start … seed_start + seeds − 1`` (the discovery set). ``replicate`` also trains the
    disjoint replication set (:func:`seed_sets`; the discovery set too when unfinished), and the aggregate
    then reports each claim's discovery and replication verdicts side by side; a replication set already
    finished in ``runs.jsonl`` is reported without ``replicate``. ``batch_seeds`` trains up to that many
    seeds of a design together as one stacked ensemble (:func:`run_group`; default: the experiment's
    ``batch_seeds`` for the preset, else :data:`BATCH_SEEDS`; 1 = one run at a time); ``compile`` passes the ensemble through
    ``torch.compile``. ``jobs`` > 1 trains that many units (a stacked group of seeds, or one seed) at once in
    worker processes with this process's torch thread count each (CPU only): the same records as ``jobs=1``,
    appended as each unit finishes."""
    exp = get(name)
    if preset not in exp.presets:
        raise ValueError(f"unknown preset {preset!r} for {name}; choose one of {', '.join(exp.presets)}")
    cfg = exp.presets[preset]
    chosen = list(designs or default_designs(exp, preset))
    from .models import layer_designs

    for d in chosen:
        exp.check_design(d) if exp.check_design else layer_designs(d, 1)  # raises a clear ValueError for an unknown name before any training
    discovery, replication = seed_sets(seeds if seeds is not None else default_seeds(exp, preset), seed_start)
    group = exp.batch_seeds.get(preset, BATCH_SEEDS.get(preset, 1)) if batch_seeds is None else batch_seeds
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"`batch_seeds` must be an int >= 1, got {group!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"`jobs` must be an int >= 1, got {jobs!r}")
    if jobs > 1 and (device != "cpu" or int(os.environ.get("WORLD_SIZE", "1")) > 1):
        raise ValueError("`jobs` > 1 runs CPU worker processes: use it with --device cpu and without torchrun "
                         "(a GPU or torchrun run uses its own parallelism)")
    dev = init_distributed(device)
    rank, _ = dist_info()
    folder = Path(out) / name
    (folder / "ckpt").mkdir(parents=True, exist_ok=True)
    runs_path = folder / "runs.jsonl"
    done = _done_runs(runs_path, preset, cfg, repair=rank == 0, warn=False)  # rank 0 writes the file and warns
    if not replicate and all((d, s) in done for d in chosen for s in replication):
        replicate = True  # finished earlier: report it
    todo_seeds = discovery + (replication if replicate else [])
    units = [u for design in chosen
             for u in _units(exp, design, [s for s in todo_seeds if (design, s) not in done], cfg, group,
                             warn=progress and rank == 0)]
    records = (_run_units_in_workers(exp, units, preset, folder, compile=compile, jobs=jobs, progress=progress)
               if jobs > 1 and units else
               (rec for u in units for rec in _run_unit(exp, *u, cfg, dev, folder, preset,
                                                         progress=progress and rank == 0, compile=compile)))
    for rec in records:
        rec = {"preset": preset, **rec}
        if rank == 0:
            with runs_path.open("a") as f:
                f.write(json.dumps(rec) + "\n")
        done[(rec["design"], rec["seed"])] = rec
    runs = [done[(d, s)] for d in chosen for s in discovery]
    agg = {"format": 2, "experiment": name, "preset": preset, "seeds": len(discovery), "seed_list": discovery,
           "designs": chosen, "config": cfg, "hyperparameters": exp.hyperparameters_note, "metrics": aggregate(runs),
           "claims": verdicts(exp, runs), "alpha": ALPHA, "cost": step_costs(runs), "versions": _versions(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if replicate:
        rep_runs = [done[(d, s)] for d in chosen for s in replication]
        rep_claims = verdicts(exp, rep_runs)
        agg["replication"] = {"seeds": len(replication), "seed_list": replication, "metrics": aggregate(rep_runs),
                              "claims": rep_claims}
        attach_replication(agg["claims"], rep_claims)
    if rank == 0:
        (folder / "aggregate.json").write_text(json.dumps(agg, indent=1))
    return agg


def _units(exp: Experiment, design: str, seeds: list[int], cfg: dict, batch_seeds: int, *,
           warn: bool = False) -> list[tuple[str, list[int], bool]]:
    """The units of work for ``design`` at ``seeds``: ``(design, seeds, stacked)``. With ``batch_seeds`` > 1 (and
    a design the ensemble can stack, in one process) groups of that many seeds trained together
    (:func:`run_group`); otherwise one seed each (:func:`run_one`)."""
    from .ensemble import supported

    if not seeds:
        return []
    if batch_seeds > 1 and len(seeds) > 1 and dist_info()[1] == 1:
        reason = supported(exp.make_model(design, cfg))
        if reason is None:
            return [(design, seeds[i:i + batch_seeds], True) for i in range(0, len(seeds), batch_seeds)]
        if warn:
            _warn(f"{design}: trained one seed at a time ({reason})")
    return [(design, [s], False) for s in seeds]


def _run_unit(exp: Experiment, design: str, seeds: list[int], stacked: bool, cfg: dict, dev: torch.device,
              folder: Path, preset: str, *, progress: bool, compile: bool = False):
    """Train and evaluate one unit of :func:`_units`; yields each run's record as it finishes (a unit's
    checkpoint, under ``folder/ckpt``, is removed once it has)."""
    if stacked:
        ckpt = folder / "ckpt" / f"{preset}-{design}-s{seeds[0]}-{seeds[-1]}.pt"
        yield from run_group(exp, design, seeds, cfg, dev, ckpt=ckpt, progress=progress, compile=compile)
    else:
        ckpt = folder / "ckpt" / f"{preset}-{design}-s{seeds[0]}.pt"
        yield run_one(exp, design, seeds[0], cfg, dev, ckpt=ckpt, progress=progress)
    ckpt.unlink(missing_ok=True)


def _unit_in_worker(module: str, name: str, preset: str, unit: tuple, folder: str, compile: bool,
                    threads: int) -> list[dict]:
    """:func:`_run_unit` in a worker process (started with ``spawn``: a fresh interpreter, so the experiment is
    found again by importing the module that registers it)."""
    import importlib

    torch.set_num_threads(threads)
    if module not in ("__main__", "__mp_main__"):
        importlib.import_module(module)
    exp = get(name)
    return list(_run_unit(exp, *unit, exp.presets[preset], torch.device("cpu"), Path(folder), preset,
                          progress=False, compile=compile))


def _run_units_in_workers(exp: Experiment, units: list, preset: str, folder: Path, *, compile: bool, jobs: int,
                          progress: bool):
    """Yield the records of ``units``, trained ``jobs`` at a time in worker processes (each with this process's
    torch thread count), in the order the units finish; a line on stderr per finished unit."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    module = exp.evaluate.__module__  # the module that defines (and registers) the experiment
    threads = torch.get_num_threads()
    with ProcessPoolExecutor(max_workers=min(jobs, len(units)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        pending = {pool.submit(_unit_in_worker, module, exp.name, preset, u, str(folder), compile, threads): u
                   for u in units}
        finished = 0
        try:
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready:
                    design, seeds, _ = pending.pop(fut)
                    recs = fut.result()
                    finished += 1
                    if progress:
                        label = f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"
                        print(f"  {design} {label} done ({finished}/{len(units)} units)", file=sys.stderr)
                    yield from recs
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


def run_group(exp: Experiment, design: str, seeds: list[int], cfg: dict, device: torch.device, *,
              ckpt: Path | None = None, progress: bool = False, stop_after: int | None = None,
              compile: bool = False) -> list[dict]:
    """:func:`run_one` for several seeds of one design trained together as a stacked ensemble
    (:func:`ropekit.experiments.train.train_stacked`), each evaluated by ``exp.evaluate`` as its own model
    (the ensemble answers every evaluation batch for all seeds at once: :class:`~.ensemble.SharedEval`).
    Each record carries the group's time divided by its size, and ``stacked`` (the group's seeds). An empty
    list when ``stop_after`` interrupted the training."""
    from .ensemble import SharedEval

    t0, c0 = time.perf_counter(), time.process_time()
    models = []
    for seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            models.append(exp.make_model(design, cfg))
    tcfg = TrainConfig(**cfg["train"])
    bar = _bar(f"{design} seeds {seeds[0]}-{seeds[-1]}") if progress else None
    res = train_stacked(models, exp.sampler(cfg), tcfg, seeds=list(seeds), device=device, ckpt=ckpt, progress=bar,
                        stop_after=stop_after, compile=compile)
    if res["stopped"]:
        return []
    record: list = []
    metrics = [exp.evaluate(SharedEval(res["stacked"], k, record), cfg, device) for k in range(len(seeds))]
    K = len(seeds)
    out = []
    for k, seed in enumerate(seeds):
        losses = res["losses"][k]
        tail = losses[-max(1, len(losses) // 10):]
        out.append({"experiment": exp.name, "design": design, "seed": seed, "config": cfg,
                    "hyperparameters": exp.hyperparameters_note, "metrics": metrics[k],
                    "final_loss": sum(tail) / len(tail), "losses": losses, "steps": res["steps"],
                    "train_s": round(res["seconds"] / K, 3), "train_cpu_s": round(res["cpu_seconds"] / K, 3),
                    "first_step_s": round(res["first_step_s"] / K, 4),
                    "first_step_cpu_s": round(res["first_step_cpu_s"] / K, 4),
                    "wall_s": round((time.perf_counter() - t0) / K, 3), "cpu_s": round((time.process_time() - c0) / K, 3),
                    "stacked": list(seeds), "compiled": compile,
                    "device": str(device), "world_size": 1, "threads": torch.get_num_threads(),
                    "versions": _versions(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return out


CONFIRMATION = ("confirmed", "not confirmed", "nothing to confirm")


def attach_replication(discovery: list[dict], replication: list[dict]) -> None:
    """Give each discovery claim its replication (same claim id, disjoint seeds) and a ``confirmation``:
    ``confirmed`` when the discovery verdict decided something (reproduced, contradicted, no effect) and the
    replication's adjusted verdict is the same, ``not confirmed`` when it decided something else or nothing,
    ``nothing to confirm`` when the discovery was inconclusive."""
    rep = {c["id"]: c for c in replication}
    for c in discovery:
        r = rep.get(c["id"])
        c["replication"] = None if r is None else {
            k: r[k] for k in ("verdict", "verdict_unadjusted", "advantage", "advantage_adjusted", "p", "p_holm",
                              "seeds", "design_mean", "baseline_mean")}
        if r is None or c["verdict"] == "inconclusive":
            c["confirmation"] = "nothing to confirm"
        else:
            c["confirmation"] = "confirmed" if r["verdict"] == c["verdict"] else "not confirmed"


def aggregate(runs: list[dict]) -> dict:
    """Per design, per metric: scalars → interval dict; curves ``{x: v}`` → ``{x: interval}``; heat maps →
    the element-wise mean over seeds (``{"mean": grid, "n": seeds}``)."""
    by_design: dict[str, list[dict]] = {}
    for r in runs:
        by_design.setdefault(r["design"], []).append(r["metrics"])
    out = {}
    for design, ms in by_design.items():
        agg = {}
        for key, first in ms[0].items():
            if isinstance(first, dict):
                agg[key] = {x: mean_interval([m[key][x] for m in ms]) for x in first}
            elif isinstance(first, list):
                grids = torch.tensor([m[key] for m in ms], dtype=torch.float64)
                agg[key] = {"mean": grids.mean(0).tolist(), "n": len(ms)}
            elif first == first:  # skip NaN scalars (a metric with no data at this preset)
                agg[key] = mean_interval([m[key] for m in ms])
        out[design] = agg
    return out


def step_costs(runs: list[dict], reference: str = "axial") -> dict:
    """Training time per step per design (wall and CPU seconds, mean over seeds) and its ratio to
    ``reference`` when that design was run too. Each run's first step is left out when recorded (it carries
    one-off costs such as compiling a kernel). Ratios compare runs of one ``runs.jsonl``, i.e. one machine;
    on a shared machine the CPU ratio is the steadier one."""
    per: dict[str, list[tuple[float, float]]] = {}
    for r in runs:
        skip = r["steps"] > 1 and "first_step_s" in r
        n = r["steps"] - skip
        per.setdefault(r["design"], []).append(((r["train_s"] - skip * r.get("first_step_s", 0.0)) / n,
                                                (r["train_cpu_s"] - skip * r.get("first_step_cpu_s", 0.0)) / n))
    out = {d: {"step_s": sum(w for w, _ in v) / len(v), "step_cpu_s": sum(c for _, c in v) / len(v), "runs": len(v)}
           for d, v in per.items()}
    ref = out.get(reference)
    for c in out.values():
        c["wall_ratio"] = c["step_s"] / ref["step_s"] if ref and ref["step_s"] > 0 else None
        c["cpu_ratio"] = c["step_cpu_s"] / ref["step_cpu_s"] if ref and ref["step_cpu_s"] > 0 else None
    return {"reference": reference if ref else None, "designs": out}


def verdicts(exp: Experiment, runs: list[dict], alpha: float = ALPHA) -> list[dict]:
    """One verdict per claim whose two designs were both run (paired by seed).

    The claims decided here are one family: ``verdict`` is the family-wise one (Holm–Bonferroni on the paired
    t-tests for reproduced / contradicted, Bonferroni-widened intervals for no effect; see
    :func:`ropekit.experiments.stats.adjusted_verdicts`), ``verdict_unadjusted`` the one of the claim's own 95 %
    interval (``advantage``), shown beside it. An undecided claim gets ``seeds_to_decide``: the seeds after
    which, at the measured spread, the adjusted interval would be narrower than δ."""
    table = {(r["design"], r["seed"]): r["metrics"] for r in runs}
    seeds = sorted({s for _, s in table})
    rows, diffs = [], []
    for c in exp.claims:
        if not all((d, s) in table for d in (c.design, c.baseline) for s in seeds):
            continue
        a = [table[(c.design, s)][c.metric] for s in seeds]
        b = [table[(c.baseline, s)][c.metric] for s in seeds]
        if any(x != x for x in a + b):  # a NaN metric (no data at this preset) decides nothing
            continue
        v = paired_verdict(a, b, c.better, c.delta)
        sign = 1.0 if c.better == "higher" else -1.0
        diffs.append([sign * (x - y) for x, y in zip(a, b)])
        rows.append({"id": c.id, "claim": c.text, "source": c.source, "metric": c.metric, "design": c.design,
                     "baseline": c.baseline, "better": c.better, "delta": c.delta, "delta_reason": c.delta_reason,
                     "verdict_unadjusted": v["verdict"], "advantage": v["advantage"],
                     "design_mean": sum(a) / len(a), "baseline_mean": sum(b) / len(b), "seeds": seeds,
                     "differences": diffs[-1]})
    adjusted = adjusted_verdicts(diffs, [r["delta"] for r in rows], alpha)
    for r, adj in zip(rows, adjusted):
        r.update({"verdict": adj["verdict"], "p": adj["p"], "p_holm": adj["p_holm"],
                  "advantage_adjusted": adj["interval"], "adjusted_level": adj["level"], "family": len(rows),
                  "alpha": alpha})
        r["seeds_to_decide"] = (seeds_to_decide(r["advantage"]["sd"], r["delta"], alpha, len(rows))
                                if r["verdict"] == "inconclusive" and len(seeds) >= 2 else None)
    return rows


def summary_table(agg: dict) -> str:
    """Plain-text table: scalar metrics per design (mean ± half-width), then the verdicts."""
    metrics = agg["metrics"]
    keys = [k for k, v in next(iter(metrics.values())).items() if "lo" in v]
    lines = [f"{agg['experiment']} ({agg['preset']}, {agg['seeds']} seed(s)); mean ± 95% half-width"]
    lines.append(f"{'design':<22}" + "".join(f"{k:>17}" for k in keys))
    for d, m in metrics.items():
        lines.append(f"{d:<22}" + "".join(
            f"{m[k]['mean']:>9.3f} ± {(m[k]['hi'] - m[k]['lo']) / 2:<5.3f}" if k in m else f"{'-':>17}" for k in keys))
    cost = agg.get("cost", {})
    if cost.get("designs"):
        ref = cost["reference"]
        lines.append("seconds per training step (CPU)" + (f", × {ref}" if ref else "") + ": " + ", ".join(
            f"{d} {c['step_cpu_s']:.3f}" + (f" ({c['cpu_ratio']:.2f}×)" if c["cpu_ratio"] else "")
            for d, c in cost["designs"].items()))
    claims = agg["claims"]
    if claims and "verdict_unadjusted" in claims[0]:
        lines.append(f"verdicts adjusted over the {len(claims)} claims (Holm-Bonferroni, alpha "
                     f"{claims[0]['alpha']:g}); unadjusted 95% verdict in brackets; delta = smallest effect of interest")
    for c in claims:
        a = c["advantage"]
        line = (f"[{c['verdict']:<12}] {c['id']}: {c['claim']} — {c['metric']} {c['design']} "
                f"{c['design_mean']:.3f} vs {c['baseline']} {c['baseline_mean']:.3f} "
                f"(advantage {a['mean']:+.3f}, 95% [{a['lo']:+.3f}, {a['hi']:+.3f}]")
        if "verdict_unadjusted" in c:
            b = c["advantage_adjusted"]
            line += (f" {c['verdict_unadjusted']}; {100 * c['adjusted_level']:.2f}% [{b['lo']:+.3f}, {b['hi']:+.3f}], "
                     f"p {c['p']:.3g}, Holm {c['p_holm']:.3g}; delta {c['delta']:g}")
            if c.get("seeds_to_decide"):
                line += f"; ~{c['seeds_to_decide']} seeds to decide"
            if below_delta(c):
                line += "; the whole adjusted interval is inside ±delta: real, but smaller than delta"
        line += ")"
        if c.get("replication"):
            r, ra = c["replication"], c["replication"]["advantage"]
            line += (f"\n    replication ({len(r['seeds'])} other seeds): {r['verdict']}, advantage {ra['mean']:+.3f} "
                     f"95% [{ra['lo']:+.3f}, {ra['hi']:+.3f}] -> {c['confirmation']}")
        lines.append(line)
    if agg.get("preset") in ("micro", "quick"):
        lines.append(f"({agg['preset']} preset: a look, not sized to decide; `--preset standard` is)")
    return "\n".join(lines)
