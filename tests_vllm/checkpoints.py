"""Tiny random ropekit checkpoints for the vLLM tests: a patched transformers model saved with a word-level
tokenizer and the family's processor, built from configs (nothing downloaded)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = [f"w{i}" for i in range(60)]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
           "<|video_pad|>", "<image>", "[IMG]", "[IMG_BREAK]", "[IMG_END]", "<img>", "</img>",
           "<IMG_CONTEXT>", "<video>", "<unk>"]
VOCAB = {w: i for i, w in enumerate(WORDS + SPECIAL)}
EOS, START, END, IMAGE, VIDEO = (VOCAB[t] for t in ("<|endoftext|>", "<|vision_start|>", "<|vision_end|>",
                                                    "<|image_pad|>", "<|video_pad|>"))
# GLM-4V: its own markers, and digits for the timestamp after each video frame
GLM_SPECIAL = ["<|endoftext|>", "<|begin_of_image|>", "<|end_of_image|>", "<|image|>", "<|begin_of_video|>",
               "<|end_of_video|>", "<|video|>", "<unk>"]
GLM_VOCAB = {w: i for i, w in enumerate(WORDS + [str(d) for d in range(10)] + GLM_SPECIAL)}
# Idefics3: its markers, and a tag per tile of a split image (at most 2 x 2 tiles below)
IDEFICS_SPECIAL = ["<|endoftext|>", "<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2)] + ["<unk>"]
IDEFICS_VOCAB = {w: i for i, w in enumerate(WORDS + IDEFICS_SPECIAL)}
# Gemma 3: an image is <start_of_image>, its pooled grid of <image_soft_token>, <end_of_image>; newline tokens
# (its processor puts "\n\n" around an image, and vLLM's Gemma 3 joins runs of newline tokens as Gemma's tokenizer does)
GEMMA_SPECIAL = ["<|endoftext|>", "<start_of_image>", "<end_of_image>", "<image_soft_token>", "\n", "\n\n", "\n\n\n",
                 "\n\n\n\n", "<unk>"]
GEMMA_VOCAB = {w: i for i, w in enumerate(WORDS + GEMMA_SPECIAL)}
# Gemma 4: an image is <|image>, its pooled grid of <|image|>, <image|>; its processor names <|video|>, its config
# names audio tokens (no audio tower here)
GEMMA4_SPECIAL = ["<|endoftext|>", "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>", "<|video|>",
                  "<unk>"]
GEMMA4_VOCAB = {w: i for i, w in enumerate(WORDS + GEMMA4_SPECIAL)}
TEXT = dict(hidden_size=64, intermediate_size=96, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
            vocab_size=80, num_hidden_layers=2, max_position_embeddings=1024, rms_norm_eps=1e-6,
            tie_word_embeddings=False)
SECTIONS = [4, 6, 6]  # head_dim 32: 16 frequency pairs
LLAVA_IMAGE = VOCAB["<image>"]
LLAVA_SIDE = 4  # image tokens per side of a LLaVA image: image_size 56 / patch_size 14
LLAVA_NEXT_PINPOINTS = [[56, 112], [112, 56], [112, 112]]
# LLaVA-OneVision: vLLM 0.32 sizes its encoder cache by the tokens of a 944 x 1153 image, which with 2 x 2 tiles
# are fewer than a square image's
ONEVISION_PINPOINTS = [[56, 112], [112, 56]]


# Llama 4: an image is <|image_start|>, each tile's tokens (<|patch|>) with tile separators, <|image|> and the whole
# image's tokens, <|image_end|>
LLAMA4_SPECIAL = ["<|endoftext|>", "<|image_start|>", "<|image_end|>", "<|image|>", "<|patch|>", "<|tile_x_separator|>",
                  "<|tile_y_separator|>", "<unk>"]
LLAMA4_VOCAB = {w: i for i, w in enumerate(WORDS + LLAMA4_SPECIAL)}


# PaddleOCR-VL: its own markers, the image token named on the tokenizer
PADDLE_SPECIAL = ["<|endoftext|>", "<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>", "<|video_pad|>",
                  "<unk>"]
PADDLE_VOCAB = {w: i for i, w in enumerate(WORDS + PADDLE_SPECIAL)}


# Command A Vision: an image is <|START_OF_IMG|>, per tile (then the thumbnail) its tokens and <|IMG_LINE_BREAK|>,
# <|END_OF_IMG|>
COHERE_SPECIAL = ["<|endoftext|>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>", "<|IMG_LINE_BREAK|>", "<unk>"]
COHERE_VOCAB = {w: i for i, w in enumerate(WORDS + COHERE_SPECIAL)}
# LFM2-VL: an image is <|image_start|>, per tile its marker and tokens, <|img_thumbnail|> and the thumbnail's tokens,
# <|image_end|>
LFM2_SPECIAL = (["<|endoftext|>", "<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"]
                + [f"<|img_row_{r}_col_{c}|>" for r in (1, 2) for c in (1, 2)] + ["<unk>"])
LFM2_VOCAB = {w: i for i, w in enumerate(WORDS + LFM2_SPECIAL)}
# MiniCPM-V 4.6 / 4.7: a picture is [<image_id>N</image_id>] <image>, the thumbnail's <|image_pad|> tokens, </image>,
# then rows of slices (<slice> tokens </slice>) joined by newlines; digits for the image ids
MINICPM_SPECIAL = ["<|endoftext|>", "<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>",
                   "<|image_pad|>", "<|video_pad|>", "\n", "<unk>"]
MINICPM_VOCAB = {w: i for i, w in enumerate(WORDS + [str(d) for d in range(4)] + MINICPM_SPECIAL)}
# PaliGemma: the processor writes an image's tokens, <bos>, the prompt and a newline (vLLM's processor alike)
PALIGEMMA_SPECIAL = ["<|endoftext|>", "<bos>", "<image>", "\n", "<unk>"]
PALIGEMMA_VOCAB = {w: i for i, w in enumerate(WORDS + PALIGEMMA_SPECIAL)}
#: PaliGemma 2's Gemma 2 text model: the sliding layer's window shorter than the test's prompts
PALIGEMMA2_TEXT = dict(sliding_window=24, query_pre_attn_scalar=24)


# ERNIE-4.5-VL: an image is <|IMAGE_START|>, its merged grid of <|IMAGE_PLACEHOLDER|>, <|IMAGE_END|> (videos alike)
ERNIE_SPECIAL = ["<|endoftext|>", "<|IMAGE_START|>", "<|IMAGE_END|>", "<|IMAGE_PLACEHOLDER|>", "<|VIDEO_START|>",
                 "<|VIDEO_END|>", "<|VIDEO_PLACEHOLDER|>", "<unk>"]
ERNIE_VOCAB = {w: i for i, w in enumerate(WORDS + ERNIE_SPECIAL)}

# Step 3.7: an image is its tiles (<patch_start> tokens <patch_end>, <patch_newline> after each row of tiles but the
# last), then its global view (<im_start> tokens <im_end>)
STEP3_SPECIAL = ["<|endoftext|>", "<im_patch>", "<patch_start>", "<patch_end>", "<patch_newline>", "<im_start>",
                 "<im_end>", "<unk>"]
STEP3_VOCAB = {w: i for i, w in enumerate(WORDS + STEP3_SPECIAL)}


# Command A Compass: Qwen3-VL's prompts with its own markers (an image is <|VISION_START|>, its merged grid of
# <|IMAGE_PAD|>, <|VISION_END|>)
COMPASS_SPECIAL = ["<|endoftext|>", "<|VISION_START|>", "<|VISION_END|>", "<|IMAGE_PAD|>", "<|VIDEO_PAD|>", "<unk>"]
COMPASS_VOCAB = {w: i for i, w in enumerate(WORDS + COMPASS_SPECIAL)}
#: Compass's rope table: transformers before 5.21 reads mrope_section as (height, width, time)
COMPASS_ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 6, 4]}  # (h, w, t) before 5.21


# Qwen2.5-Omni: an image is <|vision_bos|>, its merged grid of <|IMAGE|>, <|vision_eos|> (videos alike, <|VIDEO|>); an
# audio is <|audio_bos|>, its <|AUDIO|> tokens, <|audio_eos|>
OMNI_SPECIAL = ["<|endoftext|>", "<|vision_bos|>", "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>",
                "<|audio_eos|>", "<|AUDIO|>", "<unk>"]
OMNI_VOCAB = {w: i for i, w in enumerate(WORDS + OMNI_SPECIAL)}
OMNI_NAMED = dict(image_token="<|IMAGE|>", video_token="<|VIDEO|>", audio_token="<|AUDIO|>",
                  vision_bos_token="<|vision_bos|>", vision_eos_token="<|vision_eos|>",
                  audio_bos_token="<|audio_bos|>", audio_eos_token="<|audio_eos|>")
OMNI_MEL = 8  # mel bins of an audio frame
# Qwen3-Omni: Qwen3-VL's markers (<|vision_start|>, <|image_pad|> / <|video_pad|>, <|vision_end|>); an audio is
# <|audio_start|>, its <|audio_pad|> tokens, <|audio_end|>
OMNI3_SPECIAL = ["<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
                 "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<unk>"]
OMNI3_VOCAB = {w: i for i, w in enumerate(WORDS + OMNI3_SPECIAL)}
OMNI3_NAMED = dict(image_token="<|image_pad|>", video_token="<|video_pad|>", audio_token="<|audio_pad|>",
                   vision_bos_token="<|vision_start|>", vision_eos_token="<|vision_end|>",
                   audio_bos_token="<|audio_start|>", audio_eos_token="<|audio_end|>")


def _tokenizer(vocab=VOCAB, special=SPECIAL, named=None):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>", **({"extra_special_tokens": named} if named else {}))
    fast.add_special_tokens({"additional_special_tokens": special[1:-1]})
    return fast


# Qwen3.5: its tokenizer class (which transformers picks by model type) rebuilds a byte-level BPE from the saved
# vocabulary and merges, so words are spelled: " w" and digits ("w12" is 3 tokens); the special tokens keep VOCAB's ids
QWEN3_5_PIECES = ["\u0120", "w", "\u0120w"] + [str(d) for d in range(10)]
QWEN3_5_VOCAB = {w: i for i, w in enumerate(QWEN3_5_PIECES + WORDS[len(QWEN3_5_PIECES):] + SPECIAL)}


def _qwen3_5_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(QWEN3_5_VOCAB, merges=[("\u0120", "w")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": SPECIAL[1:-1]})
    return fast


def _vision_processors(image_cls, video_cls, patch: int):
    """Qwen2-VL-style image and video processors on ``patch``-pixel patches merged 2 x 2, two frames a temporal
    patch, images up to 64 merged tokens, every given frame kept."""
    size = {"shortest_edge": (2 * patch) ** 2, "longest_edge": (2 * patch) ** 2 * 64}
    return (image_cls(patch_size=patch, merge_size=2, temporal_patch_size=2, size=size),
            video_cls(patch_size=patch, merge_size=2, temporal_patch_size=2, size=size, do_sample_frames=False))


def _ids(family: str) -> dict:
    if family.startswith("glm"):
        names = ("image_token_id", "image_start_token_id", "image_end_token_id", "video_token_id",
                 "video_start_token_id", "video_end_token_id")
        tokens = ("<|image|>", "<|begin_of_image|>", "<|end_of_image|>", "<|video|>", "<|begin_of_video|>",
                  "<|end_of_video|>")
        return {n: GLM_VOCAB[t] for n, t in zip(names, tokens)}
    return dict(image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END)


def eos(family: str) -> int:
    if family == "paddleocr_vl":
        return PADDLE_VOCAB["<|endoftext|>"]
    if family == "cohere2_vision":
        return COHERE_VOCAB["<|endoftext|>"]
    if family == "lfm2_vl":
        return LFM2_VOCAB["<|endoftext|>"]
    if family == "ernie4_5_vl_moe":
        return ERNIE_VOCAB["<|endoftext|>"]
    if family.startswith("minicpmv"):
        return MINICPM_VOCAB["<|endoftext|>"]
    if family.startswith("paligemma"):
        return PALIGEMMA_VOCAB["<|endoftext|>"]
    if family == "step3p7":
        return STEP3_VOCAB["<|endoftext|>"]
    if family.startswith("qwen2_5_omni"):
        return OMNI_VOCAB["<|endoftext|>"]
    if family.startswith("qwen3_omni"):
        return OMNI3_VOCAB["<|endoftext|>"]
    if family.startswith("cohere_compass"):
        return COMPASS_VOCAB["<|endoftext|>"]
    return GLM_VOCAB["<|endoftext|>"] if family.startswith("glm") else EOS


def config(family: str):
    import transformers as tf

    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": SECTIONS}
    if family == "qwen2_vl":
        return tf.Qwen2VLConfig(
            text_config=dict(TEXT, rope_parameters=rope, eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=1, spatial_merge_size=2,
                               patch_size=14, temporal_patch_size=2),
            **_ids(family))
    if family == "qwen2_5_vl":
        return tf.Qwen2_5_VLConfig(
            text_config=dict(TEXT, rope_parameters=rope, eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, tokens_per_second=2, fullatt_block_indexes=[0], patch_size=14,
                               temporal_patch_size=2, window_size=56),
            **_ids(family))
    if family == "qwen3_vl":
        return tf.Qwen3VLConfig(
            text_config=dict(TEXT, rope_parameters=dict(rope, mrope_interleaved=True), eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=16, temporal_patch_size=2,
                               deepstack_visual_indexes=[0], num_position_embeddings=64),
            **_ids(family))
    if family in ("qwen3_5", "qwen3_5_moe"):
        # a linear-attention (gated delta net) layer, then a full-attention one; half of each head rotates (8 pairs,
        # interleaved t 2 : h 3 : w 3 over the rotated pairs); vLLM's CPU kernel takes linear heads of 128 channels
        # (the released ones'); qwen3_5_moe: the same with experts (MOE)
        q35 = dict(rope, mrope_section=[2, 3, 3], mrope_interleaved=True, partial_rotary_factor=0.5)
        text = dict(TEXT, rope_parameters=q35, eos_token_id=EOS, bos_token_id=EOS, pad_token_id=EOS,
                    layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
                    linear_num_key_heads=1, linear_key_head_dim=128, linear_value_head_dim=128,
                    **MOE.get(family, {}))
        cls = tf.Qwen3_5MoeConfig if family == "qwen3_5_moe" else tf.Qwen3_5Config
        return cls(
            text_config=text,
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=16, temporal_patch_size=2,
                               num_position_embeddings=64),
            **_ids(family))
    if family == "glm4v":
        # half of the head rotates (8 pairs, chunked t 2 : h 3 : w 3), adjacent channels paired
        glm = dict(rope, mrope_section=[2, 3, 3], partial_rotary_factor=0.5)
        return tf.Glm4vConfig(
            text_config=dict(TEXT, rope_parameters=glm, eos_token_id=eos(family), pad_token_id=eos(family)),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=14, temporal_patch_size=2, image_size=56),
            **_ids(family))
    if family == "glm_ocr":  # GLM-4.1V's text model and positions, its own vision tower
        glm = dict(rope, mrope_section=[2, 3, 3], partial_rotary_factor=0.5)
        # vLLM sizes the vision merger by the text model's intermediate_size, transformers by 3 * out_hidden_size
        # (equal in the released checkpoint)
        return tf.GlmOcrConfig(
            text_config=dict(TEXT, intermediate_size=3 * 64, rope_parameters=glm, eos_token_id=eos(family),
                             pad_token_id=eos(family)),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=14, temporal_patch_size=2, image_size=56),
            **_ids(family))
    if family == "paddleocr_vl":
        return tf.PaddleOCRVLConfig(
            text_config=dict(TEXT, rope_parameters=rope, eos_token_id=eos(family), bos_token_id=eos(family),
                             pad_token_id=eos(family), use_bias=False),
            vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               patch_size=14, image_size=56, spatial_merge_size=2),
            image_token_id=PADDLE_VOCAB["<|IMAGE_PLACEHOLDER|>"], video_token_id=PADDLE_VOCAB["<|video_pad|>"],
            vision_start_token_id=PADDLE_VOCAB["<|IMAGE_START|>"], vision_end_token_id=PADDLE_VOCAB["<|IMAGE_END|>"])
    if family.startswith("cohere_compass"):
        # Command A Compass: a Cohere 2 decoder (parallel attention and MLP) with a rotary table per layer type, a
        # sliding-window layer (base 1e6) and a full-attention one: base 1e4, or no positions (NoPE) in
        # cohere_compass_nope, as in the released checkpoints; the logits read off the input embeddings (tied), as
        # vLLM's model reads them; Qwen3-VL's vision tower with DeepStack
        full = None if family == "cohere_compass_nope" else dict(COMPASS_ROPE, rope_theta=1e4)
        ids = (COMPASS_VOCAB[t] for t in ("<|IMAGE_PAD|>", "<|VIDEO_PAD|>", "<|VISION_START|>", "<|VISION_END|>"))
        return tf.CohereCompassConfig(
            text_config=dict(TEXT, layer_types=["sliding_attention", "full_attention"], sliding_window=24,
                             rope_parameters={"sliding_attention": COMPASS_ROPE, "full_attention": full},
                             layer_norm_eps=1e-5, tie_word_embeddings=True, eos_token_id=eos(family),
                             bos_token_id=eos(family), pad_token_id=eos(family)),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=16, temporal_patch_size=2,
                               deepstack_visual_indexes=[0], num_position_embeddings=64),
            tie_word_embeddings=True, **dict(zip(("image_token_id", "video_token_id", "vision_start_token_id",
                                                  "vision_end_token_id"), ids)))
    if family.startswith("qwen2_5_omni"):
        # the thinker (qwen2_5_omni_thinker), or the whole model without its talker (qwen2_5_omni: what vLLM 0.32
        # implements); Qwen2.5-VL's vision tower, a Whisper-like audio tower
        v = OMNI_VOCAB
        thinker = tf.Qwen2_5OmniThinkerConfig(
            text_config=dict(TEXT, rope_parameters=rope, eos_token_id=eos(family), bos_token_id=eos(family)),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=14, temporal_patch_size=2, window_size=56,
                               fullatt_block_indexes=[0]),
            audio_config=dict(num_mel_bins=OMNI_MEL, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                              d_model=32, output_dim=64, n_window=8, max_source_positions=64),
            audio_token_index=v["<|AUDIO|>"], image_token_index=v["<|IMAGE|>"], video_token_index=v["<|VIDEO|>"],
            audio_start_token_id=v["<|audio_bos|>"], audio_end_token_id=v["<|audio_eos|>"],
            vision_start_token_id=v["<|vision_bos|>"], vision_end_token_id=v["<|vision_eos|>"])
        if family == "qwen2_5_omni_thinker":
            return thinker
        return tf.Qwen2_5OmniConfig(thinker_config=thinker.to_dict(), enable_audio_output=False)
    if family.startswith("qwen3_omni"):
        # the Qwen3-Omni thinker (qwen3_omni_moe_thinker) or the whole model without its talker (qwen3_omni_moe):
        # Qwen3-VL's vision tower (DeepStack), its own audio tower, a text model with experts (interleaved sections)
        v = OMNI3_VOCAB
        thinker = tf.Qwen3OmniMoeThinkerConfig(
            text_config=dict(TEXT, rope_parameters=dict(rope, mrope_interleaved=True), eos_token_id=eos(family),
                             bos_token_id=eos(family), **MOE["qwen3_vl_moe"]),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=16, temporal_patch_size=2,
                               deepstack_visual_indexes=[0], num_position_embeddings=64),
            audio_config=dict(num_mel_bins=OMNI_MEL, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                              d_model=32, output_dim=64, n_window=50, n_window_infer=100, downsample_hidden_size=8,
                              max_source_positions=200),
            audio_token_id=v["<|audio_pad|>"], image_token_id=v["<|image_pad|>"], video_token_id=v["<|video_pad|>"],
            audio_start_token_id=v["<|audio_start|>"], audio_end_token_id=v["<|audio_end|>"],
            vision_start_token_id=v["<|vision_start|>"], vision_end_token_id=v["<|vision_end|>"])
        if family == "qwen3_omni_moe_thinker":
            return thinker
        return tf.Qwen3OmniMoeConfig(thinker_config=thinker.to_dict(), enable_audio_output=False)
    if family == "qwen3_vl_moe":
        return tf.Qwen3VLMoeConfig(
            text_config=dict(TEXT, rope_parameters=dict(rope, mrope_interleaved=True), eos_token_id=EOS,
                             bos_token_id=EOS, **MOE["qwen3_vl_moe"]),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=16, temporal_patch_size=2,
                               deepstack_visual_indexes=[0], num_position_embeddings=64),
            **_ids(family))
    if family == "glm4v_moe":
        glm = dict(rope, mrope_section=[2, 3, 3], partial_rotary_factor=0.5)
        return tf.Glm4vMoeConfig(
            text_config=dict(TEXT, rope_parameters=glm, eos_token_id=eos(family), pad_token_id=eos(family),
                             **MOE["glm4v_moe"]),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               spatial_merge_size=2, patch_size=14, temporal_patch_size=2, image_size=56),
            **_ids(family))
    if family == "llava":
        return tf.LlavaConfig(
            text_config=dict(TEXT, model_type="llama", eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=32,
                               num_hidden_layers=2, num_attention_heads=2, image_size=14 * LLAVA_SIDE, patch_size=14),
            image_token_id=LLAVA_IMAGE, vision_feature_layer=-2, vision_feature_select_strategy="default")
    if family == "llava_next":  # tiles of 56 x 56 pixels: 2 x 1, 1 x 2 or 2 x 2 of them
        return tf.LlavaNextConfig(
            text_config=dict(TEXT, model_type="llama", eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=32,
                               num_hidden_layers=2, num_attention_heads=2, image_size=14 * LLAVA_SIDE, patch_size=14),
            image_grid_pinpoints=LLAVA_NEXT_PINPOINTS, image_token_id=LLAVA_IMAGE, vision_feature_layer=-2,
            vision_feature_select_strategy="default")
    if family == "mistral3":  # a token per 28 x 28 pixels (14-pixel patches, 2 x 2 merged)
        return tf.Mistral3Config(
            text_config=dict(TEXT, model_type="mistral", eos_token_id=EOS, bos_token_id=EOS, sliding_window=None),
            vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                               num_attention_heads=2, head_dim=16, image_size=112, patch_size=14),
            image_token_id=VOCAB["[IMG]"], spatial_merge_size=2, vision_feature_layer=-1)
    if family == "internvl":  # tiles of 56 x 56 pixels, 4 x 4 patches pixel-shuffled to 2 x 2 tokens
        return tf.InternVLConfig(
            text_config=dict(TEXT, model_type="qwen2", eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=[56, 56], patch_size=[14, 14]),
            image_token_id=VOCAB["<IMG_CONTEXT>"], image_seq_length=4, downsample_ratio=0.5)
    if family in ("idefics3", "smolvlm"):  # tiles of 56 x 56 pixels, 4 x 4 patches pixel-shuffled to 2 x 2 tokens
        cls = tf.SmolVLMConfig if family == "smolvlm" else tf.Idefics3Config
        return cls(
            text_config=dict(TEXT, model_type="llama", eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=56, patch_size=14),
            image_token_id=IDEFICS_VOCAB["<image>"], scale_factor=2)
    if family == "gemma3":  # a sliding-window layer (base 1e4) and a global one (base 1e6, linear scaling)
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
        return tf.Gemma3Config(
            text_config=dict(TEXT, eos_token_id=EOS, bos_token_id=EOS, pad_token_id=EOS, rope_parameters=rope,
                             layer_types=["sliding_attention", "full_attention"], sliding_window=512,
                             query_pre_attn_scalar=32),
            vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=56, patch_size=14),
            mm_tokens_per_image=4, image_token_index=GEMMA_VOCAB["<image_soft_token>"],
            boi_token_index=GEMMA_VOCAB["<start_of_image>"], eoi_token_index=GEMMA_VOCAB["<end_of_image>"])
    if family == "gemma4":  # a sliding layer (head 32, base 1e4), a full-attention one (head 64, proportional RoPE,
        # a quarter of the pairs turning, base 1e6); images as patch grids of 4-pixel patches pooled 2 x 2
        rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}}
        v = GEMMA4_VOCAB
        return tf.Gemma4Config(
            text_config=dict(TEXT, head_dim=32, global_head_dim=64, sliding_window=512, hidden_size_per_layer_input=8,
                             vocab_size_per_layer_input=TEXT["vocab_size"], num_hidden_layers=2,
                             layer_types=["sliding_attention", "full_attention"],
                             rope_parameters=rope, eos_token_id=EOS, bos_token_id=EOS, pad_token_id=0),
            vision_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=2, head_dim=8, patch_size=4, pooling_kernel_size=2,
                               position_embedding_size=64, default_output_length=70),
            audio_config=None, image_token_id=v["<|image|>"], boi_token_id=v["<|image>"], eoi_token_id=v["<image|>"],
            video_token_id=v["<|video|>"], audio_token_id=v["<|audio|>"], boa_token_id=v["<|audio>"],
            eoa_token_index=v["<audio|>"])
    if family == "llava_onevision":  # LLaVA-NeXT's tiles with a SigLIP tower (no CLS), shrunk past 9 base views
        return tf.LlavaOnevisionConfig(
            text_config=dict(TEXT, model_type="qwen2", eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=32,
                               num_hidden_layers=2, num_attention_heads=2, image_size=14 * LLAVA_SIDE, patch_size=14),
            image_grid_pinpoints=ONEVISION_PINPOINTS, image_token_id=LLAVA_IMAGE, video_token_id=VOCAB["<video>"],
            vision_feature_layer=-1, vision_feature_select_strategy="full", vision_aspect_ratio="anyres_max_9")
    if family == "llama4":
        # a chunked-attention layer (chunks of 32 tokens, shorter than the prompts) rotating q and k (complex pairs)
        # and a RoPE-free (NoPE) one, both with experts;
        # tiles of 56 x 56 pixels, 4 x 4 patches pixel-shuffled to 2 x 2 tokens
        eos_id = LLAMA4_VOCAB["<|endoftext|>"]
        text = dict(TEXT, intermediate_size_mlp=96, num_local_experts=4, num_experts_per_tok=1,
                    interleave_moe_layer_step=1, no_rope_layers=[1, 0], attention_chunk_size=32,
                    rope_parameters={"rope_type": "default", "rope_theta": 5e5}, eos_token_id=eos_id,
                    bos_token_id=eos_id, pad_token_id=eos_id)
        text.pop("tie_word_embeddings")
        return tf.Llama4Config(
            text_config=text,
            # the pixel shuffle's MLP reads intermediate_size channels: hidden_size / pixel_shuffle_ratio²
            vision_config=dict(hidden_size=32, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                               image_size=56, patch_size=14, pixel_shuffle_ratio=0.5, vision_output_dim=64,
                               projector_input_dim=64, projector_output_dim=64,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
            image_token_index=LLAMA4_VOCAB["<|patch|>"], boi_token_index=LLAMA4_VOCAB["<|image_start|>"],
            eoi_token_index=LLAMA4_VOCAB["<|image_end|>"], tie_word_embeddings=False)
    if family == "llava_next_video":  # a frame: 4 x 4 patches pooled to 2 x 2 tokens; vLLM 0.32's pooling needs
        # image_size >= patch_size ** 2 (it divides by image_size // patch_size ** 2)
        return tf.LlavaNextVideoConfig(
            text_config=dict(TEXT, model_type="llama", eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=32,
                               num_hidden_layers=2, num_attention_heads=2, image_size=16, patch_size=4),
            image_grid_pinpoints=[[16, 32], [32, 16]], image_token_id=LLAVA_IMAGE, video_token_id=VOCAB["<video>"],
            vision_feature_layer=-2, vision_feature_select_strategy="default", spatial_pool_stride=2)
    if family == "cohere2_vision":  # tiles of 56 x 56 pixels, 4 x 4 SigLIP patches pixel-shuffled to 2 x 2 tokens;
        # a Cohere 2 text model rotating adjacent channel pairs in its sliding-window layer, none in its global one
        # (the window spans every prompt: vLLM's Cohere 2 window is one token wider than transformers'); vLLM's
        # Cohere reads logits off the input embeddings, as the released checkpoints tie them, and takes a config
        # with rms_norm_eps for one normalized by RMSNorm (Cohere 2's is a LayerNorm)
        text = {k: v for k, v in TEXT.items() if k != "rms_norm_eps"}
        return tf.Cohere2VisionConfig(
            text_config=dict(text, model_type="cohere2", eos_token_id=eos(family), bos_token_id=eos(family),
                             pad_token_id=eos(family), layer_types=["sliding_attention", "full_attention"],
                             sliding_window=512, tie_word_embeddings=True, logit_scale=1.0),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=32,
                               num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=14),
            image_token_id=COHERE_VOCAB["<|IMG_PATCH|>"], downsample_factor=2, alignment_intermediate_size=64)
    if family == "exaone4_5":  # Qwen2.5-VL's vision tower in an EXAONE 4 text model, rotating in its sliding-window
        # layer only (the window spans every prompt)
        return tf.Exaone4_5_Config(
            text_config=dict(TEXT, model_type="exaone4", eos_token_id=EOS, bos_token_id=EOS, pad_token_id=EOS,
                             layer_types=["sliding_attention", "full_attention"], sliding_window=512),
            vision_config=dict(depth=1, hidden_size=32, out_hidden_size=64, intermediate_size=32, num_heads=2,
                               num_key_value_heads=1, spatial_merge_size=2, fullatt_block_indexes=[0], patch_size=14,
                               temporal_patch_size=2, window_size=56),
            image_token_id=IMAGE, video_token_id=VIDEO)
    if family == "lfm2_vl":  # a SigLIP2 NaFlex tower (4-pixel patches, 2 x 2 of them per token) in an LFM2 text
        # model of a short-convolution layer (no positions) and an attention layer; vLLM 0.32's LFM2 reads the
        # widths block_dim and conv_dim, which LFM2's released configs carry and transformers' takes as hidden_size
        text = {k: v for k, v in TEXT.items() if k not in ("rms_norm_eps", "head_dim")}
        e = eos(family)
        return tf.Lfm2VlConfig(
            text_config=dict(text, model_type="lfm2", eos_token_id=e, bos_token_id=e, pad_token_id=e,
                             layer_types=["conv", "full_attention"], block_auto_adjust_ff_dim=False,
                             block_dim=64, conv_dim=64, norm_eps=1e-6, tie_word_embeddings=True),
            vision_config=dict(model_type="siglip2_vision_model", hidden_size=32, intermediate_size=32,
                               num_hidden_layers=1, num_attention_heads=2, patch_size=4, num_patches=64,
                               vision_use_head=False),  # as LFM2-VL's releases: vLLM's tower has no pooling head
            image_token_id=LFM2_VOCAB["<image>"], downsample_factor=2, projector_hidden_size=64)
    if family == "qianfan_ocr":  # InternVL's tiles (56 x 56 pixels, 4 x 4 patches pixel-shuffled to 2 x 2 tokens) in
        # a Qwen3 language model
        return tf.QianfanOCRConfig(
            text_config=dict(TEXT, model_type="qwen3", eos_token_id=EOS, bos_token_id=EOS),
            vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               image_size=[56, 56], patch_size=[14, 14], drop_path_rate=0.0),
            image_token_id=VOCAB["<IMG_CONTEXT>"], image_seq_length=4, downsample_ratio=0.5)
    if family == "cosmos3_edge":  # a SigLIP2 tower (16-pixel patches, 2 x 2 of them per token) in a Llama-like text
        # model with Qwen3-VL's interleaved sections and a ReLU² MLP
        return tf.Cosmos3EdgeConfig(
            text_config=dict(TEXT, rope_parameters=rope, eos_token_id=EOS, bos_token_id=EOS, pad_token_id=EOS),
            vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                               patch_size=16, num_patches=64, spatial_merge_size=2),
            projector_hidden_size=48, **_ids(family))
    if family.startswith("minicpmv"):  # a SigLIP tower of 4-pixel patches with the window merger after its layer
        # (2 x 2 patches), then the merger (2 x 2): a token per 16 x 16 pixels, in a Qwen3.5 text model of a
        # gated-delta-net layer (vLLM's CPU kernel: bfloat16, heads of 128) and a full-attention layer rotating half of
        # each head. Two KV heads of 128 channels and one value head in the gated delta net make a token's KV cache
        # large against the net's state, whose page vLLM makes an attention block as large as: 96 tokens, shorter
        # than the test's prompts, so their second request hits the prefix cache
        e, v = eos(family), MINICPM_VOCAB
        q35 = dict(rope_type="default", rope_theta=1e6, mrope_section=[8, 12, 12], mrope_interleaved=True,
                   partial_rotary_factor=0.5)
        text = dict(TEXT, model_type="qwen3_5_text", rope_parameters=q35, eos_token_id=e, bos_token_id=e,
                    pad_token_id=e, layer_types=["linear_attention", "full_attention"], linear_num_value_heads=1,
                    linear_num_key_heads=1, linear_key_head_dim=128, linear_value_head_dim=128, head_dim=128,
                    num_key_value_heads=2)
        common = dict(text_config=text, vision_config=dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, image_size=48, patch_size=4),
                      insert_layer_id=0, image_token_id=v["<|image_pad|>"], video_token_id=v["<|video_pad|>"],
                      downsample_mode="16x")
        if family == "minicpmv4_6":
            return tf.MiniCPMV4_6Config(**common, drop_vision_last_layer=False)
        return tf.MiniCPMV4_7Config(**common, image_start_id=v["<image>"], image_end_id=v["</image>"],
                                    slice_start_id=v["<slice>"], slice_end_id=v["</slice>"], newline_id=v["\n"])
    if family.startswith("paligemma"):  # a SigLIP tower of 4 x 4 patches (16 image tokens) in a Gemma text model
        # (PaliGemma 2: Gemma 2, its layers sliding and global in turn)
        e, v = eos(family), PALIGEMMA_VOCAB
        text = dict(model_type="gemma")
        if family == "paligemma2":
            text = dict(model_type="gemma2", **PALIGEMMA2_TEXT)
        return tf.PaliGemmaConfig(
            text_config=dict(TEXT, eos_token_id=e, bos_token_id=v["<bos>"], pad_token_id=e,
                             hidden_activation="gelu_pytorch_tanh", **text),
            vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=32,
                               num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=14,
                               projection_dim=TEXT["hidden_size"]),
            image_token_id=v["<image>"], projection_dim=TEXT["hidden_size"], vocab_size=TEXT["vocab_size"],
            tie_word_embeddings=True)
    if family == "ernie4_5_vl_moe":  # a dense layer and one of text and vision experts (4 each, 2 per token, a
        # shared one); [h, w, t] sections interleaving h and w; 14-pixel patches merged 2 x 2
        v, e = ERNIE_VOCAB, eos(family)
        return tf.Ernie4_5_VLMoeConfig(
            text_config=dict(TEXT, rope_parameters=dict(rope, mrope_section=[6, 6, 4]), moe_num_experts=4, moe_k=2,
                             moe_intermediate_size=[48, 48], moe_num_shared_experts=1,
                             mlp_layer_types=["dense", "sparse"], eos_token_id=e, bos_token_id=e, pad_token_id=e),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, patch_size=14,
                               spatial_merge_size=2, temporal_merge_size=2),
            image_token_id=v["<|IMAGE_PLACEHOLDER|>"], image_start_token_id=v["<|IMAGE_START|>"],
            image_end_token_id=v["<|IMAGE_END|>"], video_token_id=v["<|VIDEO_PLACEHOLDER|>"],
            video_start_token_id=v["<|VIDEO_START|>"], video_end_token_id=v["<|VIDEO_END|>"])
    if family == "step3p7":  # a sliding-window layer (window 8, shorter than the prompts) with a dense MLP, a full one
        # with experts (4, 2 per token, a shared one, routed with a correction bias, scaled 1.5); every attention
        # output gated per head; a 1-layer tower of 112-pixel views (8 x 8 patches, 2 x 2 tokens after its
        # downsamplers)
        e = eos(family)
        return tf.Step3p7Config(
            text_config=dict(TEXT, num_attention_heads=4, num_key_value_heads=2, mlp_layer_types=["dense", "sparse"],
                             n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, share_expert_dim=48,
                             moe_router_scaling_factor=1.5, layer_types=["sliding_attention", "full_attention"],
                             sliding_window=8, eos_token_id=e, pad_token_id=e),
            vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=112,
                               patch_size=14, mlp_ratio=2.0),
            image_token_id=STEP3_VOCAB["<im_patch>"])
    raise ValueError(family)


#: expert layers of the MoE families (4 experts, 2 per token; expert width 48, so no expert matrix is square).
#: Qwen3.5-MoE, served in bfloat16: every token goes to all 8 experts, so the router's softmax weights vary
#: continuously; with 2 of 4, near-tied experts swap between vLLM and transformers in bfloat16 and the stock models'
#: log-probabilities differ by up to 0.65, as much as wrong positions move them (docs/serving.md, "Qwen3.5")
MOE = {
    "qwen3_vl_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48),
    "qwen3_5_moe": dict(num_experts=8, num_experts_per_tok=8, moe_intermediate_size=48,
                        shared_expert_intermediate_size=48),
    "glm4v_moe": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                      first_k_dense_replace=1, n_group=1, topk_group=1),
}


def _processor(family: str):
    import transformers as tf

    if family == "paddleocr_vl":
        tok = _tokenizer(PADDLE_VOCAB, PADDLE_SPECIAL, named={"image_token": "<|IMAGE_PLACEHOLDER|>"})
        image = tf.PaddleOCRVLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=1,
                                             size={"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64})
        return tf.PaddleOCRVLProcessor(image_processor=image, tokenizer=tok)
    if family == "llama4":  # an image of up to 2 x 2 tiles of 56 x 56 pixels, and the whole image
        image = tf.Llama4ImageProcessorFast(size={"height": 56, "width": 56}, max_patches=4)
        return tf.Llama4Processor(image_processor=image, tokenizer=_tokenizer(LLAMA4_VOCAB, LLAMA4_SPECIAL),
                                  patch_size=14, pixel_shuffle_ratio=0.5)
    if family == "cohere2_vision":  # up to 4 tiles of 56 x 56 pixels (2 x 2 tokens each) and a thumbnail
        tok = _tokenizer(COHERE_VOCAB, COHERE_SPECIAL, named=dict(
            boi_token="<|START_OF_IMG|>", eoi_token="<|END_OF_IMG|>", image_token="<|IMG_PATCH|>",
            img_line_break_token="<|IMG_LINE_BREAK|>"))
        image = tf.Cohere2VisionImageProcessor(size={"height": 56, "width": 56}, crop_to_patches=True, min_patches=1,
                                               max_patches=4, patch_size=2)
        return tf.Cohere2VisionProcessor(image_processor=image, tokenizer=tok)
    if family == "lfm2_vl":  # tiles of 16 x 16 pixels (2 x 2 tokens each), up to 2 x 2 of them, and a thumbnail
        image = tf.Lfm2VlImageProcessor(encoder_patch_size=4, tile_size=16, min_tiles=2, max_tiles=4,
                                        min_image_tokens=1, max_image_tokens=16, downsample_factor=2)
        return tf.Lfm2VlProcessor(image_processor=image, tokenizer=_tokenizer(LFM2_VOCAB, LFM2_SPECIAL))
    if family.startswith("minicpmv"):  # slices of about 48 x 48 pixels (3 x 3 tokens), up to 4 of them
        tok = _tokenizer(MINICPM_VOCAB, MINICPM_SPECIAL, named=dict(
            image_token="<|image_pad|>", video_token="<|video_pad|>", image_start_token="<image>",
            image_end_token="</image>", slice_start_token="<slice>", slice_end_token="</slice>",
            image_id_start_token="<image_id>", image_id_end_token="</image_id>"))
        opts = dict(patch_size=4, scale_resolution=48, max_slice_nums=4, downsample_mode="16x")
        image = tf.MiniCPMV4_6ImageProcessor(**opts)
        video = tf.MiniCPMV4_6VideoProcessor(**opts, do_sample_frames=False)
        cls = tf.MiniCPMV4_6Processor if family == "minicpmv4_6" else tf.MiniCPMV4_7Processor
        return cls(image_processor=image, tokenizer=tok, video_processor=video)
    if family == "step3p7":  # a 112-pixel global view and tiles of 56 pixels (2 x 2 and 1 x 1 tokens)
        image = tf.Step3p7ImageProcessor(size={"height": 112, "width": 112}, patch_size=56, max_image_size=224)
        return tf.Step3p7Processor(image_processor=image, tokenizer=_tokenizer(STEP3_VOCAB, STEP3_SPECIAL))
    if family.startswith(("qwen2_5_omni", "qwen3_omni")):  # Qwen2-VL's image and video processing, Whisper's mels
        qwen3 = family.startswith("qwen3_omni")
        cls, tokenizer = ((tf.Qwen3OmniMoeProcessor, _tokenizer(OMNI3_VOCAB, OMNI3_SPECIAL, named=OMNI3_NAMED)) if qwen3
                          else (tf.Qwen2_5OmniProcessor, _tokenizer(OMNI_VOCAB, OMNI_SPECIAL, named=OMNI_NAMED)))
        image, video = _vision_processors(tf.Qwen2VLImageProcessor, tf.Qwen2VLVideoProcessor, 16 if qwen3 else 14)
        return cls(image_processor=image, video_processor=video,
                   feature_extractor=tf.WhisperFeatureExtractor(feature_size=OMNI_MEL), tokenizer=tokenizer)
    if family.startswith("cohere_compass"):  # the test serves images only (vLLM 0.32's Compass takes no video)
        image, video = _vision_processors(tf.CohereCompassImageProcessor, tf.CohereCompassVideoProcessor, 16)
        return tf.CohereCompassProcessor(image_processor=image, tokenizer=_tokenizer(COMPASS_VOCAB, COMPASS_SPECIAL),
                                         video_processor=video)
    if family.startswith("paligemma"):
        tok = _tokenizer(PALIGEMMA_VOCAB, PALIGEMMA_SPECIAL)
        tok.add_special_tokens({"bos_token": "<bos>"})
        image = tf.SiglipImageProcessor(size={"height": 56, "width": 56}, image_seq_length=16)
        return tf.PaliGemmaProcessor(image_processor=image, tokenizer=tok)
    if family.startswith("glm"):
        tok = _tokenizer(GLM_VOCAB, GLM_SPECIAL)
        size = {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64}
        image = tf.Glm4vImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, size=size)
        video = tf.Glm4vVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, size=size,
                                       max_image_size={"longest_edge": 28 * 28 * 64}, do_sample_frames=False)
        return tf.Glm4vProcessor(image_processor=image, tokenizer=tok, video_processor=video)
    tok = _tokenizer()
    if family == "llava":
        side = 14 * LLAVA_SIDE
        image = tf.CLIPImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
        return tf.LlavaProcessor(image_processor=image, tokenizer=tok, patch_size=14, image_token="<image>",
                                 vision_feature_select_strategy="default", num_additional_image_tokens=1)
    if family == "llava_next":
        side = 14 * LLAVA_SIDE
        image = tf.LlavaNextImageProcessor(size={"shortest_edge": side}, crop_size={"height": side, "width": side},
                                           image_grid_pinpoints=LLAVA_NEXT_PINPOINTS)
        return tf.LlavaNextProcessor(image_processor=image, tokenizer=tok, patch_size=14, image_token="<image>",
                                     vision_feature_select_strategy="default", num_additional_image_tokens=1)
    if family == "llava_next_video":
        image = tf.LlavaNextImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                           image_grid_pinpoints=[[16, 32], [32, 16]])
        video = tf.LlavaNextVideoVideoProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16},
                                                do_sample_frames=False)
        return tf.LlavaNextVideoProcessor(video_processor=video, image_processor=image, tokenizer=tok, patch_size=4,
                                          vision_feature_select_strategy="default", num_additional_image_tokens=1)
    if family == "llava_onevision":
        side = 14 * LLAVA_SIDE
        image = tf.LlavaOnevisionImageProcessor(size={"height": side, "width": side},
                                                image_grid_pinpoints=ONEVISION_PINPOINTS)
        video = tf.LlavaOnevisionVideoProcessor(size={"height": side, "width": side})
        return tf.LlavaOnevisionProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                                          num_image_tokens=LLAVA_SIDE ** 2, vision_feature_select_strategy="full",
                                          vision_aspect_ratio="anyres_max_9")
    if family == "mistral3":
        image = tf.PixtralImageProcessor(size={"longest_edge": 112}, patch_size=14)
        return tf.PixtralProcessor(image_processor=image, tokenizer=tok, patch_size=14, spatial_merge_size=2)
    if family == "idefics3":  # an image of up to 112 pixels per side: up to 2 x 2 tiles, and the whole image
        image = tf.Idefics3ImageProcessor(size={"longest_edge": 112}, max_image_size={"longest_edge": 56},
                                          do_image_splitting=True)
        return tf.Idefics3Processor(image_processor=image, tokenizer=_tokenizer(IDEFICS_VOCAB, IDEFICS_SPECIAL),
                                    image_seq_len=4)
    if family == "smolvlm":  # Idefics3's tiles and markers (its processor needs the num2words package)
        image = tf.SmolVLMImageProcessor(size={"longest_edge": 112}, max_image_size={"longest_edge": 56},
                                         do_image_splitting=True)
        video = tf.SmolVLMVideoProcessor(size={"longest_edge": 56}, max_image_size={"longest_edge": 56})
        return tf.SmolVLMProcessor(image_processor=image, tokenizer=_tokenizer(IDEFICS_VOCAB, IDEFICS_SPECIAL),
                                   video_processor=video, image_seq_len=4)
    if family == "gemma3":  # no pan and scan: an image is one 56 x 56 view
        tok = _tokenizer(GEMMA_VOCAB, GEMMA_SPECIAL, named=dict(
            boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>"))
        image = tf.Gemma3ImageProcessor(size={"height": 56, "width": 56}, do_pan_and_scan=False)
        return tf.Gemma3Processor(image_processor=image, tokenizer=tok, image_seq_length=4)
    if family == "gemma4":  # images of at most 70 tokens (4-pixel patches pooled 2 x 2)
        tok = _tokenizer(GEMMA4_VOCAB, GEMMA4_SPECIAL, named=dict(
            boi_token="<|image>", eoi_token="<image|>", image_token="<|image|>", boa_token="<|audio>",
            eoa_token="<audio|>", audio_token="<|audio|>"))
        image = tf.Gemma4ImageProcessor(patch_size=4, pooling_kernel_size=2, max_soft_tokens=70)
        video = tf.Gemma4VideoProcessor(patch_size=4, pooling_kernel_size=2, max_soft_tokens=70)
        return tf.Gemma4Processor(feature_extractor=tf.Gemma4AudioFeatureExtractor(), image_processor=image, tokenizer=tok, video_processor=video,
                                  image_seq_length=70)
    if family == "qianfan_ocr":  # GotOcr2's tiling with PIL, which is how vLLM tiles (the remote-code release's
        # processing); ImageNet's mean and std, as vLLM normalizes
        tok = _tokenizer(named=dict(start_image_token="<img>", end_image_token="</img>",
                                    context_image_token="<IMG_CONTEXT>"))
        image = tf.GotOcr2ImageProcessorPil(size={"height": 56, "width": 56}, crop_to_patches=True, min_patches=1,
                                            max_patches=4, image_mean=[0.485, 0.456, 0.406],
                                            image_std=[0.229, 0.224, 0.225])
        return tf.QianfanOCRProcessor(image_processor=image, tokenizer=tok, image_seq_length=4)
    if family == "internvl":
        tok = _tokenizer(named=dict(start_image_token="<img>", end_image_token="</img>",
                                    context_image_token="<IMG_CONTEXT>", video_token="<video>"))
        image = tf.GotOcr2ImageProcessor(size={"height": 56, "width": 56}, crop_to_patches=True, min_patches=1,
                                         max_patches=4)
        video = tf.InternVLVideoProcessor(size={"height": 56, "width": 56})
        return tf.InternVLProcessor(image_processor=image, tokenizer=tok, video_processor=video, image_seq_length=4)
    if family == "ernie4_5_vl_moe":  # frames as given (the video processor's default draws timestamps onto them
        # with a font it downloads)
        tok = _tokenizer(ERNIE_VOCAB, ERNIE_SPECIAL, named=dict(
            image_token="<|IMAGE_PLACEHOLDER|>", image_start_token="<|IMAGE_START|>", image_end_token="<|IMAGE_END|>",
            video_token="<|VIDEO_PLACEHOLDER|>", video_start_token="<|VIDEO_START|>", video_end_token="<|VIDEO_END|>"))
        size = {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64}
        return tf.Ernie4_5_VLMoeProcessor(
            image_processor=tf.Ernie4_5_VLMoeImageProcessor(patch_size=14, merge_size=2, size=size), tokenizer=tok,
            video_processor=tf.Ernie4_5_VLMoeVideoProcessor(patch_size=14, merge_size=2, size=size,
                                                            draw_on_frames=False))
    if family == "cosmos3_edge":
        size = {"shortest_edge": 32 * 32, "longest_edge": 32 * 32 * 64}
        image = tf.Cosmos3EdgeImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=1, size=size)
        video = tf.Cosmos3EdgeVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=1, size=size, fps=2,
                                             min_frames=2, max_frames=8, do_sample_frames=False)
        return tf.Cosmos3EdgeProcessor(image_processor=image, tokenizer=tok, video_processor=video)
    if family.startswith("qwen3_5"):
        tok = _qwen3_5_tokenizer()
    if family.startswith(("qwen3_vl", "qwen3_5")):
        size = {"shortest_edge": 32 * 32, "longest_edge": 32 * 32 * 64}
        image = tf.Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2, size=size)
        video = tf.Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2, size=size, fps=2,
                                         min_frames=2, max_frames=8, do_sample_frames=False)
        return tf.Qwen3VLProcessor(image_processor=image, tokenizer=tok, video_processor=video)
    size = {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64}
    image = tf.Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, size=size)
    video = tf.Qwen2VLVideoProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, size=size,
                                     do_sample_frames=False)
    if family == "exaone4_5":
        return tf.Exaone4_5_Processor(image_processor=image, tokenizer=tok, video_processor=video)
    cls = tf.Qwen2_5_VLProcessor if family == "qwen2_5_vl" else tf.Qwen2VLProcessor
    return cls(image_processor=image, tokenizer=tok, video_processor=video)


CLASSES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
           "qwen3_vl": "Qwen3VLForConditionalGeneration", "glm4v": "Glm4vForConditionalGeneration",
           "llava": "LlavaForConditionalGeneration", "llava_next": "LlavaNextForConditionalGeneration",
           "mistral3": "Mistral3ForConditionalGeneration",
           "internvl": "InternVLForConditionalGeneration", "idefics3": "Idefics3ForConditionalGeneration",
           "gemma3": "Gemma3ForConditionalGeneration", "llava_onevision": "LlavaOnevisionForConditionalGeneration",
           "llava_next_video": "LlavaNextVideoForConditionalGeneration"}

CLASSES.update(qwen3_vl_moe="Qwen3VLMoeForConditionalGeneration", glm4v_moe="Glm4vMoeForConditionalGeneration",
               glm_ocr="GlmOcrForConditionalGeneration", qwen3_5="Qwen3_5ForConditionalGeneration",
               qwen3_5_moe="Qwen3_5MoeForConditionalGeneration", paddleocr_vl="PaddleOCRVLForConditionalGeneration",
               llama4="Llama4ForConditionalGeneration", gemma4="Gemma4ForConditionalGeneration",
               cohere2_vision="Cohere2VisionForConditionalGeneration",
               exaone4_5="Exaone4_5_ForConditionalGeneration", lfm2_vl="Lfm2VlForConditionalGeneration",
               smolvlm="SmolVLMForConditionalGeneration", qianfan_ocr="QianfanOCRForConditionalGeneration",
               cosmos3_edge="Cosmos3EdgeForConditionalGeneration",
               ernie4_5_vl_moe="Ernie4_5_VLMoeForConditionalGeneration",
               minicpmv4_6="MiniCPMV4_6ForConditionalGeneration", minicpmv4_7="MiniCPMV4_7ForConditionalGeneration",
               paligemma="PaliGemmaForConditionalGeneration", paligemma2="PaliGemmaForConditionalGeneration",
               step3p7="Step3p7ForConditionalGeneration",
               cohere_compass="CohereCompassForConditionalGeneration",
               cohere_compass_nope="CohereCompassForConditionalGeneration",
               qwen2_5_omni_thinker="Qwen2_5OmniThinkerForConditionalGeneration",
               qwen2_5_omni="Qwen2_5OmniForConditionalGeneration",
               qwen3_omni_moe_thinker="Qwen3OmniMoeThinkerForConditionalGeneration",
               qwen3_omni_moe="Qwen3OmniMoeForConditionalGeneration")


#: weights of a family's test checkpoint set to a value, by module name: MiniCPM-V's q/k norms (Qwen3.5's scale by
#: 1 + weight) make its one full-attention layer attend sharply enough that the positions move its bfloat16
#: log-probabilities clearly past bfloat16's noise
FILL = {f: {"q_norm": 2.0, "k_norm": 2.0} for f in ("minicpmv4_6", "minicpmv4_7")}


def build(family: str, out: Path, design, seed: int = 0, release: str = None, **patch) -> Path:
    """Save a random ``family`` model patched with ``design`` (and ``patch_model`` keywords) at ``out``; with
    ``design=None`` the stock model, unpatched; with ``release``, patched as under that transformers release
    (:func:`_patch_as_of`)."""
    import transformers as tf

    from ropekit.hf import patch_model

    torch.manual_seed(seed)
    model = getattr(tf, CLASSES[family])(config(family)).eval()
    with torch.no_grad():  # weights large enough that positions move the log-probabilities visibly
        for name, p in model.named_parameters():
            if p.ndim >= 2 and "visual" not in name:
                p.normal_(0, 0.1)
            if name.rsplit(".", 2)[-2] in FILL.get(family, {}):
                p.fill_(FILL[family][name.rsplit(".", 2)[-2]])
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # a correction bias that changes which experts are chosen
                b.normal_(0, 0.1)
    if design is not None and release is not None:
        _patch_as_of(release, model, design, **patch)
    elif design is not None:
        patch_model(model, design, **patch)
    model.save_pretrained(out)
    _processor(family).save_pretrained(out)
    return out


def _patch_as_of(release: str, model, design, **patch) -> None:
    """``patch_model`` as under transformers ``release``: ropekit reads the installed release as ``release``, and each
    layer type's rope parameters carry the ``mrope_interleaved`` flag that release's config writes (Command A
    Compass: true from 5.21 on, where its rotary interleaves the sections), so the record keeps that release's native
    layout (``native``), as a checkpoint patched there does."""
    from ropekit.hf import boundary, patch_model
    from ropekit.hf.adapters import ADAPTERS

    installed = boundary.transformers_version
    boundary.transformers_version = lambda: release
    try:
        flag = ADAPTERS[model.config.model_type].native_allocation == "interleaved"
        for rope in model.config.get_text_config().rope_parameters.values():
            if rope is not None:
                rope["mrope_interleaved"] = flag
        patch_model(model, design, **patch)
    finally:
        boundary.transformers_version = installed
