"""Alternating Geometry Encoding (Circle-RoPE paper §4.2): which geometry each decoder layer uses.

Schedules (0-based layers, ``N`` layers, ``True`` = the first geometry, Circle-RoPE by default):

- ``"all"``: every layer.
- ``"lower"``: layers ``0 … ⌈N/2⌉-1`` (the paper's Table 4 "strategy 3"; the released code's ``strategy_2``).
- ``"upper"``: layers ``⌈N/2⌉ … N-1`` (the paper's "strategy 2"; the released code's ``strategy_3``).
- ``"alternate"``: even layers (the released default, ``strategy_4``).
- ``"none"``: no layer (plain second geometry).
- an explicit list of N booleans, or of N design names.

The strings ``"strategy_1"`` … ``"strategy_4"`` follow the released code's numbering (1 all, 2 lower,
3 upper, 4 alternate), which swaps 2 and 3 relative to the paper's table.

For odd N the lower half takes the middle layer.
"""
from __future__ import annotations

from typing import Sequence, Union

from .designs.registry import get_design

__all__ = ["age_schedule", "SCHEDULES", "MAX_LAYERS"]

#: Most layers a schedule may have (no model comes close; it keeps a typo from building a huge list).
MAX_LAYERS = 2**16

SCHEDULES = ("all", "lower", "upper", "alternate", "none")

_CODE_NAMES = {"strategy_1": "all", "strategy_2": "lower", "strategy_3": "upper", "strategy_4": "alternate"}


def age_schedule(
    schedule: Union[str, Sequence],
    num_layers: int,
    designs: tuple[str, str] = ("circle", "mrope"),
) -> list[str]:
    """Design name per layer for an AGE schedule (paper §4.2; names of the released code accepted too)."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= MAX_LAYERS:
        raise ValueError(f"`num_layers` must be an int from 1 to {MAX_LAYERS}, got {num_layers!r}"[:200])
    if isinstance(designs, str) or not isinstance(designs, (tuple, list)) or len(designs) != 2:
        raise ValueError(f"`designs` must be a pair of design names (first, second), got {designs!r}"[:200])
    for d in designs:
        _check_name(d, "`designs`")
    first, second = designs
    if not isinstance(schedule, str) and (isinstance(schedule, (bytes, dict)) or
                                          not isinstance(schedule, (Sequence, tuple, list))):
        raise TypeError(
            f"AGE `schedule` must be a name ({', '.join(SCHEDULES)}) or a list of {num_layers} entries, "
            f"got {type(schedule).__name__}"
        )
    if isinstance(schedule, str):
        name = _CODE_NAMES.get(schedule, schedule)
        if name not in SCHEDULES:
            raise ValueError(
                f"unknown AGE schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}, "
                f"the released code's strategy_1…4, or a list of {num_layers} entries"
            )
        half = (num_layers + 1) // 2
        pick = {
            "all": lambda i: True,
            "none": lambda i: False,
            "lower": lambda i: i < half,
            "upper": lambda i: i >= half,
            "alternate": lambda i: i % 2 == 0,
        }[name]
        return [first if pick(i) else second for i in range(num_layers)]
    items = list(schedule)
    if len(items) != num_layers:
        raise ValueError(
            f"AGE schedule list has {len(items)} entries but the model has {num_layers} layers; "
            f"give exactly one entry per layer"
        )
    out = []
    for i, it in enumerate(items):
        if isinstance(it, bool):
            out.append(first if it else second)
        elif isinstance(it, str):
            _check_name(it, f"AGE schedule entry {i}")
            out.append(it)
        else:
            raise TypeError(f"AGE schedule entry {i} must be a bool or a design name, got {type(it).__name__}")
    return out


def _check_name(name: object, what: str) -> None:
    """A design name the registry knows (ValueError/TypeError that says where it came from)."""
    try:
        get_design(name)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what}: {e}") from None
