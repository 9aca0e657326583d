"""Qwen3.5-MoE: Qwen3.5 (partial rotary, interleaved sections over the rotated pairs, hybrid linear/full attention)
with mixture-of-experts MLPs; the position code and text rotary are Qwen3.5's. Only the multimodal forwards differ,
by ``output_router_logits``, which the patch hands on."""
from .qwen3_5 import Qwen3_5


class Qwen3_5Moe(Qwen3_5):
    model_type = "qwen3_5_moe"
    forward_params = frozenset({"output_router_logits"})
