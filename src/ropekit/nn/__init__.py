"""nn modules: attention with any ropekit rotary, and a tiny ViT for experiments."""
from .attention import Rotary, RotaryAttention, TinyViT
from .rotary import RotaryEmbedding
from .learned import GRAPE, ComRoPE, LieRE

__all__ = ["Rotary", "RotaryAttention", "RotaryEmbedding", "TinyViT", "LieRE", "ComRoPE", "GRAPE"]
from .fope import FoPE
from .string_rope import STRING

__all__ += ["FoPE", "STRING"]
