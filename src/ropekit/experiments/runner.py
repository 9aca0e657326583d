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
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from .base import Experiment
from .registry import get
from .stats import (ALPHA, UNINFORMATIVE, adjusted_verdicts, below_delta, mean_interval, paired_verdict,
                    seeds_to_decide)
from .train import TrainConfig, dist_info, train, train_stacked

__all__ = ["run_experiment", "read_runs", "aggregate", "verdicts", "step_costs", "default_designs", "summary_table",
           "nonfinite_runs",
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


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _bad_value(v) -> "str | None":
    """Why a metric value is not one a run can hold (a number, a ``{condition: number}`` curve, or a nested list
    of numbers, a heat map), or None when it is one. NaN and ±inf are numbers here: a run may yield them."""
    if _number(v):
        return None
    if isinstance(v, dict):
        bad = [x for x in v.values() if not _number(x)]
        return None if not bad else f"a curve holding {bad[0]!r}, not a number"
    if isinstance(v, list):
        stack = list(v)
        while stack:
            x = stack.pop()
            if isinstance(x, list):
                stack.extend(x)
            elif not _number(x):
                return f"a grid holding {x!r}, not a number"
        return None
    return f"{v!r}, not a number"


def _bad_record(rec: dict) -> "str | None":
    """What is wrong with a run record whose keys are there (a field holding the wrong kind of value), or None."""
    if not isinstance(rec["design"], str):
        return f"its design is {rec['design']!r}, not a name"
    if isinstance(rec["seed"], bool) or not isinstance(rec["seed"], int):
        return f"its seed is {rec['seed']!r}, not an int"
    if not isinstance(rec["config"], dict) or not isinstance(rec["config"].get("train"), dict):
        return "its config is not a dict with a `train` dict"
    metrics = rec.get("metrics", {})
    if not isinstance(metrics, dict):
        return f"its metrics are {metrics!r}, not a dict of metric values"
    for key, v in metrics.items():
        why = _bad_value(v)
        if why is not None:
            return f"metric {key!r} of {rec['design']} seed {rec['seed']} is {why}"
    for key in ("steps", "train_s", "train_cpu_s", "first_step_s", "first_step_cpu_s"):
        if key in rec and not _number(rec[key]):
            return f"its {key} is {rec[key]!r}, not a number"
    return None


def _scan_runs(path: Path) -> tuple[list[dict], int, bytes, "tuple[int, str] | None"]:
    """``(records, end, rest, damaged)`` of a ``runs.jsonl``: its whole records, the byte offset just past the
    last of them, the bytes after that, and ``(line number, reason)`` of a damaged last line (None when there
    is none). A damaged line with records after it raises a ``ValueError`` naming the file and the line, and so
    does a whole record holding a wrong value (a metric that is not a number, say): no crash writes that."""
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
        why = _bad_record(rec)
        if why is not None:  # a whole line (valid JSON, every key): edited or damaged, not cut off by a crash
            raise ValueError(f"'{path}' line {number} is not a valid run record: {why}; repair or delete line "
                             f"{number} (a deleted run is trained again by the next {_rerun(path)})")
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
           "claims": verdicts(exp, runs), "nonfinite_runs": nonfinite_runs(runs), "alpha": ALPHA,
           "cost": step_costs(runs), "versions": _versions(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if replicate:
        rep_runs = [done[(d, s)] for d in chosen for s in replication]
        rep_claims = verdicts(exp, rep_runs)
        agg["replication"] = {"seeds": len(replication), "seed_list": replication, "metrics": aggregate(rep_runs),
                              "claims": rep_claims, "nonfinite_runs": nonfinite_runs(rep_runs)}
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
    ``nothing to confirm`` when the discovery was inconclusive or not informative."""
    rep = {c["id"]: c for c in replication}
    for c in discovery:
        r = rep.get(c["id"])
        c["replication"] = None if r is None else {
            **{k: r[k] for k in ("verdict", "verdict_unadjusted", "advantage", "advantage_adjusted", "p", "p_holm",
                                 "seeds", "design_mean", "baseline_mean")},
            **{k: r[k] for k in ("reason", "nonfinite_seeds") if k in r}}
        if r is None or c["verdict"] in ("inconclusive", UNINFORMATIVE):
            c["confirmation"] = "nothing to confirm"
        else:
            c["confirmation"] = "confirmed" if r["verdict"] == c["verdict"] else "not confirmed"


def _finite(v) -> bool:
    return math.isfinite(v)


def _interval_of(values: list, seeds: list) -> dict:
    """:func:`mean_interval` of the finite values; the seeds whose value is NaN or ±inf (a diverged run, or a
    metric undefined for that run) are left out of it and listed under ``nonfinite_seeds`` (``n`` counts the
    values used). No finite value at all: NaN mean and interval, ``n`` 0 — the metric is kept, never dropped."""
    keep = [float(v) for v in values if _finite(v)]
    bad = [s for v, s in zip(values, seeds) if not _finite(v)]
    if keep:
        iv = mean_interval(keep)
    else:
        nan = float("nan")
        iv = {"mean": nan, "lo": nan, "hi": nan, "n": 0, "sd": nan}
    if bad:
        iv["nonfinite_seeds"] = bad
    return iv


def _nonfinite_keys(metrics: dict) -> list[str]:
    """The metrics of one run holding NaN or ±inf (a scalar, a point of a curve or a cell of a heat map)."""
    def bad(v) -> bool:
        if isinstance(v, dict):
            return any(bad(x) for x in v.values())
        if isinstance(v, list):
            return any(bad(x) for x in v)
        return not _finite(v)
    return [k for k, v in metrics.items() if bad(v)]


def _seed_list(seeds: list) -> str:
    return ", ".join(str(s) for s in seeds)


def nonfinite_runs(runs: list[dict]) -> dict:
    """``{design: [{"seed", "metrics"}, …]}``: the runs (a diverged one, say) with a NaN or infinite value, and
    which metrics hold it; designs without such runs are absent. The aggregate keeps those runs' finite
    values and lists the others (:func:`aggregate`), and the summary names them."""
    out: dict[str, list[dict]] = {}
    for r in runs:
        keys = _nonfinite_keys(r["metrics"])
        if keys:
            out.setdefault(r["design"], []).append({"seed": r["seed"], "metrics": keys})
    return out


def aggregate(runs: list[dict]) -> dict:
    """Per design, per metric: scalars → interval dict; curves ``{x: v}`` → ``{x: interval}``; heat maps →
    the element-wise mean over seeds (``{"mean": grid, "n": seeds}``).

    A NaN or infinite value (a diverged run, a metric with no data) is left out of its interval, whose
    ``nonfinite_seeds`` names the runs it came from and whose ``n`` counts the values used; a metric with no
    finite value has a NaN interval and ``n`` 0. No metric is ever dropped."""
    by_design: dict[str, list[dict]] = {}
    for r in runs:
        by_design.setdefault(r["design"], []).append(r)
    out = {}
    for design, rs in by_design.items():
        ms, seeds = [r["metrics"] for r in rs], [r["seed"] for r in rs]
        agg = {}
        for key, first in ms[0].items():
            if isinstance(first, dict):
                agg[key] = {x: _interval_of([m[key][x] for m in ms], seeds) for x in first}
            elif isinstance(first, list):
                grids = torch.tensor([m[key] for m in ms], dtype=torch.float64)
                agg[key] = {"mean": grids.mean(0).tolist(), "n": len(ms)}
            else:
                agg[key] = _interval_of([m[key] for m in ms], seeds)
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
    which, at the measured spread, the adjusted interval would be narrower than δ.

    A seed where either design's value is NaN or infinite (a diverged run) is left out of the claim's pairs
    and named in ``nonfinite_seeds`` (``{design: [seeds]}``); ``seeds`` lists the pairs used. A claim with no
    finite pair, or whose differences are the same in every seed (no spread: e.g. both designs at chance in
    every run), is ``not informative`` with a ``reason``: it decides nothing (see
    :func:`ropekit.experiments.stats.adjusted_verdicts`; a claim with no finite pair is outside the family)."""
    table = {(r["design"], r["seed"]): r["metrics"] for r in runs}
    all_seeds = sorted({s for _, s in table})
    rows, diffs, empty = [], [], []
    for c in exp.claims:
        if not all((d, s) in table for d in (c.design, c.baseline) for s in all_seeds):
            continue
        values = {d: {s: table[(d, s)][c.metric] for s in all_seeds} for d in (c.design, c.baseline)}
        bad = {d: [s for s, v in vs.items() if not _finite(v)] for d, vs in values.items()}
        seeds = [s for s in all_seeds if all(_finite(values[d][s]) for d in values)]
        row = {"id": c.id, "claim": c.text, "source": c.source, "metric": c.metric, "design": c.design,
               "baseline": c.baseline, "better": c.better, "delta": c.delta, "delta_reason": c.delta_reason,
               "seeds": seeds}
        if any(bad.values()):
            row["nonfinite_seeds"] = {d: ss for d, ss in bad.items() if ss}
        if not seeds:
            nan = float("nan")
            iv = {"mean": nan, "lo": nan, "hi": nan, "n": 0, "sd": nan}
            row.update({"verdict_unadjusted": UNINFORMATIVE, "verdict": UNINFORMATIVE, "advantage": iv,
                        "advantage_adjusted": dict(iv), "design_mean": nan, "baseline_mean": nan,
                        "differences": [], "p": 1.0, "p_holm": 1.0, "reason": (
                            f"no seed has a finite {c.metric} for both designs (NaN or infinite in "
                            + "; ".join(f"{d} seeds {_seed_list(ss)}" for d, ss in bad.items() if ss)
                            + "): nothing to test")})
            empty.append(row)
            rows.append(row)
            continue
        a = [values[c.design][s] for s in seeds]
        b = [values[c.baseline][s] for s in seeds]
        v = paired_verdict(a, b, c.better, c.delta)
        sign = 1.0 if c.better == "higher" else -1.0
        diffs.append([sign * (x - y) for x, y in zip(a, b)])
        row.update({"verdict_unadjusted": v["verdict"], "advantage": v["advantage"],
                    "design_mean": sum(a) / len(a), "baseline_mean": sum(b) / len(b), "differences": diffs[-1]})
        if v["verdict"] == UNINFORMATIVE:
            row["reason"] = (f"the paired difference in {c.metric} is {diffs[-1][0]:+.4g} in every one of the "
                             f"{len(seeds)} seeds (design {a[0]:.4g}, baseline {b[0]:.4g} in the first): no spread "
                             "to measure noise against, so the metric was not informative here (e.g. both designs "
                             "at chance) and decides nothing")
        rows.append(row)
    tested = [r for r in rows if not any(r is e for e in empty)]
    adjusted = adjusted_verdicts(diffs, [r["delta"] for r in tested], alpha)
    level = 1.0 - alpha / max(1, len(tested))
    for r in empty:
        r.update({"adjusted_level": level, "family": len(tested), "alpha": alpha, "seeds_to_decide": None})
    for r, adj in zip(tested, adjusted):
        r.update({"verdict": adj["verdict"], "p": adj["p"], "p_holm": adj["p_holm"],
                  "advantage_adjusted": adj["interval"], "adjusted_level": adj["level"], "family": len(tested),
                  "alpha": alpha})
        r["seeds_to_decide"] = (seeds_to_decide(r["advantage"]["sd"], r["delta"], alpha, len(tested))
                                if r["verdict"] == "inconclusive" and len(r["seeds"]) >= 2 else None)
    return rows


def summary_table(agg: dict) -> str:
    """Plain-text table: scalar metrics per design (mean ± half-width; ``*``: some runs' values were NaN or
    infinite and are left out, listed under the table), then the verdicts (a ``not informative`` one with its
    reason)."""
    metrics = agg["metrics"]
    keys = list(dict.fromkeys(k for m in metrics.values() for k, v in m.items() if isinstance(v, dict) and "lo" in v))
    lines = [f"{agg['experiment']} ({agg['preset']}, {agg['seeds']} seed(s)); mean ± 95% half-width"]
    lines.append(f"{'design':<22}" + "".join(f"{k:>17}" for k in keys))

    def cell(iv: "dict | None") -> str:
        if iv is None:
            return f"{'-':>17}"
        if not iv.get("n"):
            return f"{'no finite value':>17}"
        half = (iv["hi"] - iv["lo"]) / 2
        if iv.get("nonfinite_seeds"):
            return f"{iv['mean']:>8.3f} ± {half:<5.3f}*"
        return f"{iv['mean']:>9.3f} ± {half:<5.3f}"

    for d, m in metrics.items():
        lines.append(f"{d:<22}" + "".join(cell(m.get(k)) for k in keys))
    bad = agg.get("nonfinite_runs") or {}
    if bad:
        lines.append("* runs with NaN or infinite values (a diverged run, or a metric undefined for it), left out of "
                     "the means and intervals: " + "; ".join(
                         f"{d} seed {r['seed']} ({', '.join(r['metrics'])})" for d, rs in bad.items() for r in rs))
    cost = agg.get("cost", {})
    if cost.get("designs"):
        ref = cost["reference"]
        lines.append("seconds per training step (CPU)" + (f", × {ref}" if ref else "") + ": " + ", ".join(
            f"{d} {c['step_cpu_s']:.3f}" + (f" ({c['cpu_ratio']:.2f}×)" if c["cpu_ratio"] else "")
            for d, c in cost["designs"].items()))
    claims = agg["claims"]
    if claims and "verdict_unadjusted" in claims[0]:
        family = claims[0].get("family", len(claims))
        lines.append(f"verdicts adjusted over the {family} claims (Holm-Bonferroni, alpha {claims[0]['alpha']:g}); "
                     "unadjusted 95% verdict in brackets; delta = smallest effect of interest")
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
        if c.get("reason"):
            line += f"\n    {c['verdict']}: {c['reason']}"
        if c.get("nonfinite_seeds"):
            line += ("\n    left out (NaN or infinite " + c["metric"] + "): " + "; ".join(
                f"{d} seed(s) {_seed_list(ss)}" for d, ss in c["nonfinite_seeds"].items())
                + (f"; decided on the {len(c['seeds'])} other seed(s)" if c["seeds"] else ""))
        if c.get("replication"):
            r, ra = c["replication"], c["replication"]["advantage"]
            line += (f"\n    replication ({len(r['seeds'])} other seeds): {r['verdict']}, advantage {ra['mean']:+.3f} "
                     f"95% [{ra['lo']:+.3f}, {ra['hi']:+.3f}] -> {c['confirmation']}")
            if r.get("reason"):
                line += f"\n    replication {r['verdict']}: {r['reason']}"
        lines.append(line)
    if agg.get("preset") in ("micro", "quick"):
        lines.append(f"({agg['preset']} preset: a look, not sized to decide; `--preset standard` is)")
    return "\n".join(lines)
