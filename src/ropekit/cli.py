"""Command-line interface: ``ropekit report | positions | ptd | designs | viz``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence


def _option(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"design option {text!r} must look like name=value, e.g. alpha=0.3")
    key, raw = text.split("=", 1)
    try:
        val = json.loads(raw)
    except json.JSONDecodeError:
        val = raw
    return key.strip(), val


def _cmd_report(args: argparse.Namespace) -> int:
    from .analysis.metrics import layout_ptd
    from .designs import designs
    from .report import build_report

    metrics = build_report(args.out, progress=not args.quiet, experiments=args.experiments)
    out = Path(args.out).resolve()
    print(f"report written to {out / 'index.html'} (metrics in {out / 'metrics.json'}, "
          f"{metrics['_meta']['seconds']} s)")
    print(f"\n{'design':<10} {'PTD I3x3 T5':>12} {'PTD T4 V3x3x3 T4':>17}")
    for name in designs():
        print(f"{name:<10} {layout_ptd('I3x3 T5', name):>12.3f} {layout_ptd('T4 V3x3x3 T4', name):>17.3f}")
    return 0


def _cmd_positions(args: argparse.Namespace) -> int:
    from .designs import positions
    from .layout import Layout

    lay = Layout.parse(args.layout)
    coords = positions(lay, args.design, **dict(args.option))
    kinds = lay.token_types().tolist()
    if args.json:
        print(json.dumps({"layout": str(lay), "design": args.design, "positions": coords.tolist(),
                          "token_types": kinds}))
        return 0
    names = "tivg"
    print(f"# layout {lay}, design {args.design}, {coords.shape[1]} axes")
    for i, (row, k) in enumerate(zip(coords.tolist(), kinds)):
        print(f"{i:5d} {names[k]} " + " ".join(f"{v:10.4f}" for v in row))
    return 0


def _cmd_ptd(args: argparse.Namespace) -> int:
    from .analysis.metrics import layout_ptd
    from .designs import designs

    chosen = args.design or designs()
    res = {d: layout_ptd(args.layout, d) for d in chosen}
    if args.json:
        print(json.dumps({"layout": args.layout, "ptd": res}))
    else:
        print(f"PTD for layout '{args.layout}' (Circle-RoPE eq. 1; 0 = text equidistant from the image)")
        for d, v in res.items():
            print(f"  {d:<10} {v:8.4f}")
    return 0


def _cmd_designs(args: argparse.Namespace) -> int:
    from .designs import designs, get_design

    for name in designs():
        d = get_design(name)
        print(f"{name:<9} [{d.allocation:<6}] {d.summary}  options: {', '.join(d.options) or '-'}")
    return 0


def _cmd_relative(args: argparse.Namespace) -> int:
    from .analysis.relative import relative_table

    rows = relative_table(args.head_dim, num_trials=args.trials)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"relative-position error, head_dim {args.head_dim} (max |score(m,n) - score(m+d,n+d)| / rms score)")
    for r in rows:
        verdict = "exactly relative" if r["exact"] else "NOT relative"
        print(f"  {r['name']:<36} {r['ratio']:10.2e}  {verdict}")
    return 0


def _cmd_experiment(args: argparse.Namespace) -> int:
    from .experiments import registry, runner

    if args.list or not args.name:
        for name in registry.experiments():
            exp = registry.get(name)
            print(f"{name}: {exp.summary}\n  designs: {', '.join(exp.designs)}")
            for c in exp.claims:
                print(f"  claim {c.id} ({c.source}): {c.text}")
        return 0
    designs = [d.strip() for d in args.designs.split(",") if d.strip()] if args.designs else None
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    agg = runner.run_experiment(args.name, designs=designs, seeds=args.seeds, preset=args.preset,
                                device=args.device, out=args.out, progress=not args.quiet)
    print(runner.summary_table(agg))
    print(f"results in {Path(args.out).resolve() / args.name} (runs.jsonl, aggregate.json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ropekit", description="Geometric rotary position embeddings.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="write the HTML report of every design and family")
    r.add_argument("--out", default="report", help="output folder (default: report/)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--experiments", help="folder of `ropekit experiment` results to add (figures, verdicts)")
    r.set_defaults(func=_cmd_report)

    ps = sub.add_parser("positions", help="print the coordinates of a layout under a design")
    ps.add_argument("layout", help="e.g. 'T3 I4x4 T2' or 'T5 V8x3x3 T1'")
    ps.add_argument("--design", default="mrope")
    ps.add_argument("-o", "--option", type=_option, action="append", default=[],
                    help="design option name=value (repeatable), e.g. -o alpha=0.3 -o radius=\"auto\"")
    ps.add_argument("--json", action="store_true")
    ps.set_defaults(func=_cmd_positions)

    pt = sub.add_parser("ptd", help="Per-Token Distance of a layout under each design")
    pt.add_argument("layout", nargs="?", default="I3x3 T5")
    pt.add_argument("--design", action="append", help="repeatable; default: every design")
    pt.add_argument("--json", action="store_true")
    pt.set_defaults(func=_cmd_ptd)

    rl = sub.add_parser("relative", help="which embeddings are exactly relative (measured)")
    rl.add_argument("--head-dim", type=int, default=96)
    rl.add_argument("--trials", type=int, default=128)
    rl.add_argument("--json", action="store_true")
    rl.set_defaults(func=_cmd_relative)

    ds = sub.add_parser("designs", help="list the registered position designs")
    ds.set_defaults(func=_cmd_designs)

    ex = sub.add_parser("experiment", help="train small models to test the papers' claims (--list to see them)")
    ex.add_argument("name", nargs="?", help="experiment name (see --list)")
    ex.add_argument("--list", action="store_true", help="say what each experiment tests and which claim it probes")
    ex.add_argument("--designs", help="comma-separated designs (default: the experiment's own list)")
    ex.add_argument("--seeds", type=int, default=None, help="seeds per design (default: 3; 1 for micro)")
    ex.add_argument("--preset", choices=("micro", "quick", "full"), default="quick")
    ex.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ex.add_argument("--out", default="experiments", help="output folder (default: experiments/)")
    ex.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on a busy machine)")
    ex.add_argument("--quiet", action="store_true", help="no progress bars")
    ex.set_defaults(func=_cmd_experiment)

    try:
        from .viz import add_viz_parser
    except ImportError:
        pass
    else:
        add_viz_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError) as e:
        print(f"ropekit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
