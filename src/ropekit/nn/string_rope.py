"""STRING (Separable Translationally Invariant Position Encodings) as an ``nn.Module``.

Schenck, Reid, Jacob et al., "Learning the RoPEs: Better 2D and 3D Position Encodings with STRING"
(arXiv 2502.02562, ICML 2025). A STRING rotates a token at ``r ∈ R^A`` by ``R(r) = exp(Σ_a r_a L_a)`` with
commuting skew-symmetric generators ``L_a``: then ``R(r)ᵀ R(r') = R(r' − r)`` and every attention score
depends on the coordinate difference alone, in any number of axes. The paper shows that every such ``R``
is RoPE in an orthogonal basis, ``P · RoPE(r) · Pᵀ``; the outer ``P`` cancels in ``q·k``, so a STRING is
computed as RoPE after a learned orthogonal map. Two parametrisations, both here:

- ``variant="cayley"`` (Cayley-STRING): ``R(r) x = RoPE(r) · P_S · x`` with
  ``P_S = (I − S)(I + S)⁻¹`` for a learned skew-symmetric ``S`` (``I + S`` is always invertible, so every
  weight gives an orthogonal map). ``S = 0`` is plain RoPE.
- ``variant="circulant"`` (Circulant-STRING): the generators themselves are circulant and skew-symmetric,
  ``L_a = C_a − C_aᵀ`` with ``C_a`` circulant (entry ``(i, j)`` = ``c_a[(i − j) mod b]``), on blocks of
  ``block_size`` channels. Circulant matrices commute and share the Fourier eigenvectors, so ``R(r)`` is
  computed with an FFT: ``x ↦ IFFT(e^{iφ} · FFT(x))`` with ``φ_k = 2 Σ_a r_a Im(FFT(c_a))_k``. In the real
  Fourier basis this is RoPE with learned frequencies ``2 Im(FFT(c_a))_k`` (``⌊(b − 1)/2⌋`` planes per
  block; the constant mode, and the alternating one for even ``b``, stay fixed). ``c = 0`` is the identity.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..apply.planar import CHANNEL_LAYOUTS, apply_rotary, cos_sin
from ..layout import Layout
from ..rotations.lie import check_int, skew
from ..rotations.planar import angles, frequency_matrix
from .learned import _LearnedRotary, _check_scale, _generator

__all__ = ["STRING", "STRING_VARIANTS", "cayley"]

STRING_VARIANTS = ("cayley", "circulant")


def cayley(S: torch.Tensor) -> torch.Tensor:
    """The Cayley transform ``(I − S)(I + S)⁻¹`` of skew-symmetric ``S (..., D, D)``: an orthogonal matrix.

    ``I − S`` and ``(I + S)⁻¹`` commute, so this is one linear solve ``(I + S) P = I − S``."""
    eye = torch.eye(S.shape[-1], dtype=S.dtype, device=S.device)
    return torch.linalg.solve(eye + S, eye - S)


class STRING(_LearnedRotary):
    """STRING: exactly relative learned rotations in any number of axes (module docstring).

    - ``variant``: ``"cayley"`` (default) or ``"circulant"``.
    - ``num_heads``: one set of weights per head (q/k must then have that many heads, or 1); ``None`` shares.
    - ``init_scale`` (default: 0 for Cayley, so a model starts from RoPE; 0.5 for circulant): Cayley's
      ``weight`` starts at ``init_scale · N(0, 1)/√D`` (``S = weight − weightᵀ``); the circulant first columns
      at ``init_scale · N(0, 1)/√(2b)``, so a unit step along an axis turns each plane by an angle of
      standard deviation ``init_scale``. Seeded by ``seed``.
    - ``design``: the position design used when ``rotate`` gets a layout string.

    Cayley only: the RoPE is ``allocation`` (default ``"interleaved"``: pair j → axis ``j mod A``, any
    number of axes) with ``base``, on channel pairs ``channels`` (``"half"``: ``(j, j + D/2)``; or
    ``"interleaved"``: ``(2j, 2j + 1)``); ``learn_frequencies=True`` makes its frequency matrix
    ``freqs (A, D/2)`` a parameter (still exactly relative). Parameter ``weight (D, D)`` (``(H, D, D)``).

    Circulant only: ``block_size`` (default ``head_dim``, one circulant generator per axis over the whole
    head; the paper sweeps 4–64) must divide ``head_dim`` and be >= 3 (a 2 × 2 circulant is symmetric, so
    its generator is 0). Parameter ``weight (A, D/b, b)`` (``(H, A, D/b, b)``): the first column of each
    ``C_a`` per block.
    """

    def __init__(self, head_dim: int, num_axes: int = 2, *, variant: str = "cayley", num_heads: int | None = None,
                 init_scale: float | None = None, seed: int | None = None, design: str = "rope2d",
                 allocation: str = "interleaved", base: float = 10000.0, channels: str = "half",
                 learn_frequencies: bool = False, block_size: int | None = None) -> None:
        super().__init__(head_dim, num_axes, num_heads, design, "STRING")
        if variant not in STRING_VARIANTS:
            raise ValueError(f"STRING: `variant` must be one of {STRING_VARIANTS} ('cayley': RoPE after a Cayley "
                             f"orthogonal map; 'circulant': circulant generators), got {variant!r}")
        if not isinstance(learn_frequencies, bool):
            raise TypeError(f"STRING: `learn_frequencies` must be True or False, got {learn_frequencies!r}")
        self.variant = variant
        gen = _generator(seed)
        if variant == "cayley":
            if block_size is not None:
                raise ValueError("STRING: `block_size` belongs to variant='circulant' (circulant blocks); the Cayley "
                                 "map is dense over the head, so leave block_size=None")
            if head_dim % 2:
                raise ValueError(f"STRING 'cayley': `head_dim` must be even (RoPE rotates channel pairs), got "
                                 f"{head_dim}")
            if channels not in CHANNEL_LAYOUTS:
                raise ValueError(f"STRING: `channels` must be 'half' (pairs j, j + D/2) or 'interleaved' (pairs "
                                 f"2j, 2j + 1), got {channels!r}")
            self.channels, self.allocation = channels, allocation
            W = frequency_matrix(allocation, head_dim, num_axes, base=base)
            if learn_frequencies:
                self.freqs = nn.Parameter(W)
            else:
                self.register_buffer("freqs", W, persistent=False)  # a function of the arguments, not a weight
            scale = _check_scale(0.0 if init_scale is None else init_scale) / math.sqrt(head_dim)
            self.weight = nn.Parameter(torch.randn(self._shape(head_dim, head_dim), generator=gen) * scale)
        else:
            if learn_frequencies:
                raise ValueError("STRING: `learn_frequencies` belongs to variant='cayley'; the circulant weights "
                                 "already are the frequencies, so leave learn_frequencies=False")
            block_size = head_dim if block_size is None else block_size
            check_int(block_size, "block_size", 3)
            if head_dim % block_size:
                raise ValueError(f"STRING 'circulant': `block_size` ({block_size}) must divide `head_dim` "
                                 f"({head_dim}); the head is cut into head_dim / block_size circulant blocks")
            self.block_size, self.num_blocks = block_size, head_dim // block_size
            scale = _check_scale(0.5 if init_scale is None else init_scale) / math.sqrt(2.0 * block_size)
            shape = self._shape(num_axes, self.num_blocks, block_size)
            self.weight = nn.Parameter(torch.randn(shape, generator=gen) * scale)

    # -- the orthogonal pieces -------------------------------------------------------------------------------

    def orthogonal(self) -> torch.Tensor:
        """Cayley: ``P_S (D, D)`` (``(H, D, D)`` per head), the map applied before RoPE."""
        if self.variant != "cayley":
            raise ValueError("STRING.orthogonal: only variant='cayley' has a position-independent map; the "
                             "circulant variant's rotation depends on the position (STRING.frequencies)")
        return cayley(skew(self.weight))

    def generators(self) -> torch.Tensor:
        """Circulant: the skew-symmetric block generators ``L_a = C_a − C_aᵀ`` as ``(A, D/b, b, b)``
        (``(H, A, D/b, b, b)``) dense matrices (for analysis; ``rotate`` uses the FFT)."""
        if self.variant != "circulant":
            raise ValueError("STRING.generators: variant='cayley' has no per-axis generators of its own; its "
                             "rotation is RoPE after STRING.orthogonal()")
        b = self.block_size
        i = torch.arange(b, device=self.weight.device)
        C = self.weight[..., (i[:, None] - i[None, :]) % b]  # C[i, j] = c[(i − j) mod b]
        return C - C.transpose(-1, -2)

    def frequencies(self) -> torch.Tensor:
        """Circulant: plane frequencies ``2 · Im(FFT(c))`` per axis, block and Fourier mode ``k = 0 … b//2``:
        ``(A, D/b, b//2 + 1)`` (``(H, …)``). Mode k turns by ``Σ_a r_a · frequencies[a, n, k]``."""
        if self.variant != "circulant":
            raise ValueError("STRING.frequencies: variant='cayley' uses the RoPE frequency matrix `freqs`")
        b = self.block_size
        theta = 2.0 * torch.fft.rfft(self.weight, dim=-1).imag
        moving = torch.ones(b // 2 + 1, dtype=theta.dtype, device=theta.device)
        moving[0] = 0.0  # the constant mode: Im = 0 exactly; set so, not rounded
        if b % 2 == 0:
            moving[-1] = 0.0  # the alternating mode (even b): likewise fixed
        return theta * moving

    # -- rotation --------------------------------------------------------------------------------------------

    def _work(self, *tensors: torch.Tensor) -> torch.dtype:
        return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32

    def _rotate_cayley(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, P: torch.Tensor,
                       work: torch.dtype) -> torch.Tensor:
        y = x.to(work) @ P.to(work).transpose(-1, -2)  # P x per token; (H, D, D) broadcasts over the batch
        return apply_rotary(y, cos.to(work), sin.to(work), channels=self.channels).to(x.dtype)

    def _rotate_circulant(self, x: torch.Tensor, turn: torch.Tensor, work: torch.dtype) -> torch.Tensor:
        b = self.block_size
        spec = torch.fft.rfft(x.to(work).unflatten(-1, (self.num_blocks, b)), dim=-1)  # (B, H, L, n, K)
        out = torch.fft.irfft(spec * turn, n=b, dim=-1)
        return out.flatten(-2).to(x.dtype)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords: "torch.Tensor | Layout | str", *,
               seq_dim: int = -2) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q and k ``(B, H, L, D)`` (``seq_dim=1``: ``(B, L, H, D)``) at ``coords`` ``(L, A)``,
        ``(B, L, A)`` or a layout string."""
        self._check_qk(q, k, seq_dim)
        if seq_dim == 1:
            rq, rk = self.rotate(q.transpose(1, 2), k.transpose(1, 2), coords)
            return rq.transpose(1, 2), rk.transpose(1, 2)
        c = self._coords(self._batch(coords, q), self.weight.device)
        work = self._work(q, k, c, self.weight)
        if self.variant == "cayley":
            cos, sin = cos_sin(angles(c.to(work), self.freqs.to(work)))  # (…, L, D/2), shared by every head
            P = self.orthogonal()
            return self._rotate_cayley(q, cos, sin, P, work), self._rotate_cayley(k, cos, sin, P, work)
        theta = self.frequencies().to(work)  # (…, A, n, K)
        c = c.to(work)
        if theta.ndim == 4:  # per head: (…, 1, L, A) against (H, 1, A, n, K)
            c, theta = c[..., None, :, :], theta[:, None]
        phase = sum(c[..., a, None, None] * theta[..., a, :, :] for a in range(self.num_axes))  # (…, L, n, K)
        if self.num_heads is None and phase.ndim == 4:  # (B, L, n, K): broadcast over heads
            phase = phase[:, None]
        turn = torch.polar(torch.ones_like(phase), phase)
        return self._rotate_circulant(q, turn, work), self._rotate_circulant(k, turn, work)

    forward = rotate

    def extra_repr(self) -> str:
        extra = (f", allocation={self.allocation!r}, channels={self.channels!r}" if self.variant == "cayley"
                 else f", block_size={self.block_size}")
        return f"variant={self.variant!r}, " + super().extra_repr() + extra
