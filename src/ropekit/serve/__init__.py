"""Serving ropekit checkpoints with inference engines (vLLM: :mod:`ropekit.serve.vllm`, docs/serving.md)."""
