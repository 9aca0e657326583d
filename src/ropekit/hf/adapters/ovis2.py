"""Ovis2 (``ovis2``): image tiles of a ViT tower whose merged patch windows become probabilistic visual words (a soft
lookup in a visual embedding table), in a 1-D language model (Qwen2).

How the model fills the tokens (``Ovis2VisionModel``): every tile of ``pixel_values`` (one row per tile, the whole
image first) gives an ``n × n`` patch grid (``n = image_size / patch_size``), padded to a multiple of
``hidden_stride`` and cut into ``hidden_stride × hidden_stride`` windows read row by row; each window becomes one
token (a distribution over the visual vocabulary, embedded): one tile is an ``s × s`` grid,
``s = ⌈n / hidden_stride⌉``. The processor writes ``<IMG_START>``, the whole image's tokens, ``<IMG_GRID>``, then for
a split image each tile's tokens row by row with ``<IMG_COL>`` between the tiles of a row and ``<IMG_ROW>`` between
rows, ``<IMG_END>``. The markers are the visual indicator tokens, whose embeddings the model replaces with learned
features; they stay single tokens of the sequence and are placed as text. ropekit places the whole image and every
tile as an ``s × s`` block of its own.
"""
from __future__ import annotations

from typing import Any, Optional

from .llava import GridLlava


class Ovis2(GridLlava):
    model_type = "ovis2"
    name = "Ovis2"

    def grid_side(self, config: Any, strategy: Optional[str] = None) -> int:
        vcfg = config.vision_config
        size, patch, stride = vcfg.image_size, vcfg.patch_size, vcfg.hidden_stride
        if not all(isinstance(v, int) for v in (size, patch, stride)) or size % patch or stride < 1:
            raise ValueError(
                f"patch_model: Ovis2 tiles of image_size {size!r}, patch_size {patch!r} and hidden_stride {stride!r}: "
                f"the tower needs square tiles of whole patches (the model cannot reshape them otherwise)"
            )
        return -(-(size // patch) // stride)  # the patch grid is padded to whole windows
