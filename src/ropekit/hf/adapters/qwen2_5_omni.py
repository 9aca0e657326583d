"""Qwen2.5-Omni's thinker (``qwen2_5_omni_thinker``): TMRoPE over text, images, videos and audio.

Positions: transformers' ``get_rope_index`` of the family is the ``tmrope`` design (``temporal_rounding="floor"``):
M-RoPE whose video time is ``(f · seconds_per_grid) · position_id_per_seconds`` truncated, text after a block at its
largest coordinate + 1, and audio (between its start and end tokens, which are text) one position per token, as
text. Token types come from the ids: image and video tokens are vision, audio tokens are text to the design (every
registered design places audio as a text run), so the patch needs no ``mm_token_type_ids``, which the family does
not take. The family's own position arguments: ``video_second_per_grid`` / ``second_per_grids`` (each video's
seconds per temporal grid, taken as float32 as transformers takes them), ``audio_feature_lengths`` /
``audio_seqlens`` (not needed: the audio tokens are in the ids) and ``use_audio_in_video``: when true, a video's
audio track is interleaved with its frames in chunks of ``position_id_per_seconds · seconds_per_chunk`` positions
(:meth:`interleave`); the patch then types the audio tokens from the ids and places each sample's layout, where
such a block is a ``VideoAudio`` segment, with ``ropekit.positions`` (``rope_index`` takes no audio type).

Rotation: Qwen2-VL's chunked ``mrope_section`` over the full head.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .base import Adapter

_SECONDS = ("video_second_per_grid", "second_per_grids")  # forward / generate kwargs, get_rope_index
_AUDIO_LENGTHS = ("audio_feature_lengths", "audio_seqlens")


class Qwen2_5OmniThinker(Adapter):
    model_type = "qwen2_5_omni_thinker"
    takes_token_types = False
    forward_params = frozenset({"input_features", "feature_attention_mask", "audio_feature_lengths",
                                "use_audio_in_video", "video_second_per_grid"})
    position_params = frozenset({"use_audio_in_video", *_AUDIO_LENGTHS, *_SECONDS})

    def parts(self, model: nn.Module) -> tuple[Optional[nn.Module], nn.Module, nn.Module]:
        """Before transformers 5.21 the thinker was itself the bare model: the position code (``get_rope_index``,
        ``compute_3d_position_ids``, ``rope_deltas``) sat on the generation class and the text model at
        ``thinker.model``. From 5.21 ``thinker.model`` is the bare model, its text model at ``language_model``."""
        if hasattr(model, "lm_head") and hasattr(model, "compute_3d_position_ids"):
            return model, model, getattr(model, "model", None)
        return super().parts(model)

    def stock_design(self) -> tuple[str, dict]:
        return "tmrope", {}  # video time truncated, as the family's get_rope_index does

    def time_rate(self, config: Any) -> Optional[float]:
        """The thinker config's ``position_id_per_seconds`` (25): temporal positions per second."""
        return float(getattr(config, "position_id_per_seconds", 25))

    def interleave(self, config: Any) -> Optional[tuple]:
        """Chunks of ``position_id_per_seconds · seconds_per_chunk`` positions (25 · 2 = 50)."""
        rate = float(getattr(config, "position_id_per_seconds", 25))
        return "chunks", int(rate * float(getattr(config, "seconds_per_chunk", 2)))

    def position_arguments(self, given: dict) -> dict:
        out = {k: v for k, v in given.items() if k not in self.position_params}
        out["audio_in_video"] = bool(given.get("use_audio_in_video"))
        images = given.get("image_grid_thw")
        if images is not None and bool((torch.as_tensor(images)[..., 0] != 1).any()):
            raise ValueError(
                f"patched model: {self.model_type} got an image grid of more than one temporal patch "
                f"(image_grid_thw[:, 0] > 1); the stock model places such frames position_id_per_seconds apart "
                f"and ropekit's images have one frame. Give them as a video (video_grid_thw with its "
                f"video_second_per_grid); the processor makes single-frame image grids"
            )
        seconds = next((given[k] for k in _SECONDS if given.get(k) is not None), None)
        if seconds is not None:
            # transformers takes each video's seconds as float32 and forms (f · seconds) · rate in float32; given
            # in float64, rope_index's Δt = rate · seconds is exact and tmrope reads the float32 seconds back
            seconds = torch.as_tensor(seconds).detach().cpu().float().double().reshape(-1)
        elif given.get("video_grid_thw") is not None:
            raise ValueError(
                f"patched model: {self.model_type} got video_grid_thw without video_second_per_grid; its position "
                f"code needs each video's seconds per temporal grid (the processor returns video_second_per_grid)"
            )
        out["second_per_grid_ts"] = seconds
        return out

