"""The ViT every vision experiment trains: patchify → pre-norm blocks → mean pool → head, one position family.

Attention logits are multiplied by ``log(L) / log(L_train)`` (``L`` tokens now, ``L_train`` at the training
grid): 1 at the training grid, larger on bigger grids, so that a query's softmax over 9× more tokens is not
flattened by the extra background (length-scaled attention, Chiang & Cholak 2022). Pooling is the mean over
tokens; ``pool="attn"`` swaps in a learned-query attention pool (checked on axial RoPE and not adopted: see
docs/experiments.md).

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

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..apply.geope import GeoPE
from ..apply.linear_geope import linear_geope_attention
from ..rope import DirectionalRoPE, RoPE
from ..rotations.directional import METHODS
from ..apply.mixed import MixedFrequencies
from .geope_sweep import geope_lambda
from .models import cached_tables

__all__ = ["FAMILIES", "POOLS", "check_family", "VisionViT", "AttentionPool", "grid_coords", "length_temperature"]

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
        self.rotary = cached_tables(_rotary(family, self.head_dim, heads, layer))

    def forward(self, x: torch.Tensor, coords: torch.Tensor, temp: float = 1.0) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q = q * temp
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

    def forward(self, x: torch.Tensor, coords: torch.Tensor, temp: float = 1.0) -> torch.Tensor:
        x = x + self.attn(self.n1(x), coords, temp)
        return x + self.mlp(self.n2(x))


class AttentionPool(nn.Module):
    """Multi-head attention pooling: ``heads`` learned queries (one per head) read the token sequence.

    Content-only (no position enters the pooling), so the pooled vector is invariant to any permutation
    of the tokens; unlike a mean it can pick out a few tokens (a small object, two markers) among many.
    ``forward(x (B, L, D)) -> (B, D)``.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"`dim` ({dim}) must be divisible by `heads` ({heads})")
        self.heads, self.head_dim = heads, dim // heads
        self.query = nn.Parameter(0.02 * torch.randn(heads, 1, dim // heads))
        self.kv, self.proj = nn.Linear(dim, 2 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, temp: float = 1.0) -> torch.Tensor:
        B, L, _ = x.shape
        k, v = self.kv(x).view(B, L, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(temp * self.query.expand(B, -1, -1, -1), k, v)  # (B, H, 1, hd)
        return self.proj(out.reshape(B, -1))


POOLS = ("mean", "attn")


def length_temperature(tokens: int, train_tokens: int) -> float:
    """Factor on the attention logits for ``tokens`` tokens when trained on ``train_tokens``: the ratio of
    their logarithms. It is 1 at the training length; a key whose logit is ``t`` above ``n`` equal others then
    gets odds ``e^{s·t}/n = n^{t/log(train_tokens) - 1}``, which no longer shrink like ``e^t/n`` as n grows
    once ``t > log(train_tokens)``."""
    if tokens < 1 or train_tokens < 2:
        raise ValueError(f"need tokens >= 1 and train_tokens >= 2, got {tokens} and {train_tokens}")
    return math.log(tokens) / math.log(train_tokens)


def grid_coords(gh: int, gw: int, device=None) -> torch.Tensor:
    """float32 (row, col) of each patch of a ``gh × gw`` grid, row-major ``(gh·gw, 2)``."""
    r = torch.arange(gh, dtype=torch.float32, device=device)
    c = torch.arange(gw, dtype=torch.float32, device=device)
    return torch.stack(torch.meshgrid(r, c, indexing="ij"), -1).reshape(-1, 2)


class VisionViT(nn.Module):
    """``forward(images (B, C, H, W), layout=None) -> (B, classes)``; H and W any multiple of ``patch``."""

    def __init__(self, family: str, classes: int, *, patch: int = 4, train_grid: int = 8, dim: int = 48,
                 depth: int = 3, heads: int = 2, mlp_ratio: float = 2.0, in_chans: int = 3,
                 pool: str = "mean", length_scale: bool = True) -> None:
        super().__init__()
        self.family = check_family(family)
        if pool not in POOLS:
            raise ValueError(f"`pool` must be one of {', '.join(POOLS)}, got {pool!r}")
        if dim % heads or (dim // heads) % 12:
            raise ValueError(f"`dim` ({dim}) / `heads` ({heads}) must be a head size divisible by 12 (pairs "
                             f"split over 2 axes for axial RoPE, triples for GeoPE)")
        if isinstance(train_grid, bool) or not isinstance(train_grid, int) or train_grid < 2:
            raise ValueError(f"`train_grid` must be an int >= 2 (patches per side at training), got {train_grid!r}")
        self.patch, self.train_tokens, self.length_scale = patch, train_grid * train_grid, length_scale
        self.embed = nn.Conv2d(in_chans, dim, patch, stride=patch)
        self.pos = nn.Parameter(0.02 * torch.randn(1, dim, train_grid, train_grid)) if family == "learned" else None
        self.blocks = nn.ModuleList(_Block(dim, heads, family, i, mlp_ratio) for i in range(depth))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, classes)
        self.pool = AttentionPool(dim, heads) if pool == "attn" else None

    def forward(self, images: torch.Tensor, layout: str | None = None) -> torch.Tensor:
        if images.ndim != 4 or images.shape[-1] % self.patch or images.shape[-2] % self.patch:
            raise ValueError(f"`images` must be (B, C, H, W) with H, W multiples of patch={self.patch}, got "
                             f"{tuple(images.shape)}")
        x = self.embed(images)
        gh, gw = x.shape[-2:]
        if self.pos is not None:
            pos = self.pos if self.pos.shape[-2:] == (gh, gw) else F.interpolate(
                self.pos, size=(gh, gw), mode="bilinear", align_corners=False)
            # one table (1, D, h, w) broadcasts over the batch; a stacked ensemble's (K, D, h, w) adds table k
            # to model k's block of rows (ropekit.experiments.ensemble)
            x = (x.view(pos.shape[0], -1, *x.shape[1:]) + pos.unsqueeze(1)).view(x.shape)
        x = x.flatten(2).transpose(1, 2)
        coords = grid_coords(gh, gw, x.device)
        temp = length_temperature(gh * gw, self.train_tokens) if self.length_scale else 1.0
        for blk in self.blocks:
            x = blk(x, coords, temp)
        x = self.norm(x)
        return self.head(x.mean(1) if self.pool is None else self.pool(x, temp))


# One set of hyper-parameters for every family, chosen on `axial` only (quick preset); see docs/experiments.md.
HYPERPARAMETERS_NOTE = ("chosen once on axial RoPE (quick preset): mean pooling and length-scaled attention "
                        "over attention pooling, 6x6 grid and 400 steps for isotropy; identical for every family")
MODEL = {"micro": {"dim": 24, "depth": 1, "heads": 2}, "quick": {"dim": 48, "depth": 3, "heads": 2},
         "full": {"dim": 192, "depth": 6, "heads": 4}}
MODEL["standard"] = MODEL["quick"]  # standard: quick's model and training, more seeds and larger evaluation sets
TRAIN = {"micro": {"steps": 6, "batch": 8, "lr": 3e-3, "warmup": 2},
         "quick": {"steps": 250, "batch": 32, "lr": 2e-3, "warmup": 25, "ckpt_every": 100},
         "full": {"steps": 5000, "batch": 256, "lr": 1e-3, "warmup": 250, "ckpt_every": 1000}}
TRAIN["standard"] = TRAIN["quick"]


def make_vision_model(classes: int):
    """A ``make_model(design, cfg)`` for the harness building a :class:`VisionViT` from ``cfg["model"]``."""

    def make(design: str, cfg: dict) -> VisionViT:
        return VisionViT(design, classes, train_grid=cfg["task"]["grid"], **cfg["model"])

    return make
