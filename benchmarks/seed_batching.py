"""Seed-runs per CPU-minute of the experiments, one run at a time vs the seeds of a design stacked.

``python -m benchmarks.seed_batching [--experiments crossmodal,resolution] [--designs ...] [--seeds 4]``

For each experiment, at its ``quick`` configuration, the same designs × seeds are trained and evaluated
three ways in one process, one design after another (so that a change of machine load hits every engine
of a design alike): ``sequential`` (:func:`ropekit.experiments.runner.run_one` per seed, the engine
before), ``stacked`` (:func:`~ropekit.experiments.runner.run_group`: the seeds of a design as one stacked
ensemble) and ``stacked+compile`` (the same through ``torch.compile``, its compilation done in this process
and counted). The score is finished seed-runs per minute of this process's CPU time (training, evaluation
and any compilation). Each engine's metrics are compared with the sequential ones (largest absolute
difference over every scalar metric), and the stacked engine is run twice on the first design to check
that the same command gives the same numbers. Writes ``benchmarks/results/seed_batching.json``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from .common import machine

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_DESIGNS = {"crossmodal": ["mrope", "circle"], "resolution": ["axial", "geope"]}
ENGINES = ("sequential", "stacked", "stacked+compile")


def _scalars(metrics: dict) -> dict:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, float):
            out[k] = v
        elif isinstance(v, dict):
            out.update({f"{k}[{x}]": y for x, y in v.items()})
    return out


def _max_diff(a: list[dict], b: list[dict]) -> float:
    diffs = [abs(x[k] - y[k]) for ra, rb in zip(a, b) for x, y in [(_scalars(ra["metrics"]), _scalars(rb["metrics"]))]
             for k in x if x[k] == x[k]]
    return max(diffs) if diffs else 0.0


def _timed(fn):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - c0, time.perf_counter() - w0


def bench(name: str, designs: list[str], seeds: list[int], engines: tuple[str, ...], log=print) -> dict:
    from ropekit.experiments import get
    from ropekit.experiments.runner import run_group, run_one

    exp = get(name)
    cfg = exp.presets["quick"]
    dev = torch.device("cpu")
    per = {e: {"cpu_s": 0.0, "wall_s": 0.0, "runs": 0, "records": []} for e in engines}
    repeat_equal = None
    for i, design in enumerate(designs):
        for e in engines:
            if e == "sequential":
                fn = lambda: [run_one(exp, design, s, cfg, dev) for s in seeds]  # noqa: E731
            else:
                fn = lambda c=(e == "stacked+compile"): run_group(exp, design, seeds, cfg, dev, compile=c)  # noqa: E731
            if e == "stacked+compile":
                torch._dynamo.reset()  # each design compiles afresh, as a new process would
            recs, cpu, wall = _timed(fn)
            per[e]["cpu_s"] += cpu
            per[e]["wall_s"] += wall
            per[e]["runs"] += len(recs)
            per[e]["records"] += recs
            log(f"  {name} {design} {e}: {len(recs)} runs, {cpu:.1f} s CPU ({wall:.1f} s wall)")
            if i == 0 and e == "stacked":  # the same command again: the same numbers
                again = run_group(exp, design, seeds, cfg, dev)
                repeat_equal = all(a["metrics"] == b["metrics"] and a["losses"] == b["losses"]
                                   for a, b in zip(recs, again))
    base = per["sequential"]
    out = {"experiment": name, "preset": "quick", "designs": designs, "seeds": seeds, "config": cfg,
           "stacked_repeat_identical": repeat_equal, "engines": {}}
    for e, r in per.items():
        rate = r["runs"] / (r["cpu_s"] / 60)
        out["engines"][e] = {"cpu_s": round(r["cpu_s"], 2), "wall_s": round(r["wall_s"], 2), "runs": r["runs"],
                             "seed_runs_per_cpu_minute": round(rate, 3),
                             "speedup_vs_sequential": round(rate / (base["runs"] / (base["cpu_s"] / 60)), 3)
                             if "sequential" in per else None,
                             "max_metric_diff_vs_sequential": (_max_diff(base["records"], r["records"])
                                                               if "sequential" in per else None)}
        log(f"{name} {e}: {rate:.2f} seed-runs per CPU-minute "
            f"({out['engines'][e]['speedup_vs_sequential']}x sequential; largest metric difference "
            f"{out['engines'][e]['max_metric_diff_vs_sequential']:.2g})")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.seed_batching", description=__doc__.splitlines()[0])
    p.add_argument("--experiments", default="crossmodal,resolution")
    p.add_argument("--designs", default=None, help="comma-separated designs (default: two per experiment)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per design (default 4)")
    p.add_argument("--engines", default=",".join(ENGINES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS / "seed_batching.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # compile in this process, so that its CPU time is counted
    engines = tuple(e for e in args.engines.split(",") if e)
    if "sequential" not in engines:
        p.error("--engines must include sequential (the reference)")
    results = []
    for name in args.experiments.split(","):
        designs = args.designs.split(",") if args.designs else DEFAULT_DESIGNS.get(name, ["axial"])
        results.append(bench(name, designs, list(range(args.seeds)), engines))
    info = machine()
    try:
        load = open("/proc/loadavg").read().split()[:3]
    except OSError:
        load = None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": info, "load_average_at_end": load, "threads": args.threads,
                                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    "results": results}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
