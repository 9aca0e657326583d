"""HoPE (Li et al., "HoPE: Hybrid of Position Embedding for Length Generalization in Vision-Language
Models"): VideoRoPE's centred diagonal layout with *dynamic temporal scaling*, paired with a hybrid
allocation that gives time zero frequency (the ``"hope"`` allocation).

Frame f of a block that starts at ``s`` sits at time ``s + γ·f`` (h, w centred on it as in
VideoRoPE); text resumes at ``s + γ·(T−1) + 1``. ``temporal_scale`` is γ: fixed at evaluation (1 by
default). For training, give ``scales`` (the paper draws from ``(0.5, 0.75, 1.0, 1.25, 1.5)``) and a
``generator`` (a ``torch.Generator`` or an int seed): each call, i.e. each sample, draws one γ from
``scales`` with that generator. No global random state is used.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..layout import Layout, Segment
from ._common import positive_number
from .registry import register, walk
from .videorope import diagonal_blocks

__all__ = ["hope", "hope_blocks", "draw_temporal_scale", "as_generator", "TRAIN_SCALES"]

TRAIN_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5)


def as_generator(generator: "torch.Generator | int") -> torch.Generator:
    """``generator`` itself, or a new ``torch.Generator`` seeded with it (an int seed in ``[0, 2**63)``)."""
    if isinstance(generator, torch.Generator):
        return generator
    if isinstance(generator, bool) or not isinstance(generator, int):
        raise TypeError(
            f"hope: drawing a temporal scale needs `generator` = a torch.Generator or an int seed, got "
            f"{type(generator).__name__}; HoPE never uses global random state"
        )
    if not 0 <= generator < 2**63:
        raise ValueError(f"hope: an int `generator` is a seed and must lie in [0, 2**63), got {str(generator)[:40]}")
    return torch.Generator().manual_seed(generator)


def draw_temporal_scale(scales: Sequence[float], generator: "torch.Generator | int") -> float:
    """One γ drawn uniformly from ``scales`` with ``generator`` (a ``torch.Generator`` or an int seed)."""
    generator = as_generator(generator)
    if isinstance(scales, (str, bytes)) or not isinstance(scales, Sequence):
        raise TypeError(f"hope: `scales` must be a sequence of temporal scales, e.g. {TRAIN_SCALES}, "
                        f"got {type(scales).__name__}")
    values = [positive_number(s, "scales", "hope") for s in scales]
    if not values:
        raise ValueError("hope: `scales` must hold at least one temporal scale, e.g. (0.5, 0.75, 1.0, 1.25, 1.5)")
    return values[int(torch.randint(len(values), (1,), generator=generator))]


def hope_blocks(
    segments: Sequence[Segment],
    temporal_scale: float = 1.0,
    scales: Optional[Sequence[float]] = None,
    generator: "torch.Generator | int | None" = None,
):
    """HoPE block rule: VideoRoPE's diagonal with stride γ = ``temporal_scale``.

    A random γ is drawn per sample, which a rule placing a whole batch at once cannot do: with
    ``scales`` given, call :func:`ropekit.positions` per sample instead of ``rope_index``.
    """
    if scales is not None or generator is not None:
        raise ValueError(
            "hope: `scales`/`generator` draw one temporal scale per sample; rope_index places a whole batch at "
            "once: use ropekit.hope_index(..., scales=..., generator=...) for a batch, or "
            "ropekit.positions(layout, 'hope', scales=..., generator=...) per sample"
        )
    return diagonal_blocks(segments, positive_number(temporal_scale, "temporal_scale", "hope"), "hope")


@register(
    "hope",
    summary="HoPE: VideoRoPE diagonal with dynamic temporal scale, time at zero frequency",
    allocation="hope",
    block_rule=hope_blocks,
    delta_axes=(0,),
    axes=3,
)
def hope(
    layout: Layout,
    temporal_scale: float = 1.0,
    scales: Optional[Sequence[float]] = None,
    generator: "torch.Generator | int | None" = None,
) -> torch.Tensor:
    """HoPE positions ``(L, 3)``; with ``scales`` and ``generator`` the temporal scale is drawn for this sample."""
    if scales is not None:
        if generator is None:
            raise ValueError("hope: `scales` needs a `generator` (torch.Generator or int seed) to draw from")
        temporal_scale = draw_temporal_scale(scales, generator)
    elif generator is not None:
        raise ValueError("hope: `generator` is only used with `scales` (the temporal scales to draw from)")
    return walk(layout, hope_blocks, temporal_scale=temporal_scale)
