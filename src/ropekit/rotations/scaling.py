"""Context extension as a transform of the frequency matrix ``W (A, R/2)``.

Every method here rewrites frequencies, so it composes with any allocation (1-D, M-RoPE sections,
interleaved, VRoPE groups, axial, dense directional/mixed ``W``): each non-zero entry ``W[a, j]`` is
read as a frequency ``θ`` on axis ``a`` and replaced by the method's ``θ'`` (the sign is kept).
Axes can be scaled independently (``factor`` as one number per axis, or ``axes=[...]``), so a video
design can stretch only its temporal axis.

The configuration is the dict a Hugging Face model config carries as ``rope_parameters`` (or the older
``rope_scaling``): ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, ...}``.
For one axis the results equal transformers' ``ROPE_INIT_FUNCTIONS`` (inverse frequencies and the
attention factor that multiplies cos/sin).

Methods (``rope_type``):

- ``"default"``: no change.
- ``"linear"``: position interpolation, ``θ' = θ / s``.
- ``"ntk"``: NTK-aware base change, ``base' = base · s^(d/(d-2))`` (rotary-embedding-torch's
  ``theta_rescale_factor``).
- ``"dynamic"``: the NTK base change with ``s`` grown from the current length:
  ``base' = base · (s·L/M - (s-1))^(d/(d-2))`` for ``L = max(seq_len, M)``.
- ``"yarn"``: per-frequency blend of interpolation and extrapolation by how many turns a frequency makes
  over the original context (YaRN), plus the attention factor ``0.1·ln(s) + 1``.
- ``"longrope"``: one rescale factor per frequency pair (``short_factor`` up to the original context,
  ``long_factor`` beyond it), attention factor ``sqrt(1 + ln s / ln M₀)``.
- ``"llama3"``: wavelength bands: short wavelengths kept, long ones divided by ``s``, a smooth ramp between.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Mapping, Sequence

import torch

__all__ = ["SCALING_TYPES", "Scaling", "attention_factor", "parse_scaling", "scale_frequencies", "scaled_inv_freq",
           "scaling_from_config"]

SCALING_TYPES = ("default", "linear", "ntk", "dynamic", "yarn", "longrope", "llama3")

# keys a model config's rope dict may carry that describe the allocation or dim, not the scaling
_PASSTHROUGH = {"type", "rope_type", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"}
_KEYS = {
    "default": set(),
    "linear": {"factor"},
    "ntk": {"factor"},
    "dynamic": {"factor", "max_position_embeddings"},
    "yarn": {"factor", "original_max_position_embeddings", "max_position_embeddings", "attention_factor",
             "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"},
    "longrope": {"short_factor", "long_factor", "factor", "original_max_position_embeddings",
                 "max_position_embeddings", "attention_factor"},
    "llama3": {"factor", "original_max_position_embeddings", "max_position_embeddings", "low_freq_factor",
               "high_freq_factor"},
}
_NEEDS_ORIGINAL = ("yarn", "longrope", "llama3")
# transformers configs may carry the pretraining length on every rope type; these types do not use it (transformers
# ignores it there too), so it is accepted and dropped rather than refused
_IGNORES_ORIGINAL = ("default", "linear", "ntk", "dynamic")


@dataclass(frozen=True)
class Scaling:
    """A validated scaling configuration (build it with :func:`parse_scaling`)."""

    rope_type: str
    params: Mapping[str, Any]
    axes: tuple[int, ...] | None = None  # None: every axis

    @property
    def depends_on_length(self) -> bool:
        """Whether the frequencies change with the current sequence length (dynamic NTK, LongRoPE)."""
        return self.rope_type in ("dynamic", "longrope")

    def axis_factors(self, num_axes: int) -> list[Any]:
        """Per axis of ``W``: the factor that axis is scaled by (``None`` for an axis left alone)."""
        f = self.params.get("factor")
        if isinstance(f, (list, tuple)):
            if len(f) != num_axes:
                raise ValueError(f"scaling: `factor` has {len(f)} entries but W has {num_axes} axes; "
                                 f"give one factor per axis (1.0 leaves an axis unchanged)")
            per_axis = [None if float(x) == 1.0 else x for x in f]
        else:
            per_axis = [f] * num_axes
        if self.axes is not None:
            bad = [a for a in self.axes if not 0 <= a < num_axes]
            if bad:
                raise ValueError(f"scaling: `axes` {list(self.axes)} name axes outside 0..{num_axes - 1} "
                                 f"(W has {num_axes} axes)")
            per_axis = [x if a in self.axes else None for a, x in enumerate(per_axis)]
        return per_axis

    def scaled_axes(self, num_axes: int) -> list[int]:
        """Indices of the axes this scaling changes."""
        if self.rope_type == "default":
            return []
        return [a for a, f in enumerate(self.axis_factors(num_axes)) if f is not None]


def _positive(value: Any, name: str, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"scaling: `{name}` must be a finite number > 0, got {value!r}")
    return float(value)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"scaling: `{name}` must be an int >= 1, got {value!r}")
    return value


def parse_scaling(
    scaling: "Mapping[str, Any] | Scaling | None",
    *,
    max_position_embeddings: int | None = None,
    base: float | None = None,
) -> Scaling:
    """Validate a ``rope_parameters`` / ``rope_scaling`` dict into a :class:`Scaling`.

    ``rope_type`` (or the older ``type``) picks the method; keys that only describe the allocation
    (``rope_theta``, ``partial_rotary_factor``, ``mrope_section``…) are accepted and ignored here.
    ``axes`` (a ropekit extension) limits the scaling to those axes of ``W``. ``max_position_embeddings``
    is the model config's value: dynamic NTK needs it, and like transformers it stands in for a missing
    ``original_max_position_embeddings`` and for a missing YaRN/LongRoPE ``factor`` (``max / original``).
    ``base``, when given, must agree with the dict's ``rope_theta``.
    """
    if isinstance(scaling, Scaling):
        return scaling
    if scaling is None:
        return Scaling("default", {})
    if not isinstance(scaling, Mapping):
        raise TypeError(f"`scaling` must be a dict like {{'rope_type': 'yarn', 'factor': 4.0, ...}}, "
                        f"got {type(scaling).__name__}")
    p = dict(scaling)
    rope_type = p.get("rope_type", p.get("type", "default"))
    if rope_type not in SCALING_TYPES:
        raise ValueError(f"scaling: unknown `rope_type` {rope_type!r}; choose one of {', '.join(SCALING_TYPES)}")
    axes = p.pop("axes", None)
    if axes is not None:
        if isinstance(axes, (str, bytes)) or not all(isinstance(a, int) and not isinstance(a, bool) for a in axes):
            raise TypeError(f"scaling: `axes` must be a list of axis indices, got {axes!r}")
        axes = tuple(axes)
    if rope_type in _IGNORES_ORIGINAL:
        p.pop("original_max_position_embeddings", None)
    unknown = set(p) - _PASSTHROUGH - _KEYS[rope_type]
    if unknown:
        raise ValueError(f"scaling: rope_type {rope_type!r} does not take {', '.join(sorted(map(repr, unknown)))}; "
                         f"it takes {', '.join(sorted(_KEYS[rope_type])) or 'no parameters'}")
    if max_position_embeddings is not None:
        p.setdefault("max_position_embeddings", _positive_int(max_position_embeddings, "max_position_embeddings"))
    _check(rope_type, p)
    out = Scaling(rope_type, p, axes)
    if base is not None:
        _base(out, base)
    return out


def _check(rope_type: str, p: dict) -> None:
    """Validate (and complete, as transformers does) the parameters of one method, in place."""
    if rope_type == "default":
        return
    if "max_position_embeddings" in p:
        _positive_int(p["max_position_embeddings"], "max_position_embeddings")
    if rope_type in _NEEDS_ORIGINAL:
        _check_original(rope_type, p)
    if rope_type == "longrope":
        _check_longrope_lists(p)
    _check_factor(rope_type, p)
    if rope_type == "dynamic" and "max_position_embeddings" not in p:
        raise ValueError("scaling: rope_type 'dynamic' needs `max_position_embeddings` (the trained context length "
                         "beyond which the base grows)")
    if rope_type == "llama3":
        _check_llama3(p)
    if rope_type == "yarn":
        _check_yarn(p)
    if rope_type in ("yarn", "longrope"):
        _positive(p.get("attention_factor"), "attention_factor", allow_none=True)


def _check_original(rope_type: str, p: dict) -> None:
    if "original_max_position_embeddings" not in p:
        if "max_position_embeddings" not in p:
            raise ValueError(f"scaling: rope_type {rope_type!r} needs `original_max_position_embeddings` "
                             f"(the context length the model was trained with)")
        p["original_max_position_embeddings"] = p["max_position_embeddings"]
    _positive_int(p["original_max_position_embeddings"], "original_max_position_embeddings")


def _check_longrope_lists(p: dict) -> None:
    for key in ("short_factor", "long_factor"):
        v = p.get(key)
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or not v:
            raise ValueError(f"scaling: longrope needs `{key}`, a list with one number per frequency pair")
        for x in v:
            _positive(x, key)
    if len(p["short_factor"]) != len(p["long_factor"]):
        raise ValueError(f"scaling: `short_factor` ({len(p['short_factor'])}) and `long_factor` "
                         f"({len(p['long_factor'])}) must have the same length (rotary_dim / 2)")


def _check_factor(rope_type: str, p: dict) -> None:
    if rope_type in ("yarn", "longrope") and p.get("factor") is None:
        if "max_position_embeddings" not in p:  # the attention factor (and YaRN's frequencies) need one
            raise ValueError(f"scaling: rope_type {rope_type!r} needs `factor` (or `max_position_embeddings`, "
                             f"from which factor = max_position_embeddings / original_max_position_embeddings)")
        p["factor"] = p["max_position_embeddings"] / p["original_max_position_embeddings"]
    if "factor" not in p:
        raise ValueError(f"scaling: rope_type {rope_type!r} needs `factor`")
    factor = p["factor"]
    if isinstance(factor, (list, tuple)):
        if rope_type == "longrope" or not factor:
            raise ValueError(f"scaling: `factor` must be one number for rope_type {rope_type!r}")
        for x in factor:
            _positive(x, "factor")
    else:
        _positive(factor, "factor")


def _check_llama3(p: dict) -> None:
    for key in ("low_freq_factor", "high_freq_factor"):
        if key not in p:
            raise ValueError(f"scaling: rope_type 'llama3' needs `{key}`")
        _positive(p[key], key)
    if p["high_freq_factor"] <= p["low_freq_factor"]:
        raise ValueError(f"scaling: llama3 needs `high_freq_factor` > `low_freq_factor`, got "
                         f"{p['high_freq_factor']} <= {p['low_freq_factor']}")


def _check_yarn(p: dict) -> None:
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if p.get(key) is not None and (isinstance(p[key], bool) or not isinstance(p[key], Real)):
            raise ValueError(f"scaling: `{key}` must be a number, got {p[key]!r}")
    if (p.get("beta_fast") or 32) < (p.get("beta_slow") or 1):
        raise ValueError(f"scaling: yarn needs `beta_fast` >= `beta_slow`, got {p.get('beta_fast')} and "
                         f"{p.get('beta_slow')}")


# --- the methods: each maps frequencies θ (with their exponents e, θ = 1/base**e) to θ' --------------------


def _base_change(new_base: float, e: torch.Tensor) -> torch.Tensor:
    return 1.0 / (new_base ** e)


def _ntk(theta, e, idx, dim, base, p, factor, seq_len):
    return _base_change(base * factor ** (dim / (dim - 2)), e)


def _dynamic(theta, e, idx, dim, base, p, factor, seq_len):
    m = p["max_position_embeddings"]
    length = m if seq_len is None else max(seq_len, m)
    return _base_change(base * ((factor * length / m) - (factor - 1)) ** (dim / (dim - 2)), e)


def _yarn_range(p: Mapping, dim: int, base: float) -> tuple[float, float]:
    """Pair-index range over which YaRN ramps from extrapolation (below) to interpolation (above)."""
    original = p["original_max_position_embeddings"]

    def pair_index(turns: float) -> float:  # pair whose wavelength fits `turns` times into the context
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(p.get("beta_fast") or 32), pair_index(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn(theta, e, idx, dim, base, p, factor, seq_len):
    low, high = _yarn_range(p, dim, base)
    if low == high:
        high += 0.001  # a one-pair ramp would divide by zero
    interpolate = torch.clamp((idx - low) / (high - low), 0, 1)  # 0: keep θ, 1: θ / s
    keep = 1 - interpolate
    # on the standard grid θ == 1 / base**e bit for bit (see _exponents); off it, θ is kept exactly
    return (1.0 / (factor * base ** e)) * (1 - keep) + theta * keep


def _llama3(theta, e, idx, dim, base, p, factor, seq_len):
    original, lo, hi = p["original_max_position_embeddings"], p["low_freq_factor"], p["high_freq_factor"]
    wavelength = 2 * math.pi / theta
    out = torch.where(wavelength > original / lo, theta / factor, theta)
    smooth = (original / wavelength - lo) / (hi - lo)
    blended = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelength < original / hi) * ~(wavelength > original / lo)
    return torch.where(medium, blended, out)


def _linear(theta, e, idx, dim, base, p, factor, seq_len):
    return theta / factor


_METHODS = {"linear": _linear, "ntk": _ntk, "dynamic": _dynamic, "yarn": _yarn, "llama3": _llama3}


def _longrope_rescale(s: Scaling, seq_len: int | None, pairs: int) -> torch.Tensor:
    for key in ("short_factor", "long_factor"):
        if len(s.params[key]) != pairs:
            raise ValueError(f"scaling: longrope `{key}` has {len(s.params[key])} entries but the frequency matrix "
                             f"has {pairs} frequency pairs (rotary_dim / 2); give one factor per pair")
    long = seq_len is not None and seq_len > s.params["original_max_position_embeddings"]
    return torch.tensor(s.params["long_factor" if long else "short_factor"], dtype=torch.float32)


def attention_factor(s: Scaling, factor: float | None = None) -> float:
    """The factor transformers multiplies cos and sin by (1.0 except for YaRN and LongRoPE)."""
    p = s.params
    if s.rope_type not in ("yarn", "longrope"):
        return 1.0
    if p.get("attention_factor") is not None:
        return float(p["attention_factor"])
    f = factor if factor is not None else p.get("factor")
    if isinstance(f, (list, tuple)):
        f = max(f)
    if s.rope_type == "longrope":
        if f is None or f <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(f) / math.log(p["original_max_position_embeddings"]))

    def mscale(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if p.get("mscale") and p.get("mscale_all_dim"):
        return float(mscale(f, p["mscale"]) / mscale(f, p["mscale_all_dim"]))
    return mscale(f)


# --- exponents of the entries of W ------------------------------------------------------------------------


def _exponents(theta: torch.Tensor, dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Exponent ``e`` (``θ = 1/base**e``) and pair index ``e·dim/2`` of each frequency, float32.

    A frequency on the standard grid ``1/base**(2i/dim)`` gets the exact float32 exponent ``2i/dim`` the
    reference computes (so 1-D results are bit-identical to transformers); any other frequency (dense or
    learned ``W``) gets its logarithm.
    """
    e_log = torch.log(1.0 / theta.double()) / math.log(base)
    steps = torch.round(e_log * dim / 2).clamp_min(0).to(torch.int64) * 2
    e_grid = steps.float() / dim
    on_grid = (1.0 / (base ** e_grid)) == theta
    e = torch.where(on_grid, e_grid, e_log.float())
    idx = torch.where(on_grid, (steps // 2).float(), e_log.float() * dim / 2)
    return e, idx


def spectrum_dim(allocation: str, rotary_dim: int, num_axes: int) -> int:
    """The length of the spectrum a frequency matrix's entries come from, which rope scaling reads (YaRN's
    correction range, NTK's base change): each axis's own ``rotary_dim / num_axes`` channels under the axial
    allocation (every axis a full spectrum of its own), the whole ``rotary_dim`` under every other allocation (the
    axes share one spectrum). :class:`ropekit.RoPE` and :func:`ropekit.patch_model` both ask this."""
    return rotary_dim // num_axes if allocation == "axial" else rotary_dim


def scale_frequencies(
    W: torch.Tensor,
    scaling: "Mapping[str, Any] | Scaling | None",
    *,
    base: float | None = None,
    dim: int | None = None,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Apply a context-extension method to a frequency matrix: returns ``(W', attention_factor)``.

    ``W`` is ``(A, R/2)`` (a 1-D tensor of inverse frequencies is read as one axis and returned 1-D), or
    per head ``(H, A, R/2)`` (MHRoPE, RoPE-Mixed), each head scaled as its own ``(A, R/2)``.
    ``base`` is the RoPE base the frequencies were built with (default: the dict's ``rope_theta``, else
    10000); ``dim`` the length of the spectrum they come from (default ``R = 2·W.shape[-1]``; for the
    axial allocation pass ``R / A``, each axis having its own full spectrum). ``seq_len`` is the current
    sequence length (max position + 1), used by ``"dynamic"`` and ``"longrope"`` only.

    Multiply cos and sin by the returned attention factor, as transformers does.
    """
    s = parse_scaling(scaling, max_position_embeddings=max_position_embeddings)
    if not isinstance(W, torch.Tensor) or not W.is_floating_point():
        raise TypeError(f"`W` must be a floating-point tensor (A, R/2), got {getattr(W, 'dtype', type(W))}")
    if W.ndim == 3 and W.shape[0]:  # per head: every head's (A, R/2) on its own, one attention factor for all
        heads = [scale_frequencies(w, s, base=base, dim=dim, seq_len=seq_len) for w in W.unbind(0)]
        return torch.stack([w for w, _ in heads]), heads[0][1]
    one_d = W.ndim == 1
    W2 = W[None] if one_d else W
    if W2.ndim != 2:
        raise ValueError(f"`W` must be (A, R/2), (H, A, R/2) or (R/2,), got shape {tuple(W.shape)}")
    if not torch.isfinite(W2).all():
        raise ValueError("`W` contains non-finite values")
    base = _base(s, base)
    dim = 2 * W2.shape[-1] if dim is None else dim
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"`dim` must be an even int >= 2 (the spectrum's rotary dim), got {dim!r}")
    if dim == 2 and s.rope_type in ("ntk", "dynamic") and s.scaled_axes(W2.shape[0]):
        raise ValueError(f"scaling: rope_type {s.rope_type!r} changes the base by s^(dim/(dim-2)), which has no value "
                         f"for a rotary dim of 2 (one frequency pair; transformers divides by zero there too); use "
                         f"'linear' or 'yarn', or rotate more channels")
    if seq_len is not None:
        seq_len = _positive_int(int(seq_len) if isinstance(seq_len, torch.Tensor) else seq_len, "seq_len")
    factors = s.axis_factors(W2.shape[0])
    out = W2.clone()
    for a in s.scaled_axes(W2.shape[0]):
        mask = W2[a] != 0
        theta = W2[a, mask].abs().float()
        e, idx = _exponents(theta, dim, base)
        if s.rope_type == "longrope":  # a factor per frequency of the spectrum, found by its index where it has one
            ext = _longrope_rescale(s, seq_len, W2.shape[-1]).to(W2.device)
            cols = torch.arange(W2.shape[-1], device=W2.device)[mask]
            whole = (idx == idx.round()) & (idx >= 0) & (idx < W2.shape[-1])  # on the grid (compass-prerotated
            new = 1.0 / (ext[torch.where(whole, idx.round().long(), cols)] * base ** e)  # reorders it); else its column
        else:
            new = _METHODS[s.rope_type](theta, e, idx, dim, base, s.params, factors[a], seq_len)
        out[a, mask] = (new * torch.sign(W2[a, mask]).float()).to(W.dtype)
    scaled = [factors[a] for a in s.scaled_axes(W2.shape[0]) if factors[a] is not None]
    attn = attention_factor(s, max(scaled) if scaled else None)
    return (out[0] if one_d else out), attn


def scaled_inv_freq(
    dim: int,
    scaling: "Mapping[str, Any] | Scaling | None",
    *,
    base: float | None = None,
    seq_len: int | None = None,
    max_position_embeddings: int | None = None,
) -> tuple[torch.Tensor, float]:
    """1-D inverse frequencies ``(dim/2,)`` under a scaling method, and the attention factor.

    Equal to ``ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len)`` of transformers for the same
    rope parameters.
    """
    s = parse_scaling(scaling, max_position_embeddings=max_position_embeddings)
    from .planar import inv_freq

    return scale_frequencies(inv_freq(dim, _base(s, base)), s, base=base, seq_len=seq_len)


def _base(s: Scaling, base: float | None) -> float:
    theta = s.params.get("rope_theta")
    if base is None:
        base = 10000.0 if theta is None else theta
    elif theta is not None and float(theta) != float(base):
        raise ValueError(f"scaling: the dict's `rope_theta` ({theta}) differs from `base` ({base}); "
                         f"drop one or make them agree")
    return float(_positive(base, "base"))


def scaling_from_config(config: Any) -> dict:
    """The scaling dict of a Hugging Face (text) config: its ``rope_parameters`` (or ``rope_scaling``),
    completed with ``max_position_embeddings`` so dynamic NTK and derived factors work."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if not isinstance(params, Mapping):
        raise TypeError(f"config.rope_parameters must be a dict, got {type(params).__name__}")
    out = dict(params)
    m = getattr(config, "max_position_embeddings", None)
    if m is not None and out.get("rope_type", out.get("type", "default")) in ("dynamic", "yarn", "longrope",
                                                                               "llama3"):
        out.setdefault("max_position_embeddings", m)
    if getattr(config, "original_max_position_embeddings", None) is not None:
        out["original_max_position_embeddings"] = config.original_max_position_embeddings
    return out
