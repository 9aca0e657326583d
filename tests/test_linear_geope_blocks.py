"""Linear GeoPE in the experiments' attention: memory kept for backward grows linearly in the tokens."""
from __future__ import annotations

import torch

import ropekit.apply.linear_geope as lg
from ropekit.experiments.vision import LINEAR_GEOPE_BLOCK, _Attention


def _saved_bytes(length: int) -> int:
    """Bytes of the distinct storages autograd keeps for backward after one attention forward."""
    torch.manual_seed(0)
    att = _Attention(24, 2, "linear-geope", 0)
    x = torch.randn(1, length, 24, requires_grad=True)
    pos = 4 * torch.randn(length, 3)
    kept = {}

    def pack(t):
        st = t.untyped_storage()
        kept[st.data_ptr()] = st.nbytes()  # views of one tensor (q per block, k, v) count once
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        att(x, pos)
    return sum(kept.values())


def test_backward_memory_is_blockwise_not_quadratic(monkeypatch):
    # the point transformer reaches 2 048 points; keeping every block's attention probabilities for backward
    # (no checkpointing) stores B·H·L² floats, ~4× when L doubles; checkpointed blocks keep O(L) (~2×)
    monkeypatch.setattr(lg, "_FUSED_MIN_WORK", 1 << 62)  # the eager kernel: no compilation in the test
    small, large = _saved_bytes(2 * LINEAR_GEOPE_BLOCK), _saved_bytes(4 * LINEAR_GEOPE_BLOCK)
    assert large / small < 2.5
    assert large < 4 * LINEAR_GEOPE_BLOCK * 4 * LINEAR_GEOPE_BLOCK * 4  # far below one L² float32 map
