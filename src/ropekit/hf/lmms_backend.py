"""lmms-eval backend for checkpoints saved from patched models: ``lmms-eval --model ropekit --model_args
pretrained=DIR,...``.

ropekit registers it with lmms-eval through the ``lmms_eval.models`` entry points (pyproject.toml), so installing
ropekit next to lmms-eval is all it takes. The backend is lmms-eval's generic Hugging Face chat model
(``lmms_eval.models.chat.huggingface.Huggingface``: the processor's chat template, images and videos, greedy or
sampled ``generate``) with two differences:

- the model loads through ``AutoModelForImageTextToText`` with ropekit imported, so the checkpoint comes back
  patched from the record in its ``config.json`` (docs/hf.md, "Saving and reloading a patched model"); a checkpoint
  that is not a patched one is refused, since evaluating the stock model under this backend's name would be a
  silent mistake (evaluate those with lmms-eval's own backends);
- ``dtype`` is an argument (lmms-eval's backend always loads bfloat16): ``bfloat16`` (default, as lmms-eval),
  ``float16``, ``float32`` or ``auto``;
- the processor is called as transformers 5 takes it: lmms-eval 0.7.3's backend passes ``audios=`` (refused by
  transformers 5, which names it ``audio``) and empty lists for absent media; they are passed as ``audio=`` and
  ``None``.

lmms-eval's Qwen-specific backends (``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``) load with the family's own class,
which ropekit refuses for such a checkpoint by name (it would build the stock model); use this one.
Everything here imports lmms-eval lazily: the module is read by lmms-eval's registry only.
"""
from __future__ import annotations

from typing import Any, Optional, Union

MODEL_ID = "ropekit"
DTYPES = ("bfloat16", "float16", "float32", "auto")
_MADE: dict = {}

__all__ = ["MODEL_ID", "manifest"]


def manifest():
    """The ``lmms_eval.models`` entry point: lmms-eval's manifest of the ``ropekit`` chat model."""
    from lmms_eval.models.registry_v2 import ModelManifest

    return ModelManifest(model_id=MODEL_ID, chat_class_path=f"{__name__}.Ropekit")


def __getattr__(name: str) -> Any:
    """``Ropekit``, the backend class, made on first use (it subclasses lmms-eval's, imported only then)."""
    if name == "Ropekit":
        if name not in _MADE:
            _MADE[name] = _make_class()
        return _MADE[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Processor:
    """The checkpoint's processor, called with lmms-eval's keywords (see the module doc); everything else as is."""

    def __init__(self, processor: Any) -> None:
        self._processor = processor

    def __getattr__(self, name: str) -> Any:
        return getattr(self._processor, name)

    def __call__(self, *args: Any, images=None, videos=None, audios=None, **kwargs: Any) -> Any:
        if audios:
            kwargs["audio"] = audios
        return self._processor(*args, images=images or None, videos=videos or None, **kwargs)


def _make_class() -> type:
    import torch
    from accelerate import Accelerator, DistributedType
    from lmms_eval.api.model import lmms
    from lmms_eval.models.chat.huggingface import Huggingface
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    from .auto import register
    from .patch import is_patched

    class Ropekit(Huggingface):
        """lmms-eval's Hugging Face chat backend on a saved patched checkpoint (see the module doc)."""

        is_simple = False

        def __init__(
            self,
            pretrained: str,
            device: Optional[str] = "cuda",
            device_map: Optional[str] = "auto",
            batch_size: Optional[Union[int, str]] = 1,
            dtype: str = "bfloat16",
            use_cache: bool = True,
            attn_implementation: Optional[str] = None,
            max_num_frames: int = 32,
            system_prompt: Optional[str] = None,
            interleave_visuals: bool = False,
            max_length: int = 2048,
        ) -> None:
            lmms.__init__(self)
            if dtype not in DTYPES:
                raise ValueError(f"ropekit (lmms-eval): `dtype` must be one of {', '.join(DTYPES)}, got {dtype!r}")
            if attn_implementation not in (None, "flash_attention_2", "sdpa", "eager"):
                raise ValueError(f"ropekit (lmms-eval): `attn_implementation` must be flash_attention_2, sdpa or "
                                 f"eager, got {attn_implementation!r}")
            register()
            config = AutoConfig.from_pretrained(pretrained)
            if not isinstance(getattr(config, "ropekit", None), dict):
                raise ValueError(
                    f"ropekit (lmms-eval): {pretrained} is not a checkpoint saved from a model patched by ropekit (its "
                    f"config.json has no ropekit record); evaluate a stock checkpoint with lmms-eval's own backends "
                    f"(--model huggingface, qwen2_5_vl, ...)")
            accelerator = Accelerator()
            self.accelerator = accelerator
            if accelerator.num_processes > 1:
                self._device = torch.device(f"cuda:{accelerator.local_process_index}")
                self.device_map = f"cuda:{accelerator.local_process_index}"
            else:
                self._device = torch.device(device)
                self.device_map = device_map if device_map else device
            kwargs = {"dtype": getattr(torch, dtype) if dtype != "auto" else "auto", "device_map": self.device_map}
            if attn_implementation is not None:
                kwargs["attn_implementation"] = attn_implementation
            self._model = AutoModelForImageTextToText.from_pretrained(pretrained, **kwargs).eval()
            if not is_patched(self._model):  # a safety net: the Auto classes patch every ropekit checkpoint
                raise RuntimeError(f"ropekit (lmms-eval): {pretrained} loaded unpatched")
            self.trust_remote_code = False
            self.max_num_frames = max_num_frames
            prompt = system_prompt.replace("\\n", "\n") if system_prompt else None
            self.system_prompt = self._resolve_system_prompt(prompt) if prompt else None
            self.processor = _Processor(AutoProcessor.from_pretrained(pretrained))
            self._tokenizer = AutoTokenizer.from_pretrained(pretrained)
            self.interleave_visuals = interleave_visuals
            self._config = self._model.config
            self._max_length = max_length
            self.batch_size_per_gpu = int(batch_size)
            self.use_cache = use_cache
            if accelerator.num_processes > 1:
                if accelerator.distributed_type not in (DistributedType.FSDP, DistributedType.MULTI_GPU):
                    raise ValueError("ropekit (lmms-eval): only DDP and FSDP are supported across processes")
                if accelerator.distributed_type == DistributedType.FSDP:
                    self._model = accelerator.prepare(self.model)
                else:
                    self._model = accelerator.prepare_model(self.model, evaluation_mode=True)
                self._rank, self._world_size = accelerator.local_process_index, accelerator.num_processes
            else:
                self._rank, self._world_size = 0, 1

    Ropekit.__module__, Ropekit.__qualname__ = __name__, "Ropekit"
    return Ropekit
