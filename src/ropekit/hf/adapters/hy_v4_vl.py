"""HY-V4-VL (``hy_v4_vl``; Tencent Hy4): a HunYuan-VL vision tower whose merger ends every merged row with a newline
token, in a HY-V4 decoder (multi-head latent attention with a sparse top-k indexer, hyper-connections, MoE).

Positions: ``HYV4VLModel.get_rope_index`` places a block at ``s`` as ``T`` frames of ``H`` rows by ``W + 1`` columns
(the newline last in each row): frame ``f``, row ``i``, column ``j`` at ``(s + fB, s + fB + i, s + fB + j)`` with
``B = max(H, W + 1)``, and the text after it from the largest position + 1. That is each frame a grid of its own,
one merged column wider (the newline as its last column), the frames one after another with Qwen's spatial
continuation between them: ropekit's ``mrope`` with ``continuation="spatial"`` over ``(1, H, W + 1)`` grids, one per
frame (:attr:`~.base.Adapter.newline_column`, :func:`~.base.split_frames`). Text is on the diagonal, images and
videos carry distinct token ids.

Rotation: Qwen3-VL's interleaved ``mrope_section`` (default ``[12, 10, 10]``) over the ``qk_rope_head_dim`` channels
of each head; the rotary returns rotate-half tables, which the attention folds into neighbouring-channel pairs
(pair ``j`` on channels ``2j``, ``2j + 1``) itself, so the patch hands it rotate-half tables too. The decoder layers'
``prev_topk_indices`` (the indexer's choice handed to the next layer) are passed on unread.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from .base import split_frames
from .qwen3_vl import Qwen3VL


class HYV4VL(Qwen3VL):
    model_type = "hy_v4_vl"
    default_sections = (12, 10, 10)
    text_params = frozenset()  # no DeepStack features
    layer_params = frozenset({"prev_topk_indices"})
    newline_column = True

    def rotary_dim(self, text: nn.Module) -> int:
        return int(text.config.qk_rope_head_dim)

    def video_grids(self, video_grid_thw: Any, temporal_merge: int = 1) -> Any:
        return split_frames(video_grid_thw)
