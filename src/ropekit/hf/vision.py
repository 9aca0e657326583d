"""Any ropekit vision rotary inside a vision encoder that already uses 2-D RoPE (docs/hf.md, "Vision encoders").

``patch_vision_model(model, family, **options)`` swaps the 2-D RoPE of transformers' DINOv3 ViT, Pixtral's
vision encoder and the Qwen2-VL / Qwen2.5-VL vision tower (alone or as the ``visual`` of the VL model) for a
ropekit rotation family, on that instance only; ``unpatch_vision_model`` gives the stock encoder back.

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
in training), Pixtral's and Qwen's integer (row, column) patch indices.
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

    writes_in_place = True  # apply(..., inplace=True) rotates x where it lies (no allocation)

    def __init__(self, W: Optional[torch.Tensor] = None, rope: Optional[DirectionalRoPE] = None) -> None:
        self.W, self.rope = W, rope

    def tables(self, coords: torch.Tensor):
        if self.rope is not None:
            return self.rope.cos_sin(coords)
        return cos_sin(angles(coords, self.W.to(coords.device)))

    def apply(self, x: torch.Tensor, tables, inplace: bool = False) -> torch.Tensor:
        return apply_rotary_fused(x, *tables, channels="half", seq_dim=-2, out=x if inplace else None)


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


class _Context:
    """One attention module's rotation: the rotator, its learned module (if any) and this call's tables."""

    def __init__(self, rotator: Any, module: Optional[nn.Module]) -> None:
        self.rotator, self.module, self.tables, self.length = rotator, module, None, 0

    def begin(self, coords: torch.Tensor) -> None:
        self.length = coords.shape[0]
        if self.module is None:
            self.tables = self.rotator.tables(coords)
        else:
            self.tables = self.rotator.tables(self.module, coords)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x (B, L, H, D)``; its last ``length`` tokens are the patches (DINOv3's prefix tokens stay)."""
        tokens = x.shape[1]
        if tokens < self.length:
            raise ValueError(f"patch_vision_model: the attention got {tokens} tokens but {self.length} patch "
                             f"coordinates; the encoder's inputs do not match its position embeddings")
        prefix, patches = x.split((tokens - self.length, self.length), dim=1)
        if self._writable(x):  # the projection's fresh output, which nothing else reads: rotate it where it lies
            self.rotator.apply(patches.transpose(1, 2), self.tables, inplace=True)
            return x
        rotated = self.rotator.apply(patches.transpose(1, 2), self.tables).transpose(1, 2).to(x.dtype)
        return rotated if tokens == self.length else torch.cat((prefix, rotated), dim=1)

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


def _shared_rotator(family: str, options: dict, adapter: VisionAdapter, rotary: nn.Module, head_dim: int):
    """The rotator of a family without parameters (one for all layers)."""
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
            return _Planar(adapter.stock_frequencies(rotary))
        if frequencies == "axial":
            return _Planar(frequency_matrix("axial", head_dim, 2, base=base))
        raise ValueError(f"patch_vision_model: `frequencies` must be 'stock' (the encoder's own layout) or "
                         f"'axial' (ropekit's axial allocation), got {frequencies!r}")
    # directional
    _take(options, ("method", "seed"), family)
    return _Planar(rope=DirectionalRoPE(head_dim, 2, options.get("method", "sobol"), base=base,
                                        seed=options.get("seed", 0)))


def _learned_factory(family: str, options: dict, head_dim: int, num_heads: int, base: float):
    """(rotator, a function building one family module) for families with parameters."""
    if family == "mixed":
        _take(options, ("theta", "seed"), family)
        seed = options.get("seed", 0)
        return _Mixed(), lambda i: MixedFrequencies(head_dim, num_heads, 2, theta=options.get("theta", 10.0),
                                                    seed=None if seed is None else seed + i)
    if "num_axes" in options:
        raise ValueError(f"patch_vision_model: `num_axes` is fixed to 2 (row, column) for vision encoders; "
                         f"drop it from the options of family={family!r}")
    if "head_dim" in options:
        raise ValueError("patch_vision_model: `head_dim` comes from the encoder; drop it from the options")
    cls = _LEARNED[family]
    rotator = _Grape() if family == "grape" else _Blocks()
    seed = options.pop("seed", 0)

    def build(i: int) -> nn.Module:
        kwargs = dict(options, seed=None if seed is None else seed + i)
        if family == "grape":  # two axes: by default rows take the first half of the planes, columns the rest
            kwargs.setdefault("mode", "chunked")
            kwargs.setdefault("base", base)
            if kwargs["mode"] == "chunked" and kwargs.get("sections") is None:
                rotary = kwargs.get("rotary_dim") or head_dim
                kwargs["sections"] = [rotary // 4, rotary // 2 - rotary // 4]
        try:
            return cls(head_dim, 2, **kwargs)
        except TypeError as e:
            raise ValueError(f"patch_vision_model: bad option for family={family!r}: {e}") from None

    return rotator, build


# --------------------------------------------------------------------------------------------------
# hooks (module-level functions: hooks stay picklable and copy with the model)


def _rotary_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    adapter: VisionAdapter = hook.adapter
    coords, like = adapter.coords(hook.owner, **hook.bind(args, kwargs))
    shape = (coords.shape[0], hook.head_dim)
    cos = torch.ones(shape, dtype=like.dtype, device=like.device)
    setattr(cos, COORDS_ATTR, coords)
    return cos, torch.zeros(shape, dtype=like.dtype, device=like.device)


def _permute_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    given = hook.bind(args, kwargs)
    out = hook.call_previous(**given)
    coords = getattr(given["input_tensor"], COORDS_ATTR, None)
    if coords is not None:  # the encoder reorders its position embeddings: reorder the coordinates alike
        setattr(out, COORDS_ATTR, hook.call_previous(**{**given, "input_tensor": coords}))
    return out


def _attention_forward(hook: hooks.Hook, *args: Any, **kwargs: Any):
    embeddings = hook.bind(args, kwargs).get("position_embeddings")
    coords = getattr(embeddings[0], COORDS_ATTR, None) if isinstance(embeddings, tuple) and embeddings else None
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
    if hook.fused:  # Qwen: (L, 3·H·D), q and k are the first two thirds
        qkv = out.reshape(1, out.shape[0], 3, heads, -1)
        q, k, v = qkv.unbind(2)
        q2, k2 = ctx.rotate(q), ctx.rotate(k)
        if q2 is q and k2 is k:  # rotated in place: out holds the result
            return out
        return torch.stack((q2, k2, v), dim=2).reshape(out.shape)
    return ctx.rotate(out.reshape(*out.shape[:-1], heads, -1)).reshape(out.shape)


# what each vision hook handles of the method it replaces (the rotary's own parameters are the adapter's)
_ATTENTION = Contract(frozenset({"hidden_states", "attention_mask", "position_embeddings", "cu_seqlens", "max_seqlen"}),
                      required=(("hidden_states",), ("position_embeddings",)), var_keyword=True)
_PROJECTION = Contract(frozenset({"input"}), required=(("input",),))  # nn.Linear.forward
_PERMUTE = Contract(frozenset({"input_tensor", "window_index", "seq_len"}), required=(("input_tensor",),))


def _rotary_contract(adapter: VisionAdapter) -> Contract:
    return Contract(frozenset(adapter.rotary_params), required=tuple((p,) for p in adapter.rotary_params))


def _check_boundary(rotary: nn.Module, adapter: VisionAdapter, encoder: nn.Module, attentions: list) -> None:
    """Refuse, before anything changes, an encoder whose hooked methods take parameters the hooks do not know."""
    check_version("patch_vision_model")
    projections = ("qkv",) if adapter.fused_qkv else ("q_proj", "k_proj")
    checks = [(type(rotary), "forward", _rotary_contract(adapter))]
    checks += [(t, "forward", _ATTENTION) for t in dict.fromkeys(map(type, attentions))]
    checks += [(type(getattr(a, p)), "forward", _PROJECTION) for a in attentions[:1] for p in projections]
    checks += [(type(encoder), m, _PERMUTE) for m in adapter.extra_hooks()]
    check_all(checks)


# --------------------------------------------------------------------------------------------------
# public functions


def _find(model: nn.Module) -> tuple[str, nn.Module, VisionAdapter, nn.Module, list[nn.Module]]:
    """(encoder name, rotary module, adapter, encoder, its attention modules); ValueError if none or several."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch_vision_model: `model` must be a torch nn.Module, got {type(model).__name__}")
    found = []
    for name, module in model.named_modules():
        for adapter in VISION_ADAPTERS:
            if adapter.matches(module):
                found.append((name, module, adapter))
    if not found:
        raise ValueError(f"patch_vision_model: `model` ({type(model).__name__}) has no supported 2-D vision RoPE; "
                         f"supported: DINOv3 ViT, Pixtral's vision encoder, the Qwen2-VL / Qwen2.5-VL vision tower")
    if len(found) > 1:
        raise ValueError(f"patch_vision_model: `model` holds {len(found)} vision encoders "
                         f"({', '.join(n or '<root>' for n, _, _ in found)}); patch each one as its own module")
    name, rotary, adapter = found[0]
    encoder = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    attentions = [m for m in encoder.modules() if type(m).__name__ in adapter.attention_classes]
    if not attentions:
        raise ValueError(f"patch_vision_model: found the rotary {name!r} but no {adapter.attention_classes} "
                         f"attention next to it; this transformers version is not supported")
    return name, rotary, adapter, encoder, attentions


def is_vision_patched(model: nn.Module) -> bool:
    """Whether ``model`` (or the vision tower inside it) carries a ropekit vision patch."""
    return any(isinstance(m.__dict__.get("forward"), hooks.Hook) and getattr(m.__dict__["forward"], "vision", False)
               for m in model.modules())


def patch_vision_model(model: nn.Module, family: str = "axial", *, shared: bool = False, **options: Any) -> nn.Module:
    """Replace the 2-D RoPE of ``model``'s vision encoder with a ropekit family (module docstring); returns
    ``model``. Patching a patched model replaces the previous patch. Options are the family's (see the
    module docstring); ``shared=True`` gives learned families one module for all layers instead of one each.
    """
    key = _check_family(family)
    if not isinstance(shared, bool):
        raise TypeError(f"patch_vision_model: `shared` must be True or False, got {shared!r}")
    _, rotary, adapter, encoder, attentions = _find(model)
    _check_boundary(rotary, adapter, encoder, attentions)
    head_dim, num_heads = adapter.head_dim(attentions[0]), adapter.num_heads(attentions[0])
    options = dict(options)
    if key in ("axial", "directional", "geope"):
        if shared:
            raise ValueError(f"patch_vision_model: `shared` applies to learned families; family={family!r} "
                             f"has no parameters and is shared already")
        rotator, build = _shared_rotator(key, options, adapter, rotary, head_dim), None
    else:
        rotator, build = _learned_factory(key, options, head_dim, num_heads, adapter.base(rotary))
        build(0)  # bad options fail here, before anything is hooked
    unpatch_vision_model(model)
    param = next(iter(encoder.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    one = build(0).to(device) if build is not None and shared else None
    for i, attn in enumerate(attentions):
        module = None
        if build is not None:
            module = one if shared else build(i).to(device)
            setattr(attn, _ROTARY_ATTR, module)
        ctx = _Context(rotator, module)
        hooks.install(attn, "forward", _attention_forward, None, contract=_ATTENTION, context=ctx, vision=True)
        projections = ("qkv",) if adapter.fused_qkv else ("q_proj", "k_proj")
        for p in projections:
            hooks.install(getattr(attn, p), "forward", _proj_forward, None, contract=_PROJECTION, context=ctx,
                          num_heads=num_heads, fused=adapter.fused_qkv, vision=True)
    hooks.install(rotary, "forward", _rotary_forward, None, contract=_rotary_contract(adapter), adapter=adapter,
                  head_dim=head_dim, vision=True)
    for method in adapter.extra_hooks():
        hooks.install(encoder, method, _permute_forward, None, contract=_PERMUTE, vision=True)
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
