"""Cohere Compass (``cohere_compass``; North-Vision): Qwen3-VL's model on a Cohere 2 decoder.

Positions: ``CohereCompassModel`` is ``Qwen3VLModel`` (its ``get_rope_index`` and ``compute_3d_position_ids``
unchanged): one ``(1, h, w)`` block per video frame, DeepStack features handed to the text model.

Rotation: the text model keeps ``rope_parameters`` per layer type (``sliding_attention``, ``full_attention``), a
type whose parameters are None taking no positions at all (NoPE: its layers get no cos/sin). Its rotary is called
once per type with ``layer_type`` and lays out Qwen3-VL's interleaved ``mrope_section`` (default ``[24, 20, 20]``)
over the whole head with rotate-half tables. The patch builds every design's tables per rotary layer type from that
type's parameters; the sections must agree across types (one position tensor serves every layer).

Before transformers 5.21 the rotary pre-permuted its frequencies (``mrope_section`` read as ``[h, w, t]``: height on
the even-indexed frequencies, width on the odd ones, laid out as two blocks, time on the lowest), a layout the
adapter does not place; those releases are refused.
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from .base import rotate_half_layout
from .qwen3_vl import Qwen3VL


class CohereCompass(Qwen3VL):
    model_type = "cohere_compass"
    rotary_params = frozenset({"layer_type"})
    oldest_transformers = ("5.21.0", "before 5.21 its rotary pre-permuted the frequencies (height on the even ones, "
                           "width on the odd ones, in two blocks; time on the lowest), a layout the adapter does "
                           "not place")

    def table_layout(self, text: nn.Module) -> str:
        return rotate_half_layout(text)

    def rope_variants(self, text: nn.Module) -> Optional[tuple[dict[str, dict], list[str]]]:
        cfg = text.config
        rope, types = getattr(cfg, "rope_parameters", None) or {}, list(getattr(cfg, "layer_types", None) or [])
        if not types or any(t not in rope or not (rope[t] is None or isinstance(rope[t], dict)) for t in types):
            raise ValueError(
                f"patch_model: Cohere Compass's language model config must give rope_parameters per layer type "
                f"({sorted(set(types))}; None for a layer type without positions), got {rope!r}"
            )
        rotary = [t for t in types if rope[t] is not None]
        if not rotary:
            raise ValueError(
                "patch_model: this Cohere Compass language model rotates no layer (rope_parameters is None for every "
                "layer type): it takes no positions, so there is nothing to patch"
            )
        tables = {t: rope[t] for t in dict.fromkeys(rotary)}
        sections = {t: list(p.get("mrope_section") or self.default_sections) for t, p in tables.items()}
        if len({tuple(s) for s in sections.values()}) > 1:
            raise ValueError(
                f"patch_model: Cohere Compass's layer types give different mrope_section ({sections}); ropekit places "
                f"one position tensor with one split of the frequencies for every layer"
            )
        return tables, rotary
