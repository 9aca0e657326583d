"""Is a task in its discriminating range? Train the *baseline* design only, at a preset with overrides, and print
the metrics the claims read (mean and range over seeds).

``python -m benchmarks.task_range video --design mrope --seeds 2 --set task.h=4 --set task.w=4``

Tasks are re-sized on the baseline alone (M-RoPE for video, axial RoPE for the vision experiments), so that
no design under test influences the task it is tested on; the chosen sizes then hold for every design.
``--set`` takes ``section.key=value`` with a JSON value (``eval.frames=[2,4,8,12,16]``). With ``--json`` the
per-seed metrics are written to that file.
"""
from __future__ import annotations

import argparse
import copy
import json
import time

import torch


def _override(cfg: dict, items: list[str]) -> dict:
    cfg = copy.deepcopy(cfg)
    for item in items:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        if section not in cfg or not name:
            raise SystemExit(f"--set {item!r}: give section.key=value with section one of {', '.join(cfg)}")
        try:
            cfg[section][name] = json.loads(value)
        except json.JSONDecodeError:
            cfg[section][name] = value
    return cfg


def main(argv: list[str] | None = None) -> int:
    from ropekit.experiments import get
    from ropekit.experiments.runner import run_group

    p = argparse.ArgumentParser(prog="python -m benchmarks.task_range", description=__doc__.splitlines()[0])
    p.add_argument("experiment")
    p.add_argument("--design", required=True, help="the baseline design (the only one trained)")
    p.add_argument("--preset", default="quick")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--seed-start", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    exp = get(args.experiment)
    cfg = _override(exp.presets[args.preset], args.set)
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    c0 = time.process_time()
    recs = run_group(exp, args.design, seeds, cfg, torch.device("cpu"))
    cpu = time.process_time() - c0
    keys = [c.metric for c in exp.claims] + ["acc"]
    print(f"{args.experiment} {args.design} {args.preset} {' '.join(args.set)}: {len(seeds)} seeds, {cpu:.0f} s CPU")
    for k in dict.fromkeys(keys):
        vals = [r["metrics"][k] for r in recs if isinstance(r["metrics"].get(k), float)]
        if vals:
            print(f"  {k:<20} mean {sum(vals) / len(vals):.3f}  per seed " + " ".join(f"{v:.3f}" for v in vals))
    for k, v in recs[0]["metrics"].items():
        if isinstance(v, dict):
            xs = list(v)
            means = [sum(r["metrics"][k][x] for r in recs) / len(recs) for x in xs]
            print(f"  {k:<20} " + " ".join(f"{x}:{m:.3f}" for x, m in zip(xs, means)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"experiment": args.experiment, "design": args.design, "preset": args.preset, "set": args.set,
                       "config": cfg, "seeds": seeds, "cpu_s": round(cpu, 1),
                       "metrics": [r["metrics"] for r in recs]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
