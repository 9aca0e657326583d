"""Cohere Compass (``cohere_compass``; North-Vision): Qwen3-VL's model on a Cohere 2 decoder.

Positions: ``CohereCompassModel`` is ``Qwen3VLModel`` (its ``get_rope_index`` and ``compute_3d_position_ids``
unchanged): one ``(1, h, w)`` block per video frame, DeepStack features handed to the text model.

Rotation: the text model keeps ``rope_parameters`` per layer type (``sliding_attention``, ``full_attention``), a
type whose parameters are None taking no positions at all (NoPE: its layers get no cos/sin). Its rotary is called
once per type with ``layer_type`` and lays out Qwen3-VL's interleaved ``mrope_section`` (default ``[24, 20, 20]``)
over the whole head with rotate-half tables. The patch builds every design's tables per rotary layer type from that
type's parameters; the sections must agree across types (one position tensor serves every layer).

Before transformers 5.21 the rotary pre-permuted its frequencies: ``mrope_section`` (default ``[22, 22, 20]``) is read
as ``[h, w, t]``, the ``h + w`` highest frequencies are laid out even-indexed first, then odd-indexed, the first ``h``
of that order turn with height, the next ``w`` with width, and the ``t`` lowest frequencies with time. On those
releases the family's native layout is ropekit's ``"compass-prerotated"`` allocation with sections ``[t, h, w]``
(its other rope types were not pre-permuted: refused). A checkpoint records the allocation it was patched with, so
it restores the tables it was trained with on either side of 5.21.
"""
from __future__ import annotations

from typing import Optional

from torch import nn

from .. import boundary
from .base import rotate_half_layout
from .qwen3_vl import Qwen3VL

#: the first transformers release whose Compass rotary interleaves ``mrope_section`` as Qwen3-VL does
INTERLEAVED_FROM = "5.21.0"


def prerotated() -> bool:
    """Whether the installed transformers builds Compass's pre-permuted rotary (releases before 5.21)."""
    version = boundary.transformers_version()
    return not version.startswith("<") and boundary._release(version) < boundary._release(INTERLEAVED_FROM)


class CohereCompass(Qwen3VL):
    model_type = "cohere_compass"
    rotary_params = frozenset({"layer_type"})

    @property
    def native_allocation(self) -> str:
        return "compass-prerotated" if prerotated() else "interleaved"

    @property
    def default_sections(self) -> tuple[int, ...]:
        return (22, 22, 20) if prerotated() else (24, 20, 20)

    #: the native layouts of the releases in the tested range (a checkpoint restores the one it was patched with)
    native_layouts = ("interleaved", "compass-prerotated")

    def check_layout(self, native: str, tables: dict) -> None:
        kinds = {t: (p or {}).get("rope_type", "default") for t, p in tables.items()}
        if native == "compass-prerotated" and set(kinds.values()) != {"default"}:
            raise ValueError(
                f"patch_model: Cohere Compass's pre-permuted layout (its rotary before transformers "
                f"{INTERLEAVED_FROM}, 'compass-prerotated') is built for 'default' rope tables only: that rotary "
                f"pre-permutes the frequencies of 'default' rope tables only and lays out the others unpermuted, "
                f"height first ({kinds}), a layout ropekit does not build; use rope_type 'default', a design that does "
                f"not take the family's layout (e.g. 'vanilla'), or transformers >= {INTERLEAVED_FROM}, whose rotary "
                f"treats every rope type alike"
            )

    def sections(self, rope: dict, half: int) -> list[int]:
        if not prerotated():
            return super().sections(rope, half)
        given = list(rope.get("mrope_section") or self.default_sections)
        if len(given) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in given) or sum(
                given) != half:
            raise ValueError(
                f"patch_model: Cohere Compass's `mrope_section` must be 3 non-negative ints (height, width, time) "
                f"summing to the head's {half} frequency pairs (transformers {boundary.transformers_version()} "
                f"splits them so), got {given!r}"
            )
        h, w, t = given
        return [t, h, w]

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
