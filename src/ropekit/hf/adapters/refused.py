"""Families ropekit knows and refuses, by transformers ``model_type``, with the reason :func:`ropekit.hf.patch_model`
gives (docs/hf.md, "Families ropekit refuses", has the details).

A family lands here when its position code does not have the Qwen-VL shape (text on the diagonal, a grid block at
``s`` on ``(s + frame, s + row, s + column)``, one rotation angle per frequency pair), so that no ropekit design
reproduces the stock model and no adapter could honour the designs' own placement, or when a 1-D family's image
tokens are no grid a design could place (nothing ties a token to a row and column of the image).
"""

REFUSED: dict[str, str] = {
    "hunyuan_vl": (
        "HunYuan-VL's XD-RoPE has no ropekit counterpart: transformers' HunYuanVLRotaryEmbedding cuts the "
        "channel-doubled cos/sin table into 2 * mrope_section[i] channels per axis, so on an image token the two "
        "channels of a frequency pair turn by different axes (not a rotation; ropekit's tables turn each pair by "
        "one angle), and get_rope_index places len(mrope_section) >= 3 axes (the sequence index, then width "
        "with a newline column, height, and an image ordinal counted across the whole batch) rather than a "
        "block at its start position; the batch-wide ordinal makes a sample's stock positions and logits depend "
        "on the samples before it, so no per-sample design (with any table rule) equals it on padded batches"
    ),
    "aria": (
        "Aria's image tokens are no grid: its projector's learned queries (projector_patch_to_query_dict: 128 or "
        "256 per image) cross-attend to all of the vision tower's patches with no position of their own, so each "
        "token summarizes the whole image (the same tokens for any order of the patches) and has no row or "
        "column; a 2-D or 3-D design would invent one, and placed as text every design is 1-D RoPE"
    ),
    "idefics2": (
        "Idefics2's image tokens are no grid: its perceiver resampler's learned latents (resampler_n_latents, 64 "
        "per image or crop) cross-attend to all of the vision tower's patches with no position of their own, so "
        "each token summarizes the whole image (the same tokens for any order of the patches) and has no row or "
        "column; a 2-D or 3-D design would invent one, and placed as text every design is 1-D RoPE"
    ),
    "mistral_large4": (
        "Mistral Large 4's rotary scales each frequency by a trained parameter (MistralLarge4TextRotaryEmbedding."
        "alpha: inv_freq * exp(alpha), learned in pretraining and updated by fine-tuning), so its cos/sin are no "
        "function of the config; ropekit builds every design's tables from rope_parameters, which would drop the "
        "trained scales (no design would give the stock model) and stop training them"
    ),
}
