"""FoPE (Fourier Position Embedding) as an ``nn.Module``: RoPE whose cos/sin are learned Fourier series.

Hua et al., "Fourier Position Embedding: Enhancing Attention's Periodic Extension for Length Generalization"
(arXiv 2412.17739); the form used by Intern-S1-Pro and served by vLLM (``FourierRotaryEmbedding``).

For a token at position ``t`` and frequencies ``ω_f = base^(−2f/R)`` (``R = rotary_dim``):

1. **Zero the sub-threshold frequencies.** A frequency whose period ``2π/ω_f`` is at least the training
   length ``N`` (``max_position_embeddings``) never completes a turn during training; FoPE drops it
   (``ω_f ≤ 2π/N``), or keeps the first ``num_inv_freq`` when that is given. ``F`` frequencies remain.
2. **Mix them per channel pair.** Pair ``d < F`` gets the Fourier series
   ``c_d(t) = Σ_f cos(ω_f t) · C[f, d]`` and ``s_d(t) = Σ_f sin(ω_f t) · S[f, d]`` with learned
   ``C, S`` (``F × F``, one pair per KV head with ``num_kv_heads``); pairs ``d ≥ F`` are the zero
   frequency: ``c_d = 1``, ``s_d = 0`` (unrotated).
3. **Apply like RoPE** on the pairs ``(d, d + D/2)`` of the whole head: ``x_d ← x_d c_d − x_{d+D/2} s_d``,
   ``x_{d+D/2} ← x_{d+D/2} c_d + x_d s_d``, the same tables for q and k; query head ``j`` uses KV head
   ``j // (H_q / H_kv)``.

With ``C = S = I`` this is RoPE on the kept frequencies (and the identity on the rest); otherwise ``c_d`` and
``s_d`` are no longer a cosine/sine pair of one angle, so FoPE is neither norm-preserving nor exactly relative.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..apply.planar import apply_rotary
from ..layout import Layout
from ..rotations.lie import check_int
from ..rotations.planar import check_base
from .learned import _LearnedRotary, _check_scale, _generator

__all__ = ["FoPE"]


class FoPE(_LearnedRotary):
    """Fourier Position Embedding (module docstring); 1-D positions.

    - ``head_dim``: channels of q/k (even); pairs are ``(d, d + head_dim/2)`` over the whole head.
    - ``max_position_embeddings``: the training length ``N``; frequencies with ``ω ≤ 2π/N`` are dropped
      (zero frequency), unless ``num_inv_freq`` picks the first ``num_inv_freq`` frequencies instead.
    - ``base``, ``rotary_dim`` (default ``head_dim``): the spectrum ``ω_f = base^(−2f/rotary_dim)``. As in
      vLLM, ``rotary_dim`` sets only the spectrum; the pairing stays ``(d, d + head_dim/2)``.
    - ``num_kv_heads``: one ``(F, F)`` pair of coefficient matrices per KV head (vLLM's ``fope_sep_head=True``,
      ``num_key_value_heads``); ``None`` shares one pair across heads (``fope_sep_head=False``).
    - ``init_factor``: coefficients start at ``I + N(0, σ²)`` with the Xavier-normal
      ``σ = init_factor · √(2 / (fan_in + fan_out))`` of the parameter's shape, as the training code
      initialises them (``fope_init_factor``); seeded by ``seed``. ``init_factor=0`` starts as RoPE.
    - ``design``: the position design used when ``rotate`` gets a layout string (1 axis).

    Parameters ``cos_coef``/``sin_coef``: ``(num_kv_heads, F, F)`` or ``(F, F)``, laid out as vLLM's
    (input frequency, output pair), so a checkpoint's tensors load as they are (with ``fope_sep_head=False``,
    vLLM's ``[0]``). ``inv_freq (F,)`` is a buffer computed from the arguments.
    """

    def __init__(self, head_dim: int, max_position_embeddings: int, *, base: float = 10000.0,
                 rotary_dim: int | None = None, num_kv_heads: int | None = None, num_inv_freq: int | None = None,
                 init_factor: float = 0.1, seed: int | None = None, design: str = "vanilla") -> None:
        super().__init__(head_dim, 1, None, design, "FoPE")
        if head_dim % 2:
            raise ValueError(f"FoPE: `head_dim` must be even (channels rotate in pairs (d, d + head_dim/2)), "
                             f"got {head_dim}")
        check_int(max_position_embeddings, "max_position_embeddings")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_int(rotary_dim, "rotary_dim", 2)
        if rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(f"FoPE: `rotary_dim` must be even and <= head_dim={head_dim}, got {rotary_dim}")
        base = check_base(base)
        if num_kv_heads is not None:
            check_int(num_kv_heads, "num_kv_heads")
        if num_inv_freq is not None:
            check_int(num_inv_freq, "num_inv_freq")
            if num_inv_freq > rotary_dim // 2:
                raise ValueError(f"FoPE: `num_inv_freq` ({num_inv_freq}) must be <= rotary_dim/2 = {rotary_dim // 2}, "
                                 f"the number of frequencies; or None to drop those with period >= "
                                 f"max_position_embeddings")
        gain = _check_scale(init_factor, "init_factor")
        # the spectrum in float32, the expression ropekit.inv_freq and the reference use
        freqs = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
        if num_inv_freq is not None:
            freqs = freqs[:num_inv_freq]
        else:  # keep ω > 2π/N: a period shorter than the training length (compared in float32, as vLLM)
            freqs = freqs[freqs > 2.0 * math.pi / max_position_embeddings]
        if freqs.numel() == 0:
            raise ValueError(f"FoPE: no frequency has a period shorter than max_position_embeddings="
                             f"{max_position_embeddings} (the highest, 1 rad/token, has period 2π ≈ 6.28); "
                             f"give a training length >= 7 or set `num_inv_freq`")
        self.max_position_embeddings, self.rotary_dim, self.base = max_position_embeddings, rotary_dim, base
        self.num_kv_heads, self.num_inv_freq, self.init_factor = num_kv_heads, num_inv_freq, gain
        self.num_freqs = F = freqs.numel()
        self.register_buffer("inv_freq", freqs, persistent=False)  # a function of the arguments, not a weight
        shape = ((num_kv_heads,) if num_kv_heads is not None else ()) + (F, F)
        fan_in, fan_out = shape[-1] * (F if len(shape) == 3 else 1), shape[0] * (F if len(shape) == 3 else 1)
        std = gain * math.sqrt(2.0 / (fan_in + fan_out))  # torch's Xavier fans for this shape
        gen = _generator(seed)
        eye = torch.eye(F)
        self.cos_coef = nn.Parameter(eye + std * torch.randn(shape, generator=gen))
        self.sin_coef = nn.Parameter(eye + std * torch.randn(shape, generator=gen))

    def _positions(self, coords: "torch.Tensor | Layout | str", device: torch.device) -> torch.Tensor:
        if isinstance(coords, torch.Tensor) and coords.ndim == 1:
            coords = coords[:, None]  # plain 1-D positions (L,)
        return self._coords(coords, device)[..., 0]

    def cos_sin(self, coords: "torch.Tensor | Layout | str") -> tuple[torch.Tensor, torch.Tensor]:
        """The mixed tables ``(…, L, head_dim/2)`` (``(…, H_kv, L, head_dim/2)`` with ``num_kv_heads``) at
        positions ``coords`` (``(L,)``, ``(L, 1)``, ``(B, L, 1)`` or a layout string): ``c_d(t)``, ``s_d(t)``
        for ``d < F``, then 1 and 0."""
        t = self._positions(coords, self.inv_freq.device)
        work = torch.float64 if torch.float64 in (t.dtype, self.cos_coef.dtype) else torch.float32
        phase = t.to(work)[..., None] * self.inv_freq.to(work)  # (…, L, F)
        C, S = self.cos_coef.to(work), self.sin_coef.to(work)
        if C.ndim == 3:  # per KV head: (…, L, F) · (H, F, F) → (…, H, L, F)
            cos = torch.einsum("...lf,hfd->...hld", phase.cos(), C)
            sin = torch.einsum("...lf,hfd->...hld", phase.sin(), S)
        else:
            cos, sin = phase.cos() @ C, phase.sin() @ S
        rest = self.head_dim // 2 - self.num_freqs  # zero-frequency pairs: cos 1, sin 0
        if rest:
            cos = torch.cat((cos, cos.new_ones(cos.shape[:-1] + (rest,))), dim=-1)
            sin = torch.cat((sin, sin.new_zeros(sin.shape[:-1] + (rest,))), dim=-1)
        return cos, sin

    def _tables_for(self, t: torch.Tensor, x: torch.Tensor, name: str, seq_dim: int) -> torch.Tensor:
        """Table ``t`` shaped for ``x``: per-head tables repeated over each KV head's query group."""
        if self.num_kv_heads is None:
            return t
        heads = x.shape[1 if seq_dim == -2 else 2]
        if t.ndim == 3:
            t = t[None]  # (1, H_kv, L, ·): one table set for every sample
        if heads % self.num_kv_heads:
            raise ValueError(f"FoPE: `{name}` has {heads} heads, not a multiple of num_kv_heads={self.num_kv_heads}; "
                             f"query head j uses KV head j // (heads / num_kv_heads)")
        return t.repeat_interleave(heads // self.num_kv_heads, dim=1)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, coords: "torch.Tensor | Layout | str", *,
               seq_dim: int = -2) -> tuple[torch.Tensor, torch.Tensor]:
        """Apply FoPE to q ``(B, H_q, L, D)`` and k ``(B, H_kv, L, D)`` (``seq_dim=1``: ``(B, L, H, D)``) at
        positions ``(L,)``, ``(L, 1)``, ``(B, L, 1)`` or a layout string."""
        self._check_qk(q, k, seq_dim)
        cos, sin = self.cos_sin(self._batch(coords, q))
        out = []
        for name, x in (("q", q), ("k", k)):
            hd = 1 if seq_dim == -2 else 2
            if self.num_kv_heads is not None and x.shape[hd] == 1:  # one head meets every KV head's tables,
                x = x.expand(*x.shape[:hd], self.num_kv_heads, *x.shape[hd + 1:])  # as LieRE's per-head weights
            c, s = self._tables_for(cos, x, name, seq_dim), self._tables_for(sin, x, name, seq_dim)
            work = x.double() if c.dtype == torch.float64 else x  # a float64 module keeps float64 maths
            out.append(apply_rotary(work, c, s, channels="half", seq_dim=seq_dim).to(x.dtype))
        return out[0], out[1]

    forward = rotate

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, max_position_embeddings={self.max_position_embeddings}, "
                f"rotary_dim={self.rotary_dim}, base={self.base}, num_freqs={self.num_freqs}, "
                f"num_kv_heads={self.num_kv_heads}")
