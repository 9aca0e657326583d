"""GLM-Image (``glm_image``): an autoregressive image generator whose prompt plans the positions of the image it
generates.

Prompt positions: transformers' ``GlmImageModel.get_rope_index`` finds images by their ``<image_start>`` and
``<image_end>`` ids (it takes no ``mm_token_type_ids``): the tokens between a start and the end after it are a
source image, the next row of the sample's ``image_grid_thw`` (split per sample by ``images_per_sample``; without
it every sample reads all rows), placed as a block at ``s`` on ``(s, s + row, s + column)`` with the text after it
from ``s + max(h, w)`` (Qwen's spatial rule, the grid taken as given: no merge). Everything else is text.

Generated positions: the rows left after the source images are the target grids of the image the model generates
after the prompt's last ``<image_start>`` (the processor ends every prompt with it; text-to-image writes two
targets, the large grid and a small preview, image-to-image one). The stock model plans their positions at
prefill: the last row first (the preview), each as the raster of its grid from the place the previous one left
off, then the end marker; it keeps that plan on the model for the decoding steps. ropekit places the same layout
as data: the prompt, then each target grid in that order as an image block of the design, then text, and keeps
the positions still to come with the KV cache (:class:`~ropekit.hf.state.Continuation`), so a cached decoding step
takes the planned position of its token; a forward over a sequence the model generated places its tokens there
too (the stock forward places tokens after an open ``<image_start>`` on the text diagonal, unlike its own
decoding). The family's ``prepare_inputs_for_generation`` drops the position ids ``generate`` carries, so
``generate``'s decoding steps read the cache's plan.

Rotation: Qwen2-VL's chunked ``mrope_section`` (default ``[8, 12, 12]``) over the ``partial_rotary_factor`` part of
the head, pair j on channels j and j + R/2 (``rotate_half``).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from ...layout import Image, Text
from .base import Adapter, partial_rotary_dim


class GlmImage(Adapter):
    model_type = "glm_image"
    native_allocation = "mrope"  # chunked sections, as Qwen2-VL
    default_sections = (8, 12, 12)
    takes_token_types = False
    position_params = frozenset({"images_per_sample"})
    #: with no image grid the stock forward skips get_rope_index and counts every token from the row's first
    #: column, padding included
    counts_padding_without_images = True

    def check(self, inner: nn.Module) -> None:
        if None in self.plan_tokens(inner.config):
            raise ValueError("patch_model: this GLM-Image config lacks image_start_token_id or image_end_token_id; "
                             "its images cannot be found in the prompt")

    def merge_of(self, config: Any) -> int:
        return 1  # get_rope_index places image_grid_thw as given (one token per grid cell)

    def rotary_dim(self, text: nn.Module) -> int:
        return partial_rotary_dim(text)

    def plan_tokens(self, config: Any) -> tuple:
        return getattr(config, "image_start_token_id", None), getattr(config, "image_end_token_id", None)

    def position_arguments(self, given: dict) -> dict:
        grids = given.get("image_grid_thw")
        if grids is not None and bool((torch.as_tensor(grids).reshape(-1, 3)[:, 0] != 1).any()):
            raise ValueError(
                "patched model: glm_image got an image grid of more than one temporal patch (image_grid_thw[:, 0] > "
                "1); GLM-Image's processor writes single-frame grids, and ropekit places those only"
            )
        return given

    def plan_layouts(self, tokens: tuple, input_ids: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                     named: dict, batch: int, length: int) -> list:
        """Per sample, ``(segments, planned)``: the layout of its valid tokens up to where the generated image
        begins (all of them where it plans none), and the image blocks the model generates from there, in the order
        it generates them. ``input_ids`` / ``mask`` on the CPU."""
        start_id, end_id = tokens
        grids = named.get("image_grid_thw")
        counts = [length] * batch if mask is None else mask.sum(-1).tolist()
        if grids is None:
            return [([Text(n)] if n else [], []) for n in counts]
        grids = torch.as_tensor(grids).reshape(-1, 3).cpu()
        per_sample = named.get("images_per_sample")
        if per_sample is not None:
            split = torch.as_tensor(per_sample).reshape(-1).tolist()
            if sum(split) != grids.shape[0] or len(split) != batch:
                raise ValueError(
                    f"patched model: images_per_sample {split} does not split image_grid_thw's {grids.shape[0]} rows "
                    f"over the batch of {batch}; give one count per sample, summing to the rows"
                )
            rows = [r.tolist() for r in torch.split(grids, split)]
        else:  # as the stock model: every sample reads all rows
            rows = [grids.tolist()] * batch
        return [self._sample(b, input_ids[b] if mask is None else input_ids[b][mask[b] != 0], rows[b],
                             start_id, end_id) for b in range(batch)]

    @staticmethod
    def _sample(b: int, ids: torch.Tensor, rows: list, start_id: int, end_id: int) -> tuple:
        n = ids.numel()
        if not rows or not n:
            return ([Text(n)] if n else [], [])
        starts = (ids == start_id).nonzero().squeeze(1).tolist()
        ends = (ids == end_id).nonzero().squeeze(1).tolist()
        if not starts:
            raise ValueError(
                f"patched model: glm_image sample {b} has image_grid_thw rows but no <image_start> token (id "
                f"{start_id}); GLM-Image generates its image after the prompt's last <image_start> (the processor "
                f"ends every prompt with it), which tells ropekit where the planned image begins"
            )
        order = "".join("s" if t == start_id else "e" for t in ids.tolist() if t in (start_id, end_id))
        sources = len(starts) - 1
        if not order[:2 * sources + 1] == "se" * sources + "s":
            raise ValueError(
                f"patched model: glm_image sample {b}: its <image_start> and <image_end> tokens do not alternate "
                f"before the last <image_start> (each source image is one start, its tokens, one end); ropekit "
                f"cannot tell which tokens are an image"
            )
        segs, at = [], 0
        for i, s in enumerate(starts[:-1]):  # the source images, each taking the sample's next row
            if i >= len(rows):  # no row left: the rest is text, as in the stock model
                break
            _, h, w = rows[i]
            if ends[i] - s - 1 != h * w:
                raise ValueError(
                    f"patched model: glm_image sample {b}: source image {i} has {ends[i] - s - 1} tokens but its "
                    f"image_grid_thw row {rows[i]} has {h * w} (the stock model fails on it too)"
                )
            segs += [Text(s + 1 - at), Image(h, w)]
            at = ends[i]
        else:
            last = starts[-1]
            if sources < len(rows):  # rows are left for the image generated after the last start
                targets = rows[sources:]
                closing = ends[sources] if len(ends) > sources else None
                if closing is not None and len(targets) > 1 and closing - last - 1 == targets[0][1] * targets[0][2]:
                    raise ValueError(
                        f"patched model: glm_image sample {b}: its last image is closed after the tokens of "
                        f"image_grid_thw row {targets[0]}, with more rows after it; ropekit cannot tell a source "
                        f"image followed by the grids to generate from the generated image. End the prompt with "
                        f"<image_start>, as the processor does"
                    )
                segs.append(Text(last + 1 - at))
                return segs, [Image(h, w) for _, h, w in reversed(targets)]
        if n > at:
            segs.append(Text(n - at))
        return segs, []
