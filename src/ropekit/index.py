"""Batched position ids for Hugging Face-style multimodal inputs, for any ropekit position design.

:func:`rope_index` is a drop-in for the ``get_rope_index`` of transformers' Qwen2-VL / Qwen2.5-VL
models (same arguments, same ``(positions, deltas)`` result), generalised from M-RoPE to every
registered design: each sample's token types are run-length encoded into a :class:`~ropekit.Layout`,
the design places that layout once (equal layouts share the work), and the coordinates are scattered
into the padded batch. :func:`decode_positions` continues a sequence during cached generation.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .designs import positions
from .layout import IMAGE, TEXT, VIDEO, Image, Layout, Text, Video

__all__ = ["rope_index", "decode_positions"]

GridLike = Union[torch.Tensor, Sequence[Sequence[int]]]


def _check_2d(x: object, name: str, shape: Optional[tuple] = None) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"rope_index: `{name}` must be a torch.Tensor of shape (batch, seq_len), got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"rope_index: `{name}` must have shape (batch, seq_len), got {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != shape:
        raise ValueError(
            f"rope_index: `{name}` has shape {tuple(x.shape)} but `mm_token_type_ids` has {shape}; "
            f"give one entry per token of the padded batch"
        )
    if x.is_floating_point() and torch.isnan(x).any():
        raise ValueError(f"rope_index: `{name}` contains NaN")
    return x


def _token_grids(grid: Optional[GridLike], name: str, merge: int) -> Optional[torch.Tensor]:
    """Validate a ``(n, 3)`` patch grid and return the token grid ``(t, h/merge, w/merge)`` as int64."""
    if grid is None:
        return None
    g = torch.as_tensor(grid)
    if g.ndim == 1 and g.numel() == 3:
        g = g[None]
    if g.ndim != 2 or g.shape[1] != 3:
        raise ValueError(f"rope_index: `{name}` must have shape (num_items, 3) holding (t, h, w), got {tuple(g.shape)}")
    if g.is_floating_point():
        if not torch.isfinite(g).all():
            raise ValueError(f"rope_index: `{name}` contains NaN or inf; grids are whole patch counts (t, h, w)")
        if not (g == g.round()).all():
            raise ValueError(f"rope_index: `{name}` must hold whole patch counts, got {g.tolist()}")
    g = g.to(torch.int64).cpu()
    if (g < 1).any():
        raise ValueError(f"rope_index: `{name}` entries must be >= 1 (an empty or negative grid has no tokens), got {g.tolist()}")
    if ((g[:, 1:] % merge) != 0).any():
        bad = g[((g[:, 1:] % merge) != 0).any(dim=1)][0].tolist()
        raise ValueError(
            f"rope_index: `{name}` has a grid {bad} whose h or w is not divisible by spatial_merge_size={merge}; "
            f"grids are patch grids before merging"
        )
    return torch.cat([g[:, :1], g[:, 1:] // merge], dim=1)


def _intervals(num_videos: int, second_per_grid_ts, tokens_per_second) -> list[float]:
    """Δt per video: ``tokens_per_second · second_per_grid_ts[v]`` (Qwen2.5-VL) or 1 (Qwen2-VL)."""
    if tokens_per_second is not None:
        tps = torch.as_tensor(tokens_per_second)
        if tps.numel() != 1 or not torch.isfinite(tps.double()).all() or float(tps) <= 0:
            raise ValueError(f"rope_index: `tokens_per_second` must be a finite number > 0, got {tokens_per_second!r}")
    if second_per_grid_ts is None:
        return [float(tokens_per_second) if tokens_per_second is not None else 1.0] * num_videos
    if tokens_per_second is None:
        raise ValueError(
            "rope_index: `second_per_grid_ts` needs `tokens_per_second` "
            "(Qwen2.5-VL: config.vision_config.tokens_per_second)"
        )
    s = torch.as_tensor(second_per_grid_ts).reshape(-1)
    if s.numel() != num_videos:
        raise ValueError(
            f"rope_index: `second_per_grid_ts` has {s.numel()} entries but `video_grid_thw` has {num_videos} videos; "
            f"give one per video"
        )
    if not torch.isfinite(s.double()).all() or (s < 0).any():
        raise ValueError(f"rope_index: `second_per_grid_ts` must be finite and >= 0, got {s.tolist()}")
    # same arithmetic (and dtype) as transformers: number times the tensor element
    return [float(tokens_per_second * s[v]) for v in range(num_videos)]


def _assign(run_len: torch.Tensor, grids: Optional[torch.Tensor], name: str, kind: str) -> list[list[int]]:
    """Split the runs of one modality into whole grids (in order); returns the grid indices of each run."""
    if run_len.numel() == 0:
        if grids is not None and grids.shape[0]:
            raise ValueError(
                f"rope_index: `{name}` describes {grids.shape[0]} {kind}(s) but `mm_token_type_ids` "
                f"holds no {kind} tokens (after the attention mask)"
            )
        return []
    if grids is None or grids.shape[0] == 0:
        raise ValueError(f"rope_index: `mm_token_type_ids` holds {kind} tokens but `{name}` is missing; pass the grids")
    tokens = grids.prod(dim=1)
    cum_g, cum_r = tokens.cumsum(0), run_len.cumsum(0)
    if int(cum_g[-1]) != int(cum_r[-1]):
        raise ValueError(
            f"rope_index: `{name}` describes {int(cum_g[-1])} {kind} tokens (t·h·w / merge² per grid: "
            f"{tokens.tolist()}) but `mm_token_type_ids` holds {int(cum_r[-1])}; the grids must match the tokens"
        )
    if not torch.isin(cum_r, cum_g).all():
        raise ValueError(
            f"rope_index: the runs of {kind} tokens in `mm_token_type_ids` (lengths {run_len.tolist()}) do not split "
            f"into whole {kind}s of `{name}` (tokens per {kind}: {tokens.tolist()})"
        )
    owner = torch.searchsorted(cum_r, cum_g).tolist()
    out: list[list[int]] = [[] for _ in range(run_len.numel())]
    for k, r in enumerate(owner):
        out[r].append(k)
    return out


def rope_index(
    input_ids: Optional[torch.Tensor],
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: Optional[GridLike] = None,
    video_grid_thw: Optional[GridLike] = None,
    attention_mask: Optional[torch.Tensor] = None,
    *,
    design: str = "mrope",
    spatial_merge_size: int = 2,
    second_per_grid_ts: Optional[Union[torch.Tensor, Sequence[float]]] = None,
    tokens_per_second: Optional[float] = None,
    per_axis_deltas: bool = False,
    **design_options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``(A, B, L)`` float32 and deltas of a padded multimodal batch under ``design``.

    Arguments follow transformers' Qwen2-VL ``get_rope_index``: ``mm_token_type_ids`` marks text 0,
    image 1, video 2; ``image_grid_thw``/``video_grid_thw`` are patch grids ``(t, h, w)``, one row per
    image/video in batch order, whose h and w are divided by ``spatial_merge_size``; videos get the
    temporal interval ``tokens_per_second · second_per_grid_ts[v]`` (Qwen2.5-VL) or 1. Left or right
    padding is given by ``attention_mask``; padded positions are 0 (as transformers 5.x). Consecutive
    images with no text between them are split by their grids.

    ``deltas`` is ``max position + 1 − number of valid tokens`` per sample, shape ``(B, 1)``
    (transformers' ``rope_deltas``), so decoding continues at ``cache_length + delta``. Designs whose
    text leaves the diagonal (``compact``) need ``per_axis_deltas=True``: deltas ``(B, A)`` from each
    axis' own max, which makes cached decoding match a full pass exactly.
    """
    types = _check_2d(mm_token_type_ids, "mm_token_type_ids")
    if types.is_floating_point():
        raise TypeError("rope_index: `mm_token_type_ids` must be an integer tensor (text 0, image 1, video 2)")
    shape = tuple(types.shape)
    device = input_ids.device if isinstance(input_ids, torch.Tensor) else types.device
    if input_ids is not None:
        _check_2d(input_ids, "input_ids", shape)
    if isinstance(spatial_merge_size, bool) or not isinstance(spatial_merge_size, int) or spatial_merge_size < 1:
        raise ValueError(f"rope_index: `spatial_merge_size` must be an int >= 1, got {spatial_merge_size!r}")
    types = types.to("cpu", torch.int64)
    if ((types < TEXT) | (types > VIDEO)).any():
        raise ValueError(
            f"rope_index: `mm_token_type_ids` values must be 0 (text), 1 (image) or 2 (video), "
            f"got {sorted(set(types.unique().tolist()))}"
        )
    if attention_mask is None:
        valid = torch.ones(shape, dtype=torch.bool)
    else:
        mask = _check_2d(attention_mask, "attention_mask", shape).cpu()
        if ((mask != 0) & (mask != 1)).any():
            raise ValueError("rope_index: `attention_mask` must hold only 0 (padding) and 1 (token)")
        valid = mask.bool()
    images = _token_grids(image_grid_thw, "image_grid_thw", spatial_merge_size)
    videos = _token_grids(video_grid_thw, "video_grid_thw", spatial_merge_size)
    intervals = _intervals(0 if videos is None else videos.shape[0], second_per_grid_ts, tokens_per_second)

    # run-length encode (sample, token type) over the valid tokens, sample-major
    batch = shape[0]
    counts = valid.sum(dim=1)
    sample = torch.arange(batch).repeat_interleave(counts)
    keys, run_len = torch.unique_consecutive(sample * 3 + types[valid], return_counts=True)
    run_sample, run_type = (keys // 3).tolist(), (keys % 3).tolist()
    is_img, is_vid = (keys % 3) == IMAGE, (keys % 3) == VIDEO
    img_of_run = iter(_assign(run_len[is_img], images, "image_grid_thw", "image"))
    vid_of_run = iter(_assign(run_len[is_vid], videos, "video_grid_thw", "video"))

    segments: list[list] = [[] for _ in range(batch)]
    for b, kind, n in zip(run_sample, run_type, run_len.tolist()):
        if kind == TEXT:
            segments[b].append(Text(n))
        elif kind == IMAGE:
            for k in next(img_of_run):
                t, h, w = images[k].tolist()
                segments[b].append(Image(h, w) if t == 1 else Video(t, h, w, 1.0))
        else:
            for k in next(vid_of_run):
                t, h, w = videos[k].tolist()
                segments[b].append(Video(t, h, w, intervals[k]))

    cache: dict[Layout, tuple[torch.Tensor, torch.Tensor]] = {}
    placed, deltas, num_axes = [], [], None
    for b in range(batch):
        if not segments[b]:
            deltas.append(None)
            continue
        lay = Layout(segments[b])
        if lay not in cache:
            pos = positions(lay, design, **design_options)
            top = pos.double().amax(dim=0) if per_axis_deltas else pos.double().max().reshape(1)
            cache[lay] = (pos, top + 1.0)
        pos, nxt = cache[lay]
        num_axes = pos.shape[1] if num_axes is None else num_axes
        placed.append(pos)
        deltas.append(nxt - lay.num_tokens)
    if num_axes is None:  # nothing valid anywhere: ask the design for its number of axes
        num_axes = positions("T1", design, **design_options).shape[1]

    out = torch.zeros(batch, shape[1], num_axes, dtype=torch.float32)
    if placed:
        out[valid] = torch.cat(placed)
    width = num_axes if per_axis_deltas else 1
    zero = torch.zeros(width, dtype=torch.float64)
    delta = torch.stack([zero if d is None else d for d in deltas]).to(torch.float32)
    return out.permute(2, 0, 1).contiguous().to(device), delta.to(device)


def decode_positions(
    deltas: torch.Tensor,
    past_length: int,
    num_new: int,
    num_axes: int,
    attention_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Positions ``(num_axes, B, num_new)`` of the next ``num_new`` tokens during cached decoding.

    Each new token sits at its 1-D cache index plus the sample's delta from :func:`rope_index`, the
    rule of transformers' Qwen2-VL ``compute_3d_position_ids``. Without ``attention_mask`` the index
    is ``past_length + k``; with it (shape ``(B, past_length + num_new)``, needed for left-padded
    batches) it counts the valid tokens before, and padded new tokens get the bare delta.
    """
    if not isinstance(deltas, torch.Tensor) or deltas.ndim != 2:
        raise ValueError("decode_positions: `deltas` must be the (B, 1) or (B, A) tensor returned by rope_index")
    for name, v in (("past_length", past_length), ("num_new", num_new), ("num_axes", num_axes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name != "past_length" else 0):
            raise ValueError(f"decode_positions: `{name}` must be an int >= {0 if name == 'past_length' else 1}, got {v!r}")
    if deltas.shape[1] not in (1, num_axes):
        raise ValueError(
            f"decode_positions: `deltas` has {deltas.shape[1]} columns; expected 1 or num_axes={num_axes}"
        )
    d = deltas.to(torch.float32).T[:, :, None]  # (1 or A, B, 1)
    if attention_mask is None:
        idx = torch.arange(past_length, past_length + num_new, device=deltas.device, dtype=torch.float32)
        idx = idx.expand(deltas.shape[0], num_new)
    else:
        want = (deltas.shape[0], past_length + num_new)
        if attention_mask.ndim != 2 or tuple(attention_mask.shape) != want:
            raise ValueError(
                f"decode_positions: `attention_mask` must have shape (B, past_length + num_new) = {want}, "
                f"got {tuple(attention_mask.shape)}"
            )
        keep = attention_mask.to(deltas.device) != 0
        idx = (keep.long().cumsum(-1) - 1).masked_fill(~keep, 0)[:, -num_new:].to(torch.float32)
    return (idx[None] + d).expand(num_axes, -1, -1).contiguous()
