"""Experiment `pointcloud`: scene generator invariants, mIoU by hand, the 3-D families, a micro run."""
from __future__ import annotations

import json

import pytest
import torch

from ropekit.experiments import runner
from ropekit.experiments.stats import VERDICTS
from ropekit.experiments.pointcloud import FAMILIES, PointTransformer, confusion, local_features, mean_iou
from ropekit.experiments.tasks.points import KINDS, random_rotations, scene_batch
from ropekit.report.experiments import experiments_section


def g(seed=0):
    return torch.Generator().manual_seed(seed)


def _local(b):
    """Each point back in its primitive's frame, recomputed in float64 from the recorded pose."""
    idx = b.info["owner"]
    B = idx.shape[0]
    ar = torch.arange(B)[:, None]
    c = b.info["centre"][ar, idx].double()
    R = b.info["rotation"][ar, idx].double()
    x = b.tokens.double() - c
    return torch.einsum("bnij,bni->bnj", R, x), b.info["size"][ar, idx].double(), b.info["kind"][ar, idx]


def test_points_lie_on_their_primitive_and_labels_match():
    b = scene_batch(6, 120, g=g(1), primitives=4, noise=0.0)
    loc, size, kind = _local(b)
    assert torch.equal(b.target, kind)  # label = kind of the primitive that produced the point
    for k, name in enumerate(KINDS):
        m = kind == k
        if not m.any():
            continue
        p, s = loc[m], size[m]
        if name == "sphere":
            assert torch.allclose(p.norm(dim=-1), s[:, 0], atol=1e-5)
        elif name == "box":  # inside the box and on its boundary
            r = (p.abs() / s).max(-1).values
            assert torch.allclose(r, torch.ones_like(r), atol=1e-5)
        elif name == "cylinder":
            assert torch.allclose(p[:, :2].norm(dim=-1), s[:, 0], atol=1e-5)
            assert bool((p[:, 2].abs() <= s[:, 1] + 1e-5).all())
        else:
            assert torch.allclose(p[:, 2], torch.zeros_like(p[:, 2]), atol=1e-5)
            assert bool((p[:, :2].abs() <= s[:, :1] + 1e-5).all())
    assert set(b.target.unique().tolist()) <= set(range(len(KINDS)))


def test_noise_has_the_requested_spread_and_scenes_are_seeded():
    clean = scene_batch(4, 300, g=g(2), noise=0.0)
    noisy = scene_batch(4, 300, g=g(2), noise=0.05)
    # same generator draws up to the noise: the difference is the noise itself
    assert abs(float((noisy.tokens - clean.tokens).std()) - 0.05) < 0.005
    assert torch.equal(clean.tokens, scene_batch(4, 300, g=g(2), noise=0.0).tokens)
    big = scene_batch(4, 240, g=g(3), primitives=6, extent=16.0, noise=0.0)
    assert float(big.info["centre"].max()) > 8.0 and float(big.info["centre"].max()) < 16.0


def test_rotations_are_proper():
    R = random_rotations(64, g(4)).double()
    assert torch.allclose(R.transpose(1, 2) @ R, torch.eye(3, dtype=torch.float64).expand(64, 3, 3), atol=1e-5)
    assert torch.allclose(torch.det(R), torch.ones(64, dtype=torch.float64), atol=1e-5)


def test_bad_scene_arguments_raise():
    for kw, word in (({"points": 10, "primitives": 3}, "multiple"), ({"points": 12, "primitives": 0}, "primitives"),
                     ({"points": 12, "extent": -1.0}, "extent"), ({"points": 12, "noise": float("nan")}, "noise")):
        with pytest.raises(ValueError, match=word):
            scene_batch(2, g=g(), **kw)


def test_mean_iou_and_confusion_by_hand():
    target = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    pred = torch.tensor([0, 0, 1, 1, 1, 2, 0, 3])
    conf = confusion(pred, target, 4)
    assert conf.tolist() == [[2, 1, 0, 0], [0, 2, 0, 0], [1, 0, 1, 1], [0, 0, 0, 0]]
    # IoU: class0 2/(2+1+1)=1/2, class1 2/(2+1)=2/3, class2 1/3, class3 0/1 (predicted, never true) = 0
    assert mean_iou(conf) == pytest.approx((1 / 2 + 2 / 3 + 1 / 3 + 0) / 4)


def test_local_features_by_brute_force():
    pts = torch.randn(1, 10, 3, generator=g(5))
    f = local_features(pts, k=3)
    for i in range(10):
        d = ((pts[0] - pts[0, i]) ** 2).sum(-1)
        d[i] = float("inf")
        nb = pts[0, d.argsort()[:3]].mean(0) - pts[0, i]
        assert torch.allclose(f[0, i, :3], nb, atol=1e-5)
        assert torch.allclose(f[0, i, 3], nb.norm(), atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_segments_any_size_and_relative_ones_ignore_translation(family):
    torch.manual_seed(0)
    m = PointTransformer(family, dim=24, depth=1, heads=2).double()
    pts = scene_batch(2, 30, g=g(6)).tokens.double()
    out = m(pts)
    assert out.shape == (2, len(KINDS), 30)
    assert m(scene_batch(1, 60, g=g(7), primitives=6, extent=16.0).tokens.double()).shape == (1, len(KINDS), 60)
    shifted = m(pts + torch.tensor([3.0, -2.0, 5.0], dtype=torch.float64))
    if family == "learned":  # absolute: the shift changes its input
        assert not torch.allclose(out, shifted, atol=1e-6)
    else:  # relative families (and none) see offsets only; geope is not exactly relative
        if family != "geope":
            assert torch.allclose(out, shifted, atol=1e-6)


@pytest.mark.parametrize("family", ["axial", "nd-sobol", "geope"])
def test_3d_families_use_every_axis(family):
    # attention scores q·k after rotation must depend on each coordinate axis (a 2-D rotary fed 3-D points
    # would silently ignore or reject the third)
    m = PointTransformer(family, dim=24, depth=1, heads=2).double()
    rot = m.blocks[0].attn.rotary
    q = torch.randn(1, 2, 2, 12, generator=g(8), dtype=torch.float64)
    k = torch.randn(1, 2, 2, 12, generator=g(9), dtype=torch.float64)
    base = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]], dtype=torch.float64)

    def score(c):
        qr, kr = rot.rotate(q, k, c)
        return (qr[..., 1, :] * kr[..., 0, :]).sum(-1)

    for axis in range(3):
        moved = base.clone()
        moved[0, 1, axis] += 0.7
        assert (score(base) - score(moved)).abs().max() > 1e-3, f"axis {axis} ignored"


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="point-cloud family"):
        PointTransformer("rope2d")
    with pytest.raises(ValueError, match="divisible by 6"):
        PointTransformer("axial", dim=16, heads=2)
    with pytest.raises(ValueError, match="points"):
        PointTransformer("none", dim=24, heads=2)(torch.randn(2, 5, 2))


def test_micro_run_end_to_end(tmp_path):
    designs = ["axial", "geope", "learned", "none"]
    agg = runner.run_experiment("pointcloud", designs=designs, preset="micro", seeds=2, out=tmp_path, progress=False)
    assert set(agg["metrics"]) == set(designs)
    runs = [json.loads(l) for l in (tmp_path / "pointcloud" / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2 * len(designs)
    for r in runs:
        for k in ("miou", "acc", "miou_large", "acc_large"):
            assert 0.0 <= r["metrics"][k] <= 1.0
    ids = {c["id"] for c in agg["claims"]}
    assert {"P1", "P2", "P4", "P5"} <= ids
    for c in agg["claims"]:
        assert c["verdict"] in VERDICTS
    sec = experiments_section(tmp_path, tmp_path)
    assert "pointcloud" in sec["html"]
    assert (tmp_path / "exp_pointcloud_bars.png").exists()
