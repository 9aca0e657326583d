"""Molmo2 (``molmo2``): a ViT whose patch features are pooled into image tokens by a cross-attention adapter, in a
1-D language model whose layers split between a scaled and an unscaled rotary table.

Images: the processor writes each image as two views, a low-resolution one (the whole image resized) and a
high-resolution one (the crops stitched), in that order: ``image_grids`` holds ``(low rows, low cols, high rows, high
cols)`` per image, and the model fills ``low rows · low cols + high rows · high cols`` image tokens, row by row, low
view first. Each view is ``<low_res_im_start>`` (or ``<im_start>``), its rows, ``<im_end>``; with the processor's
column tokens on (its default for images) every row of a view ends in ``<im_col>``. Videos: ``video_grids`` holds
``(frames, rows, cols)``; each frame is a view of its own (``<frame_start>``, its rows, ``<frame_end>``, timestamp
text between frames), without column tokens by default.

ropekit places every view (and every frame) as one grid; where its rows end in a column token, that token is the
grid's last column (as Mistral 3's row ends): placed as text it would cut the view into one-row blocks. Whether a
view has column tokens is read off the sequence (the token after each row of image tokens); a one-row view, where
the token after the row may be the view's end token, is told by its id (``image_end_token_id``,
``frame_end_token_id``), so it needs ``input_ids``. The view and frame begin/end tokens are text. Images and videos
share the image token id, so a forward's tokens are images or video frames by the pixels (or encoded features) it
is given. The grids come from ``image_grids`` / ``video_grids``: a forward given images or videos needs them;
``generate`` places the prompt before it encodes the images, from the arguments it was given.

Attention: the forward lets every image (or frame) token attend to every other one both ways (a block mask from
``mm_token_type_ids``). The patch hands ``mm_token_type_ids`` on unread and changes no mask.

Rotation: the layers listed in ``rope_scaling_layers`` rotate with ``rope_parameters`` (its scaling included), the
others with the same base unscaled; the text model holds one rotary module for each (``rotary_emb``,
``rotary_emb_unscaled``). The patch builds every design's tables for both, at the same positions, each layer
rotating with its own.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .llava import Llava, encoded_images, place_items


class Molmo2(Llava):
    model_type = "molmo2"
    name = "Molmo2"
    forward_params = frozenset({"image_token_pooling", "image_grids", "image_num_crops", "video_token_pooling",
                                "video_grids", "mm_token_type_ids"})
    masks_in_forward = True
    rotary_modules = (("rotary_emb", "scaled"), ("rotary_emb_unscaled", "unscaled"))

    def check(self, inner: nn.Module) -> None:
        text = inner.language_model
        for attr, _ in self.rotary_modules:
            if not isinstance(getattr(text, attr, None), nn.Module):
                raise ValueError(f"patch_model: Molmo2's language model has no rotary module `{attr}`; the patch "
                                 f"knows Molmo2 with a scaled and an unscaled rotary (rotary_emb, rotary_emb_unscaled)")
        self.rope_variants(text)

    def rope_variants(self, text: nn.Module) -> Optional[tuple[dict[str, dict], list[str]]]:
        cfg = text.config
        rope = dict(getattr(cfg, "rope_parameters", None) or {})
        scaled = set(getattr(cfg, "rope_scaling_layers", None) or ())
        if "rope_theta" not in rope:
            raise ValueError(f"patch_model: Molmo2's language model config gives no rope_theta ({rope!r})")
        per_layer = ["scaled" if i in scaled else "unscaled" for i in range(len(text.layers))]
        return {"scaled": rope, "unscaled": {"rope_type": "default", "rope_theta": rope["rope_theta"]}}, per_layer

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        encoded = kwargs.get("mm_encoder_outputs")
        encoded = encoded if isinstance(encoded, dict) else {}
        patches = (types != 0).long()  # images and video frames share the image token id
        if kwargs.get("pixel_values") is not None or encoded_images(kwargs) is not None:
            kind, what, grids = 1, "image", kwargs.get("image_grids")
            if grids is not None:
                g = torch.as_tensor(grids).reshape(-1, 4).tolist()
                views = [[(int(a), int(b)), (int(c), int(d))] for a, b, c, d in g]
        elif kwargs.get("pixel_values_videos") is not None or encoded.get("video") is not None:
            kind, what, grids = 2, "video", kwargs.get("video_grids")
            if grids is not None:
                views = [[(int(r), int(c))] * int(f) for f, r, c in torch.as_tensor(grids).reshape(-1, 3).tolist()]
        else:
            return torch.zeros_like(types), None, None  # image token ids without images are text, as in stock
        if grids is None:
            raise ValueError(
                f"patched Molmo2: {what}s were given without `{what}_grids`; pass the processor's {what}_grids "
                f"(they decide each {what}'s token grids; encoded features carry only the token count)"
            )
        ends = {getattr(inner.config, "image_end_token_id", None), getattr(inner.config, "frame_end_token_id", None)}
        marked, items = _views(patches, views, kwargs.get("input_ids"), ends - {None}, what)
        types, found = place_items(marked * kind, kind, items, what)
        return (types, None, found) if kind == 2 else (types, found, None)


def _views(patches: torch.Tensor, views: list[list[tuple[int, int]]], input_ids: Optional[torch.Tensor],
           ends: set, what: str) -> tuple[torch.Tensor, list[list[tuple[int, int, int]]]]:
    """Mark each view's column tokens (the token after every row, where the view has them) as image tokens.

    ``views``: per image (or video) its views' ``(rows, cols)`` in the order the model fills them. Returns (the 0/1
    marks with the column tokens set, per image its views as ``(1, rows, cols + 1 if columns else cols)`` grids)."""
    t = patches.cpu().clone()
    where = (t == 1).nonzero().tolist()
    ids = None if input_ids is None else input_ids.cpu()
    at, items, length = 0, [], t.shape[1]
    for i, item in enumerate(views):
        grids = []
        for rows, cols in item:
            count = rows * cols
            if count == 0:
                continue
            if at + count > len(where):
                raise _layout_error(what, i, f"the input holds {len(where)} {what} tokens, fewer than its grids fill")
            b, start = where[at]
            run = t[b, start:start + count]
            if rows > 1 and run.numel() == count and bool((run == 1).all()):
                columns = False
            elif rows > 1:
                columns = True
            else:  # one row: the token after it is a column token unless it ends the view
                after = start + cols
                if after >= length or t[b, after] == 1:
                    columns = False
                elif ids is None:
                    raise ValueError(
                        f"patched Molmo2: {what} {i} has a one-row view and no input_ids tell whether the token after "
                        f"its row is a column token (<im_col>) or the view's end; pass input_ids"
                    )
                else:
                    columns = int(ids[b, after]) not in ends
            width = cols + int(columns)
            block = t[b, start:start + rows * width]
            if block.numel() != rows * width:
                raise _layout_error(what, i, "its rows run past the end of the sequence")
            grid = block.view(rows, width)
            if not bool((grid[:, :cols] == 1).all()) or (columns and bool((grid[:, cols] == 1).any())):
                raise _layout_error(what, i, f"its {rows} rows of {cols} tokens are neither contiguous nor each "
                                             f"followed by one column token")
            grid[:, cols:] = 1
            grids.append((1, rows, width))
            at += count
        items.append(grids)
    if at != len(where):
        raise ValueError(
            f"patched Molmo2: the input holds {len(where)} {what} tokens but its {what}_grids fill {at}; give each "
            f"{what} the tokens the model's processor gives it"
        )
    return t.to(patches.device), items


def _layout_error(what: str, index: int, why: str) -> ValueError:
    return ValueError(
        f"patched Molmo2: {what} {index} is not laid out as the processor writes it (each view's rows of tokens, "
        f"each row followed by <im_col> or none): {why}"
    )
