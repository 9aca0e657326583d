"""GeoPE's λ as a swept parameter: the grid the vision experiments' ``full`` presets run, and λ of a family.

GeoPE's per-triple frequencies are ``ω_i = λ^(−i/n)`` (λ > 1): λ sets how fast the rotation slows down
over the triples, as the base does for RoPE. λ near 1 gives every triple nearly the frequency 1 (no
long-range triples); large λ gives triples that barely turn across the grid. The grid runs from λ = 2
(almost a single frequency) through one point per decade to 10⁴, around the default λ = 100 (family
``geope``), so a figure of the metric against λ on a log axis shows whether the default sits on a plateau
or a slope.
"""
from __future__ import annotations

import math

__all__ = ["DEFAULT_LAMBDA", "LAMBDAS", "SWEEP", "family_for", "geope_lambda"]

DEFAULT_LAMBDA = 100.0  # the λ of family ``geope`` (GeoPE's own default)
LAMBDAS = (2.0, 10.0, 100.0, 1000.0, 10000.0)


def family_for(lam: float) -> str:
    """The vision family name running GeoPE at ``lam``: ``geope`` at the default, else ``geope-lam<λ>``."""
    return "geope" if lam == DEFAULT_LAMBDA else f"geope-lam{lam:g}"


def geope_lambda(family: str) -> float | None:
    """λ of a GeoPE family name (``geope`` → 100, ``geope-lam10`` → 10), None for any other name."""
    if family == "geope":
        return DEFAULT_LAMBDA
    if family.startswith("geope-lam"):
        try:
            lam = float(family[len("geope-lam"):])
        except ValueError:
            return None
        return lam if math.isfinite(lam) and lam > 1 else None
    return None


SWEEP = tuple(family_for(lam) for lam in LAMBDAS)
