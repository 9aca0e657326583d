"""Fused apply path: same results and errors as the eager reference, compiles without graph breaks,
and the Triton kernel (run through Triton's CPU interpreter) agrees with both."""
from __future__ import annotations

import importlib.util
import logging
import platform
import warnings

import pytest
import torch

from ropekit import apply_rotary_qk
from ropekit.apply import fused, triton_rope
from ropekit.apply.fused import apply_rotary_fused, apply_rotary_qk_fused

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
HAS_TRITON = importlib.util.find_spec("triton") is not None


def _inputs(dtype, channels_first=True, B=2, Hq=3, Hk=1, L=5, D=12, rot=12, cos_dims=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, D, generator=g).to(dtype)
    k = torch.randn(B, Hk, L, D, generator=g).to(dtype)
    shape = {2: (L, rot // 2), 3: (B, L, rot // 2), 4: (B, Hq, L, rot // 2)}[cos_dims]
    ang = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    ang = ang if dtype == torch.float64 else ang.float()
    if not channels_first:  # (B, L, H, D) as non-contiguous views of the same data
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    return q, k, ang.cos(), ang.sin()


def _brute_force(x, cos, sin, channels, seq_dim):
    """float64 rotation, pair by pair, with explicit 2×2 matrices (RoPE eq. 34)."""
    x64 = x.double()
    if seq_dim == 1:
        x64 = x64.transpose(1, 2)
    B, H, L, D = x64.shape
    c = cos.double().expand(B, H, L, cos.shape[-1]) if cos.ndim != 3 else cos.double()[:, None].expand(B, H, L, -1)
    s = sin.double().expand(B, H, L, sin.shape[-1]) if sin.ndim != 3 else sin.double()[:, None].expand(B, H, L, -1)
    out = x64.clone()
    half = cos.shape[-1]
    for j in range(half):
        a, b = (j, j + half) if channels == "half" else (2 * j, 2 * j + 1)
        rotm = torch.stack([torch.stack([c[..., j], -s[..., j]], -1), torch.stack([s[..., j], c[..., j]], -1)], -2)
        pair = torch.stack([x64[..., a], x64[..., b]], -1)
        new = (rotm @ pair[..., None])[..., 0]
        out[..., a], out[..., b] = new[..., 0], new[..., 1]
    return out.transpose(1, 2) if seq_dim == 1 else out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels", ["half", "interleaved"])
@pytest.mark.parametrize("rot", [12, 8])
@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_fused_equals_eager_bit_for_bit(dtype, channels, rot, seq_dim):
    q, k, cos, sin = _inputs(dtype, channels_first=seq_dim == -2, rot=rot)
    ref = apply_rotary_qk(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    out = apply_rotary_qk_fused(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    for r, o, x in zip(ref, out, (q, k)):
        assert o.dtype == x.dtype and o.shape == x.shape
        assert torch.equal(o, r)
        # and both match a float64 pair-by-pair rotation to the input dtype's rounding
        bf = _brute_force(x, cos, sin, channels, seq_dim)
        tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
        torch.testing.assert_close(o.double(), bf, rtol=tol, atol=tol * 4)
        if rot < x.shape[-1]:
            assert torch.equal(o[..., rot:], x[..., rot:])  # partial rotary: tail passes through


@pytest.mark.parametrize("channels", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim,cos_dims,rot", [(-2, 2, 12), (-2, 4, 8), (1, 3, 12), (1, 2, 6)])
def test_blocked_eager_path_equals_eager(monkeypatch, channels, seq_dim, cos_dims, rot):
    # blocks of a few positions (not a divisor of L) exercise the sequence tiling and the ragged last block
    monkeypatch.setattr(fused, "_BLOCK_ELEMS", 150)  # 2 positions per block here
    q, k, cos, sin = _inputs(torch.bfloat16, channels_first=seq_dim == -2, Hk=3, L=7, rot=rot, cos_dims=cos_dims)
    ref = apply_rotary_qk(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    out = apply_rotary_qk_fused(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    assert all(torch.equal(o, r) for o, r in zip(out, ref))


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels,seq_dim,cos_dims,rot", [("half", -2, 2, 12), ("interleaved", 1, 3, 8)])
def test_threaded_blocks_equal_eager_bit_for_bit(monkeypatch, two_threads, dtype, channels, seq_dim, cos_dims, rot):
    # with 2 torch threads the caller and a pool worker share the blocks: 13 positions in blocks of 2 is 7
    # blocks, an odd count with a ragged last one; a thread's first block waits until the other thread has
    # started one too, so both compute blocks however the machine schedules them
    import threading

    from ropekit.apply import _parallel

    ran_on, started, both = [], set(), threading.Event()
    real = fused._rotate_block

    def block(*a):
        name = threading.current_thread().name
        started.add(name)
        if len(started) == 2:
            both.set()
        both.wait(10)
        real(*a)
        ran_on.append(name)

    monkeypatch.setattr(fused, "_rotate_block", block)
    monkeypatch.setattr(fused, "_BLOCK_ELEMS", 2 * 2 * 3 * 12)  # 2 positions per block (B=2, H=3, D=12)
    q, k, cos, sin = _inputs(dtype, channels_first=seq_dim == -2, Hk=3, L=13, rot=rot, cos_dims=cos_dims, seed=3)
    ref = apply_rotary_qk(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    out = apply_rotary_qk_fused(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    assert all(torch.equal(o, r) for o, r in zip(out, ref))
    assert len(ran_on) == 14 and any(n.startswith(_parallel._WORKER_PREFIX) for n in ran_on)
    assert threading.current_thread().name in ran_on
    assert torch.get_num_threads() == 2  # the pool and the caller's single-threaded blocks left the setting alone


def test_threaded_blocks_propagate_worker_errors(two_threads):
    from ropekit.apply._parallel import run_blocks

    def boom():
        raise RuntimeError("block failed")

    with pytest.raises(RuntimeError, match="block failed"):
        run_blocks([lambda: None, boom, lambda: None])


@pytest.mark.parametrize("cos_dims", [3, 4])
def test_batched_and_per_head_cos_sin(cos_dims):
    q, k, cos, sin = _inputs(torch.bfloat16, Hk=3, cos_dims=cos_dims)
    for channels in ("half", "interleaved"):
        ref = apply_rotary_qk(q, k, cos, sin, channels=channels)
        out = apply_rotary_qk_fused(q, k, cos, sin, channels=channels)
        assert all(torch.equal(o, r) for o, r in zip(out, ref))


def test_matches_transformers_rotate_half():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    q, k, cos, sin = _inputs(torch.float32, cos_dims=3, Hk=2)
    hf = apply_rotary_pos_emb(q, k, torch.cat([cos, cos], -1), torch.cat([sin, sin], -1))
    out = apply_rotary_qk_fused(q, k, cos, sin)
    for o, h in zip(out, hf):
        torch.testing.assert_close(o, h, rtol=1e-6, atol=1e-6)


def test_single_tensor_form_and_gradients_follow_eager():
    q, _, cos, sin = _inputs(torch.float32, rot=8)
    x = q.clone().requires_grad_(True)
    y = q.clone().requires_grad_(True)
    apply_rotary_fused(x, cos, sin, channels="interleaved").square().mul(torch.arange(12.0)).sum().backward()
    apply_rotary_qk(y, y, cos, sin, channels="interleaved")[0].square().mul(torch.arange(12.0)).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-6, atol=1e-6)


def test_rotation_preserves_pair_norms():
    q, k, cos, sin = _inputs(torch.float64, rot=12)
    out, _ = apply_rotary_qk_fused(q, k, cos, sin, channels="interleaved")
    n_in = q.unflatten(-1, (6, 2)).norm(dim=-1)
    n_out = out.unflatten(-1, (6, 2)).norm(dim=-1)
    torch.testing.assert_close(n_out, n_in, rtol=1e-12, atol=1e-12)


BAD = [
    (dict(channels="pairs"), ValueError, "`channels` must be 'half' or 'interleaved'"),
    (dict(seq_dim=0), ValueError, "`seq_dim` must be -2"),
    (dict(D=11, rot=10), ValueError, "head_dim must be even"),
    (dict(D=8, rot=12), ValueError, "rotary_dim <= head_dim"),
    (dict(L_cos=4), ValueError, "sequence length"),
    (dict(int_q=True), TypeError, "floating-point tensor"),
    (dict(sin_shape=True), ValueError, "must have the same shape"),
]


@pytest.mark.parametrize("bad,err,match", BAD)
def test_same_errors_as_eager(bad, err, match):
    D, rot = bad.get("D", 12), bad.get("rot", 12)
    q = torch.randn(1, 2, 5, D)
    k = torch.randn(1, 2, 5, D)
    if bad.get("int_q"):
        q = q.long()
    cos = torch.randn(bad.get("L_cos", 5), rot // 2)
    sin = cos[:, :-1] if bad.get("sin_shape") else cos
    kw = {key: bad[key] for key in ("channels", "seq_dim") if key in bad}
    with pytest.raises(err, match=match):
        apply_rotary_qk(q, k, cos, sin, **kw)
    with pytest.raises(err, match=match):
        apply_rotary_qk_fused(q, k, cos, sin, **kw)


def test_keys_are_validated_too():
    q, _, cos, sin = _inputs(torch.float32)
    with pytest.raises(ValueError, match="sequence length"):
        apply_rotary_qk_fused(q, torch.randn(2, 1, 7, 12), cos, sin)


@pytest.mark.parametrize("channels,rot,seq_dim", [("half", 8, -2), ("interleaved", 12, 1)])
def test_traces_without_graph_breaks(channels, rot, seq_dim):
    q, k, cos, sin = _inputs(torch.bfloat16, channels_first=seq_dim == -2, rot=rot)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(apply_rotary_qk_fused)(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_fullgraph_compile_matches_eager():
    q, k, cos, sin = _inputs(torch.bfloat16, rot=8)
    torch._dynamo.reset()
    compiled = torch.compile(apply_rotary_qk_fused, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, cos, sin, channels="interleaved")
    ref = apply_rotary_qk(q, k, cos, sin, channels="interleaved")
    assert all(torch.equal(o, r) for o, r in zip(out, ref))


def test_cpu_without_triton_falls_back(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, k, cos, sin = _inputs(torch.float32)
    assert not triton_rope.available(q.device)
    assert not triton_rope.supports(q, k, cos, sin)
    monkeypatch.setattr(triton_rope, "_triton_importable", lambda: False)
    assert not triton_rope.available("cuda")
    with pytest.raises(RuntimeError, match="needs triton"):
        triton_rope.apply_rotary_triton(q, cos, sin)
    out = apply_rotary_qk_fused(q, k, cos, sin)
    assert all(torch.equal(o, r) for o, r in zip(out, apply_rotary_qk(q, k, cos, sin)))


# --- Triton kernel, run on CPU tensors by Triton's interpreter (TRITON_INTERPRET=1) -----------------

# triton is in the test extra wherever it ships wheels (Linux x86_64): there a missing triton is a
# set-up error and these tests fail; elsewhere the Triton backend cannot exist and they are skipped.
TRITON_PLATFORM = platform.system() == "Linux" and platform.machine() == "x86_64"
needs_triton = pytest.mark.skipif(
    not HAS_TRITON and not TRITON_PLATFORM, reason="no triton wheels for this platform (CUDA backend only)"
)


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _ulp_tol(dtype):
    # the interpreter casts float32 -> bfloat16 by truncation (GPUs round to nearest): allow one ulp
    return {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 2 ** -7}[dtype]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels", ["half", "interleaved"])
@pytest.mark.parametrize("rot,seq_dim,cos_dims", [(12, -2, 2), (8, 1, 3), (6, -2, 4)])
def test_triton_kernel_matches_eager(interpret, dtype, channels, rot, seq_dim, cos_dims):
    q, k, cos, sin = _inputs(dtype, channels_first=seq_dim == -2, rot=rot, cos_dims=cos_dims, Hk=3)
    assert triton_rope.supports(q, k, cos, sin)  # so apply_rotary_qk_fused dispatches to the kernel
    ref = apply_rotary_qk(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    out = apply_rotary_qk_fused(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    direct = triton_rope.apply_rotary_triton(q, cos, sin, channels=channels, seq_dim=seq_dim)
    tol = _ulp_tol(dtype)
    for o, r, x in zip(out, ref, (q, k)):
        assert o.dtype == r.dtype and o.shape == r.shape
        torch.testing.assert_close(o, r, rtol=tol, atol=tol)
        if rot < o.shape[-1]:
            assert torch.equal(o[..., rot:], x[..., rot:])
    assert torch.equal(direct, out[0])


@needs_triton
def test_triton_backward_is_inverse_rotation(interpret):
    q, _, cos, sin = _inputs(torch.float32, rot=8)
    x = q.clone().requires_grad_(True)
    y = q.clone().requires_grad_(True)
    w = torch.randn(q.shape)
    (triton_rope.apply_rotary_triton(x, cos, sin, channels="interleaved") * w).sum().backward()
    (apply_rotary_qk(y, y, cos, sin, channels="interleaved")[0] * w).sum().backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=2e-6, atol=2e-6)


@needs_triton
def test_triton_keeps_float64_and_cos_grads_on_torch_path(interpret):
    q, k, cos, sin = _inputs(torch.float64)
    assert not triton_rope.supports(q, k, cos, sin)
    q32, k32, cos32, sin32 = _inputs(torch.float32)
    assert not triton_rope.supports(q32, k32, cos32.requires_grad_(True), sin32)
    assert fused._triton_ok(q32, k32, cos32.detach(), sin32, -2)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bad,where", [(float("nan"), 0), (float("inf"), 6), (-float("inf"), 12), (1e39, 9)])
def test_non_finite_cos_sin_raise_on_every_path(monkeypatch, threads, bad, where):
    # the fused path checks cos/sin once for q and k, split over the worker jobs when blocks are threaded;
    # every path must reject a bad value wherever it sits (1e39 is finite in float64, inf in float32)
    monkeypatch.setattr(fused, "_BLOCK_ELEMS", 2 * 2 * 3 * 12)  # 7 blocks of 2 positions
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for arg in (2, 3):  # cos, then sin
            q, k, *cs = _inputs(torch.bfloat16, Hk=3, L=13, seed=4)
            cs = [t.double() for t in cs]
            cs[arg - 2][where, where % 6] = bad
            for call in (lambda: apply_rotary_qk(q, k, *cs), lambda: apply_rotary_qk_fused(q, k, *cs),
                         lambda: apply_rotary_fused(k, *cs)):
                with pytest.raises(ValueError, match=f"`{('cos', 'sin')[arg - 2]}` holds NaN or inf in torch.float32"):
                    call()
            if bad == 1e39:  # float64 inputs rotate in float64, where the value is finite
                out = apply_rotary_qk_fused(q.double(), k.double(), *cs)
                ref = apply_rotary_qk(q.double(), k.double(), *cs)
                assert all(torch.equal(o, r) for o, r in zip(out, ref))
    finally:
        torch.set_num_threads(before)


# --- the compiled CPU kernel (Inductor), the default for large calls without gradients --------------

@pytest.mark.parametrize("dtype,channels,rot,seq_dim,cos_dims", [
    (torch.bfloat16, "half", 12, -2, 2),  # the common case: every channel, shared tables
    (torch.float32, "interleaved", 8, 1, 3),  # partial rotary, (B, L, H, D) views, per-sample tables
])
def test_compiled_cpu_kernel_gives_the_reference_bits_and_layout(monkeypatch, dtype, channels, rot, seq_dim,
                                                                cos_dims):
    """Against the eager reference bit for bit (the float64 brute force fixes that reference) and with
    the reference's output strides, so downstream ``.view`` calls behave the same."""
    def no_eager(*args, **kwargs):
        raise AssertionError("compiled=True must not fall back to the eager blocks")
    monkeypatch.setattr(fused, "_rotate_eager", no_eager)
    q, k, cos, sin = _inputs(dtype, channels_first=seq_dim == -2, Hk=3, rot=rot, cos_dims=cos_dims)
    out = apply_rotary_qk_fused(q, k, cos, sin, channels=channels, seq_dim=seq_dim, compiled=True)
    ref = apply_rotary_qk(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    for o, r, x in zip(out, ref, (q, k)):
        assert torch.equal(o, r) and o.stride() == r.stride() and o.dtype == dtype
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(o.double(), _brute_force(x, cos, sin, channels, seq_dim), atol=tol, rtol=tol)
    bad = cos.clone()
    bad.view(-1)[3] = float("nan")
    with pytest.raises(ValueError, match="`cos` holds NaN"):
        apply_rotary_qk_fused(q, k, bad, sin, channels=channels, seq_dim=seq_dim, compiled=True)


@pytest.mark.parametrize("compiled", [False, True])
def test_output_memory_format_follows_the_reference(compiled):
    """A channels-last laid-out q (heads innermost) gives a channels-last output on every path, as the
    reference's ``cat`` does; a plain (B, L, H, D) transposed view gives a contiguous one."""
    g = torch.Generator().manual_seed(4)
    cos, sin = torch.rand(2, 7, 4, generator=g).unbind(0)
    for x in (torch.randn(1, 7, 8, 5, generator=g).permute(0, 3, 1, 2),
              torch.randn(1, 7, 5, 8, generator=g).transpose(1, 2)):
        ref = apply_rotary_qk(x, x, cos, sin)[0]
        out = apply_rotary_fused(x, cos, sin, compiled=compiled)
        assert torch.equal(out, ref) and out.stride() == ref.stride()


def test_forward_mode_ad_and_vmap_take_the_functional_path(monkeypatch):
    """Dual tensors and torch.func transforms never reach the compiled kernel or the out= blocks:
    the tangent is the rotation of the tangent (the map is linear in x), vmap gives the per-sample
    rotation, and neither turns the compiled path off."""
    import torch.autograd.forward_ad as fwAD

    monkeypatch.setattr(fused, "_COMPILED_MIN_ELEMS", 1)
    monkeypatch.setattr(fused, "_COMPILE_FAILED", False)
    q, k, cos, sin = _inputs(torch.float32)
    tangent = torch.randn_like(q)
    with fwAD.dual_level():
        out = apply_rotary_fused(fwAD.make_dual(q, tangent), cos, sin)
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, apply_rotary_qk(tangent, k, cos, sin)[0])
    stacked = torch.stack((q, 2 * q))
    mapped = torch.func.vmap(lambda x: apply_rotary_fused(x, cos, sin))(stacked)
    torch.testing.assert_close(mapped[1], apply_rotary_qk(2 * q, k, cos, sin)[0])
    assert not fused._COMPILE_FAILED


def test_automatic_choice_of_the_compiled_kernel(monkeypatch):
    """compiled=None takes the kernel for calls of at least the threshold, on CPU, without gradients,
    unless ROPEKIT_COMPILE=0; a kernel that fails warns once and leaves the eager path in charge."""
    calls = []
    real = fused._apply_compiled
    monkeypatch.setattr(fused, "_apply_compiled", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(fused, "_COMPILED_MIN_ELEMS", 2 * 2 * 3 * 5 * 12)  # exactly q and k of _inputs
    monkeypatch.setattr(fused, "_COMPILE_FAILED", False)
    q, k, cos, sin = _inputs(torch.bfloat16, Hk=3)
    ref = apply_rotary_qk(q, k, cos, sin)
    assert all(torch.equal(o, r) for o, r in zip(apply_rotary_qk_fused(q, k, cos, sin), ref)) and len(calls) == 1
    apply_rotary_qk_fused(q[:1], k[:1], cos, sin)  # below the threshold
    apply_rotary_qk_fused(q, k, cos, sin, compiled=False)
    apply_rotary_qk_fused(q.requires_grad_(), k, cos, sin)  # autograd: the functional eager path
    with pytest.warns(torch.jit.TracerWarning):  # torch.jit.trace records the eager ops, never the kernel
        torch.jit.trace(lambda a, b: apply_rotary_qk_fused(a, b, cos, sin), (q.detach(), k), check_trace=False)
    monkeypatch.setenv("ROPEKIT_COMPILE", "0")
    apply_rotary_qk_fused(q.detach(), k, cos, sin)
    assert len(calls) == 1
    monkeypatch.delenv("ROPEKIT_COMPILE")

    def broken(*args):
        raise RuntimeError("no C++ compiler")
    monkeypatch.setattr(fused, "_compiled", lambda key: broken)
    q = q.detach()
    with pytest.warns(RuntimeWarning, match="compiled CPU rotary kernel failed.*no C\\+\\+ compiler"):
        out = apply_rotary_qk_fused(q, k, cos, sin)
    assert all(torch.equal(o, r) for o, r in zip(out, ref)) and fused._COMPILE_FAILED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_rotary_qk_fused(q, k, cos, sin)  # no second warning, no second attempt
    assert len(calls) == 2
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler"):
        apply_rotary_qk_fused(q, k, cos, sin, compiled=True)  # forced: the error is the caller's


# 3 dtypes x 2 layouts x (full, partial) rotary widths x 2 pairings: far more variants than the 8
# compilations Dynamo keeps for one code object, each checked against the eager bits and the brute force
VARIANTS = [(dtype, seq_dim, D, rot, channels, cos_dims)
            for dtype in (torch.float32, torch.bfloat16, torch.float64)
            for seq_dim, cos_dims in ((-2, 2), (1, 3))
            for D, rot, channels in ((12, 12, "half"), (16, 8, "interleaved"))]


def _variant_inputs(dtype, seq_dim, D, rot, cos_dims, L=5):
    return _inputs(dtype, channels_first=seq_dim == -2, Hk=2, L=L, D=D, rot=rot, cos_dims=cos_dims, seed=D + L)


def test_compiled_kernel_serves_any_number_of_variants(monkeypatch):
    """compiled=True keeps working however many dtypes, widths, pairings and layouts one process uses
    (it used to raise FailOnRecompileLimitHit at about the ninth), with the reference's bits each time."""
    def no_eager(*args, **kwargs):
        raise AssertionError("compiled=True must not fall back to the eager blocks")
    monkeypatch.setattr(fused, "_rotate_eager", no_eager)
    assert len(VARIANTS) >= 12
    for L in (5, 6):  # a second size per variant: its recompilation counts against the same limit
        for dtype, seq_dim, D, rot, channels, cos_dims in VARIANTS:
            q, k, cos, sin = _variant_inputs(dtype, seq_dim, D, rot, cos_dims, L=L)
            out = apply_rotary_qk_fused(q, k, cos, sin, channels=channels, seq_dim=seq_dim, compiled=True)
            ref = apply_rotary_qk(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
            tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1.6e-2}[dtype]
            for o, r, x in zip(out, ref, (q, k)):
                assert o.dtype == dtype and torch.equal(o, r), (dtype, seq_dim, D, rot, channels, L)
                torch.testing.assert_close(o.double(), _brute_force(x, cos, sin, channels, seq_dim),
                                           rtol=tol, atol=tol * 4)


def test_compiled_kernel_recovers_from_the_recompile_limit():
    """Sizes of one variant changing in more ways than Dynamo recompiles (here a limit of 1) give that
    variant a fresh compiled copy instead of an error."""
    # config.patch, not monkeypatch: undoing a monkeypatch on torch's config module deletes the option
    with torch._dynamo.config.patch(recompile_limit=1):
        for L in (3, 4, 7):
            q, k, cos, sin = _variant_inputs(torch.float32, -2, 10, 10, 2, L=L)
            out = apply_rotary_qk_fused(q, k, cos, sin, compiled=True)
            assert all(torch.equal(o, r) for o, r in zip(out, apply_rotary_qk(q, k, cos, sin)))


class _WarningRecords(logging.Handler):
    """Collects the warnings torch's loggers emit (they print to stderr and do not propagate to the root)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def test_automatic_compiled_path_stays_quiet_across_variants(monkeypatch, capfd):
    """compiled=None over many variants: every call compiled, no Python warning, no Dynamo recompile
    warning on stderr (the shared compiled body used to hit the recompile limit and log on every call)."""
    monkeypatch.setattr(fused, "_COMPILED_MIN_ELEMS", 1)
    monkeypatch.setattr(fused, "_COMPILE_FAILED", False)
    monkeypatch.setattr(fused, "_rotate_eager", lambda *a, **kw: pytest.fail("the automatic path ran eagerly"))
    records = _WarningRecords()
    loggers = [logging.getLogger(name) for name in ("torch", "torch._dynamo", "torch._inductor")]
    for logger in loggers:
        logger.addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch's own, on first compile
            for dtype, seq_dim, D, rot, channels, cos_dims in VARIANTS:
                q, k, cos, sin = _variant_inputs(dtype, seq_dim, D, rot, cos_dims, L=7)
                out = apply_rotary_fused(q, cos, sin, channels=channels, seq_dim=seq_dim)
                assert torch.equal(out, apply_rotary_qk(q, k, cos, sin, channels=channels, seq_dim=seq_dim)[0])
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    assert [str(w.message) for w in caught] == []
    assert [r.getMessage() for r in records.records] == []
    assert "recompile" not in capfd.readouterr().err
    assert not fused._COMPILE_FAILED


def test_compiled_argument_is_checked():
    q, k, cos, sin = _inputs(torch.float32)
    with pytest.raises(TypeError, match="`compiled` must be True, False or None"):
        apply_rotary_qk_fused(q, k, cos, sin, compiled="yes")
    with pytest.raises(ValueError, match="`compiled=True` needs CPU tensors without gradients"):
        apply_rotary_fused(q.requires_grad_(), cos, sin, compiled=True)


@pytest.mark.parametrize("value,on", [("0", False), ("false", False), ("OFF", False), ("no", False), ("1", True)])
def test_rope_kit_compile_variable(monkeypatch, value, on):
    monkeypatch.setenv("ROPEKIT_COMPILE", value)
    assert fused._env_allows_compile() is on


# --- out= and in place ---------------------------------------------------------------------------------

OUT_CASES = [(dtype, channels, rot, seq_dim, cos_dims) for dtype in DTYPES for channels in ("half", "interleaved")
             for rot, seq_dim, cos_dims in ((12, -2, 2), (8, 1, 3), (12, 1, 4), (8, -2, 4))]


def _assert_into(q, k, cos, sin, want, **kw):
    """``out=`` into fresh buffers and in place both give ``want`` bit for bit and return the buffers."""
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    got = apply_rotary_qk_fused(q, k, cos, sin, out=(qo, ko), **kw)
    assert got[0] is qo and got[1] is ko
    assert torch.equal(qo, want[0]) and torch.equal(ko, want[1])
    qi, ki = q.clone(), k.clone()
    got = apply_rotary_qk_fused(qi, ki, cos, sin, out=(qi, ki), **kw)
    assert got[0] is qi and got[1] is ki
    assert torch.equal(qi, want[0]) and torch.equal(ki, want[1])


@pytest.mark.parametrize("dtype,channels,rot,seq_dim,cos_dims", OUT_CASES)
def test_out_and_in_place_give_the_functional_bits(dtype, channels, rot, seq_dim, cos_dims):
    """Every path of ``out=`` (the compiled CPU kernel for "half" pairs, the eager blocks) and in place: the
    eager reference's bits, which the float64 pair-by-pair rotation pins to the input dtype's rounding."""
    q, k, cos, sin = _inputs(dtype, channels_first=seq_dim == -2, Hk=3 if cos_dims == 4 else 1, L=37, rot=rot,
                             cos_dims=cos_dims)
    want = apply_rotary_qk(q, k, cos, sin, channels=channels, seq_dim=seq_dim)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    for r, x in zip(want, (q, k)):
        torch.testing.assert_close(r.double(), _brute_force(x, cos, sin, channels, seq_dim), rtol=tol, atol=tol * 4)
    for compiled in (None, False):
        _assert_into(q, k, cos, sin, want, channels=channels, seq_dim=seq_dim, compiled=compiled)
    x = q.clone()
    assert apply_rotary_fused(x, cos, sin, channels=channels, seq_dim=seq_dim, out=x) is x
    assert torch.equal(x, want[0])


@pytest.mark.parametrize("dtype,channels,rot", [(torch.float64, "half", 12), (torch.bfloat16, "interleaved", 8),
                                                (torch.float32, "interleaved", 12)])
def test_out_through_the_inductor_kernel_gives_the_functional_bits(dtype, channels, rot):
    """Where the compiled CPU kernel does not apply (float64, interleaved pairs), ``compiled=True`` writes
    through Inductor's code into the buffers: the same bits."""
    q, k, cos, sin = _inputs(dtype, Hk=3, L=40, rot=rot)
    want = apply_rotary_qk(q, k, cos, sin, channels=channels)
    _assert_into(q, k, cos, sin, want, channels=channels, compiled=True)


def test_the_compiled_cpu_kernel_serves_half_pairs_of_large_calls(monkeypatch):
    """The kernel itself (no eager fallback) on the shapes benchmarks use, bit for bit, in place too, with
    tables shared by the batch, per sample and per head."""
    if fused._cpu_kernel.kernel_for(torch.float32) is None:
        pytest.skip("no C++ toolchain for the compiled CPU kernel here")

    def no_eager(*args, **kwargs):
        raise AssertionError("out= with 'half' pairs must take the compiled CPU kernel")
    monkeypatch.setattr(fused, "_rotate_eager", no_eager)
    monkeypatch.setattr(fused, "_apply_compiled", no_eager)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for cos_dims, seq_dim, rot in ((2, -2, 128), (3, 1, 96), (4, -2, 128)):
            q, k, cos, sin = _inputs(dtype, channels_first=seq_dim == -2, B=2, Hq=4, Hk=4 if cos_dims == 4 else 2,
                                     L=300, D=128, rot=rot, cos_dims=cos_dims)
            want = apply_rotary_qk(q, k, cos, sin, seq_dim=seq_dim)
            _assert_into(q, k, cos, sin, want, seq_dim=seq_dim)


def test_out_views_of_one_projection_are_rotated_in_place():
    """q and k sliced from one qkv projection (interleaved in memory, not overlapping) may be rotated in place;
    v, which shares their storage, is untouched."""
    qkv = torch.randn(2, 9, 3, 4, 16)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)
    cos, sin = _inputs(torch.float32, L=9, D=16, rot=16)[2:]
    want = apply_rotary_qk(q, k, cos, sin)
    v_before = v.clone()
    apply_rotary_qk_fused(q, k, cos, sin, out=(q, k))
    assert torch.equal(q, want[0]) and torch.equal(k, want[1]) and torch.equal(v, v_before)


def test_out_is_refused_with_the_argument_named():
    q, k, cos, sin = _inputs(torch.float32, Hk=3)
    good = (torch.empty_like(q), torch.empty_like(k))
    cases = [
        (TypeError, r"`out` must be a pair", good[0]),
        (TypeError, r"`out` must be a pair", (good[0],)),
        (TypeError, r"`out\[1\]` must be a torch.Tensor", (good[0], None)),
        (TypeError, r"`out\[0\]` has dtype torch.float64", (good[0].double(), good[1])),
        (ValueError, r"`out\[1\]` has shape", (good[0], good[1][:, :, :-1])),
        (ValueError, r"`out\[0\]` is on meta", (torch.empty_like(q, device="meta"), good[1])),
        (ValueError, r"`out\[0\]` has elements that share memory", (torch.empty(q.shape[-1]).expand(q.shape), good[1])),
        (ValueError, r"`out\[0\]` overlaps the memory of `k`", (k, q)),  # swapped: each overlaps the other input
        (ValueError, r"`out\[0\]` overlaps the memory of `out\[1\]`", (good[0], good[0])),
    ]
    for exc, match, out in cases:
        with pytest.raises(exc, match=match):
            apply_rotary_qk_fused(q, k, cos, sin, out=out)
    # overlapping but not the same view: q shifted by one element in its own storage
    base = torch.randn(q.numel() + 1)
    q_view, shifted = base[:-1].view(q.shape), base[1:].view(q.shape)
    with pytest.raises(ValueError, match=r"`out\[0\]` overlaps the memory of `q`.*pass `q` itself"):
        apply_rotary_qk_fused(q_view, k, cos, sin, out=(shifted, good[1]))
    # an output over the tables
    table = torch.empty(q.numel() + cos.numel())
    c_view = table[: cos.numel()].view(cos.shape)
    c_view.copy_(cos)
    with pytest.raises(ValueError, match=r"`out\[0\]` overlaps the memory of `cos`"):
        apply_rotary_qk_fused(q, k, c_view, sin, out=(table[: q.numel()].view(q.shape), good[1]))
    with pytest.raises(ValueError, match="`out` overlaps the memory of `x`"):
        apply_rotary_fused(q_view, cos, sin, out=shifted)
    # autograd cannot flow through out=
    qg = q.clone().requires_grad_()
    with pytest.raises(ValueError, match="not differentiable"):
        apply_rotary_qk_fused(qg, k, cos, sin, out=good)
    with torch.no_grad():
        apply_rotary_qk_fused(qg, k, cos, sin, out=good)
    assert torch.equal(good[0], apply_rotary_qk(q, k, cos, sin)[0])


@pytest.mark.parametrize("compiled", [None, False, True])
def test_out_without_elements_is_accepted_like_the_call_without_out(compiled):
    """A zero-element output has no elements that could share memory, whatever its strides (an expanded
    or zero-stride view of nothing): ``out=`` takes it and returns what the call without ``out`` returns
    (the eager reference's empty result), in place too."""
    for B, H, L in ((0, 3, 5), (2, 0, 5), (2, 3, 0)):
        for dtype in (torch.float32, torch.bfloat16):
            q, k, cos, sin = _inputs(dtype, B=B, Hq=H, Hk=H, L=L)
            shape = q.shape
            want = apply_rotary_qk(q, k, cos, sin)
            assert torch.equal(apply_rotary_qk_fused(q, k, cos, sin, compiled=compiled)[0], want[0])
            for make in (lambda: torch.empty(shape, dtype=dtype),
                         lambda: torch.empty_strided(shape, (0,) * len(shape), dtype=dtype),
                         lambda: torch.empty((1, *shape[1:]), dtype=dtype).expand(shape)):
                outs = (make(), make())
                got = apply_rotary_qk_fused(q, k, cos, sin, compiled=compiled, out=outs)
                assert got[0] is outs[0] and got[1] is outs[1]
                for g, w in zip(got, want):
                    assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w)
                one = make()
                assert apply_rotary_fused(q, cos, sin, compiled=compiled, out=one) is one
            got = apply_rotary_qk_fused(q, k, cos, sin, compiled=compiled, out=(q, k))
            assert got[0] is q and got[1] is k
