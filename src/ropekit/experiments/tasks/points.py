"""Procedural 3-D point-cloud scenes for per-point segmentation: seeded, any size, no downloads.

A scene holds ``primitives`` objects, each a *kind* (``box``, ``sphere``, ``cylinder``, ``plane``) with a
random centre in ``[0, extent)³``, a random size and a random rotation, sampled as ``N / primitives``
points on its surface plus Gaussian noise of standard deviation ``noise``. The label of a point is the
kind of the primitive that produced it. Local frames (before rotation and translation):

* ``box``: half sizes ``a`` (3,), points on the faces (one coordinate at ±a_j, the others inside);
* ``sphere``: radius ``r``, points at distance ``r`` from the centre;
* ``cylinder``: radius ``r``, half height ``h``, points on the side wall (radial distance ``r``, |z| ≤ h);
* ``plane``: a square of half side ``a``, points with local z = 0.

``info`` keeps each point's primitive index (``owner``) and each primitive's kind, centre, rotation
(columns = local axes in world coordinates) and size parameters, so tests can re-derive every point.
"""
from __future__ import annotations

import torch

from . import Batch

__all__ = ["KINDS", "scene_batch", "random_rotations", "check_scene"]

KINDS = ("box", "sphere", "cylinder", "plane")
MAX_POINTS = 1 << 14


def check_scene(points: int, primitives: int, extent: float, noise: float) -> None:
    for name, v in (("points", points), ("primitives", primitives)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {v!r}")
    if points % primitives or points > MAX_POINTS:
        raise ValueError(f"`points` ({points}) must be a multiple of `primitives` ({primitives}) and at most "
                         f"{MAX_POINTS}")
    if not (isinstance(extent, (int, float)) and 0 < extent < 1e4):
        raise ValueError(f"`extent` must be a positive scene size in (0, 1e4), got {extent!r}")
    if not (isinstance(noise, (int, float)) and 0 <= noise < 1):
        raise ValueError(f"`noise` must be a standard deviation in [0, 1), got {noise!r}")


def random_rotations(n: int, g: torch.Generator) -> torch.Tensor:
    """``(n, 3, 3)`` proper rotations (det +1), Haar-distributed (QR of a Gaussian with sign fix)."""
    q, r = torch.linalg.qr(torch.randn(n, 3, 3, generator=g))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    flip = torch.det(q) < 0
    q[flip, :, 0] = -q[flip, :, 0]
    return q


def _local_points(kind: torch.Tensor, size: torch.Tensor, m: int, g: torch.Generator) -> torch.Tensor:
    """Surface points ``(P, m, 3)`` in each primitive's frame; ``size (P, 3)`` holds (a1, a2, a3) for a box,
    (r, ·, ·) for a sphere, (r, h, ·) for a cylinder and (a, ·, ·) for a plane."""
    P = kind.shape[0]
    u = 2 * torch.rand(P, m, 3, generator=g) - 1
    box = u * size[:, None, :]
    face = torch.randint(0, 3, (P, m), generator=g)
    side = torch.where(torch.rand(P, m, generator=g) < 0.5, -1.0, 1.0)
    box.scatter_(2, face[..., None], (side * size.gather(1, face))[..., None])
    d = torch.randn(P, m, 3, generator=g)
    sphere = d / d.norm(dim=-1, keepdim=True).clamp_min(1e-12) * size[:, None, :1]
    theta = 2 * torch.pi * torch.rand(P, m, generator=g)
    cyl = torch.stack([size[:, :1] * torch.cos(theta), size[:, :1] * torch.sin(theta), u[..., 2] * size[:, 1:2]], -1)
    plane = torch.cat([u[..., :2] * size[:, None, :1], torch.zeros(P, m, 1)], -1)
    every = torch.stack([box, sphere, cyl, plane])  # (4, P, m, 3)
    return every[kind, torch.arange(P)]


def scene_batch(B: int, points: int, *, g: torch.Generator, primitives: int = 3, extent: float = 8.0,
                noise: float = 0.02) -> Batch:
    """``B`` scenes: ``tokens`` are float32 points ``(B, points, 3)``, ``target`` their kinds ``(B, points)``."""
    check_scene(points, primitives, extent, noise)
    P, m = B * primitives, points // primitives
    kind = torch.randint(0, len(KINDS), (P,), generator=g)
    scale = 0.6 + 0.8 * torch.rand(P, 1, generator=g)
    size = scale * (0.5 + 0.5 * torch.rand(P, 3, generator=g))
    size[:, 1] = torch.where(kind == 2, 1.5 * size[:, 1], size[:, 1])  # cylinders: half height up to 1.5 r
    centre = extent * torch.rand(P, 3, generator=g)
    rot = random_rotations(P, g)
    local = _local_points(kind, size, m, g)
    world = local @ rot.transpose(1, 2) + centre[:, None, :] + noise * torch.randn(P, m, 3, generator=g)
    owner = torch.arange(primitives).repeat_interleave(m).expand(B, -1)
    label = kind.view(B, primitives)[:, owner[0]]
    return Batch(world.reshape(B, points, 3), "points", label.contiguous(),
                 {"owner": owner.contiguous(), "kind": kind.view(B, primitives), "centre": centre.view(B, primitives, 3),
                  "rotation": rot.view(B, primitives, 3, 3), "size": size.view(B, primitives, 3)})
