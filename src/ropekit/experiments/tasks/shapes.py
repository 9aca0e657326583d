"""Procedural shape images for the vision experiments: seeded, rendered at any resolution, no downloads.

An image shows one object: a *shape* (``disc``, ``square``, ``triangle``, ``cross``, ``ring``) at a random
position, scale and rotation, filled with a *texture* (``stripes``, ``dots``, ``checks``, ``noise``,
``grid``). Texture ``i`` is the "texture of class ``i``", so a cue-conflict image is shape ``a`` filled with
texture ``b != a``. Geometry lives in *canvas units*: the training canvas is 1 × 1 and is rendered at
``grid * patch`` pixels. ``zoom`` rendering keeps the 1 × 1 canvas and adds pixels (the same scene,
objects larger in pixels); ``canvas`` rendering keeps pixels per unit and enlarges the canvas
(same-size objects, more room). Channels: 0 = texture inside the object, 1 = the object's silhouette at
half intensity, 2 = faint background noise.
"""
from __future__ import annotations

import math

import torch

from . import Batch

__all__ = ["SHAPES", "TEXTURES", "MODES", "render", "shape_batch", "marker_batch", "check_grid"]

SHAPES = ("disc", "square", "triangle", "cross", "ring")
TEXTURES = ("stripes", "dots", "checks", "noise", "grid")
MODES = ("zoom", "canvas")
MAX_GRID = 64


def check_grid(grid, name: str = "grid") -> int:
    if isinstance(grid, bool) or not isinstance(grid, int) or not 2 <= grid <= MAX_GRID:
        raise ValueError(f"`{name}` must be an int patch count per side in [2, {MAX_GRID}], got {grid!r}")
    return grid


def _pixels(B: int, size: int, extent: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel-centre coordinates ``(size, size)`` (y, x) in canvas units covering ``[0, extent)``."""
    c = (torch.arange(size, dtype=torch.float32) + 0.5) * (extent / size)
    y, x = torch.meshgrid(c, c, indexing="ij")
    return y, x


def _shape_mask(kind: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Inside-mask of each sample's shape in its own frame (unit radius); ``kind (B,)``, ``u, v (B, S, S)``."""
    r = torch.sqrt(u * u + v * v)
    tri = torch.ones_like(u, dtype=torch.bool)
    for j in range(3):  # equilateral triangle inscribed in the unit circle: three half-planes
        a = math.pi / 2 + j * 2 * math.pi / 3
        tri &= (u * math.cos(a) + v * math.sin(a)) > -0.5
    masks = torch.stack([
        r < 1.0,
        torch.maximum(u.abs(), v.abs()) < 0.8,
        tri,
        ((u.abs() < 0.3) & (v.abs() < 1.0)) | ((v.abs() < 0.3) & (u.abs() < 1.0)),
        (r < 1.0) & (r > 0.55),
    ])  # (5, B, S, S)
    return masks[kind, torch.arange(kind.shape[0])]


def _texture(kind: torch.Tensor, y: torch.Tensor, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Texture values in [0, 1] ``(B, S, S)``; spatial periods in canvas units (0.06–0.09), random phase."""
    B = kind.shape[0]
    per = 0.06 + 0.03 * torch.rand(B, 1, 1, generator=g)
    ph = torch.rand(B, 2, 1, 1, generator=g)
    ang = torch.rand(B, 1, 1, generator=g) * math.pi
    a = (x * torch.cos(ang) + y * torch.sin(ang)) / per + ph[:, 0]
    b = (-x * torch.sin(ang) + y * torch.cos(ang)) / per + ph[:, 1]
    fa, fb = a - a.floor(), b - b.floor()
    noise_cells = torch.rand(B, 64, 64, generator=g)
    iy = (y / 0.04).long().clamp(max=63).expand(B, -1, -1)
    ix = (x / 0.04).long().clamp(max=63).expand(B, -1, -1)
    noise = torch.gather(noise_cells.view(B, -1), 1, (iy * 64 + ix).view(B, -1)).view_as(a)
    tex = torch.stack([
        (fa < 0.5).float(),                                               # stripes
        (((fa - 0.5) ** 2 + (fb - 0.5) ** 2) < 0.09).float(),             # dots
        ((a.floor() + b.floor()) % 2 == 0).float(),                       # checks
        noise,                                                            # noise
        ((fa < 0.2) | (fb < 0.2)).float(),                                # grid (cross-hatch lines)
    ])
    return tex[kind, torch.arange(B)]


def render(shape: torch.Tensor, texture: torch.Tensor, grid: int, *, patch: int = 4, mode: str = "zoom",
           train_grid: int = 8, g: torch.Generator) -> torch.Tensor:
    """Images ``(B, 3, grid·patch, grid·patch)`` of the given shape and texture ids (see module doc)."""
    check_grid(grid)
    check_grid(train_grid, "train_grid")
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {', '.join(MODES)}, got {mode!r}")
    if shape.shape != texture.shape or shape.ndim != 1:
        raise ValueError(f"`shape` and `texture` must be equal-length 1-D id tensors, got {tuple(shape.shape)} "
                         f"and {tuple(texture.shape)}")
    B, size = shape.shape[0], grid * patch
    extent = 1.0 if mode == "zoom" else grid / train_grid
    y, x = _pixels(B, size, extent)
    rad = 0.18 + 0.12 * torch.rand(B, 1, 1, generator=g)                 # object radius, canvas units
    cy = rad + (extent - 2 * rad) * torch.rand(B, 1, 1, generator=g)
    cx = rad + (extent - 2 * rad) * torch.rand(B, 1, 1, generator=g)
    rot = torch.rand(B, 1, 1, generator=g) * 2 * math.pi
    dy, dx = (y - cy) / rad, (x - cx) / rad
    u = dx * torch.cos(rot) + dy * torch.sin(rot)
    v = -dx * torch.sin(rot) + dy * torch.cos(rot)
    inside = _shape_mask(shape, u, v).float()
    tex = _texture(texture, y, x, g)
    bg = 0.15 * torch.rand(B, size, size, generator=g)
    return torch.stack([inside * (0.2 + 0.8 * tex), 0.5 * inside, bg], 1)


def shape_batch(B: int, grid: int, *, g: torch.Generator, agree: float = 1.0, conflict: bool = False,
                patch: int = 4, mode: str = "zoom", train_grid: int = 8) -> Batch:
    """Classify the shape. Texture = the shape's own with probability ``agree`` (else another, uniformly);
    ``conflict=True`` always draws another texture (cue-conflict test). ``info``: shape, texture."""
    if not 0.0 <= agree <= 1.0:
        raise ValueError(f"`agree` must be a probability in [0, 1], got {agree!r}")
    n = len(SHAPES)
    shape = torch.randint(n, (B,), generator=g)
    other = (shape + 1 + torch.randint(n - 1, (B,), generator=g)) % n
    keep = torch.rand(B, generator=g) < (0.0 if conflict else agree)
    texture = torch.where(keep, shape, other)
    img = render(shape, texture, grid, patch=patch, mode=mode, train_grid=train_grid, g=g)
    return Batch(img, f"{grid}x{grid}", shape, {"shape": shape, "texture": texture})


def marker_batch(B: int, grid: int, *, g: torch.Generator, buckets: int = 8, patch: int = 4,
                 dist: tuple[float, float] = (1.5, 3.5)) -> Batch:
    """Two marked points (red = anchor, green = target) at a continuous angle and a distance of ``dist``
    patches; the answer is the direction bucket of target from anchor (bucket 0 centred on +x, counter-
    clockwise with y pointing up). ``info``: ``angle`` in degrees [0, 360)."""
    check_grid(grid)
    size = grid * patch
    ang = torch.rand(B, generator=g) * 2 * math.pi
    r = (dist[0] + (dist[1] - dist[0]) * torch.rand(B, generator=g)) * patch
    off_x, off_y = r * torch.cos(ang), -r * torch.sin(ang)  # image rows grow downwards
    lo_x = (-off_x).clamp(min=0) + 1
    hi_x = size - 1 - off_x.clamp(min=0)
    lo_y = (-off_y).clamp(min=0) + 1
    hi_y = size - 1 - off_y.clamp(min=0)
    if bool((hi_x <= lo_x).any() or (hi_y <= lo_y).any()):
        raise ValueError(f"`dist` {dist} patches does not fit a {grid}×{grid} grid")
    ax = lo_x + (hi_x - lo_x) * torch.rand(B, generator=g)
    ay = lo_y + (hi_y - lo_y) * torch.rand(B, generator=g)
    pix = torch.arange(size, dtype=torch.float32) + 0.5
    img = 0.15 * torch.rand(B, 3, size, size, generator=g)

    def blob(cx, cy):
        d2 = (pix.view(1, 1, -1) - cx.view(-1, 1, 1)) ** 2 + (pix.view(1, -1, 1) - cy.view(-1, 1, 1)) ** 2
        return torch.exp(-d2 / 1.0)

    img[:, 0] += blob(ax, ay)
    img[:, 1] += blob(ax + off_x, ay + off_y)
    width = 2 * math.pi / buckets
    target = (((ang + width / 2) // width) % buckets).long()
    return Batch(img, f"{grid}x{grid}", target, {"angle": torch.rad2deg(ang)})
