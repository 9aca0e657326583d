"""Qwen3.5: Qwen3-VL's interleaved M-RoPE on part of each head (``partial_rotary_factor``), in a hybrid
decoder whose linear-attention layers take no positions. The sections its config carries are read over
the rotated pairs only, as transformers reads them."""
from torch import nn

from .base import partial_rotary_dim
from .qwen3_vl import Qwen3VL


class Qwen3_5(Qwen3VL):
    model_type = "qwen3_5"
    default_sections = (11, 11, 10)

    def rotary_dim(self, text: nn.Module) -> int:
        return partial_rotary_dim(text)
