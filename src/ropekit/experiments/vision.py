"""The ViT every vision experiment trains: patchify → pre-norm blocks → mean pool → head, one position family.

Families (names accepted by ``--designs``): ``learned`` (absolute embedding for the training grid,
bilinearly resized for other grids, as ViTs do), ``none`` (floor), ``axial`` (2-D RoPE, half the pairs
per axis), ``mixed`` (RoPE-Mixed, learned per-head directions), ``nd-<method>`` (directional N-D RoPE with
``method`` in sobol, weyl, ggr, golden, uniform, random), ``geope`` (GeoPE, 3-D rotations coupling the
axes, λ = 100), ``geope-lam<λ>`` (GeoPE at another λ, for sweeps) and ``linear-geope`` (Linear GeoPE, its
exactly-relative variant, which replaces the attention kernel by :func:`ropekit.linear_geope_attention`).
Token coordinates are the integer (row, col) of each patch, so a larger grid means positions beyond those
seen in training.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..apply.geope import GeoPE
from ..apply.linear_geope import linear_geope_attention
from ..rope import DirectionalRoPE, RoPE
from ..rotations.directional import METHODS
from ..rotations.mixed import MixedFrequencies
from .geope_sweep import geope_lambda

__all__ = ["FAMILIES", "check_family", "VisionViT", "grid_coords"]

FAMILIES = ("learned", "none", "axial", "mixed", *(f"nd-{m}" for m in METHODS), "geope", "linear-geope")


LINEAR_GEOPE_BLOCK = 256  # query block of Linear GeoPE attention (a 16×16 grid, or 256 points, is one block)


def check_family(name: str) -> str:
    """``name`` if it is a family (or ``geope-lam<λ>`` with λ > 1, as GeoPE requires), else a ValueError."""
    if name in FAMILIES or geope_lambda(name) is not None:
        return name
    raise ValueError(f"unknown vision family {name!r}; choose one of {', '.join(FAMILIES)} or geope-lam<λ> (λ > 1)")


def _rotary(family: str, head_dim: int, heads: int, layer: int):
    if family == "axial":
        return RoPE("rope2d", head_dim=head_dim, allocation="axial", base=100.0)
    if family == "mixed":
        return MixedFrequencies(head_dim, heads, 2, seed=layer)
    if family.startswith("nd-"):
        return DirectionalRoPE(head_dim, 2, family[3:], base=100.0)
    if family == "geope":
        return GeoPE(head_dim)
    if family.startswith("geope-lam"):
        return GeoPE(head_dim, lam=float(family[len("geope-lam"):]))
    return None


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, family: str, layer: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.linear_geope = heads, dim // heads, family == "linear-geope"
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.rotary = _rotary(family, self.head_dim, heads, layer)

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.linear_geope:
            # past one query block each block is checkpointed, so backward keeps O(block · L), not O(L²)
            out = linear_geope_attention(q, k, v, coords, block_size=LINEAR_GEOPE_BLOCK,
                                         use_checkpoint=L > LINEAR_GEOPE_BLOCK)
        else:
            if self.rotary is not None:
                q, k = self.rotary.rotate(q, k, coords)
            out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(B, L, -1))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, family: str, layer: int, mlp_ratio: float) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads, family, layer)
        self.mlp = nn.Sequential(nn.Linear(dim, int(dim * mlp_ratio)), nn.GELU(), nn.Linear(int(dim * mlp_ratio), dim))

    def forward(self, x: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x), coords)
        return x + self.mlp(self.n2(x))


def grid_coords(gh: int, gw: int, device=None) -> torch.Tensor:
    """float32 (row, col) of each patch of a ``gh × gw`` grid, row-major ``(gh·gw, 2)``."""
    r = torch.arange(gh, dtype=torch.float32, device=device)
    c = torch.arange(gw, dtype=torch.float32, device=device)
    return torch.stack(torch.meshgrid(r, c, indexing="ij"), -1).reshape(-1, 2)


class VisionViT(nn.Module):
    """``forward(images (B, C, H, W), layout=None) -> (B, classes)``; H and W any multiple of ``patch``."""

    def __init__(self, family: str, classes: int, *, patch: int = 4, train_grid: int = 8, dim: int = 48,
                 depth: int = 3, heads: int = 2, mlp_ratio: float = 2.0, in_chans: int = 3) -> None:
        super().__init__()
        self.family = check_family(family)
        if dim % heads or (dim // heads) % 12:
            raise ValueError(f"`dim` ({dim}) / `heads` ({heads}) must be a head size divisible by 12 (pairs "
                             f"split over 2 axes for axial RoPE, triples for GeoPE)")
        self.patch = patch
        self.embed = nn.Conv2d(in_chans, dim, patch, stride=patch)
        self.pos = nn.Parameter(0.02 * torch.randn(1, dim, train_grid, train_grid)) if family == "learned" else None
        self.blocks = nn.ModuleList(_Block(dim, heads, family, i, mlp_ratio) for i in range(depth))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)

    def forward(self, images: torch.Tensor, layout: str | None = None) -> torch.Tensor:
        if images.ndim != 4 or images.shape[-1] % self.patch or images.shape[-2] % self.patch:
            raise ValueError(f"`images` must be (B, C, H, W) with H, W multiples of patch={self.patch}, got "
                             f"{tuple(images.shape)}")
        x = self.embed(images)
        gh, gw = x.shape[-2:]
        if self.pos is not None:
            pos = self.pos if self.pos.shape[-2:] == (gh, gw) else F.interpolate(
                self.pos, size=(gh, gw), mode="bilinear", align_corners=False)
            x = x + pos
        x = x.flatten(2).transpose(1, 2)
        coords = grid_coords(gh, gw, x.device)
        for blk in self.blocks:
            x = blk(x, coords)
        return self.head(self.norm(x).mean(1))


# One set of hyper-parameters for every family, chosen on `axial` only (quick preset); see docs/experiments.md.
HYPERPARAMETERS_NOTE = "chosen once on axial RoPE (quick preset); identical for every family"
MODEL = {"micro": {"dim": 24, "depth": 1, "heads": 2}, "quick": {"dim": 48, "depth": 3, "heads": 2},
         "full": {"dim": 192, "depth": 6, "heads": 4}}
TRAIN = {"micro": {"steps": 6, "batch": 8, "lr": 3e-3, "warmup": 2},
         "quick": {"steps": 250, "batch": 32, "lr": 2e-3, "warmup": 25, "ckpt_every": 100},
         "full": {"steps": 5000, "batch": 256, "lr": 1e-3, "warmup": 250, "ckpt_every": 1000}}


def make_vision_model(classes: int):
    """A ``make_model(design, cfg)`` for the harness building a :class:`VisionViT` from ``cfg["model"]``."""

    def make(design: str, cfg: dict) -> VisionViT:
        return VisionViT(design, classes, train_grid=cfg["task"]["grid"], **cfg["model"])

    return make
