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


def _design_list(text: "str | None") -> "list[str] | None":
    """``--designs a,b,c`` as a list of registered names (None = every design); unknown names raise."""
    from .designs import get_design

    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("`--designs` is empty; give comma-separated names, e.g. --designs circle,mrope")
    return [get_design(n).name for n in names]


def _cmd_report(args: argparse.Namespace) -> int:
    from .layout import Layout
    from .report import build_report

    chosen = _design_list(args.designs)
    layout = None
    if args.layout is not None:
        lay = Layout.parse(args.layout)
        kinds = set(lay.token_types().tolist())
        if 0 not in kinds or kinds == {0}:
            raise ValueError(f"`--layout` {args.layout!r} needs both text and image/video tokens for the PTD and "
                             "bias measurements, e.g. --layout 'T4 I4x4 T4'")
        layout = str(lay)
    metrics = build_report(args.out, progress=not args.quiet, layout=layout, designs=chosen)
    out = Path(args.out).resolve()
    print(f"report written to {out / 'index.html'} (metrics in {out / 'metrics.json'}, "
          f"{metrics['_meta']['seconds']} s)")
    ptd = metrics["multimodal.ptd_section"]
    shown = list(ptd["whole"])
    print("\nPTD (whole sequence / largest per image or frame):")
    print(f"{'design':<10} " + " ".join(f"{lay:>20}" for lay in shown))
    for name in next(iter(ptd["whole"].values())):
        cells = [f"{ptd['whole'][lay][name]:.3f}/{max(ptd['per_block'][lay][name].values()):.3f}" for lay in shown]
        print(f"{name:<10} " + " ".join(f"{c:>20}" for c in cells))
    return 0


def _cmd_positions(args: argparse.Namespace) -> int:
    from .designs import positions
    from .layout import Layout

    lay = Layout.parse(args.layout)
    coords = positions(lay, args.design, **dict(args.option))
    kinds = lay.token_types().tolist()
    if args.plot is not None:
        from .analysis.figures import plot_layout

        written = plot_layout(lay, args.design, args.plot, **dict(args.option))
        print(f"positions plot written to {written}", file=sys.stderr)
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

# --------------------------------------------------------------------------------------------- viz


def _figure_path(save_path: "str | None", default: str) -> Path:
    """Where a ``viz`` figure goes: ``default`` in the working folder, or inside ``save_path`` when that
    is a folder (existing, or written with a trailing slash), else ``save_path`` itself."""
    if save_path is None:
        return Path(default)
    if Path(save_path).is_dir() or save_path.endswith(("/", "\\")):
        return Path(save_path) / default
    return Path(save_path)


def _cmd_viz_proj(args: argparse.Namespace) -> int:
    from .analysis.nd_figures import plot_projections

    path = _figure_path(args.save_path, f"rope_proj_{args.n_dims}d_{args.sampling_method}.png")
    out = plot_projections(args.n_dims, args.num_vectors, args.sampling_method, path, seed=args.seed)
    print(f"projection figure written to {out}")
    return 0


def _cmd_viz_sim2d(args: argparse.Namespace) -> int:
    from .analysis.nd_figures import plot_sim2d

    path = _figure_path(args.save_path, f"rope_sim2d_{args.sampling_method}.png")
    out = plot_sim2d(args.d_head, args.grid_size, args.sampling_method, path, args.num_samples,
                     base=args.base, seed=args.seed)
    print(f"2-D similarity kernel written to {out}")
    return 0


def _cmd_viz_sim3d(args: argparse.Namespace) -> int:
    from .analysis.nd_figures import plot_sim3d

    path = _figure_path(args.save_path, f"rope_sim3d_{args.sampling_method}.png")
    out = plot_sim3d(args.d_head, args.grid_size, args.slice_coords, args.sampling_method, path,
                     args.num_samples, base=args.base, seed=args.seed)
    print(f"3-D similarity kernel slices written to {out}")
    return 0


def _add_viz_parser(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add ``viz {proj, sim2d, sim3d}``; each sub-command sets ``func`` to its handler."""
    from .rotations.directional import METHODS

    viz = subparsers.add_parser("viz", help="N-D RoPE figures: directions, 2-D kernel, 3-D kernel slices")
    sub = viz.add_subparsers(dest="viz_command", required=True)

    def common(p: argparse.ArgumentParser, default: str) -> None:
        p.add_argument("--sampling-method", choices=METHODS, default="sobol",
                       help="direction generator (default: sobol)")
        p.add_argument("--seed", type=int, default=0, help="seed for sobol/uniform/random (default: 0)")
        p.add_argument("--save-path", default=None, metavar="PNG",
                       help=f"PNG file to write, or a folder to write {default} into (default: {default} "
                            "in the current folder)")

    p = sub.add_parser("proj", help="direction distribution on S^1 / S^2 vs a normalised-Gaussian reference")
    p.add_argument("--n-dims", type=int, choices=(2, 3), default=2, help="2 (circle) or 3 (sphere) (default: 2)")
    p.add_argument("--num-vectors", type=int, default=256, help="directions to draw (default: 256)")
    common(p, "rope_proj_<n-dims>d_<method>.png")
    p.set_defaults(func=_cmd_viz_proj)

    for name, dims, grid in (("sim2d", 2, 64), ("sim3d", 3, 32)):
        s = sub.add_parser(name, help=f"{dims}-D similarity kernel of the centre token vs the grid")
        s.add_argument("--d-head", type=int, default=1024, help="rotary head dimension (default: 1024)")
        s.add_argument("--grid-size", type=int, default=grid, help=f"tokens per axis (default: {grid})")
        s.add_argument("--num-samples", type=int, default=None,
                       help="Monte-Carlo over N random q instead of the exact expectation (default: exact)")
        s.add_argument("--base", type=float, default=10000.0, help="RoPE base of the magnitudes (default: 10000)")
        if dims == 3:
            s.add_argument("--slice-coords", type=float, nargs="+", default=[-10.0, 0.0, 10.0],
                           help="offsets along axis 2 of the slices (default: -10 0 10)")
        common(s, f"rope_{name}_<method>.png")
        s.set_defaults(func=_cmd_viz_sim2d if dims == 2 else _cmd_viz_sim3d)
    return viz


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ropekit", description="Geometric rotary position embeddings.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="write the HTML report of every design and family")
    r.add_argument("--out", default="report", help="output folder (default: report/)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--layout", default=None,
                   help="report on this layout instead of the default ones, e.g. 'T3 I4x4 T2 V2x3x3 T4'")
    r.add_argument("--designs", default=None,
                   help="comma-separated designs to show, e.g. circle,mrope,vrope (default: every design)")
    r.set_defaults(func=_cmd_report)

    ps = sub.add_parser("positions", help="print the coordinates of a layout under a design")
    ps.add_argument("layout", help="e.g. 'T3 I4x4 T2' or 'T5 V8x3x3 T1'")
    ps.add_argument("--design", default="mrope")
    ps.add_argument("-o", "--option", type=_option, action="append", default=[],
                    help="design option name=value (repeatable), e.g. -o alpha=0.3 -o radius=\"auto\"")
    ps.add_argument("--json", action="store_true")
    ps.add_argument("--plot", default=None, metavar="PNG",
                    help="also draw the positions (per token, and in position space) to this PNG file")
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

    _add_viz_parser(sub)
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
