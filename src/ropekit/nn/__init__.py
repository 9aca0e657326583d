"""nn modules: attention with any ropekit rotary, and a tiny ViT for experiments."""
from .attention import Rotary, RotaryAttention, TinyViT
from .rotary import RotaryEmbedding

__all__ = ["Rotary", "RotaryAttention", "RotaryEmbedding", "TinyViT"]
