"""What differs between model families: where the parts sit, their native M-RoPE layout, their video grids.

One adapter per family; a new family (LLaVA, a vision encoder) is one small file that subclasses
:class:`Adapter` and registers itself in :mod:`ropekit.hf.adapters`.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn


def partial_rotary_dim(text: nn.Module) -> int:
    """Rotated channels per head as transformers' default rotary computes them: the config's ``head_dim`` (or
    hidden size / heads) times ``partial_rotary_factor`` from ``rope_parameters``."""
    cfg = text.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    factor = (getattr(cfg, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    return int(head_dim * factor)


def rotate_half_layout(text: nn.Module) -> str:
    """How the text model's attention pairs a head's channels, read off its module's ``rotate_half`` (the function
    its ``apply_rotary_pos_emb`` rotates with, and which its rotary's cos/sin tables are laid out for): ``"half"``
    (channel j with j + R/2, Llama's) or ``"pairs"`` (2j with 2j + 1, Cohere's). A text model without such a
    function, or with another one, is refused: its rotary layout is not known."""
    import sys

    module = sys.modules.get(type(text).__module__)
    rotate = getattr(module, "rotate_half", None)
    probe = torch.arange(1.0, 5.0)
    out = rotate(probe) if callable(rotate) else None
    if out is not None and torch.equal(out, torch.tensor([-3.0, -4.0, 1.0, 2.0])):
        return "half"
    if out is not None and torch.equal(out, torch.tensor([-2.0, 1.0, -4.0, 3.0])):
        return "pairs"
    raise ValueError(
        f"patch_model: the language model {type(text).__name__} rotates q and k in a way ropekit does not know "
        f"(no rotate_half pairing channel j with j + R/2 or 2j with 2j + 1 in {type(text).__module__}); its cos/sin "
        f"tables cannot be replaced"
    )


def split_frames(video_grid_thw: Any) -> Any:
    """One ``(1, h, w)`` grid per frame of each video: families whose processor writes every frame as a block of
    its own (timestamp text between frames) and whose position code places each frame as an image."""
    if video_grid_thw is None:
        return None
    g = torch.as_tensor(video_grid_thw)
    per_frame = torch.repeat_interleave(g, g[:, 0], dim=0)
    per_frame[:, 0] = 1
    return per_frame


class Adapter:
    """A model family's specifics. Subclasses set the class attributes and override what differs."""

    model_type: str = ""
    native_allocation: str = "mrope"  # the frequency layout of a 3-axis design in this family
    default_sections: tuple[int, ...] = (16, 24, 24)  # mrope_section when the config has none
    one_d: bool = False  # the language model takes 1-D position ids (no compute_3d_position_ids to hook)
    #: how the model's cos/sin tables lay frequency pair j over a head's rotated channels: "half" (channels j and
    #: j + R/2, transformers' rotate_half) or "pairs" (channels 2j and 2j + 1, GPT-J style)
    pair_layout: str = "half"
    #: the model hands its attention float32 cos/sin whatever the activations' dtype (it rotates in float32)
    float32_tables: bool = False
    #: the model's rotary returns one complex tensor ``e^{i theta}`` per frequency pair, which its attention
    #: multiplies with channels (2j, 2j + 1) read as complex numbers (Llama 4), not a (cos, sin) pair
    complex_tables: bool = False
    #: input_ids tell video tokens from image tokens (GLM-4V writes video frames with the image token id)
    video_ids_distinct: bool = True
    #: parameters of the multimodal forwards beyond the common ones (what generate may hand on), and of the
    #: decoder layers' forward, that the family adds and the patch hands on unread (MoE routing switches)
    forward_params: frozenset = frozenset()
    layer_params: frozenset = frozenset()
    #: the bare model's forward builds the attention masks itself (from ``position_ids`` where it has no mask), not
    #: the language model (Gemma 3 and PaliGemma: images attend to themselves both ways)
    masks_in_forward: bool = False
    #: what the family's ``prepare_inputs_for_generation`` adds to the position ids ``generate`` carries (PaliGemma
    #: counts from 1 there); the position tensor handed to ``generate`` is lowered by it
    generate_shift: float = 0.0
    #: parameters of the language model's forward that the family adds and the patch hands on unread (Qwen3-VL's
    #: DeepStack visual features)
    text_params: frozenset = frozenset()
    #: parameters of the text model's rotary forward beyond ``x`` and ``position_ids``, each call picking one of
    #: several rotary tables (Gemma 3's ``layer_type``: its sliding-window and global layers use different bases);
    #: such a family also states the tables in :meth:`rope_variants`
    rotary_params: frozenset = frozenset()
    #: families whose text model holds one rotary module per table instead of one module picking its table by
    #: :attr:`rotary_params` (Molmo2's ``rotary_emb`` and ``rotary_emb_unscaled``): ``((attribute, table key), …)``
    #: of the text model, the keys those of :meth:`rope_variants`; empty: the one module ``rotary_emb``
    rotary_modules: tuple = ()
    #: the model's first position on 1-D families (PaliGemma counts from 1): every design's positions are
    #: shifted by it, as the stock model shifts its own
    position_origin: float = 0.0
    #: 1-D families whose stock model numbers a row's tokens from its first column, padding included (its forward
    #: counts token i at i and its generate does the same): every design's positions of a left-padded row are
    #: shifted by the row's leading padding, as the stock model shifts its own (the shift changes no distance)
    counts_padding: bool = False
    #: families whose stock forward counts padding (as :attr:`counts_padding`) only when no image grid is given
    #: (GLM-Image: with grids its position code counts from a row's first valid token)
    counts_padding_without_images: bool = False
    #: the family's ``prepare_inputs_for_generation`` drops the position ids ``generate`` carries (EXAONE 4.5 sets
    #: them to None and lets its forward count): the patch hands the design's on, sliced to the step's tokens
    generate_drops_positions: bool = False
    #: parameters the family's ``compute_3d_position_ids`` / ``get_rope_index`` (and ``generate``'s model kwargs)
    #: take beyond the common ones; :meth:`position_arguments` turns them into the common names or refuses them
    position_params: frozenset = frozenset()
    #: the family's forwards and ``get_rope_index`` take ``mm_token_type_ids`` (token types otherwise come from the
    #: image and video token ids only, and ``generate`` is not handed any)
    takes_token_types: bool = True
    #: the family's ``get_rope_index`` returns integer positions and deltas (Qwen3-Omni's are float32 always); the
    #: patched one returns integers where every position is whole, float32 otherwise
    integer_positions: bool = True

    #: inputs :func:`ropekit.hf.pack` lays out for this family beyond (or otherwise than) the common ones, by name:
    #: ``"last"`` joins the samples' along the last dimension (one NaViT-packed row ``(1, …, patches)``, MiniCPM-V
    #: 4.6's and 4.7's pixels), ``"first"`` stacks them along the first (one row per crop), ``"shared"`` is one value
    #: every sample gives alike (or none gives)
    pack_layout: dict = {}

    #: every merged row of an image or video frame ends with one extra (newline) token, which the family's position
    #: code places as the grid's last column (HY-V4-VL)
    newline_column: bool = False

    @property
    def name(self) -> str:
        return self.model_type

    def parts(self, model: nn.Module) -> tuple[Optional[nn.Module], nn.Module, nn.Module]:
        """(generation wrapper or None, bare multimodal model, text model) of ``model``."""
        top, inner = (model, model.model) if hasattr(model, "lm_head") and hasattr(model, "model") else (None, model)
        return top, inner, getattr(inner, "language_model", None)

    def check(self, inner: nn.Module) -> None:
        """Refuse, at patch time, a model whose layout this family's adapter cannot place."""

    #: every native layout this family's model has had across the tested transformers releases (empty: only
    #: :attr:`native_allocation`); a restored checkpoint keeps the one it was patched with (Cohere Compass)
    native_layouts: tuple = ()

    def check_layout(self, native: str, tables: dict) -> None:
        """Refuse rope tables (``{table key: rope parameters}``) that the native layout ``native`` cannot build."""

    def check_packed(self, config: Any, row: dict) -> None:
        """Refuse a packed row (:func:`ropekit.hf.pack`'s output) whose joined vision inputs the model, given a bare
        model's ``config``, would not encode as it encodes each sample alone."""

    def stock_design(self) -> tuple[str, dict]:
        """(design, options) of the family's stock-equivalent patch, the one that gives the stock model's positions
        and tables: ``vanilla`` on the 1-D families, ``mrope`` with the spatial continuation on the 3-axis ones."""
        return ("vanilla", {}) if self.one_d else ("mrope", {"continuation": "spatial"})

    def rope_variants(self, text: nn.Module) -> Optional[tuple[dict[str, dict], list[str]]]:
        """Families whose text model rotates its layers with different rope parameters (:attr:`rotary_params`):
        ``({key: that table's rope parameters}, each decoder layer's key)``; None when one table serves every layer."""
        return None

    def rotary_dim(self, text: nn.Module) -> int:
        """Channels per head the model rotates (the head dim, less under partial rotary)."""
        return int(text.layers[0].self_attn.head_dim)

    def table_dim(self, text: nn.Module, key: Optional[str]) -> int:
        """Channels per head the layers of rotary table ``key`` rotate (:meth:`rope_variants`; None: the one table),
        :meth:`rotary_dim` unless the family's layer types differ in head size (Gemma 4)."""
        return self.rotary_dim(text)

    def table_layout(self, text: nn.Module) -> str:
        """:attr:`pair_layout` of this model's text model (a family whose text model may vary overrides it)."""
        return self.pair_layout

    def merge_of(self, config: Any) -> int:
        """:meth:`merge` for a bare model's ``config`` (a family may keep its merge outside the vision config)."""
        return self.merge(getattr(config, "vision_config", None))

    def markers(self, config: Any) -> Optional[tuple[int, ...]]:
        """The ids of the marker tokens a family's position code places off the text diagonal, for a bare model's
        ``config`` (MiniCPM-V 4.7: ``<image>``, ``</image>``, ``<slice>``, ``</slice>``, newline), or None. With
        markers the prompt is placed per sample from its layout read off the ids (:mod:`ropekit.hf.state`)."""
        return None

    def plan_tokens(self, config: Any) -> Optional[tuple]:
        """Families whose prompt plans the positions of what the model generates after it (GLM-Image: the image
        after the prompt's last ``<image_start>``): the ids :meth:`plan_layouts` reads the prompt by, for a bare
        model's ``config``; None for the other families."""
        return None

    def plan_layouts(self, tokens: tuple, input_ids: Optional[torch.Tensor], mask: Optional[torch.Tensor],
                     named: dict, batch: int, length: int) -> list:
        """Families with :meth:`plan_tokens`: per sample, ``(segments, planned)``, the layout segments of its valid
        tokens up to where the generated part begins (all of them where it plans none) and the segments the model
        generates from there, read off ``input_ids`` (CPU, ``(B, L)``, or None), ``mask`` (CPU 0/1 or None) and the
        call's position arguments ``named`` (:meth:`position_arguments`)."""
        raise NotImplementedError

    def merge(self, vision_config: Any) -> int:
        """Patches merged per token side (the grid given to the design is divided by this)."""
        return int(getattr(vision_config, "spatial_merge_size", 2))

    def sections(self, rope: dict, half: int) -> list[int]:
        """The model's ``mrope_section`` as ropekit sections (summing to ``half`` frequency pairs).

        The chunked families (Qwen2-VL's rule, which GLM-4V, PaddleOCR-VL and Qwen2.5-Omni share) split the pairs
        into the listed chunks and turn chunk i with axis i mod 3. A list of fewer than three chunks leaves the
        last axes without pairs (GLM-4.5V's ``[2, 2]``: time and height, no width), zero sections here. A list of
        more than three gives an axis several runs of pairs, which three sections cannot say: refused."""
        given = list(rope.get("mrope_section") or self.default_sections)
        if len(given) > 3:
            raise ValueError(
                f"patch_model: {self.model_type} `mrope_section` {given} has {len(given)} chunks; the model turns "
                f"chunk i with axis i mod 3, so some axis gets several separate runs of frequency pairs, which "
                f"ropekit's sections (one run per axis) cannot express. Pass `sections=` (pairs per axis) to use "
                f"another split, knowing it is not the model's"
            )
        return given + [0] * (3 - len(given))

    def tokens_per_second(self, vision_config: Any) -> Optional[float]:
        """Temporal positions per second of video, when the family scales video time (else None)."""
        return None

    def time_rate(self, config: Any) -> Optional[float]:
        """Temporal positions per second of video for a bare model's ``config`` (:meth:`tokens_per_second` of its
        vision config unless the family keeps the rate elsewhere)."""
        return self.tokens_per_second(getattr(config, "vision_config", None))

    def position_arguments(self, given: dict) -> dict:
        """A position call's arguments (by name) in the common names the hooks read: ``image_grid_thw``,
        ``video_grid_thw``, ``second_per_grid_ts``, ``mm_token_type_ids`` and the rest as given. A family with
        :attr:`position_params` renames its own, and refuses those it cannot honour with a ValueError."""
        return given

    def interleave(self, config: Any) -> Optional[tuple]:
        """``(order, chunk)`` of the family's video-with-audio block (``VideoAudio``) for a bare model's
        ``config``, or None where the family has none (then audio tokens are never typed apart)."""
        return None

    def temporal_merge(self, vision_config: Any) -> int:
        """Video grid steps merged into one token step (the grid's ``t`` given to the design is divided by this)."""
        return 1

    def video_grids(self, video_grid_thw: Any, temporal_merge: int = 1) -> Any:
        """The video grids ropekit places (a family may split a video into per-frame grids); ``t`` divided by
        ``temporal_merge`` (:meth:`temporal_merge`), as the model's position code divides it."""
        if video_grid_thw is None or temporal_merge == 1:
            return video_grid_thw
        g = torch.as_tensor(video_grid_thw).clone()
        g[:, 0] //= temporal_merge
        return g

    def placed_grids(self, image_grid_thw: Any, video_grid_thw: Any, merge: int, temporal_merge: int = 1
                     ) -> tuple[Any, Any]:
        """The image and video patch grids ropekit places: :meth:`video_grids` of the videos, and, where every
        merged row ends in a newline token (:attr:`newline_column`), each grid one merged column wider (the
        newline placed as the grid's last column)."""
        videos = self.video_grids(video_grid_thw, temporal_merge)
        if not self.newline_column:
            return image_grid_thw, videos
        out = []
        for g in (image_grid_thw, videos):
            if g is not None:
                g = torch.as_tensor(g).clone()
                g[:, 2] += merge
            out.append(g)
        return out[0], out[1]

    def video_tokens(self, video_grid_thw: torch.Tensor, merge: int, temporal_merge: int = 1) -> torch.Tensor:
        """Tokens each video (a row of ``video_grid_thw``) fills in the language model."""
        return video_grid_thw.prod(dim=1) // (merge ** 2) // temporal_merge

    def vision_inputs(self, inner: nn.Module, types: torch.Tensor, kwargs: dict) -> tuple[torch.Tensor, Any, Any]:
        """1-D families: (token types, image_grid_thw, video_grid_thw) of one forward, from the image (1) and
        video (2) tokens ``types`` marks and the model's vision config; ``kwargs`` are the forward's arguments.
        Tokens the model fills with something that is no grid cell come back as text (0)."""
        raise NotImplementedError
