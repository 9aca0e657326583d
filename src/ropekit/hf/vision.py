"""Any ropekit vision rotary inside a vision encoder that already uses RoPE (docs/hf.md, "Vision encoders").

``patch_vision_model(model, family, **options)`` swaps the RoPE of transformers' DINOv3 ViT, Pixtral's
vision encoder, the Qwen2-VL / Qwen2.5-VL vision tower (alone or as the ``visual`` of the VL model), V-JEPA 2
(encoder and predictor, 3-D: frame, row, column), Gemma 4's, VideoLLaMA 3's, EXAONE 4.5's and Llama 4's vision
encoders and SAM 3's ViT backbone (a rotary per layer) for a ropekit rotation family,
on that instance only; ``unpatch_vision_model`` gives the stock encoder back.

Families (``family=``):

- ``"axial"``: planar axial RoPE; ``frequencies="stock"`` (default) the encoder's own frequency layout (it
  reproduces the stock outputs), ``"axial"`` ropekit's axial allocation (``base`` defaults to the encoder's);
- ``"directional"``: :class:`ropekit.DirectionalRoPE` (``method``, ``base``, ``seed``);
- ``"mixed"``: RoPE-Mixed, :class:`ropekit.MixedFrequencies` per layer (``theta``, ``seed``);
- ``"geope"``: :class:`ropekit.GeoPE` (``lam``, ``freq_style``, ``channels``);
- ``"liere"``, ``"comrope"``, ``"grape"``: the learned :class:`ropekit.LieRE`, :class:`ropekit.ComRoPE`,
  :class:`ropekit.GRAPE`, one per layer (``shared=True``: one for all layers), other options go to the class.

Linear GeoPE is refused: it is an attention computation (scores from distances), not a rotation of q and k,
and none of these encoders exposes a per-instance way to swap its attention function for one that also needs
the patch coordinates (Qwen's vision attention splits windows itself; DINOv3/Pixtral pick it from the shared
``config._attn_implementation``).

Learned families' modules are registered on each attention module as ``ropekit_rotary`` (so
``model.parameters()`` and optimizers see them, and they move with ``.to()``). Coordinates are the encoder's
own: DINOv3's normalised patch centres in [-1, 1] times 2π (its angle is ``2π·c·f``, augmentations included
in training), Pixtral's, Qwen's and Gemma 4's integer (row, column) patch indices (Gemma 4's per sample),
V-JEPA 2's integer (frame, row, column) indices.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ..apply.blocks import apply_block_rotation, apply_plane_rotation
from ..apply.fused import _plain, apply_rotary_fused
from ..apply.geope import GeoPE, apply_geope
from ..apply.planar import cos_sin
from ..nn.learned import GRAPE, ComRoPE, LieRE
from ..rope import DirectionalRoPE
from ..apply.mixed import MixedFrequencies
from ..rotations.planar import angles, frequency_matrix
from . import hooks
from .boundary import Contract, check_all, check_version
from .vision_adapters import VISION_ADAPTERS, VisionAdapter
from .vision_adapters.base import COORDS_ATTR

__all__ = ["patch_vision_model", "unpatch_vision_model", "VISION_FAMILIES", "is_vision_patched"]

VISION_FAMILIES = ("axial", "directional", "mixed", "geope", "liere", "comrope", "grape")
_REFUSED = {
    "linear-geope": "Linear GeoPE replaces the attention computation, not the rotation of q and k, and these "
                    "encoders give no per-instance way to swap their attention function; use family='geope'",
}
_LEARNED = {"liere": LieRE, "comrope": ComRoPE, "grape": GRAPE}
_ROTARY_ATTR = "ropekit_rotary"


# --------------------------------------------------------------------------------------------------
# rotators: tables(coords) once per attention call, apply(x (B, H, L, D), tables) per q and k; those with
# ``writes_in_place`` also take apply(..., inplace=True), which rotates x itself


class _Planar:
    """A shared planar rotation ``angles(coords, W)`` (axial, directional)."""

    def __init__(self, W: Optional[torch.Tensor] = None, rope: Optional[DirectionalRoPE] = None,
                 perm: Optional[torch.Tensor] = None, channels: str = "half") -> None:
        self.W, self.rope, self.perm, self.channels = W, rope, perm, channels
        # apply(..., inplace=True) rotates x where it lies (no allocation); a permuted layout rotates a copy
        self.writes_in_place = perm is None

    def tables(self, coords: torch.Tensor):
        if self.rope is not None:
            return self.rope.cos_sin(coords)
        return cos_sin(angles(coords, self.W.to(coords.device)))

    def apply(self, x: torch.Tensor, tables, inplace: bool = False) -> torch.Tensor:
        if self.perm is None:
            return apply_rotary_fused(x, *tables, channels=self.channels, seq_dim=-2, out=x if inplace else None)
        # the stock layout is the half-split one on permuted channels: rotate there, put the channels back
        perm = self.perm.to(x.device)
        y = apply_rotary_fused(x[..., perm], *tables, channels="half", seq_dim=-2)
        return y[..., torch.argsort(perm)]


class _Mixed:
    writes_in_place = True

    def tables(self, module: MixedFrequencies, coords: torch.Tensor):
        c, s = cos_sin(module(coords))
        return c[None], s[None]  # (1, H, L, R/2)

    def apply(self, x: torch.Tensor, tables, inplace: bool = False) -> torch.Tensor:
        return apply_rotary_fused(x, *tables, channels="half", seq_dim=-2, out=x if inplace else None)


class _GeoPE:
    def __init__(self, geope: GeoPE) -> None:
        self.geope = geope

    def tables(self, coords: torch.Tensor):
        return self.geope.rotation(coords)

    def apply(self, x: torch.Tensor, tables) -> torch.Tensor:
        return apply_geope(x, tables, seq_dim=-2, channels=self.geope.channels)


class _Blocks:  # LieRE, ComRoPE
    def tables(self, module, coords: torch.Tensor):
        return module.rotation(coords)

    def apply(self, x: torch.Tensor, tables) -> torch.Tensor:
        return apply_block_rotation(x, tables, seq_dim=-2)


class _Grape:
    writes_in_place = True  # the learned form rotates into a new tensor, then copies it back

    def tables(self, module: GRAPE, coords: torch.Tensor):
        cos, sin = module.cos_sin(coords)
        return cos, sin, (module.basis() if module.learned else None), module.channels

    def apply(self, x: torch.Tensor, tables, inplace: bool = False) -> torch.Tensor:
        cos, sin, U, channels = tables
        if U is None:
            return apply_rotary_fused(x, cos, sin, channels=channels, seq_dim=-2, out=x if inplace else None)
        y = apply_plane_rotation(x, U, cos, sin, seq_dim=-2)
        return x.copy_(y) if inplace else y


class _PerSample(list):
    """Tables for each sample of a batch whose samples have different patch coordinates."""


class _Context:
    """One attention module's rotation: the rotator, its learned module (if any) and this call's tables."""

    def __init__(self, rotator: Any, module: Optional[nn.Module], patches_first: bool = False) -> None:
        self.rotator, self.module, self.patches_first = rotator, module, patches_first
        self.tables, self.length = None, 0

    def _tables(self, coords: torch.Tensor):
        if self.module is None:
            return self.rotator.tables(coords)
        return self.rotator.tables(self.module, coords)

    def begin(self, coords: torch.Tensor) -> None:
        """Coordinates ``(P, A)`` for every sample, or ``(B, P, A)`` one set per sample."""
        self.length = coords.shape[-2]
        if coords.ndim == 3 and bool((coords == coords[:1]).all()):
            coords = coords[0]  # the same patches in every sample: one set of tables
        if coords.ndim == 2:
            self.tables = self._tables(coords)
        else:
            self.tables = _PerSample(self._tables(c) for c in coords)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x (B, L, H, D)``; its last ``length`` tokens are the patches (first ``length`` with
        ``patches_first``), the other tokens (DINOv3's prefix, Llama 4's class token) stay."""
        if isinstance(self.tables, _PerSample):
            if x.shape[0] != len(self.tables):
                raise ValueError(f"patch_vision_model: the attention got {x.shape[0]} samples but coordinates "
                                 f"for {len(self.tables)}; the encoder's inputs do not match its positions")
            every, parts, in_place = self.tables, [], True
            try:
                for i, tables in enumerate(every):
                    self.tables, sample = tables, x[i:i + 1]
                    parts.append(self.rotate(sample))
                    in_place = in_place and parts[-1] is sample
            finally:
                self.tables = every
            return x if in_place else torch.cat(parts)
        tokens = x.shape[1]
        if tokens < self.length:
            raise ValueError(f"patch_vision_model: the attention got {tokens} tokens but {self.length} patch "
                             f"coordinates; the encoder's inputs do not match its position embeddings")
        sizes = (self.length, tokens - self.length) if self.patches_first else (tokens - self.length, self.length)
        first, second = x.split(sizes, dim=1)
        patches = first if self.patches_first else second
        if self._writable(x):  # the projection's fresh output, which nothing else reads: rotate it where it lies
            self.rotator.apply(patches.transpose(1, 2), self.tables, inplace=True)
            return x
        rotated = self.rotator.apply(patches.transpose(1, 2), self.tables).transpose(1, 2).to(x.dtype)
        if tokens == self.length:
            return rotated
        return torch.cat((rotated, second) if self.patches_first else (first, rotated), dim=1)

    def _writable(self, x: torch.Tensor) -> bool:
        """Whether ``x`` may be rotated in place: a rotation with an ``out=`` form, no autograd (the in-place
        form is not differentiable) and no torch.func wrapper."""
        if not getattr(self.rotator, "writes_in_place", False) or torch.is_grad_enabled():
            return False
        tensors = [x, *(t for t in self.tables if isinstance(t, torch.Tensor))]
        return all(_plain(t) for t in tensors) and not any(t.requires_grad for t in tensors)


# --------------------------------------------------------------------------------------------------
# options


def _take(options: dict, allowed: tuple[str, ...], family: str) -> dict:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"patch_vision_model: unknown option(s) {unknown} for family={family!r}; "
                         f"it takes {', '.join(allowed) or 'no options'}")
    return options


def _check_family(family: Any) -> str:
    if not isinstance(family, str):
        raise TypeError(f"patch_vision_model: `family` must be a string, one of {', '.join(VISION_FAMILIES)}; "
                        f"got {type(family).__name__}")
    key = family.lower().replace("_", "-")
    if key in _REFUSED:
        raise ValueError(f"patch_vision_model: family={family!r} is not supported: {_REFUSED[key]}")
    if key not in VISION_FAMILIES:
        raise ValueError(f"patch_vision_model: unknown `family` {family!r}; choose one of {', '.join(VISION_FAMILIES)}")
    return key


def _rotary_width(head_dim: int, axes: int) -> int:
    """Channels ropekit's axial allocation rotates: the most that split evenly over the axes (the rest pass)."""
    return 2 * axes * (head_dim // (2 * axes))


def _shared_rotator(family: str, options: dict, adapter: VisionAdapter, rotary: nn.Module, head_dim: int):
    """The rotator of a family without parameters (one for all layers of a head size)."""
    axes = adapter.num_axes
    if family == "geope":
        _take(options, ("lam", "freq_style", "channels"), family)
        return _GeoPE(GeoPE(head_dim, **options))
    given_base = "base" in options
    base = options.pop("base", adapter.base(rotary))
    if family == "axial":
        _take(options, ("frequencies",), family)
        frequencies = options.get("frequencies", "stock")
        if frequencies == "stock":
            if given_base:
                raise ValueError("patch_vision_model: `base` applies to frequencies='axial'; the stock "
                                 "frequencies are the encoder's own (drop `base` or pass frequencies='axial')")
            own = adapter.stock_rotator(rotary, head_dim)
            if own is not None:
                return own
            return _Planar(adapter.stock_frequencies(rotary), perm=adapter.stock_permutation(head_dim),
                           channels=adapter.stock_channels)
        if frequencies == "axial":
            return _Planar(frequency_matrix("axial", _rotary_width(head_dim, axes), axes, base=base))
        raise ValueError(f"patch_vision_model: `frequencies` must be 'stock' (the encoder's own layout) or "
                         f"'axial' (ropekit's axial allocation), got {frequencies!r}")
    # directional
    _take(options, ("method", "seed"), family)
    return _Planar(rope=DirectionalRoPE(head_dim, axes, options.get("method", "sobol"), base=base,
                                        seed=options.get("seed", 0)))


def _learned_factory(family: str, options: dict, axes: int, base: float):
    """(rotator, a function building one family module for layer i, head size and head count)."""
    if family == "mixed":
        _take(options, ("theta", "seed"), family)
        seed = options.get("seed", 0)
        return _Mixed(), lambda i, head_dim, num_heads: MixedFrequencies(
            _rotary_width(head_dim, axes), num_heads, axes, theta=options.get("theta", 10.0),
            seed=None if seed is None else seed + i)
    if "num_axes" in options:
        raise ValueError(f"patch_vision_model: `num_axes` is fixed by the encoder ({axes} for this one: "
                         f"{'(row, column)' if axes == 2 else '(frame, row, column)'}); drop it from the "
                         f"options of family={family!r}")
    if "head_dim" in options:
        raise ValueError("patch_vision_model: `head_dim` comes from the encoder; drop it from the options")
    cls = _LEARNED[family]
    rotator = _Grape() if family == "grape" else _Blocks()
    seed = options.pop("seed", 0)

    def build(i: int, head_dim: int, num_heads: int) -> nn.Module:
        kwargs = dict(options, seed=None if seed is None else seed + i)
        if family == "grape":  # by default each axis takes an equal run of the planes (rows, then columns)
            kwargs.setdefault("mode", "chunked")
            kwargs.setdefault("base", base)
            if kwargs["mode"] == "chunked" and kwargs.get("sections") is None:
                planes = (kwargs.get("rotary_dim") or head_dim) // 2
                kwargs["sections"] = [planes // axes] * (axes - 1) + [planes - (axes - 1) * (planes // axes)]
        try:
            return cls(head_dim, axes, **kwargs)
        except TypeError as e:
            raise ValueError(f"patch_vision_model: bad option for family={family!r}: {e}") from None

    return rotator, build


# --------------------------------------------------------------------------------------------------
# hooks (module-level functions: hooks stay picklable and copy with the model)


def _rotary_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    adapter: VisionAdapter = hook.adapter
    coords, like = adapter.coords(hook.owner, **hook.bind(args, kwargs))
    return adapter.identity(coords, like, hook.head_dim)


def _permute_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    given = hook.bind(args, kwargs)
    out = hook.call_previous(**given)
    coords = getattr(given["input_tensor"], COORDS_ATTR, None)
    if coords is not None:  # the encoder reorders its position embeddings: reorder the coordinates alike
        setattr(out, COORDS_ATTR, hook.call_previous(**{**given, "input_tensor": coords}))
    return out


def _attention_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    adapter: VisionAdapter = hook.adapter
    coords = adapter.embedded_coords(hook.bind(args, kwargs).get(adapter.embedding_param))
    if coords is None:
        raise ValueError("patch_vision_model: this attention module got position embeddings that do not come "
                         "from the patched rotary; call the patched encoder itself (or unpatch_vision_model)")
    ctx: _Context = hook.context
    ctx.begin(coords)
    try:
        return hook.call_previous(*args, **kwargs)
    finally:
        ctx.tables = None


def _proj_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    out = hook.call_previous(*args, **kwargs)
    ctx: _Context = hook.context
    if ctx.tables is None:  # called outside the attention's forward: a plain projection
        return out
    heads = hook.num_heads
    if hook.fused:  # Qwen, EXAONE 4.5: (L, (H + 2·H_kv)·D), q then k then v
        length, (q_heads, kv_heads) = out.shape[0], hook.split
        dim = out.shape[-1] // (q_heads + 2 * kv_heads)
        q = out[:, :q_heads * dim].view(1, length, q_heads, dim)
        k = out[:, q_heads * dim:(q_heads + kv_heads) * dim].view(1, length, kv_heads, dim)
        q2, k2 = ctx.rotate(q), ctx.rotate(k)
        if q2 is q and k2 is k:  # rotated in place: out holds the result
            return out
        return torch.cat((q2.reshape(length, -1), k2.reshape(length, -1), out[:, (q_heads + kv_heads) * dim:]), dim=-1)
    if hook.per_head:  # a q/k norm's output: (B, L, H, D) already
        return ctx.rotate(out)
    if out.ndim == 2:  # an unbatched (L, H·D) output gets a batch of one
        x = out.reshape(1, out.shape[0], heads, -1)
    else:  # (B, L, H·D), or a (B, rows, columns, H·D) map (SAM 3): its tokens row by row
        x = out.reshape(out.shape[0], -1, heads, out.shape[-1] // heads)
    return ctx.rotate(x).reshape(out.shape)


def _method_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    """An attention's own rotate method ``(qk (B, H, L, D), positions) -> qk`` ("method" style encoders)."""
    given = hook.bind(args, kwargs)
    qk, positions = (given[name] for name in hook.names)
    ctx: _Context = hook.context
    ctx.begin(hook.adapter.method_coords(hook.owner, positions))
    try:
        return ctx.rotate(qk.transpose(1, 2)).transpose(1, 2)
    finally:
        ctx.tables = None


def _guard_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    """Checks an encoder input the patch cannot place exactly (``adapter.check_input``), then runs the stock."""
    hook.adapter.check_input(hook.owner, hook.info, **hook.bind(args, kwargs))
    return hook.call_previous(*args, **kwargs)


# what each vision hook handles of the method it replaces (the rotary's own parameters are the adapter's)
_ATTENTION = Contract(frozenset({"hidden_states", "attention_mask", "cu_seqlens", "max_seqlen"}),
                      var_keyword=True)
_QK_OUTPUT = Contract(frozenset({"input", "hidden_states"}), required=(("input", "hidden_states"),))  # Linear, norm
_PERMUTE = Contract(frozenset({"input_tensor", "window_index", "seq_len"}), required=(("input_tensor",),))


def _rotary_contract(adapter: VisionAdapter) -> Contract:
    return Contract(frozenset(adapter.rotary_params), required=tuple((p,) for p in adapter.rotary_params))


def _attention_contract(adapter: VisionAdapter) -> Contract:
    known = _ATTENTION.known | {adapter.embedding_param, *adapter.attention_params}
    return Contract(known, required=(("hidden_states",), (adapter.embedding_param,)), var_keyword=True)


def _method_contract(adapter: VisionAdapter) -> Contract:
    return Contract(frozenset(adapter.method_params), required=tuple((p,) for p in adapter.method_params))


def _qk_modules(adapter: VisionAdapter) -> tuple[str, ...]:
    return ("qkv",) if adapter.fused_qkv else adapter.qk_modules


def _check_boundary(rotary: nn.Module, adapter: VisionAdapter, encoder: nn.Module, attentions: list) -> None:
    """Refuse, before anything changes, an encoder whose hooked methods take parameters the hooks do not know."""
    check_version("patch_vision_model")
    kinds = list(dict.fromkeys(map(type, attentions)))
    if adapter.style == "method":
        checks = [(t, adapter.method, _method_contract(adapter)) for t in kinds]
    else:
        checks = [(type(rotary), "forward", _rotary_contract(adapter))]
        checks += [(t, "forward", _attention_contract(adapter)) for t in kinds]
        checks += [(type(getattr(a, p)), "forward", _QK_OUTPUT) for a in attentions[:1] for p in _qk_modules(adapter)]
    checks += [(type(encoder), m, _PERMUTE) for m in adapter.extra_hooks()]
    checks += [(type(owner), m, contract) for owner, m, contract, _ in adapter.guards(rotary)]
    check_all(checks)


# --------------------------------------------------------------------------------------------------
# public functions

_SUPPORTED = ("DINOv3 ViT, Pixtral's vision encoder, the Qwen2-VL / Qwen2.5-VL vision tower, V-JEPA 2's encoder and "
              "predictor, Gemma 4's, VideoLLaMA 3's, EXAONE 4.5's and Llama 4's vision encoders, SAM 3's ViT")


def _find(model: nn.Module) -> tuple[str, nn.Module, VisionAdapter, nn.Module, list[nn.Module]]:
    """(encoder name, rotary module, adapter, encoder, its attention modules); ValueError if none or several.
    For "method" style adapters the "rotary" is the encoder module the adapter matched (the outermost one)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch_vision_model: `model` must be a torch nn.Module, got {type(model).__name__}")
    found = []
    for name, module in model.named_modules():
        if any(name.startswith(f"{outer}.") or not outer for outer, _, a in found if a.style == "method"):
            continue  # inside an encoder already found (V-JEPA 2's model holds its encoder and predictor)
        for adapter in VISION_ADAPTERS:
            if adapter.matches(module):
                found.append((name, module, adapter))
    if not found:
        raise ValueError(f"patch_vision_model: `model` ({type(model).__name__}) has no supported vision RoPE; "
                         f"supported: {_SUPPORTED}")
    if len(found) > 1 and len({id(a) for _, _, a in found}) == 1 and found[0][2].rotary_per_layer:
        names = [n.split(".") for n, _, _ in found]
        common = []
        for parts in zip(*names):
            if len(set(parts)) > 1:
                break
            common.append(parts[0])
        encoder = model.get_submodule(".".join(common)) if common else model
        adapter = found[0][2]
        rotaries = [m for _, m, _ in found]
        attentions = [m for m in encoder.modules() if type(m).__name__ in adapter.attention_classes]
        if len(attentions) != len(rotaries):
            raise ValueError(f"patch_vision_model: found {len(rotaries)} per-layer rotaries but {len(attentions)} "
                             f"{adapter.attention_classes} attention modules; this transformers version is not "
                             f"supported")
        return ".".join(common), rotaries, adapter, encoder, attentions
    if len(found) > 1:
        raise ValueError(f"patch_vision_model: `model` holds {len(found)} vision encoders "
                         f"({', '.join(n or '<root>' for n, _, _ in found)}); patch each one as its own module")
    name, rotary, adapter = found[0]
    if adapter.style == "method":
        encoder = rotary
    else:
        encoder = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    attentions = [m for m in encoder.modules() if type(m).__name__ in adapter.attention_classes]
    if not attentions:
        raise ValueError(f"patch_vision_model: found the rotary {name!r} but no {adapter.attention_classes} "
                         f"attention next to it; this transformers version is not supported")
    return name, rotary, adapter, encoder, attentions


def is_vision_patched(model: nn.Module) -> bool:
    """Whether ``model`` (or the vision tower inside it) carries a ropekit vision patch."""
    return any(isinstance(value, hooks.Hook) and getattr(value, "vision", False)
               for m in model.modules() for value in m.__dict__.values())


def patch_vision_model(model: nn.Module, family: str = "axial", *, shared: bool = False, **options: Any) -> nn.Module:
    """Replace the RoPE of ``model``'s vision encoder with a ropekit family (module docstring); returns
    ``model``. Patching a patched model replaces the previous patch. Options are the family's (see the
    module docstring); ``shared=True`` gives learned families one module for all layers (of one head size)
    instead of one each.
    """
    key = _check_family(family)
    if not isinstance(shared, bool):
        raise TypeError(f"patch_vision_model: `shared` must be True or False, got {shared!r}")
    _, rotaries, adapter, encoder, attentions = _find(model)
    rotary = rotaries[0] if isinstance(rotaries, list) else rotaries  # per-layer rotaries share their settings
    _check_boundary(rotary, adapter, encoder, attentions)
    sizes = [(adapter.head_dim(a), adapter.num_heads(a)) for a in attentions]
    if key == "mixed" or "num_heads" in options:
        grouped = [a for a in attentions if adapter.num_kv_heads(a) != adapter.num_heads(a)]
        if grouped:
            raise ValueError(
                f"patch_vision_model: family={family!r} gives each head its own rotation, but this encoder's keys "
                f"have fewer heads ({adapter.num_kv_heads(grouped[0])}) than its queries "
                f"({adapter.num_heads(grouped[0])}), so a query head and the key head it reads would turn "
                f"differently; use a family shared by all heads (drop `num_heads`)")
    rotators: dict = {}
    if key in ("axial", "directional", "geope"):
        if shared:
            raise ValueError(f"patch_vision_model: `shared` applies to learned families; family={family!r} "
                             f"has no parameters and is shared already")
        for head_dim, _ in dict.fromkeys(sizes):  # bad options fail here, before anything is hooked
            rotators[head_dim] = _shared_rotator(key, dict(options), adapter, rotary, head_dim)
        build = None
    else:
        rotator, build = _learned_factory(key, dict(options), adapter.num_axes, adapter.base(rotary))
        for size in dict.fromkeys(sizes):
            build(0, *size)  # bad options fail here, before anything is hooked
    unpatch_vision_model(model)
    param = next(iter(encoder.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    shared_modules: dict = {}
    for i, (attn, (head_dim, num_heads)) in enumerate(zip(attentions, sizes)):
        module = None
        if build is not None:
            if shared:
                if (head_dim, num_heads) not in shared_modules:
                    shared_modules[head_dim, num_heads] = build(0, head_dim, num_heads).to(device)
                module = shared_modules[head_dim, num_heads]
            else:
                module = build(i, head_dim, num_heads).to(device)
            setattr(attn, _ROTARY_ATTR, module)
        ctx = _Context(rotators.get(head_dim, rotator if build is not None else None), module, adapter.patches_first)
        if adapter.style == "method":
            hooks.install(attn, adapter.method, _method_forward, None, contract=_method_contract(adapter),
                          context=ctx, adapter=adapter, vision=True)
            continue
        hooks.install(attn, "forward", _attention_forward, None, contract=_attention_contract(adapter), context=ctx,
                      adapter=adapter, vision=True)
        for p in _qk_modules(adapter):
            hooks.install(getattr(attn, p), "forward", _proj_forward, None, contract=_QK_OUTPUT, context=ctx,
                          num_heads=num_heads, fused=adapter.fused_qkv,
                          split=(num_heads, adapter.num_kv_heads(attn)), per_head=adapter.qk_per_head, vision=True)
    if adapter.style == "rotary":
        for one_rotary in rotaries if isinstance(rotaries, list) else [rotaries]:
            hooks.install(one_rotary, "forward", _rotary_forward, None, contract=_rotary_contract(adapter),
                          adapter=adapter, head_dim=sizes[0][0], vision=True)
    for method in adapter.extra_hooks():
        hooks.install(encoder, method, _permute_forward, None, contract=_PERMUTE, vision=True)
    for owner, method, contract, info in adapter.guards(rotary):
        hooks.install(owner, method, _guard_forward, None, contract=contract, adapter=adapter, info=info,
                      vision=True)
    return model


def unpatch_vision_model(model: nn.Module) -> nn.Module:
    """Remove a ropekit vision patch (no-op on a stock model); returns ``model`` with its stock encoder."""
    for module in list(model.modules()):
        for name, value in list(module.__dict__.items()):
            if isinstance(value, hooks.Hook) and getattr(value, "vision", False):
                hooks.remove(module, name)
        if isinstance(module.__dict__.get("_modules", {}).get(_ROTARY_ATTR), nn.Module):
            delattr(module, _ROTARY_ATTR)
    return model
