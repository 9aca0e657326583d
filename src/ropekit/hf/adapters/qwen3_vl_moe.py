"""Qwen3-VL-MoE: Qwen3-VL with mixture-of-experts MLPs in its text model. Its position code and text rotary are
Qwen3-VL's (transformers generates both from the same modular source): interleaved ``mrope_section``, one grid per
video frame. Only the multimodal forwards differ, by ``output_router_logits``, which the patch hands on."""
from .qwen3_vl import Qwen3VL


class Qwen3VLMoe(Qwen3VL):
    model_type = "qwen3_vl_moe"
    forward_params = frozenset({"output_router_logits"})
