"""Summary statistics over seeds: mean, Student-t 95 % interval, and a verdict per claim.

scipy is not a dependency, so the two-sided 97.5 % Student-t quantiles are tabulated (1–30 degrees of
freedom, then 40, 60, 120 and the normal limit); between table rows the next smaller df is used, which
gives a slightly wider (conservative) interval.
"""
from __future__ import annotations

import math
from typing import Sequence

__all__ = ["t_quantile_975", "mean_interval", "paired_verdict", "VERDICTS"]

VERDICTS = ("reproduced", "contradicted", "inconclusive")

_T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
    20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
    29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980,
}


def t_quantile_975(df: int) -> float:
    """Two-sided 95 % Student-t critical value for ``df`` degrees of freedom (df >= 1)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"`df` must be an int >= 1, got {df!r}")
    if df in _T975:
        return _T975[df]
    if df > 120:
        return 1.960
    return _T975[max(k for k in _T975 if k <= df)]


def mean_interval(values: Sequence[float]) -> dict:
    """``{"mean", "lo", "hi", "n", "sd"}``: the mean and its 95 % t-interval (lo = hi = mean for one value)."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("mean_interval: `values` is empty; give at least one seed's value")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"mean_interval: `values` must be finite, got {xs}")
    n = len(xs)
    m = sum(xs) / n
    if n == 1:
        return {"mean": m, "lo": m, "hi": m, "n": 1, "sd": 0.0}
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    half = t_quantile_975(n - 1) * sd / math.sqrt(n)
    return {"mean": m, "lo": m - half, "hi": m + half, "n": n, "sd": sd}


def paired_verdict(a: Sequence[float], b: Sequence[float], better: str = "higher") -> dict:
    """Verdict for the claim "a is better than b", from the 95 % interval of the per-seed difference a − b.

    Seeds are paired (same seed = same data stream and evaluation set). ``reproduced`` when the whole
    interval lies on the claimed side of 0, ``contradicted`` when it lies wholly on the other side,
    ``inconclusive`` otherwise (and always with fewer than two seeds). ``advantage`` is the interval of
    the difference signed so that positive favours a.
    """
    if better not in ("higher", "lower"):
        raise ValueError(f"`better` must be 'higher' or 'lower', got {better!r}")
    if len(a) != len(b):
        raise ValueError(f"paired_verdict: {len(a)} values for a but {len(b)} for b; pair them by seed")
    sign = 1.0 if better == "higher" else -1.0
    diff = mean_interval([sign * (x - y) for x, y in zip(a, b)])
    if diff["n"] < 2:
        verdict = "inconclusive"
    elif diff["lo"] > 0:
        verdict = "reproduced"
    elif diff["hi"] < 0:
        verdict = "contradicted"
    else:
        verdict = "inconclusive"
    return {"verdict": verdict, "advantage": diff}
