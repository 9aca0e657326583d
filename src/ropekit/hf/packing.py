"""Packed (padding-free) batches for a patched model: several samples in one row, each placed as if alone.

:func:`pack` places every sample by itself (:func:`ropekit.hf.position_ids`) and lays the samples end to end:
the position tensor's text row restarts at 0 for each sample, which is what transformers reads sample boundaries
off (a block-diagonal mask for ``sdpa`` and ``eager``, variable-length attention for flash attention), and every
geometry row holds the sample's own positions. Images, videos and their grids follow in sample order, as the
model fills its image tokens: stacked along their first dimension, or, for a family whose processor lays every crop
of a batch out as one NaViT-packed row (MiniCPM-V 4.6 and 4.7), joined along their last (the adapter's ``pack_layout``).
:class:`PackingCollator` is the same as a data collator for ``Trainer``.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

#: per-sample inputs laid end to end along the sequence (last dimension)
_SEQUENCE = ("input_ids", "mm_token_type_ids", "labels")
#: per-sample vision inputs stacked along their first dimension, in sample order (images in the order the model
#: fills their tokens)
_STACKED = ("pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw", "second_per_grid_ts",
            "video_second_per_grid", "image_sizes", "image_sizes_videos", "input_features", "feature_attention_mask",
            "audio_feature_lengths", "pixel_attention_mask", "image_attention_mask", "image_merge_sizes",
            "video_merge_sizes", "video_compression_mask", "pixel_values_local", "num_local_patches",
            "images_per_sample")
#: per-sample scalars that must agree across the samples of one row
_SHARED = ("use_audio_in_video",)

__all__ = ["pack", "PackingCollator"]


def _tensor(value: Any, name: str, index: int) -> torch.Tensor:
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"pack: sample {index}: `{name}` is not a tensor or nested list of numbers: {e}") from None


def _sequence(value: Any, name: str, index: int) -> torch.Tensor:
    """A sample's per-token input as one row ``(1, L)``."""
    t = _tensor(value, name, index)
    if t.ndim == 1:
        t = t[None]
    if t.ndim != 2 or t.shape[0] != 1:
        raise ValueError(f"pack: sample {index}: `{name}` must hold one sample ((L,) or (1, L)), got shape "
                         f"{tuple(t.shape)}; give the collator one sample per feature")
    return t


def pack(model: nn.Module, samples: Sequence[Mapping[str, Any]], *, return_flash_attn_kwargs: bool = False,
         label_pad: int = -100) -> dict[str, Any]:
    """One padding-free row of ``samples`` for a patched ``model``: ``input_ids (1, N)``, ``position_ids (R, 1, N)``
    (each sample placed alone, the text row restarting at 0 per sample), ``labels`` (each sample's own, or its
    ``input_ids``; the first token of every sample set to ``label_pad`` so no sample learns from the one before
    it), and the samples' vision inputs stacked in order. No ``attention_mask``: the model reads the boundaries off
    the text row. ``return_flash_attn_kwargs`` adds transformers' ``cu_seq_lens_q/k`` and ``max_length_q/k``.

    A sample is what the processor returns for one sample; its ``attention_mask`` (if any) must be all ones.
    """
    from .patch import _parts, _state, position_ids

    if _state(model) is None:
        raise ValueError("pack: the model is not patched; call ropekit.patch_model(model, ...) first (the "
                         "stock-equivalent design packs the stock model's positions)")
    if isinstance(samples, Mapping) or not isinstance(samples, Sequence) or not samples:
        raise TypeError("pack: `samples` must be a non-empty list of per-sample processor outputs (dicts)")
    layout = dict({k: "first" for k in _STACKED}, **_state(model).adapter.pack_layout)
    family_shared = [k for k, how in layout.items() if how == "shared"]
    known = set(_SEQUENCE) | set(layout) | set(_SHARED) | {"attention_mask"}
    seq: dict[str, list] = {k: [] for k in _SEQUENCE}
    stacked: dict[str, list] = {k: [] for k, how in layout.items() if how in ("first", "last")}
    shared: dict[str, Any] = {}
    rows, lengths = [], []
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise TypeError(f"pack: sample {i} is a {type(sample).__name__}, not a dict of processor outputs")
        unknown = sorted(set(sample) - known)
        if unknown:
            raise ValueError(f"pack: sample {i} holds {unknown}, which pack does not know how to lay out; it "
                             f"packs {sorted(known)} (drop the others, or pack them yourself)")
        if "input_ids" not in sample:
            raise ValueError(f"pack: sample {i} has no input_ids")
        ids = _sequence(sample["input_ids"], "input_ids", i).long()
        mask = sample.get("attention_mask")
        if mask is not None and not bool((_sequence(mask, "attention_mask", i) != 0).all()):
            raise ValueError(f"pack: sample {i} has padding (zeros in attention_mask); give unpadded samples")
        inputs = {k: _tensor(sample[k], k, i) for k in stacked if sample.get(k) is not None}
        for k in family_shared:
            if i and sample.get(k) != shared.get(k):
                raise ValueError(f"pack: samples disagree on `{k}` ({shared.get(k)!r}, then {sample.get(k)!r} in "
                                 f"sample {i}); pack samples with the same {k} together")
            if sample.get(k) is not None:
                shared[k] = sample[k]
        for k in _SHARED:
            if k in sample:
                if k in shared and shared[k] != sample[k]:
                    raise ValueError(f"pack: samples disagree on `{k}`; pack samples with the same value together")
                shared[k] = sample[k]
        types = sample.get("mm_token_type_ids")
        if types is not None:
            inputs["mm_token_type_ids"] = _sequence(types, "mm_token_type_ids", i).long()
        rows.append(position_ids(model, ids, **inputs, **shared))
        lengths.append(ids.shape[1])
        seq["input_ids"].append(ids)
        if types is not None:
            seq["mm_token_type_ids"].append(inputs["mm_token_type_ids"])
        labels = _sequence(sample["labels"], "labels", i).long().clone() if sample.get("labels") is not None \
            else ids.clone()
        if labels.shape != ids.shape:
            raise ValueError(f"pack: sample {i}: labels {tuple(labels.shape)} do not match input_ids {tuple(ids.shape)}")
        labels[:, 0] = label_pad
        seq["labels"].append(labels)
        for k, v in inputs.items():
            if k in stacked:
                stacked[k].append(v)
    out: dict[str, Any] = {"input_ids": torch.cat(seq["input_ids"], dim=1),
                           "position_ids": torch.cat(rows, dim=2), "labels": torch.cat(seq["labels"], dim=1)}
    if seq["mm_token_type_ids"]:
        if len(seq["mm_token_type_ids"]) != len(samples):
            raise ValueError("pack: some samples have mm_token_type_ids and others not; give them for every sample")
        out["mm_token_type_ids"] = torch.cat(seq["mm_token_type_ids"], dim=1)
    for k, parts in stacked.items():
        if parts and layout[k] == "last":
            out[k] = torch.cat(_one_row(parts, k), dim=-1)
        elif parts:
            out[k] = torch.cat(_same_tiles([p if p.ndim else p[None] for p in parts], k), dim=0)
    out.update(shared)
    _state(model).adapter.check_packed(_parts(model)[1].config, out)
    if return_flash_attn_kwargs:
        cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
    return out


def _same_tiles(parts: list, name: str) -> list:
    """Per-sample ``(1, tiles, …)`` inputs with different tile counts (Idefics3, SmolVLM: samples × tiles, an all-zero
    tile is padding) zero-padded to the most tiles; any other shape mismatch is refused naming the input."""
    shapes = {tuple(p.shape[1:]) for p in parts}
    if len(shapes) == 1:
        return parts
    rest = {s[1:] for s in shapes if len(s) >= 2}
    if len(rest) == 1 and all(len(s) >= 3 for s in shapes) and all(p.shape[0] == 1 for p in parts):
        most = max(p.shape[1] for p in parts)
        return [torch.cat([p, p.new_zeros(1, most - p.shape[1], *p.shape[2:])], dim=1) for p in parts]
    raise ValueError(f"pack: the samples' `{name}` have shapes {sorted(shapes)} past the first dimension, which "
                     f"cannot be stacked; give every sample the same {name} shape")


def _one_row(parts: list, name: str) -> list:
    """Per-sample NaViT-packed rows ``(1, …, patches)``, checked to join along their last dimension (the model reads
    the first row only, so a second one would be dropped)."""
    shapes = {tuple(p.shape[:-1]) for p in parts}
    if len(shapes) != 1 or next(iter(shapes))[:1] != (1,):
        raise ValueError(f"pack: the samples' `{name}` have shapes {sorted(tuple(p.shape) for p in parts)}; this "
                         f"family's processor gives each sample's crops as one row (1, …, patches), the crops "
                         f"joined along the last dimension: give them as it does")
    return parts


class PackingCollator:
    """A ``transformers`` data collator (``Trainer(data_collator=PackingCollator(model))``) that packs each batch of
    samples into one padding-free row with :func:`pack`."""

    def __init__(self, model: nn.Module, *, return_flash_attn_kwargs: bool = False, label_pad: int = -100):
        self.model = model
        self.return_flash_attn_kwargs = return_flash_attn_kwargs
        self.label_pad = label_pad

    def __call__(self, features: Sequence[Mapping[str, Any]], return_tensors: Optional[str] = None) -> dict:
        if return_tensors not in (None, "pt"):
            raise ValueError(f"PackingCollator: return_tensors={return_tensors!r}; it returns PyTorch tensors ('pt')")
        return pack(self.model, features, return_flash_attn_kwargs=self.return_flash_attn_kwargs,
                    label_pad=self.label_pad)
