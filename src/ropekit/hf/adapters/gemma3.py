"""Gemma 3 (``gemma3``): a SigLIP tower whose patch grid is average-pooled to ``mm_tokens_per_image`` tokens, in a
Gemma 3 language model with two rotary tables.

Images: the tower's ``(image_size / patch_size)²`` patch features are average-pooled (kernel = stride = patches per
side // ``int(√mm_tokens_per_image)``) to an ``s × s`` grid, ``s = patches per side // kernel`` (16 on the released
checkpoints: 64 patches, 256 tokens), read row by row. The processor writes each image (and each pan-and-scan crop,
which is an image of its own) as ``<start_of_image>``, ``s²`` image tokens, ``<end_of_image>``; the begin/end tokens
are text.

Attention: the model lets the tokens of one image attend to each other both ways (a block mask built from
``token_type_ids``, 1 on image tokens). The patch hands ``token_type_ids`` on unread and changes no mask.

Rotation: global layers (``full_attention``) and sliding-window layers (``sliding_attention``) rotate with their own
``rope_parameters`` (bases 1e6 and 1e4 in the released checkpoints, the global ones with linear scaling on the
larger models). The text model calls its rotary once per layer type with ``layer_type``; the patch builds every
design's tables once per layer type, from that type's parameters, at the same positions.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from .llava import GridLlava


class Gemma3(GridLlava):
    model_type = "gemma3"
    name = "Gemma 3"
    forward_params = frozenset({"token_type_ids"})
    rotary_params = frozenset({"layer_type"})
    masks_in_forward = True

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        """Tokens per side of an image's pooled grid, as the model's projector computes it: ``int(√n)`` tokens per
        side for ``n = mm_tokens_per_image``, a pooling kernel of ``patches // that`` and so ``patches // kernel``
        pooled tokens per side. A ``mm_tokens_per_image`` that is no square gives the model fewer features than
        ``n`` (its processor writes ``n`` image tokens: the stock model then refuses the input itself); the patch
        places the grid the model really produces. Refuses only a config the model cannot pool at all."""
        vcfg = config.vision_config
        patches = int(vcfg.image_size // vcfg.patch_size)
        wanted = int(config.mm_tokens_per_image ** 0.5)
        kernel = patches // wanted if wanted >= 1 else 0
        if kernel < 1:
            raise ValueError(
                f"patch_model: Gemma 3 with mm_tokens_per_image={config.mm_tokens_per_image} and {patches} patches per "
                f"side cannot pool its patches: the projector's kernel, patches per side // int(sqrt(mm_tokens_per_"
                f"image)) = {patches} // {wanted}, is below 1 (the stock model cannot build its pooling either)"
            )
        return patches // kernel

    def rope_variants(self, text: nn.Module) -> Optional[tuple[dict[str, dict], list[str]]]:
        cfg = text.config
        rope, types = getattr(cfg, "rope_parameters", None) or {}, list(getattr(cfg, "layer_types", None) or [])
        if not types or not all(isinstance(rope.get(t), dict) for t in types):
            raise ValueError(
                f"patch_model: {self.name}'s language model config must give rope_parameters per layer type "
                f"({sorted(set(types))}), got {rope!r}"
            )
        return {t: rope[t] for t in dict.fromkeys(types)}, types
