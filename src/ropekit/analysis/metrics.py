"""Position-space metrics: Per-Token Distance (Circle-RoPE eq. 1) and text→video attention-bias maps."""
from __future__ import annotations

import torch

from ..layout import TEXT, Image, Layout, Video
from ..rope import design_frequencies
from ..designs.registry import positions
from .kernel import kernel_between

__all__ = ["ptd", "layout_ptd", "attention_bias_map"]


def _as_points(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    x = x.to(torch.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"`{name}` must be a non-empty (N, A) array of coordinates, got shape {tuple(x.shape)}")
    if torch.isnan(x).any():
        raise ValueError(f"`{name}` contains NaN; positions must be finite")
    return x


def ptd(text_coords: torch.Tensor, image_coords: torch.Tensor) -> float:
    """Per-Token Distance (Circle-RoPE paper eq. 1).

    Mean over text tokens t and image tokens i of ``|d(t, i) − mean_i d(t, i)|`` with Euclidean d;
    0 means every text token is equidistant from all image tokens.
    """
    t = _as_points(text_coords, "text_coords")
    i = _as_points(image_coords, "image_coords")
    if t.shape[1] != i.shape[1]:
        raise ValueError(
            f"`text_coords` have {t.shape[1]} axes but `image_coords` have {i.shape[1]}; give both in one space"
        )
    d = torch.cdist(t, i)
    return float((d - d.mean(dim=1, keepdim=True)).abs().mean())


def layout_ptd(layout: "Layout | str", design: str, **options) -> float:
    """PTD between all text tokens and all image/video tokens of a layout under a design."""
    lay = Layout.coerce(layout)
    kinds = lay.token_types()
    if not (kinds == TEXT).any() or not (kinds != TEXT).any():
        raise ValueError(f"layout {lay} needs both text and vision tokens to measure PTD")
    c = positions(lay, design, **options)
    return ptd(c[kinds == TEXT], c[kinds != TEXT])


def attention_bias_map(
    layout: "Layout | str",
    design: str,
    *,
    head_dim: int = 128,
    base: float = 10000.0,
    allocation: str | None = None,
    query: str = "after",
    **options,
) -> torch.Tensor:
    """Expected kernel from text queries to every token of the first video/image: ``(T, H, W)`` (VRoPE fig. 3).

    ``query="after"`` averages over the text tokens following the block (the question after a video),
    ``"before"`` over those preceding it, ``"all"`` over every text token. Isotropic q = k (SPEC §5).
    """
    lay = Layout.coerce(layout)
    if query not in ("after", "before", "all"):
        raise ValueError(f"`query` must be 'after', 'before' or 'all', got {query!r}")
    start, block = 0, None
    for seg in lay:
        if isinstance(seg, (Image, Video)):
            block = seg
            break
        start += seg.num_tokens
    if block is None:
        raise ValueError(f"layout {lay} has no image or video block to map")
    n = block.num_tokens
    kinds = lay.token_types()
    idx = torch.arange(lay.num_tokens)
    text = kinds == TEXT
    sel = {"after": text & (idx >= start + n), "before": text & (idx < start), "all": text}[query]
    if not sel.any():
        raise ValueError(f"layout {lay} has no text tokens {query} the block; add some or change `query`")
    c = positions(lay, design, **options)
    W = design_frequencies(design, head_dim, c.shape[1], allocation=allocation, base=base)
    k = kernel_between(c[sel], c[start : start + n], W).mean(0)
    t = block.t if isinstance(block, Video) else 1
    return k.reshape(t, block.h, block.w)
