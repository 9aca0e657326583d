"""With the plugin installed, a checkpoint without a ropekit record is served by vLLM's own model, unchanged."""
from __future__ import annotations

import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest
import torch

import checkpoints as ck
from test_vllm_serving import TOL, _hf_logprobs, _requests, _vllm_prompt_logprobs

#: family -> (vLLM's own model class that serves its stock checkpoint, a request of the serving tests, engine limits)
STOCK = {
    "qwen2_vl": ("vllm.model_executor.models.qwen2_vl.Qwen2VLForConditionalGeneration",
                 ("qwen2_vl-circle-age", 0), {"image": 2, "video": 1}),
}


@pytest.mark.parametrize("family", list(STOCK))
def test_a_stock_checkpoint_is_served_by_vllms_own_model(tmp_path, family):
    import transformers as tf
    from vllm import LLM, SamplingParams

    own, (name, index), limits = STOCK[family]
    path = ck.build(family, tmp_path, design=None)
    llm = LLM(model=str(path), dtype="float32", max_model_len=512, max_num_batched_tokens=32, max_num_seqs=4,
              block_size=32, enforce_eager=True, limit_mm_per_prompt=limits, seed=0)
    try:
        # vLLM's own class, without the patch
        served = llm.apply_model(lambda model: f"{type(model).__module__}.{type(model).__name__}")
        assert served == [own]
        assert llm.apply_model(lambda model: hasattr(model, "_ropekit")) == [False]
        prompt, mm = _requests(name)[index]
        out = llm.generate([{"prompt": prompt, "multi_modal_data": mm}],
                           SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))[0]
    finally:
        del llm
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    model = getattr(tf, ck.CLASSES[family]).from_pretrained(path, dtype=torch.float32).eval()
    ids, want, _ = _hf_logprobs(model, tf.AutoProcessor.from_pretrained(path), prompt, mm)
    assert out.prompt_token_ids == ids
    assert (_vllm_prompt_logprobs(out) - want).abs().max().item() <= TOL
