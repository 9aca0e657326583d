"""A small compiled CPU kernel for the ``out=`` form of the fused apply (``"half"`` channel pairs).

Inductor cannot write a rotation into a caller's buffer as well as it writes a fresh one: copying each
half into a slice of an input becomes one masked loop over the whole row that also reads the old output
(0.4 of a preallocated copy in bfloat16), and a full-row copy of a concatenation is staged in a result
buffer. This kernel does per row what the reference does per element (float32 work, ``x1·c − x2·s`` and
``x2·c + x1·s`` as separate products and sums, one rounding to the output dtype), vectorised with ATen's
``at::vec`` and compiled by Inductor's C++ toolchain, whose flags keep IEEE arithmetic (no contraction
into fused multiply-adds): the same bits as the functional path, checked by the tests.

Each row reads both halves before writing either, so the output may be the input itself (in place).
Work goes in blocks of 16 sequence positions, every head of a block in turn, so one block of cos/sin
serves all heads from L1 while each head's rows are read in runs; OpenMP hands the blocks to torch's
threads a few at a time (a thread that is descheduled on a busy machine takes fewer). The kernel is built on first use (one to three seconds; Inductor caches it on disk); where that
fails, :func:`kernel_for` returns None and the caller uses its other paths.
"""
from __future__ import annotations

import threading

import torch

__all__ = ["kernel_for", "rotate_half_into", "supports"]

_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <cstring>
using scalar_t = %(T)s;
static inline at::vec::VectorizedN<float,2> load_f(const scalar_t* p, int64_t n) {
%(LOAD)s
}
static inline void store_f(const at::vec::VectorizedN<float,2>& v, scalar_t* p, int64_t n) {
%(STORE)s
}
// rows (i0, i1, i2): i1 is the dim cos/sin are usually shared along (heads), i2 the sequence
extern "C" void kernel(const scalar_t* x, scalar_t* o, const float* c, const float* s,
                       int64_t n0, int64_t n1, int64_t n2,
                       int64_t xs0, int64_t xs1, int64_t xs2, int64_t os0, int64_t os1, int64_t os2,
                       int64_t cs0, int64_t cs1, int64_t cs2, int64_t ss0, int64_t ss1, int64_t ss2,
                       int64_t half, int64_t D, int64_t nthreads)
{
    constexpr int64_t CH = 16;
    const int64_t nblk = (n2 + CH - 1) / CH;
    constexpr int64_t V = 2 * at::vec::Vectorized<float>::size();
    // dynamic: on a shared machine a descheduled thread must not hold back a fixed half of the work
    #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 4)
    for (int64_t task = 0; task < n0 * nblk; ++task) {
        const int64_t i0 = task / nblk, b = task %% nblk;
        const int64_t end = std::min(n2, (b + 1) * CH);
        for (int64_t i1 = 0; i1 < n1; ++i1) {
            for (int64_t i2 = b * CH; i2 < end; ++i2) {
                const scalar_t* xr = x + i0 * xs0 + i1 * xs1 + i2 * xs2;
                scalar_t* orow = o + i0 * os0 + i1 * os1 + i2 * os2;
                const float* cr = c + i0 * cs0 + i1 * cs1 + i2 * cs2;
                const float* sr = s + i0 * ss0 + i1 * ss1 + i2 * ss2;
                for (int64_t j = 0; j < half; j += V) {
                    const int64_t n = std::min(V, half - j);
                    auto x1 = load_f(xr + j, n);
                    auto x2 = load_f(xr + half + j, n);
                    auto cc = at::vec::VectorizedN<float,2>::loadu(cr + j, n);
                    auto ss = at::vec::VectorizedN<float,2>::loadu(sr + j, n);
                    auto r1 = x1 * cc - x2 * ss;
                    auto r2 = x2 * cc + x1 * ss;
                    store_f(r1, orow + j, n);
                    store_f(r2, orow + half + j, n);
                }
                if (2 * half < D && orow != xr)
                    std::memcpy(orow + 2 * half, xr + 2 * half, (D - 2 * half) * sizeof(scalar_t));
            }
        }
    }
}
"""

_TYPES = {  # dtype -> (C++ type, load as float, store from float)
    torch.float32: ("float", "    return at::vec::VectorizedN<float,2>::loadu(p, n);", "    v.store(p, n);"),
    torch.bfloat16: ("at::BFloat16",
                     "    return at::vec::convert<float,2,at::BFloat16,1>(at::vec::Vectorized<at::BFloat16>::loadu(p, n));",
                     "    at::vec::convert<at::BFloat16,1,float,2>(v).store(p, n);"),
    torch.float16: ("at::Half",
                    "    return at::vec::convert<float,2,at::Half,1>(at::vec::Vectorized<at::Half>::loadu(p, n));",
                    "    at::vec::convert<at::Half,1,float,2>(v).store(p, n);"),
}

_kernels: dict = {}
_failed: set = set()
_lock = threading.Lock()


def kernel_for(dtype: torch.dtype):
    """The compiled kernel for ``dtype`` (built on first use), or None when it cannot be built here."""
    kern = _kernels.get(dtype)
    if kern is not None or dtype in _failed or dtype not in _TYPES:
        return kern
    with _lock:
        if dtype in _kernels:
            return _kernels[dtype]
        ctype, load, store = _TYPES[dtype]
        try:
            from torch._inductor.codecache import CppPythonBindingsCodeCache

            argtypes = [f"const {ctype}*", f"{ctype}*", "const float*", "const float*"] + ["int64_t"] * 18
            kern = CppPythonBindingsCodeCache.load_pybinding(argtypes, _SOURCE % {"T": ctype, "LOAD": load,
                                                                                  "STORE": store})
        except Exception:  # noqa: BLE001 - no compiler, another torch: the caller has other paths
            _failed.add(dtype)
            return None
        _kernels[dtype] = kern
        return kern


def supports(x: torch.Tensor, out: torch.Tensor, channels: str) -> bool:
    """Whether the kernel handles this call: CPU, float32/bfloat16/float16, ``"half"`` pairs, 3-D or 4-D
    tensors whose channels are contiguous."""
    return (channels == "half" and x.device.type == "cpu" and x.dtype in _TYPES and x.ndim in (3, 4)
            and x.stride(-1) == 1 and out.stride(-1) == 1)


def rotate_half_into(kern, x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, out: torch.Tensor, seq_dim: int,
                     rot: int) -> None:
    """Rotate ``x`` into ``out`` (which may be ``x``); ``c``/``s`` broadcast against ``x[..., :rot/2]``."""
    half = rot // 2
    shape = (*x.shape[:-1], half)
    c = c.to(torch.float32).expand(shape)  # the work dtype (as the reference's c.to(float32)); views
    s = s.to(torch.float32).expand(shape)
    if c.stride(-1) != 1:
        c = c.contiguous()
    if s.stride(-1) != 1:
        s = s.contiguous()
    if x.ndim == 3:  # one (H, L, D) sample
        x, out, c, s = x[None], out[None], c[None], s[None]
        seq_dim = -2
    dims = (0, 1, 2) if seq_dim == -2 else (0, 2, 1)  # (batch, heads, sequence)
    pick = lambda t: [t[d] for d in dims]  # noqa: E731
    kern(x, out, c, s, *pick(x.shape), *pick(x.stride()), *pick(out.stride()), *pick(c.stride()),
         *pick(s.stride()), half, x.shape[-1], torch.get_num_threads())
