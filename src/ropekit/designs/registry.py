"""The design registry: a position design is one function ``layout -> (L, A) float32`` plus an entry here."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..layout import Layout

__all__ = ["Design", "register", "get_design", "designs", "positions"]


@dataclass(frozen=True)
class Design:
    """A registered position design (SPEC §3)."""

    name: str
    fn: Callable[..., torch.Tensor]
    summary: str
    allocation: str  # the frequency allocation this design is normally paired with
    aliases: tuple = field(default=())

    @property
    def options(self) -> tuple:
        """Keyword options the design accepts."""
        sig = inspect.signature(self.fn)
        return tuple(p.name for p in list(sig.parameters.values())[1:])


_REGISTRY: dict[str, Design] = {}
_ALIASES: dict[str, str] = {}


def register(name: str, *, summary: str, allocation: str, aliases: tuple = ()) -> Callable:
    """Decorator: add a design function ``fn(layout, **options) -> Tensor (L, A)`` to the registry."""

    def deco(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if name in _REGISTRY:
            raise ValueError(f"register: a design named {name!r} already exists")
        _REGISTRY[name] = Design(name, fn, summary, allocation, tuple(aliases))
        for a in aliases:
            _ALIASES[a] = name
        return fn

    return deco


def get_design(name: str) -> Design:
    """Look a design up by name or alias; unknown names get the list of known ones."""
    if not isinstance(name, str):
        raise TypeError(f"`design` must be a design name (str), got {type(name).__name__}")
    key = _ALIASES.get(name, name)
    if key not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown design {name!r}; choose one of: {known} (see ropekit.designs())")
    return _REGISTRY[key]


def designs() -> list[str]:
    """Names of all registered position designs."""
    return sorted(_REGISTRY)


def check_options(design: Design, options: dict) -> None:
    """Reject option names the design does not take, listing the ones it does."""
    allowed = design.options
    bad = [k for k in options if k not in allowed]
    if bad:
        raise TypeError(
            f"design {design.name!r} got unknown option(s) {', '.join(map(repr, bad))}; "
            f"it accepts: {', '.join(allowed) or 'no options'}"
        )


def positions(layout: "Layout | str", design: str = "mrope", **options) -> torch.Tensor:
    """Coordinates of every token of ``layout`` under ``design``: float32 tensor ``(L, A)``.

    ``layout`` is a :class:`~ropekit.Layout` or its string form (``"T3 I4x4 T2"``).
    """
    lay = Layout.coerce(layout)
    d = get_design(design)
    check_options(d, options)
    out = d.fn(lay, **options)
    if out.shape[0] != lay.num_tokens or out.ndim != 2:
        raise RuntimeError(f"design {d.name!r} returned shape {tuple(out.shape)} for {lay.num_tokens} tokens")
    return out.to(torch.float32)
