"""q/k rotation throughput: ropekit (eager, fused, compiled) against transformers' Qwen2-VL path and
rotary-embedding-torch, for 1-D RoPE and M-RoPE, plus the cost of building cos/sin.

Every case rotates q and k of the same shape. "Minimum bytes" is what any implementation must move:
read q and k, write both outputs, read cos/sin once. Achieved bytes/s is that over the median time,
compared with the copy bandwidth measured in the same process (a 256 MiB ``copy_`` into a preallocated
buffer, :func:`benchmarks.common.copy_bandwidth`).

Two references of the same shape are timed with the cases: ``copy_prealloc`` (``q_out.copy_(q);
k_out.copy_(k)`` into buffers allocated once) and ``clone`` (``q.clone(); k.clone()``, fresh outputs,
which pay a page fault per 4 KiB on first touch as every functional call does). ``ropekit_fused_out`` is
the fused apply writing into preallocated buffers (``out=``) and ``ropekit_fused_inplace`` rotates q and k
in place (``out=(q, k)``); each row records every case's speed relative to both references.
"""
from __future__ import annotations

import time
import warnings

import torch

from ropekit import angles, apply_rotary_qk, cos_sin, frequency_matrix, positions
from ropekit.apply.fused import apply_rotary_qk_fused

from .common import timeit_many

SHAPES = [(1, 16, 4096, 128), (8, 32, 2048, 128)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
THETA = 1e6
SECTIONS = [16, 24, 24]  # Qwen2-VL's M-RoPE split for head_dim 128
# a text + image + text sample filling the sequence exactly (image grids in merged tokens)
LAYOUTS = {4096: "T96 I60x60 T400", 2048: "T48 I40x40 T400"}


def _hf_rotary(heads: int, head_dim: int):
    """Transformers' Qwen2-VL rotary module, built from a text config (no weights, no downloads)."""
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding

    cfg = Qwen2VLTextConfig(
        hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=heads,
        num_hidden_layers=1, intermediate_size=16,
        rope_parameters={"rope_type": "default", "rope_theta": THETA, "mrope_section": SECTIONS},
    )
    return Qwen2VLRotaryEmbedding(cfg)


def _coords(kind: str, B: int, L: int) -> torch.Tensor:
    """Positions ``(B, L, A)``: 0…L-1 for 1-D, ropekit's M-RoPE of a text/image/text sample otherwise."""
    if kind == "1d":
        return torch.arange(L, dtype=torch.float32)[None, :, None].expand(B, L, 1)
    return positions(LAYOUTS[L], "mrope")[None].expand(B, L, 3)


def _ropekit_cos_sin(kind: str, coords: torch.Tensor, D: int):
    """ropekit's cos/sin: ``(L, D/2)`` shared by the batch for 1-D, ``(B, L, D/2)`` for M-RoPE."""
    if kind == "1d":
        return cos_sin(angles(coords[0], frequency_matrix("1d", D, base=THETA)))
    return cos_sin(angles(coords, frequency_matrix("mrope", D, 3, base=THETA, sections=SECTIONS)))


def _ret_freqs(kind: str, L: int, D: int) -> torch.Tensor:
    """rotary-embedding-torch angles ``(L, D)`` (interleaved): 1-D, or 2-D axial over an h × w grid."""
    from rotary_embedding_torch import RotaryEmbedding

    if kind == "1d":
        rot = RotaryEmbedding(dim=D, theta=THETA, cache_if_possible=False)
        return rot(torch.arange(L, dtype=torch.float32)).detach()
    w = 64
    rot = RotaryEmbedding(dim=D // 2, theta=THETA, cache_if_possible=False)
    return rot.get_axial_freqs(L // w, w).reshape(L, D).detach()


def bench_case(shape, dtype_name: str, kind: str, *, repeat: int, compiled=None) -> dict:
    from rotary_embedding_torch import apply_rotary_emb
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    B, H, L, D = shape
    dtype = DTYPES[dtype_name]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(shape, generator=g).to(dtype)
    k = torch.randn(shape, generator=g).to(dtype)
    coords = _coords(kind, B, L)
    cos, sin = _ropekit_cos_sin(kind, coords, D)
    hf_rot = _hf_rotary(H, D)
    pid = coords.permute(2, 0, 1).long().expand(3, B, L)  # Qwen2-VL position_ids (3, B, L)
    hf_cos, hf_sin = hf_rot(q, pid)
    ret_freqs = _ret_freqs(kind, L, D)

    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    q_in, k_in = q.clone(), k.clone()  # rotated in place again and again: a rotation keeps them finite
    apply_rotary_qk_fused(q, k, cos, sin, out=(q_out, k_out))  # builds the out= kernel (once per process)
    want = apply_rotary_qk_fused(q, k, cos, sin)
    if not (torch.equal(q_out, want[0]) and torch.equal(k_out, want[1])):
        raise AssertionError(f"out= differs from the functional fused apply on {shape} {dtype_name} {kind}")
    del want
    cases = {
        "copy_prealloc": lambda: (q_out.copy_(q), k_out.copy_(k)),
        "clone": lambda: (q.clone(), k.clone()),
        "transformers_qwen2vl": lambda: apply_rotary_pos_emb(q, k, hf_cos, hf_sin),
        "rotary_embedding_torch": lambda: (apply_rotary_emb(ret_freqs, q), apply_rotary_emb(ret_freqs, k)),
        "ropekit_eager": lambda: apply_rotary_qk(q, k, cos, sin),
        "ropekit_fused": lambda: apply_rotary_qk_fused(q, k, cos, sin),
        "ropekit_blocks": lambda: apply_rotary_qk_fused(q, k, cos, sin, compiled=False),
        "ropekit_fused_out": lambda: apply_rotary_qk_fused(q, k, cos, sin, out=(q_out, k_out)),
        "ropekit_fused_inplace": lambda: apply_rotary_qk_fused(q_in, k_in, cos, sin, out=(q_in, k_in)),
    }
    references = ("copy_prealloc", "clone")
    result = {"shape": list(shape), "dtype": dtype_name, "positions": kind, "cases": {}}
    t0 = time.perf_counter()
    apply_rotary_qk_fused(q, k, cos, sin)  # the default path compiles its kernel on the first large call
    result["fused_first_call_s"] = time.perf_counter() - t0
    if compiled is not None:
        t0 = time.perf_counter()
        compiled(q, k, cos, sin)
        result["compile_s"] = time.perf_counter() - t0
        cases["ropekit_compiled"] = lambda: compiled(q, k, cos, sin)

    min_bytes = 4 * q.numel() * q.element_size() + 2 * cos.numel() * cos.element_size()
    result["min_bytes"] = min_bytes
    result["cases"] = timeit_many(cases, warmup=1, repeat=repeat)
    for t in result["cases"].values():
        t["bytes_per_s"] = min_bytes / t["median_s"]
        for ref_name in references:  # fraction of the reference's speed (it moves 4·|q| bytes, cos/sin aside)
            t[f"vs_{ref_name}"] = result["cases"][ref_name]["median_s"] / t["median_s"]
    if dtype == torch.float32:  # sanity: everyone computes the same rotation
        ref = apply_rotary_qk(q, k, cos, sin)[0]
        skip = ("rotary_embedding_torch", "ropekit_fused_inplace", *references)  # in place: rotated many times
        diffs = {n: (cases[n]()[0] - ref).abs().max().item() for n in cases if n not in skip}
        if kind == "1d":  # rotary-embedding-torch pairs interleaved channels
            ref_i = apply_rotary_qk(q, k, cos, sin, channels="interleaved")[0]
            diffs["rotary_embedding_torch_vs_interleaved"] = (cases["rotary_embedding_torch"]()[0] - ref_i).abs().max().item()
        result["max_abs_diff_vs_ropekit_eager"] = diffs

    # cos/sin construction, per forward: ropekit (angles + cos/sin) and the transformers rotary module
    result["cos_sin"] = timeit_many(
        {"ropekit": lambda: _ropekit_cos_sin(kind, coords, D), "transformers_qwen2vl": lambda: hf_rot(q, pid)},
        warmup=1, repeat=repeat,
    )
    return result


def run(*, quick: bool = False, repeat: int = 5, compile_fused: bool = True, log=print) -> list[dict]:
    """All apply cases; ``quick`` keeps the first shape only."""
    shapes = SHAPES[:1] if quick else SHAPES
    compiled = None
    if compile_fused:
        # one compiled function, dynamic shapes: it recompiles per dtype and cos/sin rank, not per size
        compiled = torch.compile(apply_rotary_qk_fused, fullgraph=True, dynamic=True)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for shape in shapes:
            for dtype_name in DTYPES:
                for kind in ("1d", "mrope"):
                    r = bench_case(shape, dtype_name, kind, repeat=repeat, compiled=compiled)
                    log(_line(r))
                    out.append(r)
    return out


def _line(r: dict) -> str:
    ms = {n: f"{c['median_s'] * 1e3:.1f}" for n, c in r["cases"].items()}
    c = r["cases"]
    return (f"apply {tuple(r['shape'])} {r['dtype']} {r['positions']}: " + ", ".join(f"{n} {v} ms" for n, v in ms.items())
            + "; vs preallocated copy_: " + ", ".join(f"{n} {c[n]['vs_copy_prealloc']:.2f}" for n in
                                                       ("clone", "ropekit_fused", "ropekit_fused_out", "ropekit_fused_inplace")))
