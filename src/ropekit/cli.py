"""Command-line interface: ``ropekit report | positions | ptd | relative | designs | viz``.

Also ``python -m ropekit``. Every failure is one ``ropekit: error: …`` line on stderr and a non-zero
exit status (see :func:`main`); ``--help`` of every command shows each option's default.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import unicodedata
from pathlib import Path
from typing import Sequence


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: …)`` to an option's help unless the help already says it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        # by identity: a default of 0 (== False) is shown
        hidden = action.default == [] or any(action.default is d for d in (None, False, argparse.SUPPRESS))
        if "(default" in text or hidden:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with defaults in ``--help`` and usage errors on one line (no usage block)."""

    def __init__(self, *args, formatter_class=_HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str):
        _say(f"{message} (see '{self.prog} --help')")
        self.exit(2)


def _say(message: str) -> None:
    """One line on stderr, whatever the message holds."""
    print("ropekit: error: " + " ".join(str(message).split()), file=sys.stderr)


def _ascii_digits(text: str) -> str:
    """``text`` if its digits are ASCII 0-9, else ArgumentTypeError naming the first other digit and the text
    with ASCII digits: Python's int(), float() and regular expressions read any Unicode decimal digit (``３``,
    ``٣``) as its value, so ``T３`` would silently be ``T3``; a number typed with another script's digits is
    more likely a mistake (an input method left in full-width mode) than a wish."""
    odd = [c for c in text if c.isdigit() and not c.isascii()]
    if odd:
        fixed = "".join(str(unicodedata.digit(c)) if c in odd and unicodedata.digit(c, None) is not None else c
                        for c in text)
        name = unicodedata.name(odd[0], f"U+{ord(odd[0]):04X}")
        raise argparse.ArgumentTypeError(
            f"{text!r} holds the non-ASCII digit {odd[0]!r} ({name}); write numbers with the ASCII digits 0-9"
            + (f", e.g. {fixed!r}" if fixed != text and fixed.isascii() else ""))
    return text


def _int_arg(text: str) -> int:
    """argparse type: an integer written with ASCII digits."""
    try:
        return int(_ascii_digits(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _finite_float_arg(text: str) -> float:
    """argparse type: a finite number written with ASCII digits."""
    try:
        value = float(_ascii_digits(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


#: every segment kind :meth:`ropekit.layout.Layout.parse` reads, for the commands' help
_LAYOUT_SYNTAX = (
    "segments separated by spaces or commas: T{n} text; I{h}x{w} image; V{t}x{h}x{w}[@interval] video "
    "(interval: time between frames, default 1); A{n}[@seconds] audio (seconds per token, default 0.04); "
    "V{t}x{h}x{w}[@interval]+A{n}:time or V{t}x{h}x{w}[@interval]+A{n}:chunks[{c}] a video with its audio "
    "interleaved, by time (Qwen3-Omni) or in chunks of c positions (Qwen2.5-Omni, default 50), placed by design "
    "tmrope only; G{a}x{b}[x...] an N-D grid"
)


def _layout_arg(text: str) -> str:
    """argparse type: a layout string (read by :meth:`ropekit.layout.Layout.parse` when the command runs), its
    sizes written with ASCII digits."""
    return _ascii_digits(text)


def _int_in(low: int, high: int):
    """argparse type: an int in ``[low, high]`` (bounds keep the work a command does finite)."""

    def parse(text: str) -> int:
        _ascii_digits(text)
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return parse


def _print_json(obj: object) -> None:
    """Strict JSON (no NaN/Infinity tokens, which JSON parsers reject) on stdout."""
    try:
        text = json.dumps(obj, allow_nan=False)
    except ValueError:
        raise ValueError("the result holds NaN or infinite numbers, which JSON cannot represent; "
                         "check the sizes and intervals of the input") from None
    print(text)


def _option(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"design option {text!r} must look like name=value, e.g. alpha=0.3")
    key, raw = text.split("=", 1)
    try:
        val = json.loads(raw)
    except json.JSONDecodeError:
        val = raw
    return key.strip(), val


def _name_list(text: str, option: str = "--designs") -> list[str]:
    """``a,b,c`` as a list of names; an empty list, or an empty name (``a,,b``, ``a,``), raises naming ``option``."""
    names = [t.strip() for t in text.split(",")]
    if not any(names):
        raise ValueError(f"`{option}` is empty; give comma-separated names, e.g. {option} circle,mrope")
    if not all(names):
        raise ValueError(f"`{option}` {text!r} holds an empty name (two commas in a row, or a comma at an end); "
                         f"give comma-separated names, e.g. {option} circle,mrope")
    return names


def _design_list(text: "str | None") -> "list[str] | None":
    """``--designs a,b,c`` as a list of registered names (None = every design); unknown or empty names raise."""
    from .designs import get_design

    if text is None:
        return None
    return [get_design(n).name for n in _name_list(text)]


def _cmd_report(args: argparse.Namespace) -> int:
    from .layout import Layout
    from .report import build_report

    chosen = _design_list(args.designs)
    if args.experiments is not None:  # checked before the sections run, not after
        from .report.experiments import find_results

        find_results(args.experiments, what="`--experiments`")
    layout = None
    if args.layout is not None:
        lay = Layout.parse(args.layout)
        kinds = set(lay.token_types().tolist())
        if 0 not in kinds or not kinds & {1, 2, 3}:
            raise ValueError(f"`--layout` {args.layout!r} needs both text and image/video tokens for the PTD and "
                             "bias measurements (audio may come with them), e.g. --layout 'T4 I4x4 T4' or "
                             "'T2 A8 V2x3x3 T4'")
        layout = str(lay)
    metrics = build_report(args.out, progress=not args.quiet, layout=layout, designs=chosen,
                           experiments=args.experiments)
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
        _print_json({"layout": str(lay), "design": args.design, "positions": coords.tolist(),
                     "token_types": kinds})
        return 0
    names = "tivga"  # ropekit.layout's token-type codes: text, image, video, grid, audio
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
        _print_json({"layout": args.layout, "ptd": res})
    else:
        print(f"PTD for layout '{args.layout}' (Circle-RoPE eq. 1; 0 = text equidistant from the image)")
        for d, v in res.items():
            print(f"  {d:<10} {v:8.4f}")
    return 0


def _cmd_designs(args: argparse.Namespace) -> int:
    from .designs import designs, get_design

    rows = [("design", "allocation", "options", "summary")]
    for name in designs():
        d = get_design(name)
        rows.append((name, d.allocation, ", ".join(d.options) or "-", d.summary))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    return 0


def _cmd_relative(args: argparse.Namespace) -> int:
    from .analysis.relative import relative_table

    rows = relative_table(args.head_dim, num_trials=args.trials)
    if args.json:
        _print_json(rows)
        return 0
    print(f"relative-position error, head_dim {args.head_dim} (max |score(m,n) - score(m+d,n+d)| / rms score)")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        verdict = "exactly relative" if r["exact"] else "NOT relative"
        print(f"  {r['name']:<{width}} {r['ratio']:10.2e}  {verdict}")
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
    from .analysis.nd_figures import MAX_SLICES, check_slices_in_grid, plot_sim3d

    if len(args.slice_coords) <= MAX_SLICES:  # more slices than a figure shows: plot_sim3d says so
        check_slices_in_grid(args.slice_coords, args.grid_size, option="--slice-coords", grid_option="--grid-size")
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
        p.add_argument("--seed", type=_int_arg, default=0, help="seed for sobol/uniform/random (default: 0)")
        p.add_argument("--save-path", default=None, metavar="PNG",
                       help=f"PNG file to write, or a folder to write {default} into; missing folders are "
                            f"created (default: {default} in the current folder)")

    p = sub.add_parser("proj", help="direction distribution on S^1 / S^2 vs a normalised-Gaussian reference")
    p.add_argument("--n-dims", type=_int_arg, choices=(2, 3), default=2, help="2 (circle) or 3 (sphere) (default: 2)")
    p.add_argument("--num-vectors", type=_int_arg, default=256, help="directions to draw (default: 256)")
    common(p, "rope_proj_<n-dims>d_<method>.png")
    p.set_defaults(func=_cmd_viz_proj)

    for name, dims, grid in (("sim2d", 2, 64), ("sim3d", 3, 32)):
        s = sub.add_parser(name, help=f"{dims}-D similarity kernel of the centre token vs the grid")
        s.add_argument("--d-head", type=_int_arg, default=1024, help="rotary head dimension (default: 1024)")
        s.add_argument("--grid-size", type=_int_arg, default=grid, help=f"tokens per axis (default: {grid})")
        s.add_argument("--num-samples", type=_int_arg, default=None,
                       help="Monte-Carlo over N random q instead of the exact expectation (default: exact)")
        s.add_argument("--base", type=_finite_float_arg, default=10000.0,
                       help="RoPE base of the magnitudes (default: 10000)")
        if dims == 3:
            s.add_argument("--slice-coords", type=_finite_float_arg, nargs="+", default=[-10.0, 0.0, 10.0],
                           help="offsets along axis 2 of the slices, within the grid: from -(grid size // 2) to "
                                "grid size - 1 - grid size // 2 (default: -10 0 10)")
        common(s, f"rope_{name}_<method>.png")
        s.set_defaults(func=_cmd_viz_sim2d if dims == 2 else _cmd_viz_sim3d)
    return viz


def _cmd_experiment(args: argparse.Namespace) -> int:
    from .experiments import registry, runner

    if args.list or not args.name:
        for name in registry.experiments():
            exp = registry.get(name)
            print(f"{name}: {exp.summary}\n  designs: {', '.join(exp.designs)}")
            for c in exp.claims:
                print(f"  claim {c.id} ({c.source}): {c.text}")
        return 0
    designs = _name_list(args.designs) if args.designs is not None else None
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    elif args.jobs > 1:  # the workers share the cores torch would have given this process
        import torch

        torch.set_num_threads(max(1, torch.get_num_threads() // args.jobs))
    if args.variance is not None:
        from .experiments import variance

        if args.jobs != 1:
            raise ValueError("--jobs applies to training runs, not to --variance (which runs in one process)")

        if args.variance < 2:
            raise ValueError(f"--variance needs at least 2 evaluation sets, got {args.variance}")
        n = args.seeds if args.seeds is not None else 6
        res = variance.variance_split(args.name, designs=designs, seeds=list(range(args.seed_start, args.seed_start + n)),
                                      draws=args.variance, preset=args.preset,
                                      batch_seeds=args.batch_seeds or 8,
                                      log=None if args.quiet else (lambda m: print(m, file=sys.stderr)))
        res["pairing"] = variance.check_pairing(args.name, res["designs"], seed=args.seed_start, preset=args.preset)
        path = variance.write(res, Path(args.out) / args.name / f"variance-{args.preset}.json")
        print(variance.variance_table(res))
        print("paired designs share training batches and evaluation inputs: "
              + ("yes" if res["pairing"]["paired"] else "NO (see the file)"))
        print(f"written to {path}")
        return 0
    agg = runner.run_experiment(args.name, designs=designs, seeds=args.seeds, seed_start=args.seed_start,
                                replicate=args.replicate, preset=args.preset, device=args.device, out=args.out,
                                progress=not args.quiet, batch_seeds=args.batch_seeds, compile=args.compile,
                                jobs=args.jobs)
    print(runner.summary_table(agg))
    print(f"results in {Path(args.out).resolve() / args.name} (runs.jsonl, aggregate.json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ropekit", description="Geometric rotary position embeddings.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="write the HTML report of every design and family")
    r.add_argument("--out", default="report", help="output folder (missing folders are created)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--layout", type=_layout_arg, default=None,
                   help="report on this layout instead of the default ones, e.g. 'T3 I4x4 T2 V2x3x3 T4'; "
                        + _LAYOUT_SYNTAX)
    r.add_argument("--designs", default=None,
                   help="comma-separated designs to show, e.g. circle,mrope,vrope (default: every design)")
    r.add_argument("--experiments", default=None, metavar="DIR",
                   help="folder of `ropekit experiment` results to add (figures, verdicts): the DIR of "
                        "`ropekit experiment NAME --out DIR`")
    r.set_defaults(func=_cmd_report)

    ps = sub.add_parser("positions", help="print the coordinates of a layout under a design")
    ps.add_argument("layout", type=_layout_arg, help="e.g. 'T3 I4x4 T2' or 'T5 V8x3x3 T1'; " + _LAYOUT_SYNTAX)
    ps.add_argument("--design", default="mrope", help="position design (see `ropekit designs`)")
    ps.add_argument("-o", "--option", type=_option, action="append", default=[],
                    help="design option name=value (repeatable), e.g. -o alpha=0.3 -o radius=\"auto\"")
    ps.add_argument("--json", action="store_true",
                    help="print {layout, design, positions, token_types} as JSON instead of a table")
    ps.add_argument("--plot", default=None, metavar="PNG",
                    help="also draw the positions (per token, and in position space) to this PNG file; "
                         "missing folders are created")
    ps.set_defaults(func=_cmd_positions)

    pt = sub.add_parser("ptd", help="Per-Token Distance of a layout under each design")
    pt.add_argument("layout", nargs="?", type=_layout_arg, default="I3x3 T5",
                    help="layout string, e.g. 'I3x3 T5'; " + _LAYOUT_SYNTAX)
    pt.add_argument("--design", action="append", help="design to measure, repeatable (default: every design)")
    pt.add_argument("--json", action="store_true", help="print {layout, ptd: {design: value}} as JSON")
    pt.set_defaults(func=_cmd_ptd)

    rl = sub.add_parser("relative", help="which embeddings are exactly relative (measured)")
    rl.add_argument("--head-dim", type=_int_in(16, 8192), default=96,
                    help="channels per head, a multiple of 16 (M-RoPE sections)")
    rl.add_argument("--trials", type=_int_in(1, 4096), default=128,
                    help="random (q, k, positions, shift) draws per embedding")
    rl.add_argument("--json", action="store_true", help="print one JSON object per embedding")
    rl.set_defaults(func=_cmd_relative)

    ds = sub.add_parser("designs", help="list the registered position designs")
    ds.set_defaults(func=_cmd_designs)

    ex = sub.add_parser("experiment", help="train small models to test the papers' claims (--list to see them)")
    ex.add_argument("name", nargs="?", help="experiment name (see --list)")
    ex.add_argument("--list", action="store_true", help="say what each experiment tests and which claim it probes")
    ex.add_argument("--designs", help="comma-separated designs (default: the experiment's own list)")
    ex.add_argument("--seeds", type=_int_arg, default=None,
                    help="seeds per design (default: the preset's; 3 for quick, 1 for micro)")
    ex.add_argument("--seed-start", type=_int_arg, default=0,
                    help="first seed: seeds are START .. START+SEEDS-1 (default: 0)")
    ex.add_argument("--replicate", action="store_true",
                    help="also train a disjoint replication seed set (the same seeds + 10000) and report each "
                         "claim as confirmed only when the replication agrees")
    ex.add_argument("--batch-seeds", type=_int_arg, default=None,
                    help="train up to this many seeds of a design together as one stacked ensemble "
                         "(default: the preset's choice; 1 = one run at a time)")
    ex.add_argument("--variance", type=_int_arg, default=None, metavar="DRAWS",
                    help="instead of a run: split each metric's variance into seed and evaluation-sample parts, "
                         "evaluating every model on DRAWS evaluation sets (seeds: --seeds, default 6), and check "
                         "that designs share training batches and evaluation inputs")
    ex.add_argument("--compile", action="store_true",
                    help="run the stacked ensemble through torch.compile (pays a compilation per design)")
    ex.add_argument("--preset", choices=("micro", "quick", "standard", "full"), default="quick",
                    help="micro: seconds (tests); quick: a few-minute look on a CPU (not sized to decide); "
                         "standard: seeds and evaluation sized to decide each claim, <= ~1 h on 2 CPU cores "
                         "with --jobs 2 --threads 1 (as much again with --replicate); "
                         "full: a larger model for one GPU")
    ex.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train")
    ex.add_argument("--out", default="experiments",
                    help="output folder; missing folders are created (default: experiments/)")
    ex.add_argument("--threads", type=_int_arg, default=None, help="torch CPU threads (1 is fastest on a busy machine)")
    ex.add_argument("--jobs", type=_int_arg, default=1,
                    help="train this many groups of seeds at once in worker processes, each with --threads "
                         "threads (default: torch's threads divided among the jobs); CPU only; the same results "
                         "as one job. On 2 cores: --jobs 2 --threads 1")
    ex.add_argument("--quiet", action="store_true", help="no progress bars")
    ex.set_defaults(func=_cmd_experiment)

    _add_viz_parser(sub)
    return p


def _describe(error: BaseException) -> str:
    """The sentence a user needs for an exception raised while a command ran."""
    if isinstance(error, FileExistsError):
        return f"'{error.filename}' exists and is not a folder; choose another path"
    if isinstance(error, OSError) and error.filename is not None:
        return f"'{error.filename}': {error.strerror}"
    asked = re.search(r"tried to allocate (\d+) bytes", str(error))
    if isinstance(error, MemoryError) or asked:
        size = f" ({int(asked.group(1)) / 2**30:.1f} GiB)" if asked else ""
        return f"not enough memory for this input{size}; use smaller sizes"
    if isinstance(error, OverflowError):
        return f"a number in the input is too large ({error})"
    return str(error) or type(error).__name__


def _stdout_closed() -> int:
    """The reader of stdout went away (``ropekit positions … | head``): stop quietly, as Unix tools do."""
    try:  # later flushes (at exit) go nowhere instead of raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a file descriptor (captured in-process)
    return 128 + 13  # what a shell reports for a tool ended by SIGPIPE


_USER_ERRORS = (ValueError, TypeError, OverflowError, MemoryError, OSError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a failure is one line on stderr and a non-zero exit status, never a traceback.

    Usage errors exit 2 (as argparse does), bad input 2, an unexpected failure 1 (set ``ROPEKIT_DEBUG=1``
    for its traceback), a closed stdout 141.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe surfaces here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        if os.environ.get("ROPEKIT_DEBUG"):
            raise
        asked = isinstance(error, RuntimeError) and "can't allocate memory" in str(error)
        if isinstance(error, _USER_ERRORS) or asked:
            _say(_describe(error))
            return 2
        _say(f"internal error ({type(error).__name__}: {error}); "
             "please report it, with the traceback from ROPEKIT_DEBUG=1")
        return 1


if __name__ == "__main__":
    sys.exit(main())
