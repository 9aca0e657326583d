"""Qwen4-Exp (``qwen4_exp``): Qwen3.5-MoE's position code and text rotary (interleaved sections over the
``partial_rotary_factor`` part of each head), in a decoder with hyper-connections, per-layer n-gram embeddings and
sparse (QSA-indexed) full attention.

transformers' ``Qwen4ExpModel`` inherits ``get_rope_index`` and ``compute_3d_position_ids`` from Qwen3.5-MoE. Its
text model keeps the position rows of every token it has seen with the KV cache (the indexer pools keys over
blocks of cached tokens and rotates each block at its first token's position) and hands the rotary the rows of
cache and new tokens together; the attention takes the new tokens' part. Those rows are the patch's position
tensor less its text row, so the design's positions drive both the attention and the indexer. The decoder layers'
``conv_mask`` and ``ple_input_ids`` (the n-gram embeddings' inputs) are handed on unread.
"""
from .qwen3_5_moe import Qwen3_5Moe


class Qwen4Exp(Qwen3_5Moe):
    model_type = "qwen4_exp"
    text_params = Qwen3_5Moe.text_params | {"ple_input_ids"}
    layer_params = frozenset({"conv_mask", "ple_input_ids"})
