"""Serving ropekit checkpoints of the 1-D families (LLaVA, …) with vLLM (imported by the plugin, never by ropekit's
core).

vLLM's models of these families take one position per token, and its model runner calls a model for per-request
positions (``get_mrope_input_positions``) only when the model's config declares M-RoPE. ropekit places each image
of these families as a grid of its own, with float coordinates under designs such as Circle-RoPE, so the plugin
serves them through the same path as the M-RoPE families (:mod:`.models`):

1. :class:`MRoPEHandles` is registered in vLLM's per-architecture config hooks (``MODELS_CONFIG_MAP``): for a
   checkpoint with a ropekit record it gives vLLM's copy of the config a top-level ``mrope_section``, which is how
   vLLM tells that a model's runner must carry M-RoPE positions. The section only makes vLLM carry rows of position
   handles; no rotary reads it (the plugin replaces every decoder layer's rotary), and the language model's own
   rope parameters, which vLLM's layers are built from, are left as they are. transformers' config of the
   checkpoint, loaded by anyone else, is another object and never sees it;
2. the served class adds vLLM's M-RoPE interface to the family's stock model (:func:`.models._served_class`);
3. :class:`OneDPlacement` places a prompt as the patched transformers model does, from the token ids and what vLLM
   knows of each image (its run of placeholder tokens), on the weightless copy of the transformers model.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import torch

from . import ONE_D
from .models import _Placement

#: the M-RoPE section vLLM's copy of the config gets: vLLM carries ``max(len, 3)`` rows of position handles
HANDLE_SECTION = [1, 1, 1]


class MRoPEHandles:
    """vLLM's per-architecture config hook (the ``VerifyAndUpdateConfig`` protocol of
    ``vllm.model_executor.models.config``): a ropekit checkpoint of a 1-D family is carried as an M-RoPE model."""

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        hf_config = model_config.hf_config
        if getattr(hf_config, "ropekit", None) is None:
            return  # a stock checkpoint: vLLM's own config, untouched
        if getattr(hf_config, "mrope_section", None) not in (None, HANDLE_SECTION):
            raise ValueError(
                f"ropekit vLLM plugin ({model_config.architecture}): the checkpoint's config already has an "
                f"mrope_section ({hf_config.mrope_section!r}), which the plugin sets to carry position handles"
            )
        hf_config.mrope_section = list(HANDLE_SECTION)

    @staticmethod
    def verify_and_update_config(vllm_config: Any) -> None:
        return


#: vLLM 0.32's own config hooks of served architectures, which the plugin's hook runs before its own: Gemma 4's
#: picks attention backends for its two head sizes and touches no position setting
CHAINED_HOOKS = ("Gemma4Config",)


def untested_hook(hook: type, name: str) -> type:
    """vLLM's own config ``hook`` of ``name`` where the plugin was not tested with it (another vLLM release): a stock
    checkpoint's config goes to vLLM's hook unchanged (the plugin must never stop vLLM serving stock models); a ropekit
    checkpoint is refused, naming why, instead of serving it through a hook the plugin does not know."""

    class Untested(hook):
        wraps = hook

        @staticmethod
        def verify_and_update_model_config(model_config: Any) -> None:
            if getattr(model_config.hf_config, "ropekit", None) is not None:
                raise ValueError(
                    f"ropekit vLLM plugin ({name}): vLLM has a config hook of its own for this architecture "
                    f"({hook.__name__}), which the plugin was not tested with (this vLLM release is not one it was "
                    f"tested with: see ropekit.serve.vllm.TESTED_VLLM)"
                )
            hook.verify_and_update_model_config(model_config)

    Untested.__name__ = Untested.__qualname__ = f"Untested_{hook.__name__}"
    return Untested


def run_after(hook: type, ours: type) -> type:
    """The config hook ``ours`` run after vLLM's own ``hook`` of the architecture (``wraps`` names it)."""

    class Chained(ours):
        wraps = hook

        @staticmethod
        def verify_and_update_model_config(model_config: Any) -> None:
            hook.verify_and_update_model_config(model_config)
            ours.verify_and_update_model_config(model_config)

        @staticmethod
        def verify_and_update_config(vllm_config: Any) -> None:
            hook.verify_and_update_config(vllm_config)
            ours.verify_and_update_config(vllm_config)

    Chained.__name__ = Chained.__qualname__ = f"{ours.__name__}_{hook.__name__}"
    return Chained


class QianfanOCRHandles(MRoPEHandles):
    """Qianfan-OCR: position handles, and transformers' config of a ropekit checkpoint translated into the one vLLM
    0.32's model and processor of the family read (:func:`qianfan_ocr_remote_config`)."""

    @staticmethod
    def verify_and_update_model_config(model_config: Any) -> None:
        MRoPEHandles.verify_and_update_model_config(model_config)
        if getattr(model_config.hf_config, "ropekit", None) is not None:
            qianfan_ocr_remote_config(model_config)


#: the config hook of a served 1-D architecture where it is more than :class:`MRoPEHandles`
OWN_HOOKS = {"QianfanOCRForConditionalGeneration": QianfanOCRHandles}

#: how vLLM 0.32 turns a Qianfan-OCR image into pixels, whatever the checkpoint's processor says (its InternVL
#: processing, the remote-code release's): bicubic resampling, scaled by 1/255, normalized with ImageNet's mean and std
_INTERNVL_PIXELS = {"do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
                    "do_normalize": True, "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}


def _square(value: Any, name: str, where: str) -> int:
    sides = list(value) if isinstance(value, (list, tuple)) else [value, value]
    if len(sides) != 2 or sides[0] != sides[1]:
        raise ValueError(f"{where}: vision_config.{name} {value!r} is not square, and vLLM 0.32's InternViT tower "
                         f"takes square tiles and patches only")
    return int(sides[0])


def qianfan_ocr_remote_config(model_config: Any) -> None:
    """Give vLLM's copy of a Qianfan-OCR ropekit checkpoint's config the fields of the model's remote-code release,
    which vLLM 0.32's ``QianfanOCRForConditionalGeneration`` (its InternVL chat model) and its processor read, from
    transformers' ``QianfanOCRConfig`` and the checkpoint's image processor (GotOcr2's tiling settings). Settings under
    which vLLM's model or processing would differ from transformers' are refused, naming them."""
    import transformers
    from vllm.transformers_utils.config import get_hf_image_processor_config

    hf = model_config.hf_config
    vision = hf.vision_config
    where = f"ropekit vLLM plugin ({model_config.architecture})"
    size, patch = _square(vision.image_size, "image_size", where), _square(vision.patch_size, "patch_size", where)
    differ = {
        "vision_feature_layer": (hf.vision_feature_layer, -1, "vLLM's tower then ends at that layer, untested"),
        "vision_feature_select_strategy": (hf.vision_feature_select_strategy, "default",
                                           "vLLM's model always drops the class token"),
        "projector_hidden_act": (hf.projector_hidden_act, "gelu", "vLLM's projector is built with nn.GELU()"),
        "vision_config.use_mean_pooling": (getattr(vision, "use_mean_pooling", True), True,
                                           "transformers then ends the tower with a LayerNorm vLLM's tower has not"),
    }
    for name, (got, served, why) in differ.items():
        if got != served:
            raise ValueError(f"{where}: {name}={got!r} is not served ({why}); served: {served!r}")
    processor = getattr(model_config, "hf_image_processor_config", None)  # vLLM read it before its config hooks
    if processor is None:
        processor = get_hf_image_processor_config(model_config.model, hf_token=model_config.hf_token,
                                                  revision=model_config.revision)
    processor = dict(processor or {})
    processor = processor.get("image_processor", processor)  # a processor_config.json nests it
    defaults = transformers.GotOcr2ImageProcessorPil  # the processor transformers gives qianfan_ocr checkpoints
    setting = {key: processor.get(key, getattr(defaults, key, None)) for key in (
        *_INTERNVL_PIXELS, "size", "crop_to_patches", "min_patches", "max_patches")}
    for key, want in _INTERNVL_PIXELS.items():
        got = setting[key]
        same = (list(got) == want) if isinstance(want, list) and got is not None else got == want
        if not same:
            raise ValueError(
                f"{where}: the checkpoint's image processor has {key}={got!r}, where vLLM 0.32's processing of this "
                f"family applies {want!r} whatever the processor says, so vLLM's pixels would not be the processor's"
            )
    tile = dict(setting["size"] or {})
    if tile != {"height": size, "width": size}:
        raise ValueError(
            f"{where}: the checkpoint's image processor makes tiles of {tile}, and vLLM 0.32 tiles images of this "
            f"family at the vision tower's image_size ({size} x {size})"
        )
    # vLLM's tiling is the remote-code release's, transformers' GotOcr2 tiling with the same settings: the same grid
    # of tiles for an image, and a thumbnail after the tiles of an image of several
    hf.min_dynamic_patch = int(setting["min_patches"])
    hf.max_dynamic_patch = int(setting["max_patches"])
    hf.dynamic_image_size = bool(setting["crop_to_patches"])
    hf.use_thumbnail = True
    hf.select_layer = -1
    hf.ps_version = "v2"  # transformers' pixel shuffle: the remote-code release's second version
    hf.force_image_size = None
    vision.image_size, vision.patch_size = size, patch
    vision.qkv_bias = bool(vision.attention_bias)
    vision.qk_normalization = bool(vision.use_qk_norm)
    vision.initializer_factor = 1.0  # scales the layer-scale weights as vLLM builds them, before the checkpoint's load


def transformers_form(hf_config: Any) -> Any:
    """A copy of a Qianfan-OCR config given the remote-code fields, as transformers' config holds it (square sizes
    as pairs), for the placement's transformers model."""
    import copy

    out = copy.deepcopy(hf_config)
    vision = out.vision_config
    for name in ("image_size", "patch_size"):
        value = getattr(vision, name)
        if not isinstance(value, (list, tuple)):
            setattr(vision, name, (value, value))
    return out


def register_config_hooks(names: list[str]) -> None:
    """Put :class:`MRoPEHandles` (or the architecture's :data:`OWN_HOOKS`) in vLLM's config hooks under each of
    ``names``, after vLLM's own where the plugin was tested with it (:data:`CHAINED_HOOKS`); where vLLM has another,
    :func:`untested_hook`."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    for name in names:
        # vLLM's own hook of the architecture; a ropekit checkpoint names it with the prefix, which vLLM does not know
        hook = MODELS_CONFIG_MAP.get(_unprefixed(name))
        if isinstance(hook, type) and (issubclass(hook, MRoPEHandles) or hook.__name__.startswith("Untested_")):  # registered before (vLLM loads plugins in
            hook = getattr(hook, "wraps", None)  # every process, and may call them again)
        if hook is None:
            MODELS_CONFIG_MAP[name] = OWN_HOOKS.get(_unprefixed(name), MRoPEHandles)
        elif hook.__name__ in CHAINED_HOOKS:
            MODELS_CONFIG_MAP[name] = run_after(hook, MRoPEHandles)
        else:  # not a hook of the tested release: vLLM's own for a stock checkpoint, a ropekit one refused
            MODELS_CONFIG_MAP[name] = untested_hook(hook, name)


class OneDPlacement(_Placement):
    """The patch of a 1-D family's ropekit checkpoint; places a prompt from its token ids and image runs."""

    #: modalities the placement serves
    modalities: tuple = ("image",)
    #: modalities vLLM's model takes that the placement does not serve -> why (refused at load unless their limit
    #: per prompt is 0)
    unserved: dict = {}
    #: what the family's adapter reads of each image besides its tokens: the names of vLLM's per-image fields
    #: (kept with the request on the CPU, also when the prefix cache covers the image), stacked under the same name
    fields: tuple = ()

    def __init__(self, arch: str, hf_config: Any):
        super().__init__(arch, hf_config)
        self.arch = arch

    @staticmethod
    def check_engine(arch: str, vllm_config: Any) -> None:
        """Refuse, naming the fix, an engine setting under which vLLM's model of the family misreads its inputs."""

    def place(self, input_tokens: list[int], mm_features: list):
        from ...hf import hooks

        where = f"ropekit vLLM plugin ({self.arch})"
        items = {"image": [], "video": []}
        fields = {name: [] for name in self.fields}
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            if f.modality not in self.modalities:
                raise ValueError(f"{where}: the {f.modality!r} modality is not served")
            items[f.modality].append(f.mm_position)
            if f.modality == "image":
                for name, value in self.image_fields(f, where).items():
                    fields[name].append(value)
        ids = torch.tensor([input_tokens], dtype=torch.long)
        for modality, runs in items.items():
            self._check_runs(ids[0], modality, runs, where)
        given = dict(input_ids=ids)
        if items["image"]:
            # the family's adapter takes image tokens as images when the forward is given images; which pixels
            # does not matter to the placement (each image's grid comes from the vision config and the fields
            # above), so none are made
            given["pixel_values"] = self.pixels(len(items["image"]))
            given.update({name: self.stack(name, values) for name, values in fields.items()})
        if items["video"]:
            given["pixel_values_videos"] = self.video_pixels(items["video"], where)
        pos, cont = hooks.placement(self.inner, self.state, given)
        return pos[1:, 0].float().cpu().numpy(), cont.start[:, 0].float().cpu().numpy()

    def stack(self, name: str, values: list) -> torch.Tensor:
        """The per-image ``fields`` values of a prompt as the one tensor the adapter reads under ``name``."""
        return torch.stack(values)

    @classmethod
    def unserved_inputs(cls, hf_config: Any) -> dict:
        """:attr:`unserved` for a checkpoint of config ``hf_config``."""
        return cls.unserved

    def pixels(self, count: int) -> torch.Tensor:
        """A stand-in for the pixels of ``count`` images (on the meta device: nothing is allocated)."""
        return torch.empty((count, 0), device="meta")

    def video_pixels(self, runs: list, where: str) -> torch.Tensor:
        """A stand-in for the frames of the videos whose placeholders are ``runs`` (families that serve videos)."""
        raise ValueError(f"{where}: the 'video' modality is not served")

    def image_fields(self, feature: Any, where: str) -> dict:
        """What the adapter reads of one image (``fields``), from vLLM's multimodal feature of it."""
        out = {}
        for name in self.fields:
            value = None if feature.data is None else feature.data.get(name)
            if value is None:
                raise ValueError(f"{where}: vLLM handed no {name!r} for an image, which the placement reads")
            out[name] = torch.as_tensor(value.data)
        return out

    def _check_runs(self, ids: torch.Tensor, modality: str, runs: list, where: str) -> None:
        """The image (video) tokens of the prompt are exactly the runs vLLM fills with image (video) features (the
        placement reads them off the token ids, vLLM embeds them at its placeholder ranges)."""
        token = self.state.image_token_id if modality == "image" else self.state.video_token_id
        if token is None:
            if runs:
                raise ValueError(f"{where}: the {modality!r} modality is not served")
            return
        embedded = torch.zeros_like(ids, dtype=torch.bool)
        for r in runs:
            run = torch.ones(r.length, dtype=torch.bool)
            if r.is_embed is not None:
                run = torch.as_tensor(r.is_embed, dtype=torch.bool)
            embedded[r.offset:r.offset + r.length] = run
        tokens = ids == int(token)
        if not torch.equal(tokens, embedded):
            raise ValueError(
                f"{where}: the prompt holds {int(tokens.sum())} {modality} tokens (id {int(token)}) but vLLM fills "
                f"{int(embedded.sum())} positions with {modality} features, not the same ones; the patch places them "
                f"by their tokens, so it cannot place this prompt"
            )


class Serving:
    """What vLLM's model of a served 1-D family adds before its own ``__init__`` and ``load_weights``.

    Inputs the placement does not serve (EXAONE 4.5's and Gemma 4's videos) are refused at load unless vLLM is told
    to take none.
    Weights: transformers 5 builds a LLaVA-style model's CLIP or SigLIP tower without the ``vision_model`` level and
    saves its weights as ``vision_tower.embeddings…``, where vLLM's tower (as the checkpoints saved by transformers 4)
    has ``vision_tower.vision_model.embeddings…``; every ropekit checkpoint is saved by transformers 5."""

    def __init__(self, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any):
        arch = type(self).__name__
        mm = vllm_config.model_config.multimodal_config
        placement(_unprefixed(arch)).check_engine(arch, vllm_config)
        unserved = placement(_unprefixed(arch)).unserved_inputs(getattr(vllm_config.model_config, "hf_config", None))
        for modality, why in unserved.items():
            if mm is not None and mm.get_limit_per_prompt(modality) > 0:
                raise ValueError(
                    f"ropekit vLLM plugin ({arch}): {why}, so a prompt holding one would be refused mid-serving; "
                    f"start vLLM with limit_mm_per_prompt={{{modality!r}: 0}} to serve this checkpoint's other inputs"
                )
        super().__init__(*args, vllm_config=vllm_config, prefix=prefix, **kwargs)

    def load_weights(self, weights):
        tower = getattr(self, "vision_tower", None)
        if tower is None or not hasattr(tower, "vision_model"):
            return super().load_weights(weights)

        def renamed():
            for name, tensor in weights:
                for lead in ("vision_tower.", "model.vision_tower."):
                    rest = name[len(lead):]
                    if name.startswith(lead) and not rest.startswith("vision_model."):
                        name = lead + "vision_model." + rest
                        break
                yield name, tensor

        return super().load_weights(renamed())


class LlavaNextPlacement(OneDPlacement):
    """LLaVA-NeXT: an image's tiles, and so its token grid, follow from its size."""

    fields = ("image_sizes",)


class Mistral3Placement(OneDPlacement):
    """Mistral 3: an image is ``rows`` rows of ``cols`` image tokens, each row ended by ``[IMG_BREAK]`` (the last by
    ``[IMG_END]``). vLLM keeps no image size with the request, but its placeholder of the image marks which tokens
    it embeds, which is the grid: the adapter is handed the size of that grid in pixels."""

    fields = ("image_sizes",)

    def image_fields(self, feature: Any, where: str) -> dict:
        r = feature.mm_position
        embed = (torch.ones(r.length, dtype=torch.bool) if r.is_embed is None
                 else torch.as_tensor(r.is_embed, dtype=torch.bool).reshape(-1))
        rows = int((~embed).sum())
        cols = r.length // rows - 1 if rows else 0
        grid = torch.ones(rows, cols + 1, dtype=torch.bool) if cols > 0 else None
        if grid is None or r.length != rows * (cols + 1) or not torch.equal(embed, grid.index_fill_(1, torch.tensor(
                [cols]), False).reshape(-1)):
            raise ValueError(
                f"{where}: an image's {r.length} placeholder tokens are not rows of image tokens each ended by one "
                f"other token ([IMG_BREAK], [IMG_END]), as the family's processor writes them"
            )
        step = self.state.adapter.token_pixels(self.inner.config)
        return {"image_sizes": torch.tensor([rows * step, cols * step])}


class Idefics3Placement(OneDPlacement):
    """Idefics3, and SmolVLM (vLLM's SmolVLM is its Idefics3 model with SmolVLM's processor): the adapter checks that
    the tiles are of the vision config's size (as the processor makes them and vLLM hands them to the tower), so the
    stand-in tiles have that size."""

    def text_model(self, model: Any) -> Any:
        return model.model.text_model  # vLLM's Idefics3 keeps its Llama decoder there

    def pixels(self, count: int) -> torch.Tensor:
        size = int(self.inner.config.vision_config.image_size)
        return torch.empty((count, 1, 3, size, size), device="meta")


class LlavaOnevisionPlacement(LlavaNextPlacement):
    """LLaVA-OneVision: LLaVA-NeXT's tiles, shrunk past the config's ``anyres_max``. vLLM tiles every image of a
    prompt (as transformers' processor does when it is handed the images as one list), so the adapter is handed no
    ``batch_num_images`` and tiles every image too."""

    modalities = ("image", "video")

    def video_pixels(self, runs: list, where: str) -> torch.Tensor:
        """A video is ``frames × p × p`` pooled tokens and one newline token; vLLM keeps no frame count, so it is read
        off the placeholder's length."""
        adapter, config = self.state.adapter, self.inner.config
        p = adapter.pooled_side(config, adapter.patch_side(config, config.vision_feature_select_strategy))
        frames = [(r.length - adapter.video_newline) // (p * p) for r in runs]
        if len(set(frames)) != 1 or any((r.length - adapter.video_newline) % (p * p) for r in runs):
            raise ValueError(
                f"{where}: the prompt's video placeholders ({[r.length for r in runs]} tokens) are not videos of one "
                f"length in whole frames of {p}x{p} pooled patches and a newline token"
            )
        return torch.empty((len(runs), frames[0], 3, 1, 1), device="meta")


class LlavaNextVideoPlacement(LlavaNextPlacement):
    """LLaVA-NeXT-Video, whose vLLM model takes videos only: a video is one block of ``frames × p × p`` tokens (``p``
    the frame's patch grid after the model's spatial pooling). vLLM keeps no frame count with the request, but the
    video's placeholder holds ``frames · p²`` tokens, so the stand-in frames are that many."""

    modalities = ("video",)

    def video_pixels(self, runs: list, where: str) -> torch.Tensor:
        adapter, config = self.state.adapter, self.inner.config
        p = adapter.pooled_side(config, adapter.patch_side(config, config.vision_feature_select_strategy))
        frames = {r.length // (p * p) for r in runs}
        if len(runs) != 1 or any(r.length % (p * p) for r in runs):
            raise ValueError(
                f"{where}: a prompt's video placeholders ({[r.length for r in runs]} tokens) are not one video of "
                f"whole frames of {p}x{p} pooled patches"
            )
        return torch.empty((1, frames.pop(), 3, 1, 1), device="meta")


class InternVLPlacement(OneDPlacement):
    """InternVL (transformers' format, vLLM's InternS1 model): every tile, thumbnail and video frame a grid of its own.

    vLLM 0.32 writes a video as transformers' processor does (``Frame1: <img>…</img>``, one line per frame, the
    frame's ``image_seq_length`` tokens between the tags) but writes the frame's tokens with the ``<video>`` token
    where the processor writes the image context token; vLLM fills exactly those positions with the frame's
    features (its tower's, as for a tile), which replace whatever id they hold. The prompt the model runs is
    therefore the processor's with other ids at feature positions only: the placement maps them to the image token
    and places each frame as a tile, as the patched transformers model places a video's frames."""

    modalities = ("image", "video")

    @staticmethod
    def check_engine(arch: str, vllm_config: Any) -> None:
        """vLLM 0.32 makes a video's frames with the checkpoint's video processor at the image processor's ``size``
        (it overrides the video processor's): a checkpoint whose two sizes differ would see other frames in vLLM than
        in transformers, so it is refused unless vLLM takes no videos."""
        mm = vllm_config.model_config.multimodal_config
        if mm is None or mm.get_limit_per_prompt("video") == 0:
            return
        from transformers import AutoImageProcessor, AutoVideoProcessor

        model = vllm_config.model_config
        where = dict(revision=getattr(model, "revision", None))
        image = AutoImageProcessor.from_pretrained(model.model, **where).size
        video = AutoVideoProcessor.from_pretrained(model.model, **where).size
        if dict(image) != dict(video):
            raise ValueError(
                f"ropekit vLLM plugin ({arch}): the checkpoint's video processor makes frames of size {dict(video)}, "
                f"and vLLM 0.32 makes this family's frames at the image processor's size {dict(image)}, so vLLM's "
                f"frames would not be transformers'; start vLLM with limit_mm_per_prompt={{'video': 0}} to serve "
                f"images only, or save the checkpoint with one size"
            )

    def place(self, input_tokens: list[int], mm_features: list):
        tokens = list(input_tokens)
        image = int(self.state.image_token_id)
        as_images = []
        for f in mm_features:
            if f.modality == "video":
                r = f.mm_position
                embed = (torch.ones(r.length, dtype=torch.bool) if r.is_embed is None
                         else torch.as_tensor(r.is_embed, dtype=torch.bool).reshape(-1))
                for i in torch.nonzero(embed).flatten().tolist():
                    tokens[r.offset + i] = image
                f = dataclasses.replace(f, modality="image")
            as_images.append(f)
        return super().place(tokens, as_images)


class QianfanOCRPlacement(OneDPlacement):
    """Qianfan-OCR: placed as InternVL (every tile and the thumbnail a grid of its own), from transformers' form of
    the config vLLM's copy holds with the remote-code fields (:func:`qianfan_ocr_remote_config`). vLLM 0.32's model
    of the family takes images only."""

    def __init__(self, arch: str, hf_config: Any):
        super().__init__(arch, transformers_form(hf_config))


class Llama4Placement(OneDPlacement):
    """Llama 4: transformers' model multiplies channels ``(2j, 2j + 1)`` of q and k, read as a complex number, by
    ``e^(i theta_j)``; vLLM's model permutes the rows of the q and k weights as they load so that pair ``j`` lands on
    channels ``j`` and ``j + D/2`` and rotates rotate-half pairs (the q/k norm, over all channels of a head, and the
    scores, over channels of q and k permuted alike, do not see the permutation). The replaced rotary therefore
    rotates rotate-half pairs with the patch's frequencies. Layers without positions (``no_rope_layers``) have no
    rotary in vLLM's model and keep none; chunked attention reads token indices, not positions, in both."""

    rotary_layout = "half"


class Gemma4Placement(OneDPlacement):
    """Gemma 4: an image's token grid is its patch grid pooled ``k × k``, which the image's token count does not
    tell; vLLM keeps each image's patch coordinates (``pixel_position_ids``, ``(-1, -1)`` on padding) with the
    request, and the adapter reads them as ``image_position_ids``."""

    fields = ("image_position_ids",)
    unserved = {"video": (
        "Gemma 4 videos are not served: vLLM 0.32 writes each frame's timestamp and tokens itself, and the plugin "
        "places images only"
    )}

    @classmethod
    def unserved_inputs(cls, hf_config: Any) -> dict:
        if getattr(hf_config, "audio_config", None) is None:
            return cls.unserved  # vLLM takes no audio for a model without an audio tower
        return {**cls.unserved, "audio": (
            "Gemma 4 audio is not served: the plugin places images only (the patched transformers model places "
            "audio tokens as text, untested in vLLM)"
        )}

    #: how many images' patch grids are remembered (most recently used first; two ints each)
    remembered = 1 << 18

    def __init__(self, arch: str, hf_config: Any):
        text = hf_config.get_text_config()
        if getattr(text, "hidden_size_per_layer_input", None) and getattr(text, "pad_token_id", 0) != 0:
            raise ValueError(
                f"ropekit vLLM plugin ({arch}): the checkpoint's text config has pad_token_id {text.pad_token_id}; "
                f"vLLM 0.32 computes Gemma 4's per-layer inputs of image tokens as token 0's, transformers as the pad "
                f"token's, so they differ unless pad_token_id is 0 (as in Gemma 4's releases), stock checkpoint too"
            )
        super().__init__(arch, hf_config)
        self.grids: OrderedDict = OrderedDict()  # vLLM's identifier of an image -> its (patch rows, patch columns)

    def image_fields(self, feature: Any, where: str) -> dict:
        """The image's patch coordinates. Where the prefix cache covers an image, vLLM drops its data from the request
        (it keeps only fields it marks as kept on the CPU, which these are not), so the grid of each image placed is
        remembered under vLLM's identifier of the image (a hash of its pixels and processing)."""
        value = None if feature.data is None else feature.data.get("pixel_position_ids")
        key = feature.identifier
        if value is not None:
            coords = torch.as_tensor(value.data).reshape(-1, 2)
            coords = coords[(coords != -1).all(-1)]
            if len(coords):
                rows, cols = int(coords[:, 1].max()) + 1, int(coords[:, 0].max()) + 1
                if torch.equal(coords, _row_major(rows, cols)):  # a grid the processor makes (else the adapter refuses)
                    self.grids[key] = (rows, cols)
                    self.grids.move_to_end(key)
                    while len(self.grids) > self.remembered:
                        self.grids.popitem(last=False)
            return {"image_position_ids": coords}
        grid = self.grids.get(key)
        if grid is None:
            raise ValueError(
                f"{where}: vLLM handed no 'pixel_position_ids' for an image (it drops them where the prefix cache covers "
                f"the image) and the image is not among the {self.remembered} last placed, so its patch grid, which "
                f"decides its tokens' positions, is unknown"
            )
        self.grids.move_to_end(key)
        return {"image_position_ids": _row_major(*grid)}

    def stack(self, name: str, values: list) -> torch.Tensor:
        """Each image's patch coordinates, padded with ``(-1, -1)`` to the longest."""
        longest = max(len(v) for v in values)
        return torch.stack([torch.cat([v, v.new_full((longest - len(v), 2), -1)]) for v in values])


def _row_major(rows: int, cols: int) -> torch.Tensor:
    """``(x, y)`` of each patch of a ``rows × cols`` grid, row by row (as Gemma 4's processor lists them)."""
    ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return torch.stack([xs.flatten(), ys.flatten()], -1)


class Exaone4_5Placement(OneDPlacement):
    """EXAONE 4.5: an image's token grid is its patch grid ``image_grid_thw`` merged by the tower, which vLLM keeps
    with the request (its model is vLLM's Qwen2.5-VL with EXAONE 4's language model)."""

    fields = ("image_grid_thw",)
    unserved = {"video": (
        "EXAONE 4.5 videos are not served: the plugin does not place a video from vLLM's inputs of this family"
    )}

    @staticmethod
    def check_engine(arch: str, vllm_config: Any) -> None:
        mm = vllm_config.model_config.multimodal_config
        if mm is not None and getattr(mm, "mm_device_do_normalize", False):
            raise ValueError(
                f"ropekit vLLM plugin ({arch}): with mm_device_do_normalize on (vLLM's default for this model) vLLM "
                f"0.32's processor leaves EXAONE 4.5's pixels unnormalized for the model to normalize, and its EXAONE "
                f"4.5 vision tower does not normalize them (the stock checkpoint's images are misread as well); start "
                f"vLLM with mm_device_do_normalize=False"
            )

    def image_fields(self, feature: Any, where: str) -> dict:
        return {name: value.reshape(3).long() for name, value in super().image_fields(feature, where).items()}


class Lfm2VlPlacement(OneDPlacement):
    """LFM2-VL: an image's tiles and thumbnail are grids of their own, each its patch grid (``spatial_shapes``, one row
    per tile, which vLLM keeps with the request on the CPU) pooled by ``downsample_factor``. Only the attention layers
    of vLLM's LFM2 hold a ``self_attn`` and get the replaced rotary; its short-convolution layers take no positions."""

    fields = ("spatial_shapes",)

    def stack(self, name: str, values: list) -> torch.Tensor:
        """Every tile of the prompt's images, in order (as the processor lists them)."""
        return torch.cat([v.reshape(-1, 2) for v in values]).long()


class MiniCPMVPlacement(OneDPlacement):
    """MiniCPM-V 4.6 and 4.7: every crop of a picture (its thumbnail, then its slices) and every video frame's crops
    are grids of their own, each its patch grid (``target_sizes`` in transformers, ``tgt_sizes`` /
    ``video_tgt_sizes`` in vLLM, one row per crop) merged by the config's ``downsample_mode``; the markers around
    them (``<image>``, ``<slice>``, newlines, image ids) are text, or canvas edges under 4.7's ``canvas-mrope``.

    vLLM's models of both already carry M-RoPE positions (their language model is Qwen3.5's), so they need no config
    hook. vLLM 0.32 keeps 4.7's crop sizes with a request where the prefix cache covers a picture, not 4.6's; the
    served class's processor keeps them for a ropekit checkpoint of either (:meth:`finish_class`)."""

    modalities = ("image", "video")
    #: modality -> (vLLM's field of the crops' patch grids, the name the adapter reads them under, its pixels' name)
    SIZES = {"image": ("tgt_sizes", "target_sizes", "pixel_values"),
             "video": ("video_tgt_sizes", "target_sizes_videos", "pixel_values_videos")}
    #: modality -> vLLM's per-item flag of the downsample mode it processed the item with (True: the window merger
    #: runs, ``"16x"``)
    MERGER = {"image": "use_vit_merger", "video": "video_use_vit_merger"}

    def place(self, input_tokens: list[int], mm_features: list):
        from ...hf import hooks

        where = f"ropekit vLLM plugin ({self.arch})"
        config = self.inner.config
        merged = getattr(config, "downsample_mode", "16x") != "4x" and int(getattr(config, "insert_layer_id", -1)) >= 0
        runs = {"image": [], "video": []}
        sizes = {"image": [], "video": []}
        for f in sorted(mm_features, key=lambda f: f.mm_position.offset):
            if f.modality not in self.SIZES:
                raise ValueError(f"{where}: the {f.modality!r} modality is not served")
            field = self.SIZES[f.modality][0]
            value = None if f.data is None else f.data.get(field)
            if value is None:
                raise ValueError(f"{where}: vLLM handed no {field!r} for a {f.modality} (its crops' patch grids, which "
                                 f"decide their tokens' positions)")
            flag = f.data.get(self.MERGER[f.modality])
            if flag is not None and bool(torch.as_tensor(flag.data).reshape(-1)[0]) != merged:
                raise ValueError(
                    f"{where}: vLLM processed {'an image' if f.modality == 'image' else 'a video'} in downsample_mode "
                    f"{'16x' if not merged else '4x'}, the checkpoint's config says {config.downsample_mode!r}; the "
                    f"patch places crops with the config's mode, so requests must not set another one "
                    f"(mm_processor_kwargs downsample_mode)"
                )
            runs[f.modality].append(f.mm_position)
            sizes[f.modality].append(torch.as_tensor(value.data).reshape(-1, 2).long())
        ids = torch.tensor([input_tokens], dtype=torch.long)
        for modality, found in runs.items():
            self._check_runs(ids[0], modality, found, where)
        given = dict(input_ids=ids)
        for modality, (_, name, pixels) in self.SIZES.items():
            if sizes[modality]:
                given[name] = torch.cat(sizes[modality])
                if self.state.adapter.one_d:  # 4.6 takes image (video) tokens as pictures when given pixels; which
                    given[pixels] = torch.empty((1, 0), device="meta")  # ones does not matter to the placement
        pos, cont = hooks.placement(self.inner, self.state, given)
        return pos[1:, 0].float().cpu().numpy(), cont.start[:, 0].float().cpu().numpy()

    @staticmethod
    def finish_class(cls: type) -> type:
        """The served class with vLLM's processor of the family, keeping each picture's crop sizes with the request
        (on the CPU) for a ropekit checkpoint, as vLLM 0.32 does for 4.7's canvas positions: where the prefix cache
        covers a picture, vLLM drops its other data from the request, and the placement reads them."""
        import dataclasses

        from vllm.multimodal.inputs import MultiModalFieldConfig

        factories = cls._processor_factory
        stock = factories.processor

        class KeepCropSizes(stock):
            def _get_mm_fields_config(self, hf_inputs, hf_processor_mm_kwargs):
                fields = dict(super()._get_mm_fields_config(hf_inputs, hf_processor_mm_kwargs))
                if getattr(self.info.get_hf_config(), "ropekit", None) is not None:
                    for field, modality in (("tgt_sizes", "image"), ("video_tgt_sizes", "video")):
                        if field in fields:
                            fields[field] = MultiModalFieldConfig.batched(modality, keep_on_cpu=True)
                return fields

        KeepCropSizes.__name__ = KeepCropSizes.__qualname__ = f"{stock.__name__}KeepingCropSizes"
        cls._processor_factory = dataclasses.replace(factories, processor=KeepCropSizes)
        return cls


class PaliGemmaPlacement(OneDPlacement):
    """PaliGemma and PaliGemma 2: one image per prompt, its patch grid ahead of ``<bos>`` and the prompt (vLLM's
    processor writes it there, as transformers' does); positions count from 1, as in the patched transformers model.

    PaliGemma 2 (a Gemma 2 text model): vLLM 0.32 runs the text model as its ``Gemma2ForCausalLM``, which soft-caps
    the final logits by the config's ``final_logit_softcapping``; transformers' PaliGemma takes its logits from its
    own head, uncapped. The served model of a ropekit checkpoint computes them as transformers does: without that cap
    (:meth:`finish_class`). Attention soft-capping (``attn_logit_softcapping``) is applied by vLLM's Gemma 2 layers
    and by transformers' (eager, flash and flex attention; its SDPA attention leaves it out), and is left as it is.
    A text model of another type is refused: vLLM's PaliGemma runs any text model but Gemma as Gemma 2."""

    #: the text models vLLM 0.32's PaliGemma runs as what they are (anything else it runs as Gemma 2)
    TEXT_MODELS = ("gemma", "gemma2")

    def __init__(self, arch: str, hf_config: Any):
        text = hf_config.get_text_config()
        if getattr(text, "model_type", None) not in self.TEXT_MODELS:
            raise ValueError(
                f"ropekit vLLM plugin ({arch}): the checkpoint's text model is {getattr(text, 'model_type', None)!r}; "
                f"vLLM 0.32's PaliGemma runs any text model other than 'gemma' as Gemma 2 (Gemma2ForCausalLM), so "
                f"only 'gemma' (PaliGemma) and 'gemma2' (PaliGemma 2) are served"
            )
        scale = getattr(hf_config, "logit_scale", 1.0)
        if scale != 1.0:
            raise ValueError(
                f"ropekit vLLM plugin ({arch}): the checkpoint's config sets logit_scale={scale!r}; vLLM 0.32's "
                f"PaliGemma multiplies the logits by it, transformers' PaliGemma ignores it, so vLLM would serve other "
                f"log-probabilities than the model saved; remove logit_scale from config.json (transformers never "
                f"applied it)"
            )
        super().__init__(arch, hf_config)

    @staticmethod
    def check_engine(arch: str, vllm_config: Any) -> None:
        hf_config = getattr(vllm_config.model_config, "hf_config", None)
        if getattr(hf_config, CAUSAL_PREFIX, None) is not True:
            raise ValueError(
                f"ropekit vLLM plugin ({arch}): transformers' PaliGemma, which this checkpoint was saved from, attends "
                f"both ways over its prefix (the image, <bos> and the prompt), while vLLM 0.32's PaliGemma attends "
                f"causally (on GPU backends both ways among the image tokens only), with stock checkpoints as well, so "
                f"vLLM serves a different model than the one trained; to serve it with vLLM's causal attention "
                f"anyway, say so: start vLLM with hf_overrides={{{CAUSAL_PREFIX!r}: True}}"
            )

    @staticmethod
    def finish_class(cls: type) -> type:
        """The served class computing a ropekit PaliGemma 2's logits as transformers' PaliGemma does: vLLM's Gemma 2
        text model soft-caps them (``final_logit_softcapping``), transformers' PaliGemma does not, so the cap is
        dropped (only for a ropekit checkpoint: the served class builds vLLM's own model for any other)."""

        class Uncapped(cls):
            def __init__(self, *args: Any, vllm_config: Any = None, prefix: str = "", **kwargs: Any):
                super().__init__(*args, vllm_config=vllm_config, prefix=prefix, **kwargs)
                language_model = getattr(self, "language_model", None)
                logits = getattr(language_model, "logits_processor", None)
                if logits is None or not hasattr(logits, "soft_cap"):
                    raise ValueError(
                        f"ropekit vLLM plugin ({type(self).__name__}): this vLLM's PaliGemma keeps no logits processor "
                        f"with a soft cap on its language model, which the plugin expects to find (vLLM 0.32's does)"
                    )
                logits.soft_cap = None  # transformers' PaliGemma applies none (a Gemma text model has none either)

        Uncapped.__name__ = Uncapped.__qualname__ = cls.__name__
        return Uncapped


#: the flag (a key of vLLM's ``hf_overrides``) by which a user accepts vLLM's causal attention over PaliGemma's prefix
CAUSAL_PREFIX = "ropekit_accept_causal_prefix"


def _unprefixed(name: str) -> str:
    from ...hf.auto import ARCH_PREFIX

    return name[len(ARCH_PREFIX):] if name.startswith(ARCH_PREFIX) else name


_PLACEMENTS = {"internvl": InternVLPlacement, "llava_next": LlavaNextPlacement,
               "llava_onevision": LlavaOnevisionPlacement, "mistral3": Mistral3Placement,
               "idefics3": Idefics3Placement, "smolvlm": Idefics3Placement, "llava_next_video": LlavaNextVideoPlacement,
               "llama4": Llama4Placement, "gemma4": Gemma4Placement,
               "exaone4_5": Exaone4_5Placement, "lfm2_vl": Lfm2VlPlacement,
               "qianfan_ocr": QianfanOCRPlacement,
               "minicpmv4_6": MiniCPMVPlacement, "minicpmv4_7": MiniCPMVPlacement,
               "paligemma": PaliGemmaPlacement}


from .step3 import Step3Handles, Step3p7Placement  # noqa: E402  (it builds on the classes above)

_PLACEMENTS["step3p7"] = Step3p7Placement
OWN_HOOKS["Step3p7ForConditionalGeneration"] = Step3Handles


def placement(arch: str) -> type:
    """The placement class of a served 1-D architecture."""
    return _PLACEMENTS.get(ONE_D[arch], OneDPlacement)
