"""Model-family adapters, by transformers ``model_type``."""
from .base import Adapter
from .llava import Llava
from .qwen2_5_vl import Qwen2_5VL
from .qwen2_vl import Qwen2VL
from .qwen3_vl import Qwen3VL

ADAPTERS: dict[str, Adapter] = {a.model_type: a for a in (Qwen2VL(), Qwen2_5VL(), Qwen3VL(), Llava())}

__all__ = ["Adapter", "ADAPTERS"]
