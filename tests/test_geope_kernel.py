"""GeoPE's compiled CPU kernel for the paper's interleaved layout (ropekit.apply._cpu_kernel) and the operator
that torch.compile calls (``ropekit::geope_interleaved``): the blocked eager path's bits exactly (the
reference users get without torch.compile), the rotation itself against a float64 rotation built here with
``matrix_exp`` (independent of the library's weights), gradients, and the stand-in used without a compiler."""
import pytest
import torch

from ropekit.apply import _cpu_kernel
from ropekit.apply import geope as geo
from ropekit.apply.geope import apply_geope, apply_geope_qk
from ropekit.rotations.geope import geope_frequencies, geope_rotation, lie_embedding

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _has_kernel() -> bool:
    return _cpu_kernel.geope_kernel_for(torch.float32) is not None and _cpu_kernel.addcmul_fuses() is not None


needs_compiler = pytest.mark.skipif(not _has_kernel(), reason="no C++ compiler for the kernel (or torch.compile)")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test's compiled functions start with no cached graphs (Dynamo caps recompiles per function)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def skew_exp_rotations(coords, freqs):
    """R (..., L, n, 3, 3) in float64: exp of the skew matrix of each triple's rotation vector φ = ω_i E(p)."""
    phi = lie_embedding(coords.double())[..., None, :] * freqs.double()[:, None]
    a, b, c = phi.unbind(-1)
    z = torch.zeros_like(a)
    K = torch.stack((torch.stack((z, -c, b), -1), torch.stack((c, z, -a), -1), torch.stack((-b, a, z), -1)), -2)
    return torch.linalg.matrix_exp(K)


def rotate_reference(x, R, seq_dim):
    """x (B, H, L, D) (seq_dim -2) or (B, L, H, D) (seq_dim 1), triple i at channels 3i..3i+2, rotated in float64
    by R ((L, n, 3, 3) or (B, L, n, 3, 3)); channels past 3n unchanged."""
    n = R.shape[-3]
    xd = x.double()
    if seq_dim == 1:
        xd = xd.transpose(1, 2)
    if R.ndim == 5:
        R = R[:, None]
    v = xd[..., : 3 * n].unflatten(-1, (n, 3))
    out = torch.cat(((R @ v[..., None])[..., 0].flatten(-2), xd[..., 3 * n:]), -1)
    return out.transpose(1, 2) if seq_dim == 1 else out


def _case(D, seq_dim, batched, dtype, seed=0, B=2, H=3, L=37):
    g = torch.Generator().manual_seed(seed)
    coords = torch.randn(B, L, 3, generator=g) * 5 if batched else torch.randn(L, 2, generator=g) * 5
    shape = (B, H, L, D) if seq_dim == -2 else (B, L, H, D)
    x = torch.randn(shape, generator=g).to(dtype)
    return x, coords, geope_rotation(coords, D)


@needs_compiler
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq_dim", [-2, 1])
@pytest.mark.parametrize("D", [12, 14])  # every channel rotated (one run per block) / two pass-through channels
def test_compiled_interleaved_gives_the_eager_paths_bits(dtype, seq_dim, D):
    """torch.compile(apply_geope_qk) in the paper's layout runs the kernel and equals the blocked eager path
    exactly (L = 37: a ragged last block of positions), with a shared and a per-sample rotation."""
    compiled = torch.compile(apply_geope_qk, fullgraph=True, dynamic=True)
    for batched in (False, True):
        q, coords, rot = _case(D, seq_dim, batched, dtype)
        k = (q.float() * 0.5 - 1).to(dtype)
        ref_q, ref_k = apply_geope_qk(q, k, rot, seq_dim=seq_dim)  # the blocked eager path (below the kernel's size)
        out_q, out_k = compiled(q, k, rot, seq_dim=seq_dim)
        assert out_q.dtype == dtype and out_q.shape == q.shape
        assert torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k)
        R = skew_exp_rotations(coords, geope_frequencies(D))
        tol = dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.03, rtol=0.02)
        torch.testing.assert_close(out_q.double(), rotate_reference(q, R, seq_dim), **tol)


@needs_compiler
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_reads_planes_in_place_or_packed_triples_with_the_same_bits(dtype):
    """Direct kernel calls: weight planes read in place and packed triples laid out per block give the eager
    path's bits, for a (H, L, D) sample, a non-contiguous input and a head dim whose rows are not one run."""
    kern = _cpu_kernel.geope_kernel_for(dtype)
    fused = _cpu_kernel.addcmul_fuses()
    g = torch.Generator().manual_seed(3)
    L, D = 21, 15
    rot = geope_rotation(torch.randn(L, 2, generator=g) * 3, D)
    xs = [torch.randn(4, L, D, generator=g).to(dtype),  # one (H, L, D) sample
          torch.randn(2, L, 4, D, generator=g).to(dtype).transpose(1, 2),  # (B, H, L, D) view of (B, L, H, D)
          torch.randn(2, 4, L, 2 * D, generator=g).to(dtype)[..., ::2]]  # channels strided: not supported
    for x in xs:
        ref = apply_geope(x, rot)
        if not _cpu_kernel.geope_supports(x):
            assert x.stride(-1) != 1
            continue
        for planes, w in ((True, rot.planes), (False, rot.triples)):
            out = torch.empty_like(x)
            _cpu_kernel.rotate_geope_into(kern, x, w, out, -2, planes=planes, fused=fused)
            assert torch.equal(out, ref)


@needs_compiler
def test_unfused_mode_gives_the_separately_rounded_sums():
    """Where ATen's addcmul rounds product and sum apart (its default kernels), the kernel does too: then it
    equals the in-triple form evaluated with plain products and sums (float32 throughout, no fused ops)."""
    x, _, rot = _case(12, -2, True, torch.float32, seed=4)
    kern = _cpu_kernel.geope_kernel_for(torch.float32)
    out = torch.empty_like(x)
    _cpu_kernel.rotate_geope_into(kern, x, rot.planes, out, -2, planes=True, fused=False)
    w = rot.triples[:, None]
    v0, v1, v2 = x.unflatten(-1, (4, 3)).unbind(-1)
    t = w.unbind(-1)
    expected = torch.stack((t[0] * v0 + t[1] * v1 + t[2] * v2,
                            t[3] * v1 + t[4] * v2 + t[5] * v0,
                            t[6] * v2 + t[7] * v1 + t[8] * v0), -1).flatten(-2)
    assert torch.equal(out, expected)


def test_addcmul_probe_matches_a_direct_check():
    """The probe's answer is what addcmul does to a long and a short tensor of values where fusing matters."""
    mode = _cpu_kernel.addcmul_fuses()
    g = torch.Generator().manual_seed(5)
    a, b, c = torch.randn(3, 4099, generator=g)
    exact = (a.double() + b.double() * c.double()).float()  # the product of two floats is exact in float64
    got = torch.addcmul(a, b, c)
    fused_like = (got == exact).float().mean().item()
    if mode is True:
        assert fused_like > 0.999
    elif mode is False:
        assert torch.equal(got, a + b * c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_without_the_kernel_the_operator_still_gives_the_eager_bits(monkeypatch, dtype):
    """No compiler (the kernel cannot be built): the operator's stand-in sums with ATen's addcmul in the eager
    path's order, so torch.compile (here its eager backend, which needs no compiler) still gives those bits."""
    monkeypatch.setattr(_cpu_kernel, "geope_kernel_for", lambda dtype: None)
    for seq_dim, D in ((-2, 12), (1, 14)):
        x, _, rot = _case(D, seq_dim, True, dtype, seed=6)
        ref = apply_geope(x, rot, seq_dim=seq_dim)
        assert torch.equal(torch.ops.ropekit.geope_interleaved(x, rot.planes, seq_dim), ref)
        compiled = torch.compile(apply_geope, backend="eager", fullgraph=True)
        assert torch.equal(compiled(x, rot, seq_dim=seq_dim), ref)


@needs_compiler
def test_large_eager_calls_take_the_kernel_with_unchanged_results(monkeypatch):
    """Eager calls of at least ``_KERNEL_MIN_ELEMS`` elements run the kernel; the blocked eager path
    (``ROPEKIT_COMPILE=0``) gives the same bits. A NaN stays inside its triple on both."""
    x, _, rot = _case(12, -2, False, torch.bfloat16, seed=7)
    x[0, 1, 5, 4] = float("nan")
    monkeypatch.setenv("ROPEKIT_COMPILE", "0")
    ref = apply_geope(x, rot)
    monkeypatch.setenv("ROPEKIT_COMPILE", "1")
    monkeypatch.setattr(geo, "_KERNEL_MIN_ELEMS", 0)
    calls = []
    real = _cpu_kernel.rotate_geope_into
    monkeypatch.setattr(_cpu_kernel, "rotate_geope_into", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = apply_geope(x, rot)
    assert calls
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(), ref.nan_to_num())
    nan_rows = out.isnan().nonzero()
    assert {tuple(r) for r in nan_rows.tolist()} == {(0, 1, 5, c) for c in (3, 4, 5)}


@pytest.mark.parametrize("kernel", [True, False])
def test_gradients_through_the_operator_are_the_transposed_rotation(monkeypatch, kernel):
    """The operator's backward applies Rᵀ (the same operator with the transposed weights): the gradient of
    Σ g·Rx in x is Rᵀg (float64 check), and of ‖Rx‖² it is 2x (a rotation keeps norms), eager and compiled."""
    if kernel and not _has_kernel():
        pytest.skip("no C++ compiler for the kernel")
    if not kernel:
        monkeypatch.setattr(_cpu_kernel, "geope_kernel_for", lambda dtype: None)
    x, coords, rot = _case(14, -2, True, torch.float32, seed=8)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(9))
    R = skew_exp_rotations(coords, geope_frequencies(14))
    xg = x.clone().requires_grad_(True)
    (torch.ops.ropekit.geope_interleaved(xg, rot.planes, -2) * g).sum().backward()
    # Rᵀg per triple: rotate by the transposed float64 matrices
    expected = rotate_reference(g, R.transpose(-1, -2), -2)
    torch.testing.assert_close(xg.grad.double(), expected, atol=2e-5, rtol=1e-5)
    if kernel:
        xc = x.clone().requires_grad_(True)
        out = torch.compile(apply_geope, fullgraph=True)(xc, rot)
        assert torch.equal(out.detach(), apply_geope(x, rot))
        out.square().sum().backward()
        torch.testing.assert_close(xc.grad[..., :12], 2 * x[..., :12], atol=1e-5, rtol=1e-5)


@needs_compiler
@pytest.mark.parametrize("seq_dim", [-2, 1])
def test_queries_and_keys_in_one_call_with_other_head_counts(monkeypatch, seq_dim):
    """apply_geope_qk rotates q and k (grouped-query: fewer key heads) with one kernel call when both take it;
    each equals its own blocked eager rotation, and the pair's backward is Rᵀ on each gradient."""
    g = torch.Generator().manual_seed(10)
    B, L, D = 2, 19, 12
    coords = torch.randn(B, L, 2, generator=g) * 4
    rot = geope_rotation(coords, D)
    shape = lambda h: (B, h, L, D) if seq_dim == -2 else (B, L, h, D)  # noqa: E731
    q, k = torch.randn(shape(4), generator=g), torch.randn(shape(2), generator=g)
    monkeypatch.setenv("ROPEKIT_COMPILE", "0")
    ref_q, ref_k = apply_geope(q, rot, seq_dim=seq_dim), apply_geope(k, rot, seq_dim=seq_dim)
    monkeypatch.setenv("ROPEKIT_COMPILE", "1")
    monkeypatch.setattr(geo, "_KERNEL_MIN_ELEMS", 0)
    calls = []
    real = _cpu_kernel.rotate_geope_into
    monkeypatch.setattr(_cpu_kernel, "rotate_geope_into", lambda *a, **kw: calls.append(len(a[1])) or real(*a, **kw))
    out_q, out_k = apply_geope_qk(q, k, rot, seq_dim=seq_dim)
    assert calls == [2]
    assert torch.equal(out_q, ref_q) and torch.equal(out_k, ref_k)
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    oq, ok = torch.ops.ropekit.geope_interleaved_qk(qg, kg, rot.planes, seq_dim)
    (oq.square().sum() + ok.square().sum()).backward()
    torch.testing.assert_close(qg.grad, 2 * q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kg.grad, 2 * k, atol=1e-5, rtol=1e-5)
