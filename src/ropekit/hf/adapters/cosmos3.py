"""NVIDIA Cosmos3: the Edge model (``cosmos3_edge``) and the Omni reasoner (``cosmos3_omni``).

Cosmos3-Edge: ``Cosmos3EdgeModel.get_rope_index`` is Qwen2-VL's (transformers 5.x: a block at ``s`` on
``(s + frame, s + row, s + column)``, text after it from ``s + max(rows, columns)``) after splitting every video
into one ``(1, h, w)`` grid per frame (its processor writes each frame's timestamp as text between frames); the
text rotary is Qwen3-VL's (interleaved ``mrope_section``, default ``[24, 20, 20]``) on a Llama decoder
(``rotate_half`` tables). Its generation class hands ``generate`` three position rows, not four; the patch hands it
its own position tensor, text row first, which the text model splits as it splits transformers' four rows.

Cosmos3-Omni: transformers' ``Cosmos3OmniModel`` is Qwen3-VL's model under another ``model_type`` (its position
code is ``Qwen3VLModel``'s line for line), building its language model from the text config (``AutoModel``), so
the text model's class is checked: Qwen3-VL's is the one whose rotary the adapter knows.
"""
from __future__ import annotations

from torch import nn

from .qwen3_vl import Qwen3VL


class Cosmos3Edge(Qwen3VL):
    model_type = "cosmos3_edge"
    text_params = frozenset()  # no DeepStack features


class Cosmos3Omni(Qwen3VL):
    model_type = "cosmos3_omni"

    def check(self, inner: nn.Module) -> None:
        cls = type(getattr(inner, "language_model", None)).__name__
        if cls != "Qwen3VLTextModel":
            raise ValueError(
                f"patch_model: cosmos3_omni with a {cls} language model is not supported: ropekit knows the rotary "
                f"layout of Qwen3VLTextModel only (the text config's model_type 'qwen3_vl_text')"
            )
