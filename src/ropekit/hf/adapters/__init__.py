"""Model-family adapters, by transformers ``model_type``."""
from .aya_vision import AyaVision
from .base import Adapter
from .cohere_compass import CohereCompass
from .cosmos3 import Cosmos3Edge, Cosmos3Omni
from .cohere2_vision import Cohere2Vision
from .deepseek_vl import DeepseekVL
from .ernie4_5_vl_moe import Ernie4_5VLMoe
from .exaone4_5 import Exaone4_5
from .gemma3 import Gemma3
from .gemma4 import Gemma4
from .glm4v import Glm4V, Glm4VMoe, Glm46V
from .glm_image import GlmImage
from .glm_ocr import GlmOcr
from .hy_v4_vl import HYV4VL
from .idefics3 import Idefics3
from .internvl import InternVL
from .janus import Janus
from .kimi_k25 import KimiK25
from .llama4 import Llama4
from .lfm2_vl import Lfm2Vl
from .llava import Llava
from .llava_next import LlavaNext, LlavaNextVideo
from .llava_onevision import LlavaOnevision
from .minicpmv4_6 import MiniCPMV4_6
from .minicpmv4_7 import MiniCPMV4_7
from .minimax_m3_vl import MiniMaxM3VL
from .mistral3 import Mistral3
from .molmo2 import Molmo2
from .ovis2 import Ovis2
from .paddleocr_vl import PaddleOCRVL
from .paligemma import PaliGemma
from .qianfan_ocr import QianfanOCR
from .qwen2_5_omni import Qwen2_5OmniThinker
from .qwen2_5_vl import Qwen2_5VL
from .qwen2_vl import Qwen2VL
from .qwen3_omni_moe import Qwen3OmniMoeThinker
from .qwen3_vl import Qwen3VL
from .qwen3_vl_moe import Qwen3VLMoe
from .qwen3_5 import Qwen3_5
from .qwen3_5_moe import Qwen3_5Moe
from .qwen4_exp import Qwen4Exp
from .refused import REFUSED
from .smolvlm import SmolVLM
from .step3p7 import Step3p7
from .video_llama_3 import VideoLlama3

ADAPTERS: dict[str, Adapter] = {a.model_type: a for a in (
    Qwen2VL(), Qwen2_5VL(), Qwen3VL(), Qwen3VLMoe(), Qwen3_5(), Qwen3_5Moe(), Glm4V(), Glm4VMoe(), Glm46V(),
    GlmOcr(), Ernie4_5VLMoe(), PaddleOCRVL(), Qwen2_5OmniThinker(), Qwen3OmniMoeThinker(), Llava(), LlavaNext(),
    LlavaNextVideo(), LlavaOnevision(), InternVL(), Gemma3(), Idefics3(), SmolVLM(), Mistral3(), PaliGemma(),
    AyaVision(), Cohere2Vision(), QianfanOCR(), Exaone4_5(), Janus(), MiniMaxM3VL(),
    Gemma4(), Llama4(), Lfm2Vl(), Ovis2(), DeepseekVL(), VideoLlama3(), KimiK25(),
    Qwen4Exp(), Cosmos3Edge(), Cosmos3Omni(), CohereCompass(), HYV4VL(), MiniCPMV4_6(), MiniCPMV4_7(), Molmo2(),
    Step3p7(), GlmImage())}

__all__ = ["Adapter", "ADAPTERS", "REFUSED"]
