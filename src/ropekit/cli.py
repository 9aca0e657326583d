"""Command-line interface: ``ropekit report | positions | ptd | relative | designs | viz``.

Also ``python -m ropekit``. Every failure is one ``ropekit: error: …`` line on stderr and a non-zero
exit status (see :func:`main`); ``--help`` of every command shows each option's default.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Sequence


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: …)`` to an option's help unless the help already says it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default in (None, False, [], argparse.SUPPRESS):
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


def _int_in(low: int, high: int):
    """argparse type: an int in ``[low, high]`` (bounds keep the work a command does finite)."""

    def parse(text: str) -> int:
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


def _cmd_report(args: argparse.Namespace) -> int:
    from .analysis.metrics import layout_ptd
    from .designs import designs
    from .report import build_report

    metrics = build_report(args.out, progress=not args.quiet)
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
        _print_json({"layout": str(lay), "design": args.design, "positions": coords.tolist(),
                     "token_types": kinds})
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
    for r in rows:
        verdict = "exactly relative" if r["exact"] else "NOT relative"
        print(f"  {r['name']:<36} {r['ratio']:10.2e}  {verdict}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ropekit", description="Geometric rotary position embeddings.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("report", help="write the HTML report of every design and family")
    r.add_argument("--out", default="report", help="output folder (created if missing)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.set_defaults(func=_cmd_report)

    ps = sub.add_parser("positions", help="print the coordinates of a layout under a design")
    ps.add_argument("layout", help="e.g. 'T3 I4x4 T2' or 'T5 V8x3x3 T1'")
    ps.add_argument("--design", default="mrope", help="position design (see `ropekit designs`)")
    ps.add_argument("-o", "--option", type=_option, action="append", default=[],
                    help="design option name=value (repeatable), e.g. -o alpha=0.3 -o radius=\"auto\"")
    ps.add_argument("--json", action="store_true",
                    help="print {layout, design, positions, token_types} as JSON instead of a table")
    ps.set_defaults(func=_cmd_positions)

    pt = sub.add_parser("ptd", help="Per-Token Distance of a layout under each design")
    pt.add_argument("layout", nargs="?", default="I3x3 T5",
                    help="layout string: T{n} text, I{h}x{w} image, V{t}x{h}x{w}[@interval] video")
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

    try:
        from .viz import add_viz_parser
    except ImportError:
        pass
    else:
        add_viz_parser(sub)
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
