"""Small compiled CPU kernels: the ``out=`` form of the fused apply (``"half"`` channel pairs) and GeoPE's
interleaved channel triples.

Inductor cannot write a rotation into a caller's buffer as well as it writes a fresh one: copying each
half into a slice of an input becomes one masked loop over the whole row that also reads the old output
(0.4 of a preallocated copy in bfloat16), and a full-row copy of a concatenation is staged in a result
buffer. This kernel does per row what the reference does per element (float32 work, ``x1·c − x2·s`` and
``x2·c + x1·s`` as separate products and sums, one rounding to the output dtype), vectorised with ATen's
``at::vec`` and compiled by Inductor's C++ toolchain, whose flags keep IEEE arithmetic (no contraction
into fused multiply-adds): the same bits as the functional path, checked by the tests.

Each row reads both halves before writing either, so the output may be the input itself (in place).
Work goes in blocks of sequence positions, every head of a block in turn, so one block of cos/sin serves
all heads from L1 while each head's rows are read in runs of 64 bytes per channel (16 positions in float32,
32 in 16-bit types: 8 KiB at head dim 128; 16-position blocks in bfloat16 measured 2-5 % slower on a quiet
machine). OpenMP hands the blocks to torch's threads a few at a time (a thread that is descheduled on a
busy machine takes fewer). The kernel is built on first use (one to three seconds; Inductor caches it on
disk); where that fails, :func:`kernel_for` returns None and the caller uses its other paths.

GeoPE with ``channels="interleaved"`` (triple i = channels 3i, 3i+1, 3i+2): Inductor leaves a loop with
stride-3 loads and stores scalar, so compiled GeoPE in the paper's layout cost 1.5-3x compiled planar RoPE.
:func:`geope_kernel_for` builds a loop over triples that GCC vectorises with permutes (Inductor's flags turn
GCC's loop vectoriser off; the one function that needs it turns it back on). It gives the eager path's
bits: each output component sums its three terms in the eager path's order, and adds the second and third
as ATen's ``addcmul`` does there, rounded once (a fused multiply-add, the AVX2/AVX512 kernels) or twice (the
default kernels), which :func:`addcmul_fuses` finds out once per process. It reads the rotation's weight
``planes`` in place, or packed ``triples`` laid out as planes per block of positions; bfloat16 is widened and
rounded (to nearest even, as torch) inside the loop, two triples at a time as three 32-bit words; float16
goes through float32 row buffers.
"""
from __future__ import annotations

import threading

import torch

__all__ = ["geope_kernel_for", "geope_supports", "kernel_for", "rotate_geope_into", "rotate_half_into", "supports"]

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
    constexpr int64_t CH = 64 / sizeof(scalar_t);  // positions per block: as many bytes per row run in every dtype
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


def _build(name: str, dtype: torch.dtype, source: str, argtypes) -> object:
    """Kernel ``name`` for ``dtype`` from ``source`` (``%(T)s``, ``%(LOAD)s``, ``%(STORE)s`` filled in from
    :data:`_TYPES`), built on first use and kept; None when it cannot be built here (no compiler, another
    torch), remembered so that the build is tried once per process. ``argtypes`` maps the C++ element
    type to the entry point's argument types."""
    key = (name, dtype)
    kern = _kernels.get(key)
    if kern is not None or key in _failed or dtype not in _TYPES:
        return kern
    with _lock:
        if key in _kernels:
            return _kernels[key]
        ctype, load, store = _TYPES[dtype]
        try:
            from torch._inductor.codecache import CppPythonBindingsCodeCache

            kern = CppPythonBindingsCodeCache.load_pybinding(
                argtypes(ctype), source % {"T": ctype, "LOAD": load, "STORE": store})
        except Exception:  # noqa: BLE001 - no compiler, another torch: the caller has other paths
            _failed.add(key)
            return None
        _kernels[key] = kern
        return kern


def kernel_for(dtype: torch.dtype):
    """The compiled kernel for ``dtype`` (built on first use), or None when it cannot be built here."""
    return _build("half", dtype, _SOURCE,
                  lambda t: [f"const {t}*", f"{t}*", "const float*", "const float*"] + ["int64_t"] * 18)


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


# GeoPE, channels="interleaved": triple i of a row is channels 3i, 3i+1, 3i+2, rotated by the nine weights of
# ropekit.rotations.geope.triple_weights ((…, L, n, 9): R00, R01, R02, R11, R12, R10, R22, R21, R20).
_GEOPE_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>
#include <cstring>
#include <vector>
using scalar_t = %(T)s;
static inline at::vec::VectorizedN<float,2> load_f(const scalar_t* p, int64_t n) {
%(LOAD)s
}
static inline void store_f(const at::vec::VectorizedN<float,2>& v, scalar_t* p, int64_t n) {
%(STORE)s
}
// m triples of v (channels 3i, 3i+1, 3i+2) into o, weight t of triple i at w[t * m + i]. Each component sums
// its three terms in the eager path's order (own component, the nearer, the farther) in float32: the first
// product, then each further term added as ATen's addcmul adds it there, fused into one rounding (FUSED) or
// rounded product then sum; then one rounding to the output type. The build keeps IEEE arithmetic (no
// contraction, no reassociation), so vectorising changes only the loads and stores (stride 3, done with
// permutes). Inductor's flags turn GCC's loop vectoriser off (-fno-tree-loop-vectorize); this one function
// turns it back on. Elements are float, or bfloat16 as its bits (uint16_t): widening is exact, narrowing
// rounds to nearest even as torch does (NaN stays NaN), both written so that they vectorise.
#if defined(__GNUC__) && !defined(__clang__)
#define LOOP_VECTORIZE __attribute__((optimize("tree-loop-vectorize")))
#else
#define LOOP_VECTORIZE
#endif
static inline float widen(float v) { return v; }
static inline float widen(uint16_t b) { uint32_t u = uint32_t(b) << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <typename T> static inline T narrow(float f);
template <> inline float narrow<float>(float f) { return f; }
template <> inline uint16_t narrow<uint16_t>(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return f != f ? uint16_t(0x7FC0) : uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
template <bool FUSED>
static inline float term(float acc, float a, float b) {
    if constexpr (FUSED) return std::fma(a, b, acc); else return acc + a * b;
}
template <bool FUSED, typename TI, typename T>
LOOP_VECTORIZE static void rotate(const TI* __restrict__ v, T* __restrict__ o, const float* __restrict__ w,
                                  int64_t m, int64_t P) {
    const float *w0 = w, *w1 = w + P, *w2 = w + 2 * P, *w3 = w + 3 * P, *w4 = w + 4 * P, *w5 = w + 5 * P,
                *w6 = w + 6 * P, *w7 = w + 7 * P, *w8 = w + 8 * P;
    for (int64_t i = 0; i < m; ++i) {
        const float v0 = widen(v[3 * i]), v1 = widen(v[3 * i + 1]), v2 = widen(v[3 * i + 2]);
        o[3 * i] = narrow<T>(term<FUSED>(term<FUSED>(w0[i] * v0, w1[i], v1), w2[i], v2));
        o[3 * i + 1] = narrow<T>(term<FUSED>(term<FUSED>(w3[i] * v1, w4[i], v2), w5[i], v0));
        o[3 * i + 2] = narrow<T>(term<FUSED>(term<FUSED>(w6[i] * v2, w7[i], v1), w8[i], v0));
    }
}
// bfloat16 two triples at a time as three 32-bit words (a pair of bfloat16 each): widening is a shift or a
// mask of a 32-bit lane and the stride-3 permutes move 32-bit lanes, cheaper than permuting 16-bit lanes
// (same arithmetic, same bits as rotate<FUSED, uint16_t, uint16_t>). Words read through a may_alias type.
typedef uint32_t __attribute__((may_alias)) word_t;
static inline float hi_f(uint32_t w) { uint32_t u = w & 0xFFFF0000u; float f; std::memcpy(&f, &u, 4); return f; }
static inline float lo_f(uint32_t w) { uint32_t u = w << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <bool FUSED>
LOOP_VECTORIZE static void rotate_pairs(const word_t* __restrict__ v, word_t* __restrict__ o,
                                        const float* __restrict__ w, int64_t pairs, int64_t P) {
    const float *w0 = w, *w1 = w + P, *w2 = w + 2 * P, *w3 = w + 3 * P, *w4 = w + 4 * P, *w5 = w + 5 * P,
                *w6 = w + 6 * P, *w7 = w + 7 * P, *w8 = w + 8 * P;
    for (int64_t j = 0; j < pairs; ++j) {
        const uint32_t a = v[3 * j], b = v[3 * j + 1], c = v[3 * j + 2];
        const float x0 = lo_f(a), x1 = hi_f(a), x2 = lo_f(b), y0 = hi_f(b), y1 = lo_f(c), y2 = hi_f(c);
        const int64_t i = 2 * j, k = 2 * j + 1;
        const float r0 = term<FUSED>(term<FUSED>(w0[i] * x0, w1[i], x1), w2[i], x2);
        const float r1 = term<FUSED>(term<FUSED>(w3[i] * x1, w4[i], x2), w5[i], x0);
        const float r2 = term<FUSED>(term<FUSED>(w6[i] * x2, w7[i], x1), w8[i], x0);
        const float s0 = term<FUSED>(term<FUSED>(w0[k] * y0, w1[k], y1), w2[k], y2);
        const float s1 = term<FUSED>(term<FUSED>(w3[k] * y1, w4[k], y2), w5[k], y0);
        const float s2 = term<FUSED>(term<FUSED>(w6[k] * y2, w7[k], y1), w8[k], y0);
        o[3 * j] = uint32_t(narrow<uint16_t>(r0)) | (uint32_t(narrow<uint16_t>(r1)) << 16);
        o[3 * j + 1] = uint32_t(narrow<uint16_t>(r2)) | (uint32_t(narrow<uint16_t>(s0)) << 16);
        o[3 * j + 2] = uint32_t(narrow<uint16_t>(s1)) | (uint32_t(narrow<uint16_t>(s2)) << 16);
    }
}
// m consecutive triples of x into o (float32 work; float16 through the float buffers fi, fo), weight t of
// triple i at w[t * P + i]
template <typename S>
static void rotate_run(const S* x, S* o, const float* w, int64_t m, int64_t P, bool fused, float* fi, float* fo) {
    constexpr int64_t V = 2 * at::vec::Vectorized<float>::size();
    const int64_t R = 3 * m;
    if constexpr (std::is_same_v<S, float>) {
        if (fused) rotate<true>(x, o, w, m, P); else rotate<false>(x, o, w, m, P);
        return;
    } else {
        if constexpr (std::is_same_v<S, at::BFloat16>) {  // its bits, widened and rounded in the loop
            auto xi = reinterpret_cast<const uint16_t*>(x);
            auto oi = reinterpret_cast<uint16_t*>(o);
            // pairs of triples as 32-bit words where both rows are 4-byte aligned, the odd one out alone
            const bool aligned = reinterpret_cast<uintptr_t>(x) %% 4 == 0 && reinterpret_cast<uintptr_t>(o) %% 4 == 0;
            const int64_t h = aligned ? m / 2 : 0;
            if (h > 0) {
                auto xw = reinterpret_cast<const word_t*>(xi);
                auto ow = reinterpret_cast<word_t*>(oi);
                if (fused) rotate_pairs<true>(xw, ow, w, h, P); else rotate_pairs<false>(xw, ow, w, h, P);
            }
            if (m > 2 * h) {
                if (fused) rotate<true>(xi + 6 * h, oi + 6 * h, w + 2 * h, m - 2 * h, P);
                else rotate<false>(xi + 6 * h, oi + 6 * h, w + 2 * h, m - 2 * h, P);
            }
        } else {  // float16: through float32 buffers
            for (int64_t j = 0; j < R; j += V)
                load_f(x + j, std::min(V, R - j)).store(fi + j, std::min(V, R - j));
            if (fused) rotate<true>(fi, fo, w, m, P); else rotate<false>(fi, fo, w, m, P);
            for (int64_t j = 0; j < R; j += V)  // one rounding to the output dtype, as the reference
                store_f(at::vec::VectorizedN<float,2>::loadu(fo + j, std::min(V, R - j)), o + j, std::min(V, R - j));
        }
    }
}
// rows (i0, i1, i2) = (batch, heads, sequence). Weights either as planes (packed == 0): weight t of triple i of
// position (i0, i2) at w[t * wp + i0 * ws0 + i2 * ws2 + i] (ropekit's `planes`, (9, B, L, n)), read in place;
// or packed (packed == 1): the nine weights of that triple at w[i0 * ws0 + i2 * ws2 + 9 * i + t] (`triples`,
// (B, L, n, 9)), laid out as planes per block first. ws0 = 0: weights shared by the batch. Work goes in blocks
// of CH sequence positions, every head of a block in turn, so the block's weights serve every head from cache.
// Where a head's rows follow each other in memory, every channel is rotated and a block's weight planes are
// contiguous along the sequence (contiguous (B, H, L, 3n) input), the block's rows of one head are one run of
// triples: each loop runs CH times longer than a row.
template <typename S>  // a template, so that only the branches for this element type are compiled
static void run(const S* const* xs, S* const* os, const int64_t* heads, const int64_t* xst, const int64_t* ost,
                int64_t nx, const float* w, int64_t n0, int64_t n2, int64_t ws0, int64_t ws2, int64_t wp,
                bool packed, int64_t n, int64_t D, bool fused, int64_t nthreads)
{
    constexpr int64_t CH = 64;
    const int64_t nblk = (n2 + CH - 1) / CH, R = 3 * n;
    const int64_t P = packed ? CH * n : wp, step = packed ? n : ws2;
    constexpr bool widened = std::is_same_v<S, at::Half>;
    #pragma omp parallel num_threads(nthreads)
    {
        std::vector<float> wt(packed ? 9 * P : 0), fi(widened ? R : 0), fo(widened ? R : 0);
        #pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < n0 * nblk; ++task) {
            const int64_t i0 = task / nblk, b = task %% nblk;
            const int64_t start = b * CH, len = std::min(n2, start + CH) - start;
            const float* wb = w + i0 * ws0 + start * ws2;  // this block's weights: position p at wb + p * step
            if (packed) {
                for (int64_t p = 0; p < len; ++p)
                    for (int64_t i = 0; i < n; ++i)
                        for (int64_t t = 0; t < 9; ++t)
                            wt[t * P + p * n + i] = wb[p * ws2 + 9 * i + t];
                wb = wt.data();
            }
            for (int64_t j = 0; j < nx; ++j) {  // q, then k: one block of weights serves both
                const int64_t *s = xst + 3 * j, *so = ost + 3 * j;
                const bool merged = R == D && s[2] == D && so[2] == D && step == n && !widened;
                for (int64_t i1 = 0; i1 < heads[j]; ++i1) {
                    const S* xb = xs[j] + i0 * s[0] + i1 * s[1] + start * s[2];
                    S* ob = os[j] + i0 * so[0] + i1 * so[1] + start * so[2];
                    if (merged) {
                        rotate_run(xb, ob, wb, len * n, P, fused, fi.data(), fo.data());
                        continue;
                    }
                    for (int64_t p = 0; p < len; ++p) {
                        const S* xr = xb + p * s[2];
                        S* orow = ob + p * so[2];
                        rotate_run(xr, orow, wb + p * step, n, P, fused, fi.data(), fo.data());
                        if (R < D)
                            std::memcpy(orow + R, xr + R, (D - R) * sizeof(S));
                    }
                }
            }
        }
    }
}
// x and o (and, with nx = 2, y and p: the keys next to the queries) are (batch, heads, sequence) rows with
// strides xs*/os*/ys*/ps*; hx, hy heads; the batch and sequence sizes are shared.
extern "C" void kernel(const scalar_t* x, scalar_t* o, const scalar_t* y, scalar_t* p, const float* w,
                       int64_t nx, int64_t n0, int64_t hx, int64_t hy, int64_t n2,
                       int64_t xs0, int64_t xs1, int64_t xs2, int64_t os0, int64_t os1, int64_t os2,
                       int64_t ys0, int64_t ys1, int64_t ys2, int64_t ps0, int64_t ps1, int64_t ps2,
                       int64_t ws0, int64_t ws2, int64_t wp, int64_t packed, int64_t n, int64_t D, int64_t fused,
                       int64_t nthreads)
{
    const scalar_t* xs[2] = {x, y};
    scalar_t* outs[2] = {o, p};
    const int64_t heads[2] = {hx, hy};
    const int64_t xst[6] = {xs0, xs1, xs2, ys0, ys1, ys2}, ost[6] = {os0, os1, os2, ps0, ps1, ps2};
    run<scalar_t>(xs, outs, heads, xst, ost, nx, w, n0, n2, ws0, ws2, wp, packed != 0, n, D, fused != 0, nthreads);
}
"""


def geope_kernel_for(dtype: torch.dtype):
    """The compiled GeoPE kernel (interleaved triples) for ``dtype``, or None when it cannot be built here."""
    return _build("geope", dtype, _GEOPE_SOURCE,
                  lambda t: [f"const {t}*", f"{t}*", f"const {t}*", f"{t}*", "const float*"] + ["int64_t"] * 25)


def geope_supports(x: torch.Tensor) -> bool:
    """Whether the GeoPE kernel handles ``x``: CPU, float32/bfloat16/float16, 3-D or 4-D, channels contiguous."""
    return x.device.type == "cpu" and x.dtype in _TYPES and x.ndim in (3, 4) and x.stride(-1) == 1


def rotate_geope_into(kern, xs, weights: torch.Tensor, outs, seq_dim: int, *, planes: bool, fused: bool) -> None:
    """Rotate the interleaved triples of each tensor of ``xs`` (one, or q and k: same batch and sequence, head
    counts may differ) into the matching tensor of ``outs`` (not overlapping the inputs; channels past ``3n``
    copied), in one pass over the rotation's weights.

    ``weights`` are float32 CPU weights of :func:`ropekit.rotations.geope.triple_weights`' order, shared
    (``L``) or per sample (``B, L`` with B = 1 or x's batch): component-major ``planes`` ``(9, [B,] L, n)``
    (``planes=True``, read in place) or ``triples`` ``(…, L, n, 9)``. ``seq_dim`` is -2 for ``(…, H, L, D)`` and 1
    for ``(B, L, H, D)``; ``fused``: each sum term added with one rounding (see :func:`addcmul_fuses`)."""
    if isinstance(xs, torch.Tensor):
        xs, outs = (xs,), (outs,)
    if planes:
        n = weights.shape[-1]
        if weights.stride(-1) != 1:
            weights = weights.contiguous()
        if weights.ndim == 3:
            weights = weights[:, None]
        wp, ws0, ws2 = weights.stride(0), weights.stride(1), weights.stride(2)
    else:
        n = weights.shape[-2]
        if weights.stride(-1) != 1 or weights.stride(-2) != 9:
            weights = weights.contiguous()
        if weights.ndim == 3:
            weights = weights[None]
        wp, ws0, ws2 = 0, weights.stride(0), weights.stride(1)
    if weights.shape[-3 if planes else -4] == 1:
        ws0 = 0
    if xs[0].ndim == 3:  # one (H, L, D) sample each
        xs, outs = tuple(x[None] for x in xs), tuple(o[None] for o in outs)
        seq_dim = -2
    dims = (0, 1, 2) if seq_dim == -2 else (0, 2, 1)  # (batch, heads, sequence)
    pick = lambda t: [t[d] for d in dims]  # noqa: E731
    x, o = xs[0], outs[0]
    y, p = (xs[1], outs[1]) if len(xs) > 1 else (x, o)
    B, H, L = pick(x.shape)
    kern(x, o, y, p, weights, len(xs), B, H, pick(y.shape)[1], L, *pick(x.stride()), *pick(o.stride()),
         *pick(y.stride()), *pick(p.stride()), ws0, ws2, wp, int(not planes), n, x.shape[-1], int(fused),
         torch.get_num_threads())


_addcmul_mode: list = []


def addcmul_fuses() -> bool | None:
    """Whether ATen's CPU ``addcmul`` (the eager GeoPE path's sums) rounds ``acc + x·c`` once (a fused
    multiply-add: the AVX2/AVX512 kernels) or twice (the default kernels), or None when its vectorised
    body and its scalar remainder disagree (then no kernel can match the eager path for every length).
    Found once by a probe where the two differ: (1 + 2⁻¹²)² − (1 + 2⁻¹¹) is 2⁻²⁴ fused and 0 rounded."""
    if not _addcmul_mode:
        x = torch.full((67,), 1 + 2.0 ** -12)
        acc = torch.full((67,), -(1 + 2.0 ** -11))
        r = torch.addcmul(acc, x, x)  # 64 in the vectorised body (every ISA's width divides it), 3 left over
        fused = r != 0
        _addcmul_mode.append(bool(fused[0]) if bool((fused == fused[0]).all()) else None)
    return _addcmul_mode[0]
