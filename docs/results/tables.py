"""Store a finished ``ropekit experiment`` run here and print its Markdown tables for docs/experiments.md.

    python docs/results/tables.py store RUN_DIR NAME --machine "..." --load "..." [--command "..." --commit SHA]
                                                                  # -> experiments-NAME-PRESET.json
    python docs/results/tables.py print experiments-resolution-quick.json ...       # tables, never typed by hand

``store`` copies ``RUN_DIR/NAME/aggregate.json`` and adds ``run_info``: the number of runs, their summed CPU
time (``cpu_s`` per run: training plus evaluation, one thread) and wall time, the machine and its load.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ropekit.experiments.stats import verdict_text

HERE = Path(__file__).resolve().parent
SCALARS = {"crossmodal": ["acc", "cell_spread", "acc_long_gap", "acc_large_grid", "acc_multi"],
           "video": ["cell_spread", "boundary_acc", "acc_longest"], "resolution": [], "isotropy": ["acc", "angle_spread"],
           "shape-bias": ["clean_acc", "shape_bias", "conflict_shape_acc", "conflict_texture_acc"],
           "pointcloud": ["miou", "acc", "miou_large", "acc_large"]}
CURVES = {"resolution": {"acc_vs_grid_zoom": "zoom", "acc_vs_grid_canvas": "canvas"}}
SAME = {("acc_vs_grid_canvas", "8")}  # the training grid: the same scenes as zoom 8, not repeated


def store(run_dir: str, name: str, machine: str, load: str, command: str | None = None,
          commit: str | None = None) -> Path:
    folder = Path(run_dir) / name
    agg = json.loads((folder / "aggregate.json").read_text())
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines() if line.strip()]
    runs = [r for r in runs if r["preset"] == agg["preset"] and r["config"]["train"] == agg["config"]["train"]]
    agg["run_info"] = {"runs": len(runs), "cpu_s_total": round(sum(r["cpu_s"] for r in runs), 1),
                       "wall_s_total": round(sum(r["wall_s"] for r in runs), 1),
                       "cpu_s_per_design": {d: round(sum(r["cpu_s"] for r in runs if r["design"] == d), 1)
                                            for d in agg["designs"]},
                       "threads": sorted({r["threads"] for r in runs}), "machine": machine, "load": load}
    if command:
        agg["run_info"]["command"] = command
    if commit:
        agg["run_info"]["commit"] = commit
    out = HERE / f"experiments-{name}-{agg['preset']}.json"
    out.write_text(json.dumps(agg, indent=1))
    return out


def _cell(iv: dict) -> str:
    return f"{iv['mean']:.3f} ± {(iv['hi'] - iv['lo']) / 2:.3f}"


def tables(agg: dict) -> str:
    name, m = agg["experiment"], agg["metrics"]
    info = agg.get("run_info", {})
    lines = [f"`{name}`, preset `{agg['preset']}`, {agg['seeds']} seeds, finished {agg['date']}, "
             f"ropekit {agg['versions']['ropekit']}, torch {agg['versions']['torch']}."]
    if info:
        lines.append(f"{info['runs']} runs, CPU time {info['cpu_s_total'] / 60:.1f} min in all "
                     f"({info['cpu_s_total'] / info['runs']:.1f} s per run; wall {info['wall_s_total'] / 60:.1f} min "
                     f"summed over runs), threads {info['threads']}; machine: {info['machine']}; load: {info['load']}.")
    lines.append("")
    cols = [(k, k) for k in SCALARS.get(name, [])]
    for key, label in CURVES.get(name, {}).items():
        xs = list(next(v for v in m.values() if key in v)[key])
        cols += [((key, x), f"{label} {x}") for x in xs if (key, x) not in SAME]
    lines.append("| family | " + " | ".join(c for _, c in cols) + " |")
    lines.append("| --- |" + " --- |" * len(cols))
    for design, met in m.items():
        cells = [_cell(met[k[0]][k[1]] if isinstance(k, tuple) else met[k]) for k, _ in cols]
        lines.append(f"| {design} | " + " | ".join(cells) + " |")
    lines += ["", "Mean ± half-width of the 95 % t-interval over seeds.", ""]
    if agg["claims"] and "verdict_unadjusted" not in agg["claims"][0]:  # stored before adjusted verdicts existed
        lines += ["| claim | metric | design vs baseline | advantage (95 % CI) | verdict (unadjusted) |",
                  "| --- | --- | --- | --- | --- |"]
        for c in agg["claims"]:
            a = c["advantage"]
            lines.append(f"| {c['id']}: {c['claim']} ({c['source']}) | `{c['metric']}` ({c['better']} is better) | "
                         f"{c['design']} {c['design_mean']:.3f} vs {c['baseline']} {c['baseline_mean']:.3f} | "
                         f"{a['mean']:+.3f} [{a['lo']:+.3f}, {a['hi']:+.3f}] | **{c['verdict']}** |")
        return "\n".join(lines)
    lines += ["| claim | metric, δ | design vs baseline | advantage, 95 % | adjusted interval, Holm p | verdict "
              "(unadjusted) | replication |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in agg["claims"]:
        a, b, r = c["advantage"], c["advantage_adjusted"], c.get("replication")
        rep = (f"{r['verdict']}, {r['advantage']['mean']:+.3f} [{r['advantage']['lo']:+.3f}, "
               f"{r['advantage']['hi']:+.3f}]: **{c['confirmation']}**" if r else "not run")
        more = f"; ≈{c['seeds_to_decide']} seeds to decide" if c.get("seeds_to_decide") else ""
        lines.append(f"| {c['id']}: {c['claim']} ({c['source']}) | `{c['metric']}` ({c['better']} is better), "
                     f"{c['delta']:g} | {c['design']} {c['design_mean']:.3f} vs {c['baseline']} "
                     f"{c['baseline_mean']:.3f} | {a['mean']:+.3f} [{a['lo']:+.3f}, {a['hi']:+.3f}] | "
                     f"[{b['lo']:+.3f}, {b['hi']:+.3f}] ({100 * c['adjusted_level']:.1f} %), {c['p_holm']:.3g} | "
                     f"**{verdict_text(c)}** ({c['verdict_unadjusted']}){more} | {rep} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("store")
    s.add_argument("run_dir")
    s.add_argument("name")
    s.add_argument("--machine", required=True)
    s.add_argument("--load", required=True)
    s.add_argument("--command", default=None, help="the exact command that produced the run")
    s.add_argument("--commit", default=None, help="the ropekit commit it ran")
    t = sub.add_parser("print")
    t.add_argument("files", nargs="+")
    args = p.parse_args()
    if args.cmd == "store":
        print(store(args.run_dir, args.name, args.machine, args.load, args.command, args.commit))
    else:
        print("\n\n".join(tables(json.loads(Path(f).read_text())) for f in args.files))


if __name__ == "__main__":
    main()
