"""Frequency allocations of published multimodal RoPE variants, as planar frequency matrices ``W``.

Each rule says which position axis (0 = t, 1 = h, 2 = w) drives frequency pair ``j`` of the
standard spectrum ``base^(-2j/R)`` (one rule, ``"compass-prerotated"``, also reorders those frequencies over the
pairs); pair 0 is the highest frequency. A zero column means the pair is not rotated (NoPE). All of these take
three axes (t, h, w).

- ``"mrope-interleave"`` (MRoPE-I, Qwen3-VL): h on ``j ≡ 1``, w on ``j ≡ 2 (mod 3)`` for the first
  ``3·s`` pairs, t on every other pair; ``s = ⌊5·(R/2)/16⌋`` (20 of 64 pairs each for h and w) unless
  ``sections = [t, h, w]`` says otherwise.
- ``"videorope"`` (VideoRoPE's low-frequency temporal allocation, as its paper draws it: h, w, h, w, …,
  then t, t, …): the last quarter of the pairs (the lowest frequencies) to t, the others alternating
  h (even j) and w (odd j).
- ``"videorope-public"``: what the public Multimodal-RoPEs code computes instead: pair 0 stays
  temporal, odd pairs before the temporal tail are h, even ones w (t/h/w = 17/24/23 of 64 pairs).
- ``"hope"`` / ``"hope-public"``: HoPE's hybrid allocation: the ``videorope`` (resp. public) rule with
  every temporal pair set to frequency 0, so time is not rotated at all (for text tokens too).
- ``"mmrope"``: the axes repeat ``t, t, h, w, h, w, h, w`` over the pairs (16/24/24 of 64).
- ``"bailing-mrope"`` (Bailing M-RoPE, the Ling/Ming vision-language family, vLLM's
  ``BailingMRotaryEmbedding``): ``sections = [t, h, w]`` with ``h == w`` is required (the checkpoint's
  ``mrope_section``, e.g. ``[8, 12, 12]`` for a rotary dim of 64); the first ``h + w`` pairs alternate h
  (even j) and w (odd j), the last ``t`` pairs are temporal. That is the ``"videorope"`` rule with
  explicit sections. The family rotates GPT-J pairs ``(2j, 2j + 1)``: use it with
  ``channels="interleaved"``.
- ``"compass-prerotated"`` (Command A Compass's text rotary before transformers 5.21): ``sections = [t, h, w]``
  (required: the checkpoint's ``mrope_section`` reads ``[h, w, t]``). The ``h + w`` highest frequencies are laid
  out even-indexed first, then odd-indexed, and the pairs in that order go ``h`` to height, ``w`` to width; the
  last ``t`` pairs (the lowest frequencies, in order) are temporal. Pair ``j`` of ``W`` is then not frequency ``j``
  of the spectrum: ``W``'s columns follow that order, which is how the model's rotate-half tables lay them on its
  channels.
- ``"c2rope"`` (C²RoPE): the highest-frequency pairs to the 1-D position m (axis 0), then a run to x
  (axis 1) and the lowest to y (axis 2); ``sections = [m, x, y]``, default ``[R/2 − 2k, k, k]`` with
  ``k = max(1, round(3·(R/2)/64))`` (the authors' 58/3/3 of 64 pairs).
- ``"mhrope"``: a *per-head* matrix ``(H, 3, R/2)``: ``sections = [n_t, n_h, n_w]`` (default
  ``[2, 3, 3]``) gives the number of whole heads that rotate every pair by t, h or w, in that order;
  a fourth entry adds that many heads with no rotation at all (MHRoPE's leftover heads).
"""
from __future__ import annotations

import numbers
from typing import Callable, Optional, Sequence

import torch

__all__ = ["PUBLISHED", "published_matrix", "axis_of_pairs"]

T, H, W = 0, 1, 2


def _temporal_tail(half: int, sections: Optional[Sequence[int]], name: str) -> int:
    """Number of low-frequency pairs VideoRoPE/HoPE give to time (a quarter unless ``sections`` says)."""
    if sections is None:
        if half % 4:
            raise ValueError(f"allocation {name!r} gives a quarter of the pairs to time; rotary_dim/2 = {half} "
                             f"is not divisible by 4, pass sections=[t, h, w]")
        return half // 4
    secs = [int(s) for s in sections]
    if len(secs) != 3 or any(s < 0 for s in secs) or sum(secs) != half or secs[1] != secs[2]:
        raise ValueError(f"allocation {name!r}: `sections` must be [t, h, w] with h == w, summing to "
                         f"rotary_dim/2 = {half} (e.g. [16, 24, 24]), got {list(sections)}")
    return secs[0]


def _videorope(half: int, sections, public: bool, name: str) -> torch.Tensor:
    split = half - _temporal_tail(half, sections, name)
    j = torch.arange(half)
    if public:  # pair 0 temporal, odd pairs h, even pairs w
        axis = torch.where(j % 2 == 1, H, W)
        axis[0] = T
    else:  # h, w, h, w, … from the highest frequency
        axis = torch.where(j % 2 == 0, H, W)
    axis[split:] = T
    return axis


def _mmrope(half: int, sections, name: str) -> torch.Tensor:
    if sections is not None:
        raise ValueError(f"allocation {name!r} has a fixed pattern (t, t, h, w, h, w, h, w); do not pass `sections`")
    return torch.tensor([T, T, H, W, H, W, H, W])[torch.arange(half) % 8]


def _required_sections(sections, name: str, what: str) -> list[int]:
    """``sections`` of a rule without a default split: a ValueError saying ``what`` to pass when there are none, a
    TypeError when they are not ints."""
    if sections is None:
        raise ValueError(f"allocation {name!r} has no default split: pass {what}")
    if isinstance(sections, (str, bytes)) or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in sections):
        raise TypeError(f"allocation {name!r}: `sections` must be three ints [t, h, w] (numbers of frequency "
                        f"pairs), got {sections!r}")
    return [int(s) for s in sections]


def _bailing(half: int, sections, name: str) -> torch.Tensor:
    sections = _required_sections(sections, name, f"sections=[t, h, w] with h == w, the checkpoint's mrope_section, "
                                                   f"summing to rotary_dim/2 = {half} (e.g. [8, 12, 12] for rotary_dim "
                                                   f"64)")
    return _videorope(half, sections, False, name)


def _mrope_interleave(half: int, sections, name: str) -> torch.Tensor:
    if sections is None:
        hw = (5 * half) // 16
        sections = [half - 2 * hw, hw, hw]
    secs = [int(s) for s in sections]
    if len(secs) != 3 or any(s < 0 for s in secs) or sum(secs) != half or 3 * max(secs[1:]) > half:
        raise ValueError(f"allocation {name!r}: `sections` must be [t, h, w] summing to rotary_dim/2 = {half} "
                         f"with h and w small enough to interleave (e.g. [24, 20, 20]), got {list(sections)}")
    axis = torch.full((half,), T)
    for a in (H, W):
        axis[a: 3 * secs[a]: 3] = a
    return axis


def _compass_prerotated(half: int, sections, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    secs = _required_sections(sections, name, f"sections=[t, h, w], the checkpoint's mrope_section [h, w, t] "
                                              f"reordered, summing to rotary_dim/2 = {half} (e.g. [20, 22, 22] for "
                                              f"rotary_dim 128)")
    if len(secs) != 3 or min(secs) < 0 or sum(secs) != half:
        raise ValueError(f"allocation {name!r}: `sections` must be [t, h, w], none negative, summing to "
                         f"rotary_dim/2 = {half} (e.g. [20, 22, 22] for rotary_dim 128), got {list(sections)}")
    t, h, w = secs
    spatial = torch.arange(h + w)
    order = torch.cat([spatial[0::2], spatial[1::2], torch.arange(h + w, half)])
    return torch.repeat_interleave(torch.tensor([H, W, T]), torch.tensor([h, w, t])), order


def _c2rope(half: int, sections, name: str) -> torch.Tensor:
    if sections is None:
        k = max(1, (3 * half + 32) // 64)  # 3 of 64 pairs each for x and y, as in the authors' code
        sections = [half - 2 * k, k, k]
    if isinstance(sections, (str, bytes)) or not all(
            isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in sections):
        raise TypeError(f"allocation {name!r}: `sections` must be three ints [m, x, y] (numbers of frequency "
                        f"pairs), got {sections!r}")
    secs = [int(s) for s in sections]
    if len(secs) != 3 or min(secs) < 1 or sum(secs) != half:
        raise ValueError(f"allocation {name!r}: `sections` must be [m, x, y], each at least 1, summing to "
                         f"rotary_dim/2 = {half} (e.g. [58, 3, 3] for rotary_dim 128), got {list(sections)}")
    if half < 3:
        raise ValueError(f"allocation {name!r} needs at least 3 frequency pairs (rotary_dim >= 6), got {half}")
    return torch.repeat_interleave(torch.tensor([T, H, W]), torch.tensor(secs))


#: name -> (axis rule (half, sections, name) -> axis per pair, temporal pairs get frequency 0); a rule may also
#: return the order of the spectrum's frequencies over the pairs (``(axis, order)``): pair j then turns at
#: frequency ``order[j]``
_RULES: dict[str, tuple[Callable[..., torch.Tensor], bool]] = {
    "mrope-interleave": (_mrope_interleave, False),
    "videorope": (lambda half, s, n: _videorope(half, s, False, n), False),
    "videorope-public": (lambda half, s, n: _videorope(half, s, True, n), False),
    "hope": (lambda half, s, n: _videorope(half, s, False, n), True),
    "hope-public": (lambda half, s, n: _videorope(half, s, True, n), True),
    "mmrope": (_mmrope, False),
    "bailing-mrope": (_bailing, False),
    "c2rope": (_c2rope, False),
    "compass-prerotated": (_compass_prerotated, False),
}

PUBLISHED = tuple(_RULES) + ("mhrope",)


def axis_of_pairs(allocation: str, half: int, sections: Optional[Sequence[int]] = None) -> torch.Tensor:
    """The axis (0 = t, 1 = h, 2 = w) each of ``half`` frequency pairs uses under a published rule, int64."""
    return _axes_and_order(allocation, half, sections)[0]


def _axes_and_order(allocation: str, half: int, sections: Optional[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The axis of each pair and the spectrum frequency each pair turns at (``arange(half)`` for most rules)."""
    out = _RULES[allocation][0](half, sections, allocation)
    return out if isinstance(out, tuple) else (out, torch.arange(half))


def _mhrope(freqs: torch.Tensor, sections: Optional[Sequence[int]]) -> torch.Tensor:
    secs = [2, 3, 3] if sections is None else [int(s) for s in sections]
    if len(secs) not in (3, 4) or any(s < 0 for s in secs) or sum(secs[:3]) < 1:
        raise ValueError(f"allocation 'mhrope': `sections` must be the number of heads for t, h, w "
                         f"(and optionally a 4th count of unrotated heads), e.g. [2, 3, 3], got {sections}")
    owner = torch.repeat_interleave(torch.arange(len(secs)), torch.tensor(secs))
    Wm = torch.zeros(owner.numel(), 3, freqs.numel(), dtype=torch.float32)
    rotated = owner < 3
    Wm[rotated.nonzero().squeeze(1), owner[rotated]] = freqs
    return Wm


def published_matrix(
    allocation: str, freqs: torch.Tensor, num_axes: int, sections: Optional[Sequence[int]] = None
) -> torch.Tensor:
    """``W`` for a published allocation from the inverse frequencies ``freqs (R/2,)``: ``(3, R/2)``, or
    ``(H, 3, R/2)`` for ``"mhrope"``."""
    if num_axes != 3:
        raise ValueError(f"allocation {allocation!r} assigns pairs to the (t, h, w) axes; it needs num_axes=3, "
                         f"got {num_axes}")
    if allocation == "mhrope":
        return _mhrope(freqs, sections)
    temporal_off = _RULES[allocation][1]
    axis, order = _axes_and_order(allocation, freqs.numel(), sections)
    Wm = torch.zeros(3, freqs.numel(), dtype=torch.float32)
    Wm[axis, torch.arange(freqs.numel())] = freqs[order]
    if temporal_off:
        Wm[T] = 0.0
    return Wm
