"""One small file per vision-encoder family whose 2-D RoPE :func:`ropekit.hf.patch_vision_model` replaces."""
from .base import VisionAdapter
from .dinov3 import DINOv3Adapter
from .exaone4_5 import Exaone45VisionAdapter
from .gemma4 import Gemma4VisionAdapter
from .llama4 import Llama4VisionAdapter
from .pixtral import PixtralAdapter
from .sam3 import Sam3ViTAdapter
from .qwen2_vl import Qwen2VLVisionAdapter, Qwen25VLVisionAdapter
from .video_llama_3 import VideoLlama3VisionAdapter
from .vjepa2 import VJEPA2Adapter

VISION_ADAPTERS: tuple[VisionAdapter, ...] = (
    DINOv3Adapter(), PixtralAdapter(), Qwen2VLVisionAdapter(), Qwen25VLVisionAdapter(), VJEPA2Adapter(),
    Gemma4VisionAdapter(), VideoLlama3VisionAdapter(), Exaone45VisionAdapter(),
    Llama4VisionAdapter(), Sam3ViTAdapter(),
)

__all__ = ["VisionAdapter", "VISION_ADAPTERS"]
