"""Hugging Face transformers integration: ropekit designs, allocations and AGE in Qwen-VL, GLM-4V, ERNIE-4.5-VL,
PaddleOCR-VL and LLaVA models (docs/hf.md)."""
from .patch import (SUPPORTED_MODEL_TYPES, is_patched, last_positions, layer_designs, patch_model, position_ids,
                    position_rows, supported_models, unpatch_model)
from .packing import PackingCollator, pack
from .auto import from_pretrained, load_stock, register_when_transformers_loads

register_when_transformers_loads()  # a saved patched model loads patched through transformers' Auto classes

__all__ = ["patch_model", "unpatch_model", "position_ids", "position_rows", "pack", "PackingCollator", "from_pretrained", "load_stock",
           "last_positions", "layer_designs", "is_patched", "supported_models", "SUPPORTED_MODEL_TYPES"]
from .vision import VISION_FAMILIES, patch_vision_model, unpatch_vision_model  # noqa: E402
__all__ += ["patch_vision_model", "unpatch_vision_model", "VISION_FAMILIES"]
