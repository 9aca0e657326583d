"""GeoPE's ``channels="thirds"`` layout (triple i = channels i, n+i, 2n+i) against a float64 rotation
built here with ``matrix_exp`` of the rotation vector's skew matrix (independent of Rodrigues' formula and
of the library's weights), and against the interleaved layout through the channel permutation that
relates them (q·k and attention outputs are unchanged when q and k share a layout)."""
import pytest
import torch

from ropekit import GeoPE, apply_geope, apply_geope_qk, linear_geope_attention
from ropekit.rotations.geope import GeoPERotation, geope_frequencies, geope_rotation, lie_embedding


def skew_exp_rotations(coords, freqs):
    """R (L, n, 3, 3) in float64: exp of the skew matrix of GeoPE's rotation vector φ_i = ω_i · E(p), with
    E(p) = (0, p, 0), (0, p_h, p_w)/2 or (p_d, p_h, p_w)/3 (the Lie-algebra mean of the axis rotations)."""
    phi = lie_embedding(coords.double())[..., None, :] * freqs.double()[:, None]  # (L, n, 3)
    a, b, c = phi.unbind(-1)
    z = torch.zeros_like(a)
    K = torch.stack((torch.stack((z, -c, b), -1), torch.stack((c, z, -a), -1), torch.stack((-b, a, z), -1)), -2)
    return torch.linalg.matrix_exp(K)


def rotate_thirds_reference(x, R):
    """x (..., L, D) with triple i at channels (i, n+i, 2n+i), rotated by R (L, n, 3, 3); tail unchanged."""
    n = R.shape[-3]
    v = x[..., : 3 * n].double().unflatten(-1, (3, n)).transpose(-1, -2)  # (..., L, n, 3)
    out = (R @ v[..., None])[..., 0].transpose(-1, -2).flatten(-2)
    return torch.cat((out, x[..., 3 * n:].double()), -1)


def thirds_from_interleaved(D, n):
    """Index p -> interleaved channel held at position p of the thirds layout (tail channels fixed)."""
    return torch.cat((torch.arange(3 * n).view(n, 3).t().reshape(-1), torch.arange(3 * n, D)))


def test_the_reference_rotation_is_the_interleaved_layouts_rotation():
    """The matrix_exp reference agrees with the library's (independently tested) interleaved layout, so it
    fixes the rotation and only the channel placement differs between the two layouts."""
    g = torch.Generator().manual_seed(0)
    D, L = 12, 7
    coords = torch.randn(L, 2, generator=g) * 4
    x = torch.randn(1, 2, L, D, generator=g, dtype=torch.float64)
    R = skew_exp_rotations(coords, geope_frequencies(D))
    perm = thirds_from_interleaved(D, D // 3)
    expected = torch.empty_like(x)
    expected[..., perm] = rotate_thirds_reference(x[..., perm], R)
    torch.testing.assert_close(apply_geope(x, geope_rotation(coords.double(), D)), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("D", [12, 14])  # every channel rotated / two pass-through channels
@pytest.mark.parametrize("built_for", ["thirds", "interleaved", "bare"])
def test_every_path_matches_the_float64_reference(monkeypatch, D, built_for):
    """Eager (several blocks, a ragged last one), autograd, both q/k layouts, batched and shared positions,
    bfloat16 and float64, with a rotation built for either layout or with no precomputed weights."""
    import ropekit.apply.geope as geo

    monkeypatch.setattr(geo, "_BLOCK_ELEMS", 216)  # blocks of 3 (D = 12) or 2 (D = 14) tokens: L = 13 is ragged
    g = torch.Generator().manual_seed(1)
    B, H, L = 2, 3, 13
    coords = torch.randn(B, L, 3, generator=g) * 5
    x = torch.randn(B, H, L, D, generator=g)
    freqs = geope_frequencies(D)
    ref = torch.stack([rotate_thirds_reference(x[b], skew_exp_rotations(coords[b], freqs)) for b in range(B)])
    rot = geope_rotation(coords, D, channels="thirds" if built_for == "thirds" else "interleaved")
    if built_for == "bare":
        rot = GeoPERotation(rot.vector, rot.cos, rot.sinc, rot.versc)
    tol = dict(atol=2e-5, rtol=1e-5)
    run = lambda t, **kw: apply_geope(t, rot, channels="thirds", **kw)  # noqa: E731
    torch.testing.assert_close(run(x).double(), ref, **tol)
    torch.testing.assert_close(run(x.transpose(1, 2), seq_dim=1).transpose(1, 2).double(), ref, **tol)
    torch.testing.assert_close(run(x.transpose(1, 2).contiguous(), seq_dim=1).transpose(1, 2).double(), ref, **tol)
    xg = x.clone().requires_grad_(True)
    out = run(xg)
    torch.testing.assert_close(out.detach().double(), ref, **tol)
    out.square().sum().backward()  # a rotation keeps each triple's norm: d‖Rx‖²/dx = 2x
    torch.testing.assert_close(xg.grad, 2 * x)
    xb = x.bfloat16()
    refb = torch.stack([rotate_thirds_reference(xb[b], skew_exp_rotations(coords[b], freqs)) for b in range(B)])
    ob = run(xb)
    assert ob.dtype == torch.bfloat16
    torch.testing.assert_close(ob.double(), refb.bfloat16().double(), atol=0.02, rtol=0.01)
    # the form traced under torch.compile (run eagerly here), which rounds each third before the join
    traced = geo._rotate_thirds_functional(xb, geo._weight_planes(rot, torch.float32, xb.device), D // 3, -2)
    assert traced.dtype == torch.bfloat16
    torch.testing.assert_close(traced.double(), refb.bfloat16().double(), atol=0.02, rtol=0.01)
    o64 = apply_geope(x.double(), geope_rotation(coords.double(), D, channels="thirds"), channels="thirds")
    torch.testing.assert_close(o64, ref, atol=1e-12, rtol=0)
    shared = geope_rotation(coords[0], D, channels="thirds")
    torch.testing.assert_close(apply_geope(x, shared, channels="thirds").double(),
                               rotate_thirds_reference(x, skew_exp_rotations(coords[0], freqs)), **tol)


def test_a_rotation_applies_the_layout_it_was_built_for():
    """Built with channels="thirds", the rotation is applied in that layout unless the call says
    otherwise, so setting the layout only where the rotation is built cannot silently mix layouts."""
    g = torch.Generator().manual_seed(5)
    D, L = 12, 6
    coords = torch.randn(L, 2, generator=g) * 3
    x = torch.randn(1, 2, L, D, generator=g)
    R = skew_exp_rotations(coords, geope_frequencies(D))
    thirds = geope_rotation(coords, D, channels="thirds")
    assert thirds.channels == "thirds" and geope_rotation(coords, D).channels == "interleaved"
    torch.testing.assert_close(apply_geope(x, thirds).double(), rotate_thirds_reference(x, R), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(apply_geope_qk(x, x, thirds)[1].double(), rotate_thirds_reference(x, R),
                               atol=2e-5, rtol=1e-5)
    perm = thirds_from_interleaved(D, D // 3)
    expected = torch.empty(x.shape, dtype=torch.float64)
    expected[..., perm] = rotate_thirds_reference(x[..., perm], R)
    torch.testing.assert_close(apply_geope(x, thirds, channels="interleaved").double(), expected,
                               atol=2e-5, rtol=1e-5)


def test_compiled_thirds_matches_the_reference():
    g = torch.Generator().manual_seed(2)
    D, L = 15, 9
    coords = torch.randn(L, 2, generator=g) * 3
    q, k = torch.randn(2, 2, 3, L, D, generator=g).unbind(0)
    rot = geope_rotation(coords, D, channels="thirds")
    compiled = torch.compile(apply_geope_qk, fullgraph=True, dynamic=False)
    cq, ck = compiled(q, k, rot, channels="thirds")
    R = skew_exp_rotations(coords, geope_frequencies(D))
    torch.testing.assert_close(cq.double(), rotate_thirds_reference(q, R), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ck.double(), rotate_thirds_reference(k, R), atol=2e-5, rtol=1e-5)


def test_scores_are_the_interleaved_layouts_scores_on_permuted_channels():
    """What makes "thirds" a drop-in choice: with q and k in one layout, every q·k equals the interleaved
    layout's on the same vectors, and so does Linear GeoPE attention (eager and fused kernels)."""
    g = torch.Generator().manual_seed(3)
    D, L = 13, 16
    n = D // 3
    coords = torch.stack(torch.meshgrid(torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1).flatten(0, 1)
    q, k, v = torch.randn(3, 1, 2, L, D, generator=g, dtype=torch.float64).unbind(0)
    perm = thirds_from_interleaved(D, n)
    qi, ki = GeoPE(D).rotate(q, k, coords)
    qt, kt = GeoPE(D, channels="thirds").rotate(q[..., perm], k[..., perm], coords)
    torch.testing.assert_close(qt @ kt.transpose(-1, -2), qi @ ki.transpose(-1, -2), atol=1e-12, rtol=0)
    for fused in (False, True):
        ref = linear_geope_attention(q, k, v, coords, fused=fused, block_size=5)
        got = linear_geope_attention(q[..., perm], k[..., perm], v, coords, fused=fused, block_size=5,
                                     channels="thirds")
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=0)


def test_a_non_finite_channel_stays_inside_its_triple():
    g = torch.Generator().manual_seed(4)
    D, L, n = 12, 6, 4
    x = torch.randn(1, 2, L, D, generator=g)
    x[0, 1, 3, 5] = float("inf")  # thirds: channel 5 is component 1 of triple 1 (channels 1, 5, 9)
    out = apply_geope(x, geope_rotation(torch.randn(L, 2, generator=g) * 3, D, channels="thirds"), channels="thirds")
    bad = ~torch.isfinite(out)
    assert bad[0, 1, 3, [1, 5, 9]].any()
    bad[0, 1, 3, [1, 5, 9]] = False
    assert not bad.any()


def test_an_unknown_layout_is_refused_everywhere():
    rot = geope_rotation(torch.zeros(2, 2), 6)
    x = torch.zeros(1, 1, 2, 6)
    for call in (lambda: apply_geope(x, rot, channels="half"),
                 lambda: apply_geope_qk(x, x, rot, channels="split"),
                 lambda: geope_rotation(torch.zeros(2, 2), 6, channels="thirds "),
                 lambda: GeoPE(6, channels="interleave"),
                 lambda: linear_geope_attention(x, x, x, torch.zeros(2, 2), channels="half")):
        with pytest.raises(ValueError, match="`channels` must be 'interleaved'.*or 'thirds'"):
            call()
