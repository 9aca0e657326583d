"""Qwen2.5-VL: Qwen2-VL's layout plus video time scaled by ``tokens_per_second · second_per_grid_ts``."""
from typing import Any, Optional

from .base import Adapter


class Qwen2_5VL(Adapter):
    model_type = "qwen2_5_vl"

    def tokens_per_second(self, vision_config: Any) -> Optional[float]:
        tps = getattr(vision_config, "tokens_per_second", None)
        return None if tps is None else float(tps)
