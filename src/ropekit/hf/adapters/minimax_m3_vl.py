"""MiniMax-M3-VL (``minimax_m3_vl``): a Qwen-style vision tower (patches of any image size, ``m × m`` merged by the
projector) in a 1-D MiniMax M3 language model (block-sparse attention on its sparse layers).

How the model fills the tokens: ``image_grid_thw`` row ``(t, h, w)`` is an image in patches; the tower keeps the
processor's patch order (grouped by merge window) and the projector joins each run of ``m²`` patches into one
token: an image is ``h/m × w/m`` tokens, row by row, between ``<vision_start>`` and ``<vision_end>``. A video's
grid rows are its chunks; the processor writes every frame (``t`` per row) as a block of its own, with its
timestamp as text before it. ropekit places each image as an ``h/m × w/m`` image block and each video frame as a
one-frame video block; the markers and timestamps are text.

The language model rotates with 1-D positions (no ``get_rope_index``); its sparse layers' indexer rotates its own
query and key with the first channels of the same cos/sin, and picks key blocks by the 1-D text positions
(``position_ids``), which the patch hands every layer unchanged.
"""
from __future__ import annotations

from torch import nn

from .base import partial_rotary_dim
from .exaone4_5 import Exaone4_5


class MiniMaxM3VL(Exaone4_5):
    model_type = "minimax_m3_vl"
    label = "MiniMax-M3-VL"
    frames_apart = True
    counts_padding = False  # its generate numbers tokens from the attention mask, as transformers' does
    generate_drops_positions = False
    forward_params = Exaone4_5.forward_params | {"output_router_logits"}  # an MoE switch, handed on unread

    def rotary_dim(self, text: nn.Module) -> int:
        return partial_rotary_dim(text)
