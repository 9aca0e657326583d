"""What the Hugging Face tests call differently across the transformers releases ropekit supports.

transformers 5.23 renamed ``gradient_checkpointing_enable/disable`` to ``activation_checkpointing_enable/
disable`` (and their ``gradient_checkpointing_kwargs`` argument); the tests use whichever the installed
release has, so the same checks run at the oldest supported release and the newest. transformers 5.21 moved the Omni
processors' interleaving of a video with its audio track into ``replace_video_with_audio_token``
(:func:`processor_video_with_audio` calls whichever the release has). The checkpointed-training
check every family runs lives here once too, built on them, with the two model helpers every family's
fixtures share (a tiny random model set up to generate; a model restored after a test), and the per-sample
reference the packing tests compare a packed row with.
"""
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ropekit.hf import is_patched, patch_model, supported_models, unpatch_model


def ready_to_generate(model, pad: int, suppress):
    """``model`` in eval mode, set up to generate from random weights: padding ``pad``, no end token (so every
    sample runs to its length) and the placeholder tokens ``suppress`` never generated (a random model may emit
    them, and each would need pixels or a grid of its own)."""
    model = model.eval()
    model.generation_config.pad_token_id = pad
    model.generation_config.eos_token_id = None
    model.generation_config.suppress_tokens = list(suppress)
    return model


def restore(model) -> None:
    """``model`` as a test found it: unpatched, and its cached rope deltas (where its family keeps them)
    cleared."""
    if is_patched(model):
        unpatch_model(model)
    for owner in (model, getattr(model, "model", None)):  # the bare model (before 5.21 the Omni thinker itself)
        if getattr(owner, "rope_deltas", None) is not None:
            owner.rope_deltas = None


def processor_video_with_audio(processor, t: int, h: int, w: int, n: int, seconds: float, merge: int = 2,
                               rate: int = 25, chunk_seconds: int = 2) -> str:
    """An Omni processor class's tokens for a video with its audio track (``use_audio_in_video``): patch grid
    ``t × h × w``, ``n`` audio tokens, ``seconds`` per temporal grid, written '<' audio start, 'v' video, 'a' audio,
    '>' audio end (the vision start and end tokens go around it). The processor's own code, bound to these
    single-character tokens: ``replace_video_with_audio_token`` since transformers 5.21, the video branch of
    ``replace_multimodal_special_tokens`` before."""
    me = SimpleNamespace(audio_bos_token="<", audio_eos_token=">", video_token="v", audio_token="a",
                         video_processor=SimpleNamespace(merge_size=merge))
    me.get_chunked_index = lambda *a: processor.get_chunked_index(me, *a)
    if hasattr(processor, "replace_video_with_audio_token"):
        return processor.replace_video_with_audio_token(
            me, {"video_grid_thw": [[t, h, w]], "video_second_per_grid": [seconds]}, 0, {"num_audio_tokens": [n]},
            0, position_id_per_seconds=rate, seconds_per_chunk=chunk_seconds)
    me.vision_bos_token, me.vision_eos_token, me.image_token = "[", "]", "i"
    me.image_processor = SimpleNamespace(merge_size=merge)
    text, = processor.replace_multimodal_special_tokens(
        me, ["[v]"], iter([n]), iter([]), iter([np.array([t, h, w])]), iter([seconds]), True, rate, chunk_seconds)
    assert text[0] == "[" and text[-1] == "]", text
    return text[1:-1]


def checkpointing_on(model, **kwargs) -> None:
    """Turn activation (gradient) checkpointing on; ``kwargs`` are the checkpoint function's, e.g. use_reentrant."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(**({"activation_checkpointing_kwargs": kwargs} if kwargs else {}))
    else:
        model.gradient_checkpointing_enable(**({"gradient_checkpointing_kwargs": kwargs} if kwargs else {}))


def checkpointing_off(model) -> None:
    if hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:
        model.gradient_checkpointing_disable()


def checkpointed_gradients(model, inputs, labels, named_params, use_reentrant=False):
    """One training step with and without checkpointing: ``(loss, loss_checkpointed, grads, grads_checkpointed)``,
    the gradients as ``{name: grad}`` of ``named_params()`` (pairs of name and parameter) that received one."""
    import torch

    def grads():
        model.zero_grad()
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        g = {n: p.grad.clone() for n, p in named_params() if p.grad is not None}
        model.zero_grad()
        return loss, g

    model.train()
    try:
        loss, plain = grads()
        checkpointing_on(model, use_reentrant=use_reentrant)
        loss2, ckpt = grads()
    finally:
        checkpointing_off(model)
        model.eval()
    assert isinstance(loss, torch.Tensor)
    return loss, loss2, plain, ckpt


def assert_checkpointing_keeps_gradients(model, inputs, labels, text_model, use_reentrant=False) -> None:
    """The loss is finite and the same with checkpointing, and so is every gradient of ``text_model``'s
    parameters (attention included) — the invariant a patched model must keep when trained checkpointed."""
    import torch

    loss, loss2, plain, ckpt = checkpointed_gradients(model, inputs, labels, text_model.named_parameters,
                                                      use_reentrant)
    assert torch.isfinite(loss) and torch.equal(loss, loss2)
    assert plain.keys() == ckpt.keys() and any(".self_attn." in n for n in plain)
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-6, atol=1e-7)


def assert_refused_by_name(model, name: str, design: str = "vanilla", **options) -> None:
    """``patch_model`` refuses ``model`` (a family ropekit refuses) and its bare model by ``model_type``, giving the
    reason, the supported families and docs/hf.md, and leaves no hook behind."""
    assert name not in supported_models()
    for target in (model, model.model):
        with pytest.raises(ValueError, match=rf"model type '{re.escape(name)}' .* is refused: .*supported: ") as err:
            patch_model(target, design, **options)
        assert ", ".join(supported_models()) in str(err.value) and "docs/hf.md" in str(err.value)
        assert not is_patched(target)
    assert not any(type(v).__name__ == "Hook" for m in model.modules() for v in m.__dict__.values())


def runs_alone(model, samples):
    """Each of ``samples`` (one-sample inputs) run alone: the logits concatenated along the tokens, and the
    samples' summed next-token losses (a packed row's reference)."""
    import torch

    logits, losses = [], []
    with torch.no_grad():
        for s in samples:
            out = model(**s).logits[0]
            logits.append(out)
            losses.append(torch.nn.functional.cross_entropy(out[:-1], s["input_ids"][0, 1:], reduction="sum"))
    return torch.cat(logits), torch.stack(losses).sum()


def left_padded(rows, pad: int, *columns):
    """Token rows of unequal length left-padded into a batch: ``(input_ids, attention_mask, *columns)``, each
    further column (per-token lists, e.g. token types) padded with zeros alike."""
    L = max(map(len, rows))
    input_ids = torch.full((len(rows), L), pad)
    mask = torch.zeros(len(rows), L, dtype=torch.long)
    extra = [torch.zeros(len(rows), L, dtype=torch.long) for _ in columns]
    for b, ids in enumerate(rows):
        input_ids[b, L - len(ids):] = torch.tensor(ids)
        mask[b, L - len(ids):] = 1
        for out, col in zip(extra, columns):
            out[b, L - len(ids):] = torch.tensor(col[b])
    return (input_ids, mask, *extra)
