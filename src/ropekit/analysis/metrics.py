"""Position-space metrics: Per-Token Distance (Circle-RoPE eq. 1) and text→video attention-bias maps."""
from __future__ import annotations

import torch

from ..layout import AUDIO, GRID, IMAGE, TEXT, VIDEO, Image, Layout, Video, VideoAudio
from ..rope import design_frequencies
from ..designs.registry import positions
from .kernel import kernel_between

__all__ = ["ptd", "layout_ptd", "block_ptd", "vision_blocks", "attention_bias_map", "frame_bias", "boundary_continuity"]


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
    """PTD between all text tokens and all image/video tokens of a layout under a design (audio tokens are
    neither: they take no part)."""
    lay = Layout.coerce(layout)
    kinds = lay.token_types()
    vision = (kinds != TEXT) & (kinds != AUDIO)
    if not (kinds == TEXT).any() or not vision.any():
        raise ValueError(f"layout {lay} needs both text and vision tokens to measure PTD")
    c = positions(lay, design, **options)
    return ptd(c[kinds == TEXT], c[vision])


def _first_block(lay: Layout):
    """``(start index, segment)`` of the first image or video of ``lay``."""
    start = 0
    for seg in lay:
        if isinstance(seg, (Image, Video)):
            return start, seg
        start += seg.num_tokens
    raise ValueError(f"layout {lay} has no image or video block to map")


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
    ``"before"`` over those preceding it, ``"all"`` over every text token. Isotropic q = k: the kernel is
    ``E[q·R(Δ)q] / E[q·q]`` (see :mod:`ropekit.analysis.kernel`).
    """
    lay = Layout.coerce(layout)
    if query not in ("after", "before", "all"):
        raise ValueError(f"`query` must be 'after', 'before' or 'all', got {query!r}")
    start, block = _first_block(lay)
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


# ------------------------------------------------------------------------ per-block PTD and frame bias


def vision_blocks(layout: "Layout | str") -> list[tuple[str, torch.Tensor]]:
    """``(label, token indices)`` of every vision block: each image, each frame of each video, each grid. A
    video with its audio interleaved (``VideoAudio``) gives its frames' video tokens, wherever its order puts them.

    Labels number images and videos separately in layout order: ``"image 1 (I3x3)"``,
    ``"video 1 frame 0 (V3x3x3)"``.
    """
    lay = Layout.coerce(layout)
    out, start, count = [], 0, {}
    for seg in lay:
        n = seg.num_tokens
        if seg.kind not in (TEXT, AUDIO):
            kind = {IMAGE: "image", VIDEO: "video", GRID: "grid"}[seg.kind]
            count[kind] = count.get(kind, 0) + 1
            if isinstance(seg, VideoAudio):  # each frame's video tokens, where the segment's order puts them
                is_audio, index, _ = seg.interleave()
                slots = torch.nonzero(~is_audio).flatten() + start + 2  # after the two start markers
                frame = index[~is_audio] // (seg.h * seg.w)
                for f in range(seg.t):
                    out.append((f"{kind} {count[kind]} frame {f} ({seg})", slots[frame == f]))
            elif isinstance(seg, Video):
                per = seg.h * seg.w
                for f in range(seg.t):
                    idx = torch.arange(start + f * per, start + (f + 1) * per)
                    out.append((f"{kind} {count[kind]} frame {f} ({seg})", idx))
            else:
                out.append((f"{kind} {count[kind]} ({seg})", torch.arange(start, start + n)))
        start += n
    return out


def block_ptd(layout: "Layout | str", design: str, **options) -> dict[str, float]:
    """PTD between all text tokens and each vision block on its own (every image, every video frame).

    ``{label: ptd}`` in layout order, labels from :func:`vision_blocks`. A design can be equidistant per
    block (Circle-RoPE puts each image, and each frame, on its own ring) and still not over the whole
    sequence, where :func:`layout_ptd` also counts the distances *between* blocks.
    """
    lay = Layout.coerce(layout)
    kinds = lay.token_types()
    text = kinds == TEXT
    blocks = vision_blocks(lay)
    if not text.any() or not blocks:
        raise ValueError(f"layout {lay} needs both text and vision tokens to measure PTD")
    c = positions(lay, design, **options)
    return {label: ptd(c[text], c[idx]) for label, idx in blocks}


def frame_bias(layout: "Layout | str", design: str, **kwargs) -> dict:
    """Positional bias of the expected kernel from text queries to a video, split as the VRoPE paper does.

    Takes :func:`attention_bias_map`'s arguments. ``within_frame`` is the spread (max − min) of the
    kernel over the tokens of one frame, averaged over frames: VRoPE's "positional attention bias", an
    uneven focus on some regions of every frame. ``across_frames`` is the spread of the per-frame means:
    the decay from the frames nearest to the query to the farthest, which a text query also has over
    earlier text and which the paper does not count as a spatial bias. ``flip_asymmetry`` is the largest
    change of the map when every frame is rotated by 180° (0 = symmetric within frames).
    """
    m = attention_bias_map(layout, design, **kwargs)
    per_frame = m.amax(dim=(1, 2)) - m.amin(dim=(1, 2))
    means = m.mean(dim=(1, 2))
    return {"within_frame": float(per_frame.mean()), "within_frame_per_frame": per_frame.tolist(),
            "across_frames": float(means.max() - means.min()), "overall": float(m.max() - m.min()),
            "flip_asymmetry": float((m - m.flip(-1).flip(-2)).abs().max())}


def boundary_continuity(
    layout: "Layout | str", design: str, *, head_dim: int = 128, base: float = 10000.0,
    allocation: str | None = None, **options,
) -> dict:
    """How smoothly the text after the first image/video continues it (VRoPE's video→text transition).

    ``index_jump``: the largest, over axes, of the first text token's coordinate minus the block's largest
    coordinate on that axis: the paper's notion (text "offset by the maximum position value"); 1 = the
    text continues every axis by one step, as text continues text. ``gap``: Euclidean distance from the first text token after the block to the nearest token of the
    block; ``text_step``: distance between that text token and the next; ``jump = gap / text_step``
    (1 = the text continues the block as text continues text; larger = a jump in position space).
    ``kernel_gap`` / ``kernel_step``: the expected kernel across the same two steps (isotropic q).
    Needs at least two text tokens right after the block.
    """
    lay = Layout.coerce(layout)
    start, block = _first_block(lay)
    first = start + block.num_tokens
    kinds = lay.token_types()
    if first + 1 >= lay.num_tokens or not bool((kinds[first : first + 2] == TEXT).all()):
        raise ValueError(f"layout {lay} needs at least two text tokens right after its first image/video "
                         "to measure the video→text transition, e.g. 'T4 V4x6x6 T4'")
    c = positions(lay, design, **options).to(torch.float64)
    W = design_frequencies(design, head_dim, c.shape[1], allocation=allocation, base=base)
    vis = c[start:first]
    d = (vis - c[first]).norm(dim=-1)
    near = int(d.argmin())
    step = float((c[first + 1] - c[first]).norm())
    k_gap = kernel_between(c[first : first + 1], vis[near : near + 1], W)
    k_step = kernel_between(c[first : first + 1], c[first + 1 : first + 2], W)
    index_jump = float((c[first] - vis.amax(dim=0)).max())
    return {"index_jump": index_jump, "gap": float(d[near]), "text_step": step, "jump": float(d[near]) / step,
            "kernel_gap": float(k_gap), "kernel_step": float(k_step)}
