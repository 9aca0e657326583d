"""With the plugin installed, a checkpoint without a ropekit record is served by vLLM's own model, unchanged."""
from __future__ import annotations

import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch

import checkpoints as ck
from test_vllm_serving import TOL, _hf_logprobs, _requests, _vllm_prompt_logprobs


def test_a_stock_checkpoint_is_served_by_vllms_own_model(tmp_path):
    import transformers as tf
    from vllm import LLM, SamplingParams

    path = ck.build("qwen2_vl", tmp_path, design=None)
    llm = LLM(model=str(path), dtype="float32", max_model_len=512, max_num_batched_tokens=32, max_num_seqs=4,
              block_size=32, enforce_eager=True, limit_mm_per_prompt={"image": 2, "video": 1}, seed=0)
    try:
        served = llm.apply_model(lambda model: f"{type(model).__module__}.{type(model).__name__}")
        assert served == ["vllm.model_executor.models.qwen2_vl.Qwen2VLForConditionalGeneration"]
        prompt, mm = _requests("qwen2_vl-circle-age")[0]
        out = llm.generate([{"prompt": prompt, "multi_modal_data": mm}],
                           SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))[0]
    finally:
        del llm
        gc.collect()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    model = tf.Qwen2VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    ids, want, _ = _hf_logprobs(model, tf.AutoProcessor.from_pretrained(path), prompt, mm)
    assert out.prompt_token_ids == ids
    assert (_vllm_prompt_logprobs(out) - want).abs().max().item() <= TOL
