"""Fused apply path: the planar rotary apply with fewer passes over memory, same results.

:func:`apply_rotary_qk_fused` has the semantics of :func:`ropekit.apply.planar.apply_rotary_qk`
(RoPE, Su et al. eq. 34; ``"half"``/``"interleaved"`` pairs, partial rotary, float32 maths, output in
the input dtype, ``seq_dim`` read as a dim index: -2/2 for ``(B, H, L, D)``, 1/-3 for ``(B, L, H, D)``)
and picks the cheapest backend:

- CUDA tensors with triton installed: one Triton kernel per tensor (:mod:`.triton_rope`), which reads
  q/k and cos/sin once and writes the result once.
- inside ``torch.compile``: a purely functional formulation with no data-dependent branches, which
  Inductor fuses into one loop per half (``fullgraph=True`` compiles it without graph breaks).
- large CPU calls without gradients (``compiled=None``, the default: at least ``2**22`` elements of q
  and k together, when ``torch.compile`` works on the machine): that same formulation compiled once per
  process by Inductor. The first such call compiles it (seconds); a call it cannot handle, or a machine
  where compiling fails, falls back to the blocks below (with one warning).
- otherwise (small calls): the reference's operations run block by block along the sequence, so
  float32 temporaries stay in cache, writing straight into the output, in the reference's memory format.
  Calls that need gradients, forward-mode AD or a ``torch.func`` transform run the functional form eagerly.

All give the eager reference's float32 results (bit-for-bit on the torch paths, compiled included; the
Triton kernel may fuse a multiply-add, a difference of one float32 rounding). Setting the environment
variable ``ROPEKIT_COMPILE=0`` turns the automatic compiled path off process-wide.
"""
from __future__ import annotations

import itertools
import os
import types
import warnings

import torch
import torch.autograd.forward_ad as _forward_ad

from . import _cpu_kernel, triton_rope
from ._parallel import run_blocks
from .planar import _broadcast, _validate, check_finite

__all__ = ["apply_rotary_fused", "apply_rotary_qk_fused", "rotate_functional"]


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def rotate_functional(
    x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, channels: str, rot: int
) -> torch.Tensor:
    """Out-of-place rotation of validated input with cos/sin broadcastable to ``x[..., :R/2]``.

    Written for tracing: only shape-static branches, no in-place writes, so a compiler can fuse it.
    """
    work = _work_dtype(x)
    c = c.to(work)
    s = s.to(work)
    xr = x[..., :rot].to(work)
    # each half is rounded to the output dtype before it is joined (the same single rounding): Inductor
    # then writes bfloat16 straight into the output instead of a float32 buffer plus conversion passes
    if channels == "half":
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
        out = torch.cat(((x1 * c - x2 * s).to(x.dtype), (x2 * c + x1 * s).to(x.dtype)), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack(((x1 * c - x2 * s).to(x.dtype), (x2 * c + x1 * s).to(x.dtype)), dim=-1).flatten(-2)
    if rot == x.shape[-1]:
        return out
    return torch.cat((out, x[..., rot:]), dim=-1)


# Elements of x per eager block (2 MiB of float32): the block and its temporaries stay in a core's L2
# and the shared L3, and a block is large enough that the dozen torch calls on it cost little next to
# the arithmetic (measured: 1 MiB blocks were 10-40 % slower in bfloat16, 256 KiB ones 2x slower).
_BLOCK_ELEMS = 1 << 19


def _rotate_block(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, out: torch.Tensor, channels: str, rot: int,
                  inplace: bool = False):
    """Rotate one block of ``x`` into the matching block of ``out`` (float32 maths, one rounding).

    Each half is ``x1·c`` written in place, then ``− x2·s`` (or ``+ x1·s``) subtracted in place: the
    reference's products and sums, so the same bits. A bfloat16/float16 output is computed in a float32
    block buffer and converted in one pass: a float32 op writing a low-precision ``out=`` would compute
    into a hidden float32 buffer and convert per op. ``inplace`` (``out`` is ``x``): the block is computed
    in a block buffer too, then copied over ``x``, since each half reads both halves of the input.
    """
    xf = x[..., :rot].to(c.dtype)
    direct = out.dtype == c.dtype and not inplace
    tmp = out[..., :rot] if direct else torch.empty(xf.shape, dtype=c.dtype, device=x.device)
    if channels == "half":
        x1, x2 = xf[..., : rot // 2], xf[..., rot // 2 :]
        o1, o2 = tmp[..., : rot // 2], tmp[..., rot // 2 :]
    else:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        o1, o2 = tmp[..., 0::2], tmp[..., 1::2]
    torch.mul(x1, c, out=o1).sub_(x2 * s)
    torch.mul(x2, c, out=o2).add_(x1 * s)
    if not direct:
        out[..., :rot].copy_(tmp)
    if rot < x.shape[-1] and not inplace:
        out[..., rot:] = x[..., rot:]


def _output_format(x: torch.Tensor) -> torch.memory_format:
    """The memory format of the reference's output (a ``torch.cat``): channels-last when a 4-D ``x`` is
    laid out channels-last (and not also contiguous), else contiguous."""
    if x.ndim == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _rotate_eager(
    x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, channels: str, rot: int, seq_dim: int,
    jobs: list | None = None, dest: torch.Tensor | None = None,
) -> torch.Tensor:
    """Eager rotation in cache-sized blocks along the sequence, written straight into the output.

    The reference makes about ten full passes over float32 temporaries; here each block's temporaries
    stay in cache, so memory sees roughly one read of x and one write of the output. With several torch
    threads the blocks run concurrently (:func:`._parallel.run_blocks`), each block single-threaded. The
    operations and their order are the reference's, so results are identical bit for bit. With ``jobs``
    the blocks are appended there for the caller to run (q's and k's blocks in one pool pass) and
    ``out`` is only complete after that. ``dest`` (validated by :func:`_check_out`) is written instead of a
    new tensor; it may be ``x`` itself.
    """
    work = _work_dtype(x)
    c = c.to(work)
    s = s.to(work)
    shape = torch.broadcast_shapes(x.shape[:-1] + (rot // 2,), c.shape, s.shape)
    if (shape != x.shape[:-1] + (rot // 2,) or x.requires_grad or c.requires_grad or s.requires_grad
            or not all(_plain(t) for t in (x, c, s))):
        # broadcasting grows x, autograd, forward-mode AD or torch.func: stay functional (no out= ops)
        out = rotate_functional(x, c, s, channels, rot)
        return out if dest is None else dest.copy_(out)
    out = torch.empty_like(x, memory_format=_output_format(x)) if dest is None else dest
    inplace = dest is not None and _same_view(dest, x)
    ldim = x.ndim - 2 if seq_dim == -2 else 1
    cdim, sdim = ldim - (x.ndim - c.ndim), ldim - (x.ndim - s.ndim)
    L = x.shape[ldim]
    step = max(1, (_BLOCK_ELEMS * L) // max(1, x.numel()))
    if x.device.type != "cpu" or step >= L:
        _rotate_block(x, c, s, out, channels, rot, inplace)
        return out
    def block(i: int, n: int):
        return lambda: _rotate_block(x.narrow(ldim, i, n), c.narrow(cdim, i, n), s.narrow(sdim, i, n),
                                     out.narrow(ldim, i, n), channels, rot, inplace)

    blocks = [block(i, min(step, L - i)) for i in range(0, L, step)]
    if jobs is None:
        run_blocks(blocks)
    else:
        jobs.extend(blocks)
    return out


def _rotate_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, channels: str, seq_dim: int, rot: int,
                use_triton: bool, jobs: list | None = None, dest: torch.Tensor | None = None) -> torch.Tensor:
    if use_triton:
        out = triton_rope.apply_rotary_triton(x, cos, sin, channels=channels, seq_dim=seq_dim)
        return out if dest is None else dest.copy_(out)
    c = _broadcast(cos, x, seq_dim)
    s = _broadcast(sin, x, seq_dim)
    if torch.compiler.is_compiling():
        if dest is not None:
            _rotate_into(x, c, s, dest, channels, rot, _same_view(dest, x))
            return dest
        return rotate_functional(x, c, s, channels, rot)
    return _rotate_eager(x, c, s, channels, rot, seq_dim, jobs, dest)


# Calls with at least this many elements of q and k together take the compiled CPU kernel by default.
_COMPILED_MIN_ELEMS = 1 << 22
_compiled_fns: dict = {}  # variant key (:func:`_variant_key`) -> the body compiled for that variant
_copy_tags = itertools.count()
_COMPILE_FAILED = False


def _rotate_qk_body(q, k, cos, sin, channels: str, seq_dim: int, rot: int):
    """q and k rotated functionally: the body that :func:`_compiled` compiles into one loop per half.
    (Measured: tensors nested in tuples compiled to a kernel twice as slow, a finiteness reduction in
    the same graph added 60 %, so the tables are checked outside, and ``dynamic=True`` made the integer
    arguments symbolic, which cost 1.8×; with automatic dynamic shapes they stay constants and only the
    sizes become symbolic after the first recompilation.)"""
    return tuple(rotate_functional(x, _broadcast(cos, x, seq_dim), _broadcast(sin, x, seq_dim), channels, rot)
                 for x in (q, k))


def _rotate_one_body(x, cos, sin, channels: str, seq_dim: int, rot: int):
    """The single-tensor form of :func:`_rotate_qk_body`."""
    return rotate_functional(x, _broadcast(cos, x, seq_dim), _broadcast(sin, x, seq_dim), channels, rot)


def _rotate_into(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, out: torch.Tensor, channels: str, rot: int,
                 inplace: bool = False) -> None:
    """:func:`rotate_functional` written into ``out`` (the same products, sums and single rounding).

    Traceable: each half is one element-wise expression copied into its slice of ``out``, which Inductor
    compiles into loops that store straight into ``out`` (no result buffer, no second pass). With
    ``inplace`` (``out`` is ``x``) both halves are formed before either is written, as each reads both
    halves of the input.
    """
    work = _work_dtype(x)
    c = c.to(work)
    s = s.to(work)
    xr = x[..., :rot].to(work)
    if channels == "half":
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2 :]
        o1, o2 = out[..., : rot // 2], out[..., rot // 2 : rot]
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        o1, o2 = out[..., 0:rot:2], out[..., 1:rot:2]
    if inplace:
        first, second = (x1 * c - x2 * s).to(out.dtype), (x2 * c + x1 * s).to(out.dtype)
        o1.copy_(first)
        o2.copy_(second)
        return
    o1.copy_((x1 * c - x2 * s).to(out.dtype))
    o2.copy_((x2 * c + x1 * s).to(out.dtype))
    if rot < x.shape[-1]:
        out[..., rot:].copy_(x[..., rot:])


def _rotate_qk_out_body(q, k, cos, sin, q_out, k_out, channels: str, seq_dim: int, rot: int):
    """:func:`_rotate_qk_body` written into ``q_out``/``k_out`` (distinct from the inputs)."""
    for x, o in ((q, q_out), (k, k_out)):
        _rotate_into(x, _broadcast(cos, x, seq_dim), _broadcast(sin, x, seq_dim), o, channels, rot)


def _rotate_one_out_body(x, cos, sin, out, channels: str, seq_dim: int, rot: int):
    """The single-tensor form of :func:`_rotate_qk_out_body`."""
    _rotate_into(x, _broadcast(cos, x, seq_dim), _broadcast(sin, x, seq_dim), out, channels, rot)


def _tensor_key(t: torch.Tensor) -> tuple:
    """What a compiled graph fixes about one input besides its sizes: dtype, rank (each size read as 0, 1
    or more, since Dynamo specializes sizes 0 and 1), last dim (the rotary width is compared with it),
    contiguity."""
    return t.dtype, tuple(min(n, 2) for n in t.shape), t.shape[-1], t.is_contiguous()


def _variant_key(xs: tuple, cos: torch.Tensor, sin: torch.Tensor, channels: str, seq_dim: int, rot: int,
                 outs: tuple = ()) -> tuple:
    """The variant of a call: calls with the same key differ only in sizes, which one compiled body absorbs
    (automatic dynamic shapes: static first, symbolic sizes after the first change)."""
    return (len(xs), len(outs), channels, seq_dim, rot, *(_tensor_key(t) for t in (*xs, cos, sin, *outs)))


def _own_copy(fn):
    """``fn`` with its own code object (named ``fn__v<N>``).

    Dynamo keeps compiled graphs per code object and refuses more than ``recompile_limit`` (8) of them
    (with ``fullgraph=True`` it raises ``FailOnRecompileLimitHit``); it also pools its automatic-dynamic
    observations by function name. A copy per variant gives each variant its own budget and its own
    observations, without touching torch's process-wide settings."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}__v{next(_copy_tags)}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def _compiled(key: tuple, fresh: bool = False):
    """The body compiled for the variant ``key`` (:func:`_variant_key`), built on first use; ``fresh``
    replaces a body whose variant hit Dynamo's recompile limit all the same."""
    fn = _compiled_fns.get(key)
    if fn is None or fresh:
        bodies = {(2, 0): _rotate_qk_body, (1, 0): _rotate_one_body, (2, 2): _rotate_qk_out_body,
                  (1, 1): _rotate_one_out_body}
        body = bodies[key[:2]]
        fn = _compiled_fns[key] = torch.compile(_own_copy(body), fullgraph=True)
    return fn


def _hit_recompile_limit(err: Exception) -> bool:
    """Dynamo refused to compile a body once more (``FailOnRecompileLimitHit`` and its older names)."""
    name = type(err).__name__.lower()
    return "recompile" in name or "limit" in name


def _call_compiled(key: tuple, args: tuple):
    """Run the variant's compiled body. A body that hit the recompile limit all the same (the variant's
    sizes changed in more ways than Dynamo recompiles one body) is replaced by a fresh copy, once."""
    try:
        return _compiled(key)(*args)
    except Exception as err:  # noqa: BLE001 - only the recompile limit is retried
        if not _hit_recompile_limit(err):
            raise
    return _compiled(key, fresh=True)(*args)


def _plain(t: torch.Tensor) -> bool:
    """Not a forward-mode dual (its tangent would be dropped) nor a torch.func (vmap/grad/jvp) wrapper."""
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        return False
    # outside any dual level (the common case) no tensor carries a tangent: skip the lookup
    return _forward_ad._current_level < 0 or _forward_ad.unpack_dual(t).tangent is None


def _env_allows_compile() -> bool:
    return os.environ.get("ROPEKIT_COMPILE", "1").strip().lower() not in ("0", "false", "off", "no")


def _use_compiled(compiled: bool | None, xs: tuple, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    if compiled is not None and not isinstance(compiled, bool):
        raise TypeError(f"`compiled` must be True, False or None (automatic), got {compiled!r}")
    if compiled is False:
        return False
    tensors = (*xs, cos, sin)
    eligible = (not torch.compiler.is_compiling() and not torch.jit.is_tracing()
                and all(t.device.type == "cpu" and _plain(t) for t in tensors)
                and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)))
    if compiled:
        if not eligible:
            raise ValueError("`compiled=True` needs CPU tensors without gradients (nor forward-mode or "
                             "torch.func transforms), outside torch.compile and torch.jit.trace; "
                             "pass compiled=None to let the call pick its path")
        return True
    return (eligible and not _COMPILE_FAILED and _env_allows_compile()
            and sum(x.numel() for x in xs) >= _COMPILED_MIN_ELEMS)


def _apply_compiled(xs: tuple, cos: torch.Tensor, sin: torch.Tensor, channels: str, seq_dim: int, rot: int,
                    forced: bool, outs: tuple = ()):
    """The compiled CPU path, or None when it failed (then the caller runs the eager blocks). With ``outs``
    (distinct from the inputs) the results are written there and ``outs`` is returned."""
    global _COMPILE_FAILED
    work = torch.float64 if all(x.dtype == torch.float64 for x in xs) else torch.float32
    check_finite(cos, "cos", work)
    check_finite(sin, "sin", work)
    try:
        key = _variant_key(xs, cos, sin, channels, seq_dim, rot, outs)
        out = _call_compiled(key, (*xs, cos, sin, *outs, channels, seq_dim, rot))
        if outs:
            return outs
    except Exception as err:  # noqa: BLE001 - no compiler, an input it cannot trace, ...: the eager path still works
        if forced:
            raise
        if _hit_recompile_limit(err) or isinstance(err, torch._dynamo.exc.Unsupported):
            # something about this call (an input Dynamo cannot trace, a recompile limit set below what one
            # variant needs), not the machine: this call runs eagerly, the next large one tries again
            return None
        if not _COMPILE_FAILED:
            warnings.warn(f"ropekit: the compiled CPU rotary kernel failed ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}); using the eager blocked path "
                          "from now on (ROPEKIT_COMPILE=0 skips the attempt)", RuntimeWarning, stacklevel=4)
        _COMPILE_FAILED = True
        return None
    return out if isinstance(out, tuple) else (out,)


def _triton_ok(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_dim: int) -> bool:
    if torch.compiler.is_compiling() or not triton_rope.supports(q, k, cos, sin):
        return False
    return all(triton_rope.expand_cos_sin(t, x, seq_dim) is not None for x in (q, k) for t in (cos, sin))


def apply_rotary_qk_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    channels: str = "half",
    seq_dim: int = -2,
    compiled: bool | None = None,
    out: "tuple[torch.Tensor, torch.Tensor] | None" = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys like :func:`ropekit.apply_rotary_qk`, on the fastest available backend.

    ``q``/``k`` are ``(B, H, L, D)`` (``seq_dim=-2`` or ``2``) or ``(B, L, H, D)`` (``seq_dim=1`` or ``-3``) and may have
    different head counts (grouped-query attention); ``cos``/``sin`` are ``(L, R/2)``, ``(B, L, R/2)``
    or ``(B, H, L, R/2)`` with ``R <= D`` rotary channels, their batch q's or 1 (see :func:`ropekit.apply_rotary`).
    ``compiled``: None (default) takes the compiled CPU kernel for large calls without gradients (see the
    module docstring), True always for CPU calls without gradients, False never.

    ``out=(q_out, k_out)`` writes the results into those tensors and returns them: the same values, bit for
    bit, without allocating (a fresh output costs a page fault per 4 KiB on first touch, which is most of
    the time of a large functional call). Each must have its input's shape, dtype and device and memory of
    its own; ``q_out`` may be ``q`` itself (and ``k_out`` ``k``) to rotate in place, but no output may
    otherwise overlap an input, cos/sin or the other output. Not differentiable: refused when autograd
    would need the inputs.
    """
    rot, seq_dim = _validate(q, cos, sin, channels, seq_dim, "q", finite=False)
    if _validate(k, cos, sin, channels, seq_dim, "k", finite=False)[1] != seq_dim:
        raise ValueError(f"`k` {tuple(k.shape)} must have the rank of `q` {tuple(q.shape)}")
    if out is None:
        return _apply((q, k), cos, sin, channels, seq_dim, rot, compiled)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"`out` must be a pair (q_out, k_out) of tensors, got {type(out).__name__}"
                        + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    outs = _check_out(tuple(out), (q, k), ("q", "k"), ("out[0]", "out[1]"), cos, sin)
    return _apply((q, k), cos, sin, channels, seq_dim, rot, compiled, outs)


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` are the same elements in the same layout (``a`` may be written as ``b``'s in-place result)."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """First and one-past-last byte address that ``t``'s elements may occupy (empty for no elements)."""
    if t.numel() == 0:
        return 0, 0
    start = t.data_ptr()
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride())) + 1
    return start, start + extent * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share an element's memory: never across storages or disjoint byte ranges;
    exactly for two views of one layout (q, k and v sliced from one projection); otherwise conservatively
    (intersecting byte ranges count as overlapping)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    if not (a0 < b1 and b0 < a1):
        return False
    if a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype:
        return True
    diff, rem = divmod(b.data_ptr() - a.data_ptr(), a.element_size())
    return rem == 0 and _reachable(diff, a.shape, a.stride())


def _self_overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share memory (an expanded view); decided from the strides: sorted by
    stride, each must exceed the reach of the smaller ones (torch's own check gives up on permuted views).
    A tensor without elements has none to share, whatever its strides (an expanded zero-size view)."""
    if t.numel() == 0:
        return False
    reach = 0
    for st, n in sorted((abs(st), n) for n, st in zip(t.shape, t.stride()) if n > 1):
        if st <= reach:
            return True
        reach += (n - 1) * st
    return False


def _reachable(d: int, shape, stride) -> bool:
    """Whether ``d = Σ e_k·stride_k`` for some integers ``|e_k| < shape_k``: two views of one non-self-overlapping
    layout, ``d`` elements apart, share an element. With the dims sorted by stride, each stride exceeds the
    reach of the smaller ones, so from the largest stride down each digit has at most two candidates."""
    dims = sorted((abs(st), n) for n, st in zip(shape, stride) if n > 1)
    reach = [0]
    for st, n in dims:
        if st <= reach[-1]:
            return True  # not nested (the layout overlaps itself): stay conservative
        reach.append(reach[-1] + (n - 1) * st)

    def solve(d: int, k: int) -> bool:
        if k < 0:
            return d == 0
        st, n = dims[k]
        return any(abs(e) < n and abs(d - e * st) <= reach[k] and solve(d - e * st, k - 1)
                   for e in {d // st, -(-d // st)})

    return solve(d, len(dims) - 1)


def _check_out(outs: tuple, xs: tuple, x_names: tuple, names: tuple, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    """Validate ``out`` tensors for the inputs ``xs``; returns them. TypeError for a non-tensor or a wrong dtype,
    ValueError for a wrong shape or device, overlapping memory, or a call that autograd would need."""
    for o, x, name, x_name in zip(outs, xs, names, x_names):
        if not isinstance(o, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor (the result for `{x_name}`), got {type(o).__name__}")
        if o.dtype != x.dtype:
            raise TypeError(f"`{name}` has dtype {o.dtype} but `{x_name}` is {x.dtype}; the result keeps its "
                            f"input's dtype, so `{name}` must be {x.dtype}")
        if o.shape != x.shape:
            raise ValueError(f"`{name}` has shape {tuple(o.shape)} but `{x_name}` has {tuple(x.shape)}; they must match")
        if o.device != x.device:
            raise ValueError(f"`{name}` is on {o.device} but `{x_name}` is on {x.device}; they must be on one device")
        if _self_overlapping(o):
            raise ValueError(f"`{name}` has elements that share memory (an expanded or broadcast view); give a tensor "
                             f"with memory of its own")
    for i, (o, name) in enumerate(zip(outs, names)):
        others = [(x, f"`{n}`") for j, (x, n) in enumerate(zip(xs, x_names))]
        others += [(cos, "`cos`"), (sin, "`sin`")] + [(outs[j], f"`{names[j]}`") for j in range(i + 1, len(outs))]
        for j, (t, what) in enumerate(others):
            if j == i and _same_view(o, t):
                continue  # the input itself: in place
            if _overlap(o, t):
                hint = (f"; to rotate in place pass `{x_names[i]}` itself (same view)" if j == i else "")
                raise ValueError(f"`{name}` overlaps the memory of {what}{hint}; outputs must not overlap "
                                 f"other arguments")
    tensors = (*xs, cos, sin, *outs)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise ValueError("`out=` is not differentiable (as torch's out= functions); call without `out` when "
                         "autograd needs the result, or under torch.no_grad()")
    if not all(_plain(t) for t in tensors):
        raise ValueError("`out=` does not support forward-mode AD or torch.func transforms; call without `out`")
    return outs


def _apply(xs: tuple, cos: torch.Tensor, sin: torch.Tensor, channels: str, seq_dim: int, rot: int,
           compiled: bool | None = None, outs: tuple = ()) -> tuple:
    """Rotate the validated tensors ``xs`` (one or q and k) with cos/sin whose values are not yet checked;
    into ``outs`` (validated by :func:`_check_out`) when given."""
    if outs and _into_with_kernel(xs, outs, cos, sin, channels, seq_dim, rot, compiled):
        return outs
    inplace = any(_same_view(o, x) for o, x in zip(outs, xs))
    # in place, Inductor's code would need a result buffer (each output reads both halves of its input):
    # the eager blocks compute each block in a cache-sized buffer and copy it over the input instead
    if _use_compiled(compiled, xs, cos, sin) and not inplace:
        out = _apply_compiled(xs, cos, sin, channels, seq_dim, rot, forced=bool(compiled), outs=outs)
        if out is not None:
            return out
    use_triton = _triton_ok(xs[0], xs[-1], cos, sin, seq_dim)
    jobs: list = []  # eager CPU blocks of every tensor, run together on the worker threads
    dests = outs or (None,) * len(xs)
    out = tuple(_rotate_one(x, cos, sin, channels, seq_dim, rot, use_triton, jobs, d) for x, d in zip(xs, dests))
    # cos/sin are checked once for all tensors, in the working dtype of any (float32 unless all are float64)
    dtype = torch.float64 if all(x.dtype == torch.float64 for x in xs) else torch.float32
    if jobs:  # never under torch.compile or on accelerators: nothing there is deferred
        # the checks run as jobs too, so no multi-threaded op runs out here
        run_blocks(_finite_checks(cos, sin, dtype, pieces=max(1, len(jobs) // 8)) + jobs)
    else:
        check_finite(cos, "cos", dtype)
        check_finite(sin, "sin", dtype)
    return out


def _into_with_kernel(xs: tuple, outs: tuple, cos: torch.Tensor, sin: torch.Tensor, channels: str, seq_dim: int,
                      rot: int, compiled: bool | None) -> bool:
    """``out=`` on the CPU with the compiled kernel of :mod:`._cpu_kernel` (in place too); False where it does
    not apply (other layouts or dtypes, ``compiled=False``, ``ROPEKIT_COMPILE=0``, inside torch.compile, no
    compiler), and the caller takes its other paths."""
    if compiled is False or not _env_allows_compile() or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if not all(_cpu_kernel.supports(x, o, channels) for x, o in zip(xs, outs)) or xs[0].dtype != xs[-1].dtype:
        return False
    kern = _cpu_kernel.kernel_for(xs[0].dtype)
    if kern is None:
        return False
    check_finite(cos, "cos", torch.float32)
    check_finite(sin, "sin", torch.float32)
    for x, o in zip(xs, outs):
        _cpu_kernel.rotate_half_into(kern, x, _broadcast(cos, x, seq_dim), _broadcast(sin, x, seq_dim), o, seq_dim,
                                     rot)
    return True


def _finite_checks(cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, pieces: int) -> list:
    """Jobs checking that cos/sin are finite (:func:`.planar.check_finite`), each over a slice of positions.

    With several torch threads a multi-threaded reduction over the tables would be one more fork/join
    (each costing milliseconds when a sibling thread is descheduled); as jobs they share the block pool."""
    return [lambda arg=arg, part=part: check_finite(part, arg, dtype)
            for arg, t in (("cos", cos), ("sin", sin))
            for part in t.tensor_split(min(pieces, max(1, t.shape[-2])), dim=-2)]


def apply_rotary_fused(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    channels: str = "half",
    seq_dim: int = -2,
    compiled: bool | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Single-tensor form of :func:`apply_rotary_qk_fused` (same backends, same semantics); ``out`` is one
    tensor (``x`` itself rotates in place)."""
    rot, seq_dim = _validate(x, cos, sin, channels, seq_dim, finite=False)
    if out is None:
        return _apply((x,), cos, sin, channels, seq_dim, rot, compiled)[0]
    outs = _check_out((out,), (x,), ("x",), ("out",), cos, sin)
    return _apply((x,), cos, sin, channels, seq_dim, rot, compiled, outs)[0]
