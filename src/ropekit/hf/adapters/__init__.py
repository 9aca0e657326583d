"""Model-family adapters, by transformers ``model_type``."""
from .base import Adapter
from .llava import Llava
from .llava_next import LlavaNext, LlavaNextVideo
from .llava_onevision import LlavaOnevision
from .qwen2_5_vl import Qwen2_5VL
from .qwen2_vl import Qwen2VL
from .qwen3_vl import Qwen3VL
from .qwen3_5 import Qwen3_5

ADAPTERS: dict[str, Adapter] = {a.model_type: a for a in (Qwen2VL(), Qwen2_5VL(), Qwen3VL(), Llava(), Qwen3_5(), LlavaOnevision(),
                                                LlavaNext(), LlavaNextVideo())}

__all__ = ["Adapter", "ADAPTERS"]
