"""The hooks a patched model runs: positions, cos/sin per geometry, each layer's geometry, generation."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..apply.planar import cos_sin
from ..rotations.planar import angles
from .state import _State, _decode, _from_stash, _prefill, _token_types

class _Embeddings(tuple):
    """``(cos, sin)`` of the first geometry that also carries every geometry's pair and positions.

    Decoder layers receive this object through ``position_embeddings``; patched layers pick their own
    geometry from it, so a re-run under gradient checkpointing sees the same values as the first run.
    """

    geoms: dict[str, tuple[torch.Tensor, torch.Tensor]]
    positions: dict[str, torch.Tensor]



def _make_compute(state: _State):
    def compute_3d_position_ids(
        input_ids=None, inputs_embeds=None, image_grid_thw=None, video_grid_thw=None, attention_mask=None,
        past_key_values=None, mm_token_type_ids=None, second_per_grid_ts=None, **_: Any,
    ):
        """ropekit replacement: stores every geometry's positions for the rotary hook; returns None."""
        state.pending = None
        ref = inputs_embeds if inputs_embeds is not None else input_ids
        batch, length = ref.shape[:2]
        past = 0 if past_key_values is None else int(past_key_values.get_seq_length())
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 2 else None
        if mask is not None:
            mask = (mask != 0).long().cpu()
        has_grids = image_grid_thw is not None or video_grid_thw is not None
        if past == 0:
            if mask is not None and mask.shape[1] != length:
                mask = None
            types = _token_types(state, input_ids, mm_token_type_ids, batch, length, False, ref.device).cpu()
            if has_grids or not _from_stash(state, types, mask):
                if has_grids and mm_token_type_ids is None and input_ids is None:
                    _token_types(state, None, None, batch, length, True, ref.device)  # raises the clear error
                _prefill(state, types, image_grid_thw, video_grid_thw, mask, second_per_grid_ts)
        else:
            state.stash = None
            types = None if mm_token_type_ids is None else mm_token_type_ids
            _decode(state, types, mask, past, batch, length)
        state.pending = {k: v.to(ref.device) for k, v in state.pending.items()}
        return None

    return compute_3d_position_ids


def _make_generation_positions(state: _State):
    def _prepare_position_ids_for_generation(inputs_tensor: torch.Tensor, model_kwargs: dict) -> None:
        """Place the prompt while ``generate`` still holds the grids; the model places every later token.

        Returning None keeps ``generate`` from passing (and extending) 1-D position ids of its own.
        """
        state.stash = None
        cache = model_kwargs.get("past_key_values")
        if cache is not None and cache.get_seq_length() > 0:
            return None
        input_ids = model_kwargs.get("input_ids")
        if input_ids is None or input_ids.shape[1] == 0:
            is_ids = inputs_tensor.ndim == 2 and not inputs_tensor.is_floating_point()
            input_ids = inputs_tensor if is_ids else None
        batch, length = inputs_tensor.shape[:2]
        grids = model_kwargs.get("image_grid_thw"), model_kwargs.get("video_grid_thw")
        has_grids = any(g is not None for g in grids)
        types = _token_types(
            state, input_ids, model_kwargs.get("mm_token_type_ids"), batch, length, has_grids, inputs_tensor.device
        ).cpu()
        mask = model_kwargs.get("attention_mask")
        mask = (mask != 0).long().cpu() if isinstance(mask, torch.Tensor) and mask.ndim == 2 else None
        _prefill(state, types, grids[0], grids[1], mask, model_kwargs.get("second_per_grid_ts"))
        state.stash, state.pending = (types, mask, state.pending), None
        return None

    return _prepare_position_ids_for_generation


def _fallback_positions(state: _State, position_ids: torch.Tensor, batch: int, length: int) -> dict:
    """Positions when the model was given ``position_ids`` itself (no design placement this forward)."""
    ids = position_ids if position_ids.ndim == 3 else position_ids[None]
    ids = ids.expand(-1, batch, -1).float()
    out = {}
    for name, geo in state.geometries.items():
        A = geo.W.shape[0]
        if ids.shape[0] == A:
            out[name] = ids
        elif bool((ids == ids[:1]).all()):
            out[name] = ids[:1].expand(A, -1, -1)
        else:
            raise ValueError(
                f"patched model: explicit position_ids with {ids.shape[0]} axes cannot drive design {name!r} "
                f"({A} axes); pass position_ids=None and let the patched model place the tokens"
            )
    return out


def _make_rotary(state: _State):
    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> _Embeddings:
        """cos/sin of every geometry, once per forward (float32 angles, SPEC §2)."""
        batch, length = x.shape[0], x.shape[1]
        pending, state.pending = state.pending, None
        if pending is None or any(tuple(p.shape[1:]) != (batch, length) for p in pending.values()):
            pending = _fallback_positions(state, position_ids, batch, length)
        geoms = {}
        with torch.no_grad():
            for name, geo in state.geometries.items():
                pos = pending[name].to(x.device, torch.float32)
                c, s = cos_sin(angles(pos.permute(1, 2, 0), geo.W.to(x.device)))
                # the model's own apply uses rotate-half tables, so each half repeats the pair's value
                cos = torch.cat([c, c], dim=-1) * state.scaling
                sin = torch.cat([s, s], dim=-1) * state.scaling
                geoms[name] = (cos.to(x.dtype), sin.to(x.dtype))
        first = geoms[state.layer_geometry[0]]
        out = _Embeddings(first)
        out.geoms, out.positions = geoms, pending
        return out

    return forward


def _make_layer(state: _State, layer: nn.Module, index: int):
    original = layer.forward  # bound (or previously set instance) forward

    def forward(*args: Any, **kwargs: Any):
        """Run the layer with the cos/sin of its own geometry."""
        emb = kwargs.get("position_embeddings")
        if isinstance(emb, _Embeddings):
            name = state.layer_geometry[index]
            kwargs["position_embeddings"] = emb.geoms[name]
            state.last[index] = emb.positions[name]
        return original(*args, **kwargs)

    return forward


