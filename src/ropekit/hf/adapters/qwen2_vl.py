"""Qwen2-VL: chunked ``mrope_section`` (temporal, height, width), one grid per video."""
from .base import Adapter


class Qwen2VL(Adapter):
    model_type = "qwen2_vl"
