"""ID-Align (Li & Zhang 2025, "ID-Align: RoPE-Conscious Position Remapping for Dynamic High-Resolution
Adaptation in Vision-Language Models", arXiv 2505.21465): high-resolution tokens reuse the positions of
their thumbnail.

Dynamic high resolution (LLaVA-NeXT) feeds an image twice: a thumbnail (the whole image at the vision
tower's own size, a fixed ``h × w`` grid) and, right after it, a high-resolution grid ``H × W`` of the same
image. Under 1-D RoPE the thumbnail takes ``s … s + h·w − 1`` as usual. ID-Align gives each high-resolution
token the position of the thumbnail token that covers the same spot of the image (nearest neighbour),
so the pair spans only the thumbnail's ``h·w`` positions, and the text after it continues at ``s + h·w``.

Layout convention (ropekit's, written down here because a layout has no "thumbnail" segment): the option
``thumbnail=(h, w)`` names the thumbnail grid (LLaVA-NeXT's base grid, 24×24 for a 336-pixel CLIP tower).
An image of exactly that grid is a thumbnail; any other image is the high-resolution view of the thumbnail
directly before it, which must be there. High-resolution token (r, c) of an ``H × W`` grid inherits from
thumbnail token ``(⌊r·h/H⌋, ⌊c·w/W⌋)`` (PyTorch's ``nearest`` rule, the one the authors' code uses; exact
integer arithmetic here). Without ``thumbnail`` (the default) no image is paired and every token takes the
next index, as 1-D RoPE (LLaVA) does. Videos and other grids are not touched by ID-Align: their tokens take
the next indices in raster order. A 2-D ``Grid`` is read as an image.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence, Union

import numpy as np
import torch

from ..layout import Grid, Image, Layout, Segment, _show
from .registry import BlockTable, _ragged, register, segment_tokens, walk

__all__ = ["id_align", "id_align_blocks", "inherited_index"]

Thumbnail = Optional[Union[Sequence[int], str]]

#: Largest thumbnail side accepted (keeps the index arithmetic inside int64 for every placeable grid).
MAX_SIDE = 2**31 - 1


def _size(value: object) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)) and 1 <= int(value) <= MAX_SIDE:
        return int(value)
    return None


def check_thumbnail(thumbnail: Thumbnail) -> Optional[tuple]:
    """``thumbnail`` as ``(h, w)`` ints >= 1 (None stays None); ``"24x24"`` is read as ``(24, 24)``."""
    if thumbnail is None:
        return None
    if isinstance(thumbnail, str):
        m = re.fullmatch(r"\s*I?(\d+)\s*[xX×]\s*(\d+)\s*", thumbnail, re.ASCII)
        sizes = None if m is None else tuple(_size(int(g)) for g in m.groups())
    else:
        try:
            sizes = tuple(_size(v) for v in thumbnail)
        except TypeError:
            sizes = None
    if sizes is None or len(sizes) != 2 or None in sizes:
        raise ValueError(
            f"id-align: `thumbnail` must be the thumbnail grid (h, w) as two ints in [1, {MAX_SIDE}], e.g. "
            f"thumbnail=(24, 24) (LLaVA-NeXT with a 336-pixel CLIP tower) or the string '24x24', or None to pair "
            f"no image; "
            f"got {_show(thumbnail)}"
        )
    return sizes


def inherited_index(th: int, tw: int, H: np.ndarray, W: np.ndarray, r: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Raster index in a ``th × tw`` thumbnail of the token covering high-resolution token ``(r, c)`` of an
    ``H × W`` grid: ``⌊r·th/H⌋·tw + ⌊c·tw/W⌋`` (int64, element-wise)."""
    return (r * th // H) * tw + (c * tw // W)


def _image_columns(segments: Sequence[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment: whether it is an image (an ``Image`` or a 2-D ``Grid``) and its rows and columns."""
    if isinstance(segments, BlockTable):
        return segments.is_image.numpy(), segments.h.numpy(), segments.w.numpy()
    rows = []
    for s in segments:
        if isinstance(s, Image):
            rows.append((1, s.h, s.w))
        elif isinstance(s, Grid) and len(s.sizes) == 2:
            rows.append((1, s.sizes[0], s.sizes[1]))
        else:
            rows.append((0, 1, 1))
    table = np.array(rows, dtype=np.int64).reshape(len(rows), 3)
    return table[:, 0].astype(bool), table[:, 1], table[:, 2]


def id_align_blocks(segments: Sequence[Segment], thumbnail: Thumbnail = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ID-Align block rule (1 axis): a thumbnail, a video or any unpaired image has token k at offset k and
    advances by its size; a high-resolution image (an image whose grid is not ``thumbnail``) has token (r, c)
    at ``inherited_index(...) − h·w``, the thumbnail's own offset seen from the running start after the
    thumbnail, and advances by 0. The rule sees each block alone: that the thumbnail comes directly before
    is checked by :func:`id_align` (``positions``), not here."""
    thumb = check_thumbnail(thumbnail)
    n = segment_tokens(segments).numpy()
    owner, local = _ragged(n)
    offsets = local.astype(np.float64)
    advance = n.astype(np.float64)
    if thumb is not None and len(n):
        th, tw = thumb
        is_image, h, w = _image_columns(segments)
        high = is_image & ~((h == th) & (w == tw))
        if high.any():
            tok = high[owner]
            H, W = h[owner[tok]], w[owner[tok]]
            k = local[tok]
            offsets[tok] = (inherited_index(th, tw, H, W, k // W, k % W) - th * tw).astype(np.float64)
            advance[high] = 0.0
    return torch.from_numpy(offsets)[:, None], torch.from_numpy(advance)[:, None]


def _check_pairs(layout: Layout, thumb: tuple) -> None:
    """Every high-resolution image must directly follow a thumbnail (one view per thumbnail)."""
    th, tw = thumb
    previous, images = None, 0
    for seg in layout:
        if isinstance(seg, Grid) and len(seg.sizes) == 2:
            seg = Image(*seg.sizes)
        if isinstance(seg, Image):
            images += 1
            if (seg.h, seg.w) != (th, tw):
                if previous != Image(th, tw):
                    after = ("the start of the layout" if previous is None else
                             f"another high-resolution view ({previous}; one view per thumbnail)"
                             if isinstance(previous, Image) else f"segment {previous}")
                    raise ValueError(
                        f"id-align: image {images} ({seg}) is not a thumbnail (thumbnail={th}x{tw}), so it is the "
                        f"high-resolution view of the thumbnail directly before it, but it follows {after}; write each "
                        f"high-resolution grid right after its thumbnail (e.g. 'T2 I{th}x{tw} {seg} T3'), give the "
                        f"thumbnail's grid as `thumbnail`, or leave `thumbnail` unset to pair no image"
                    )
        previous = seg


@register(
    "id-align",
    summary="ID-Align: high-resolution image tokens reuse their thumbnail token's 1-D position (thumbnail=(h, w))",
    allocation="1d",
    aliases=("idalign", "id_align"),
    block_rule=id_align_blocks,
    axes=1,
)
def id_align(layout: Layout, thumbnail: Thumbnail = None) -> torch.Tensor:
    """ID-Align positions ``(L, 1)``.

    ``thumbnail=(h, w)`` (or ``"hxw"``): the thumbnail grid; an image of another grid is the high-resolution
    view of the thumbnail directly before it (a ValueError otherwise) and its tokens take the positions of the
    thumbnail tokens under them (nearest neighbour). Left unset, no image is paired: 1-D RoPE.
    """
    thumb = check_thumbnail(thumbnail)
    if thumb is not None:
        _check_pairs(layout, thumb)
    return walk(layout, id_align_blocks, thumbnail=thumbnail)
