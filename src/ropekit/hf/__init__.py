"""Hugging Face transformers integration: ropekit designs, allocations and AGE in Qwen-VL models (docs/hf.md)."""
from .patch import SUPPORTED_MODEL_TYPES, is_patched, last_positions, layer_designs, patch_model, unpatch_model

__all__ = ["patch_model", "unpatch_model", "last_positions", "layer_designs", "is_patched", "SUPPORTED_MODEL_TYPES"]
from .vision import VISION_FAMILIES, patch_vision_model, unpatch_vision_model  # noqa: E402
__all__ += ["patch_vision_model", "unpatch_vision_model", "VISION_FAMILIES"]
