"""Janus (``janus``, Janus-Pro): one SigLIP-style patch grid per image in a Llama language model, for image
understanding; the same language model also generates images as VQ codes.

How the model fills the tokens (``JanusModel.get_image_features``): the tower's ``(image_size / patch_size)²`` patch
features (no CLS token), row by row, through the aligner MLP: one image is an ``s × s`` grid, ``s = image_size /
patch_size`` (24 × 24 = ``num_image_tokens`` 576 in the released models). The processor writes
``<begin_of_image>``, the ``s²`` image tokens, ``<end_of_image>``. ropekit places every image as one ``s × s``
block; the markers are text.

Image generation (``generate(generation_mode="image")``) runs the language model directly on the VQ codes'
embeddings, one code after another, with no image token ids and no grid: the patch sees a text sequence there, so
every design places the prompt and the generated codes as text (``vanilla`` gives the stock model).
"""
from __future__ import annotations

from typing import Any, Optional

from .llava import GridLlava


class Janus(GridLlava):
    model_type = "janus"

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        vcfg = config.vision_config
        size, patch = vcfg.image_size, vcfg.patch_size
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        patch = tuple(patch) if isinstance(patch, (list, tuple)) else (patch, patch)
        if size[0] != size[1] or patch[0] != patch[1] or size[0] % patch[0]:
            raise ValueError(
                f"patch_model: Janus needs square images of whole patches (its processor makes them); got vision "
                f"image_size {list(size)} and patch_size {list(patch)}"
            )
        return size[0] // patch[0]
