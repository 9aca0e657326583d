"""Fine-tune a Qwen-VL model patched with a ropekit design, save it, reload it and generate.

    python examples/finetune_vlm.py --model tiny --design circle --age alternate --steps 20
    python examples/finetune_vlm.py --model Qwen/Qwen2.5-VL-3B-Instruct --trainer hf --bf16 ...

The recipe (docs/finetune.md):

1. load the model (``--model tiny`` builds a small random Qwen2.5-VL from a config, no download);
2. ``ropekit.patch_model(model, design, age=..., allocation=...)`` — Circle-RoPE with AGE by default;
3. train on image–text pairs: here a handful of synthetic ones (random pixel patches whose brightness
   decides a one-token answer), with ``input_ids`` built from token ids directly (no tokenizer) and the
   labels masked (−100) on the prompt; with the transformers ``Trainer`` (``--trainer hf``, needs
   ``accelerate``, which is also what scales it to many GPUs through accelerate / torchrun / DeepSpeed /
   FSDP) or a plain PyTorch loop (``--trainer loop``);
4. ``save_pretrained``: the patch is recorded in ``config.json`` under ``ropekit``;
5. reload with ``AutoModelForImageTextToText.from_pretrained`` (it comes back patched, from the record),
   check the reloaded model gives the trained model's logits, and ``generate`` an answer per image.

:func:`main` returns a dict of what happened (losses, the design per layer, the generated answers) so
the test suite can run the recipe end to end on the tiny model.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

import ropekit
from ropekit.hf import layer_designs

# token ids of the synthetic task (any checkpoint's vocabulary has them; they need no tokenizer)
PAD = 0
PROMPT_IDS = range(1, 60)  # "words" of the prompt
ANSWER_BASE = 60  # answer for class c is the token ANSWER_BASE + c
CLASSES = 4


# --------------------------------------------------------------------------------------------------
# model


def tiny_model(seed: int = 0):
    """A small random Qwen2.5-VL (4 layers, hidden 32, head_dim 16) built from a config."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=32, intermediate_size=48, num_attention_heads=2, num_key_value_heads=1,
                         vocab_size=80, num_hidden_layers=4, bos_token_id=None, eos_token_id=72,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, hidden_size=16, out_hidden_size=32, intermediate_size=16, num_heads=2,
                           spatial_merge_size=2, tokens_per_second=2, fullatt_block_indexes=[0], patch_size=2,
                           temporal_patch_size=2, window_size=8),
        image_token_id=70, video_token_id=71,
    )
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(cfg)


def load_model(name: str, dtype: torch.dtype):
    if name == "tiny":
        return tiny_model()
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(name, dtype=dtype)


def _vision(model) -> tuple[int, int, int]:
    """(image token id, values per pixel patch, spatial merge size) from the model's config."""
    cfg = model.config
    v = cfg.vision_config
    channels = getattr(v, "in_channels", None) or getattr(v, "in_chans", 3)
    return int(cfg.image_token_id), channels * v.temporal_patch_size * v.patch_size ** 2, v.spatial_merge_size


def _eos(model) -> int:
    eos = getattr(model.config.get_text_config(), "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    return ANSWER_BASE + CLASSES if eos is None else int(eos)


# --------------------------------------------------------------------------------------------------
# synthetic image–text pairs


@dataclass
class Pair:
    prompt: torch.Tensor  # (P,) token ids: words, image tokens, words
    answer: torch.Tensor  # (2,) the class token, then end of sequence
    pixel_values: torch.Tensor  # (h · w, patch values)
    grid: torch.Tensor  # (3,) image_grid_thw = (1, h, w) in patches


def synthetic_pairs(model, n: int, seed: int = 0) -> list[Pair]:
    """``n`` pairs: an image of random size whose brightness (class c) the answer token names."""
    image_token, patch_values, merge = _vision(model)
    eos = _eos(model)
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        c = i % CLASSES
        h, w = (merge * int(torch.randint(1, 4, (1,), generator=g)) for _ in range(2))
        words = lambda k: torch.tensor(PROMPT_IDS)[torch.randint(0, len(PROMPT_IDS), (k,), generator=g)]
        prompt = torch.cat([words(3), torch.full((h * w // merge ** 2,), image_token), words(2)])
        pixels = 0.1 * torch.randn(h * w, patch_values, generator=g) + (c - CLASSES / 2)
        pairs.append(Pair(prompt, torch.tensor([ANSWER_BASE + c, eos]), pixels, torch.tensor([1, h, w])))
    return pairs


class PairDataset(torch.utils.data.Dataset):
    """The pairs as model inputs: ``input_ids`` = prompt + answer, ``labels`` −100 on the prompt."""

    def __init__(self, pairs: list[Pair], image_token: int):
        self.pairs, self.image_token = pairs, image_token

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict:
        p = self.pairs[i]
        ids = torch.cat([p.prompt, p.answer])
        labels = torch.cat([torch.full_like(p.prompt, -100), p.answer])
        return dict(input_ids=ids, labels=labels, pixel_values=p.pixel_values, image_grid_thw=p.grid[None],
                    mm_token_type_ids=(ids == self.image_token).long())


def collate(items: list[dict]) -> dict:
    """Right-pad a batch (labels −100 and attention 0 on the padding); images concatenated in order."""
    L = max(x["input_ids"].numel() for x in items)
    B = len(items)
    out = dict(input_ids=torch.full((B, L), PAD), labels=torch.full((B, L), -100),
               attention_mask=torch.zeros(B, L, dtype=torch.long), mm_token_type_ids=torch.zeros(B, L, dtype=torch.long))
    for b, x in enumerate(items):
        n = x["input_ids"].numel()
        for k in ("input_ids", "labels", "mm_token_type_ids"):
            out[k][b, :n] = x[k]
        out["attention_mask"][b, :n] = 1
    out["pixel_values"] = torch.cat([x["pixel_values"] for x in items])
    out["image_grid_thw"] = torch.cat([x["image_grid_thw"] for x in items])
    return out


# --------------------------------------------------------------------------------------------------
# training


def train_loop(model, dataset, args) -> list[float]:
    """Plain PyTorch: AdamW, one optimizer step per batch, ``args.steps`` steps over the shuffled pairs."""
    device = next(model.parameters()).device
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(args.seed))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    losses, step = [], 0
    while step < args.steps:
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
            step += 1
            if step == args.steps:
                break
    model.eval()
    return losses


def accelerate_available() -> bool:
    return importlib.util.find_spec("accelerate") is not None


class MissingAccelerate(RuntimeError):
    """``--trainer hf`` without the ``accelerate`` package (the script prints it as one line and exits)."""


def require_accelerate() -> None:
    if not accelerate_available():
        raise MissingAccelerate(
            "--trainer hf: the transformers Trainer needs the `accelerate` package, which is not installed; "
            "install it with `python -m pip install 'accelerate>=1.1'`, or use --trainer loop"
        )


def train_hf(model, dataset, args) -> list[float]:
    """The transformers ``Trainer`` (accelerate / torchrun / DeepSpeed / FSDP scale it out)."""
    require_accelerate()
    import inspect

    from transformers import Trainer, TrainingArguments

    # transformers 5.23 renamed gradient_checkpointing to activation_checkpointing: use the installed name
    names = inspect.signature(TrainingArguments).parameters
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    targs = TrainingArguments(
        output_dir=str(Path(args.output_dir) / "trainer"), max_steps=args.steps,
        per_device_train_batch_size=args.batch_size, learning_rate=args.lr, lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", report_to=[], remove_unused_columns=False, seed=args.seed,
        bf16=args.bf16, use_cpu=args.cpu, deepspeed=args.deepspeed, fsdp=args.fsdp or "", dataloader_pin_memory=False,
        **{checkpointing: args.gradient_checkpointing},
    )
    trainer = Trainer(model=model, args=targs, train_dataset=dataset, data_collator=collate)
    trainer.train()
    model.eval()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


# --------------------------------------------------------------------------------------------------
# the recipe


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, except where the help says it already or there is none (flags)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or any(action.default is d for d in (None, False, argparse.SUPPRESS)):
            return text
        return super()._get_help_string(action)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=_HelpFormatter)
    p.add_argument("--model", default="tiny", help="checkpoint name or folder, or 'tiny' (random, no download)")
    p.add_argument("--design", default="circle", help="ropekit design (ropekit.designs())")
    p.add_argument("--age", default="alternate", help="AGE schedule ('none' for the design on every layer)")
    p.add_argument("--allocation", default=None, help="frequency allocation (default: the design's own)")
    p.add_argument("--trainer", choices=("auto", "hf", "loop"), default="auto",
                   help="hf: transformers Trainer (needs accelerate); loop: plain PyTorch; auto: hf if available")
    p.add_argument("--pairs", type=int, default=8, help="synthetic image–text pairs")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=4, help="pairs per step")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic pairs, the tiny model and training")
    p.add_argument("--bf16", action="store_true", help="bf16 weights/autocast (GPUs)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in the backward pass")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even when a GPU is present")
    p.add_argument("--deepspeed", default=None, help="DeepSpeed config JSON (Trainer only)")
    p.add_argument("--fsdp", default=None, help="FSDP options, e.g. 'full_shard auto_wrap' (Trainer only)")
    p.add_argument("--max-new-tokens", type=int, default=2, help="tokens generated per answer after reloading")
    p.add_argument("--output-dir", default="finetuned-vlm", help="folder the fine-tuned model is saved to")
    args = p.parse_args(argv)
    if args.steps < 1 or args.pairs < 1 or args.batch_size < 1:
        p.error("--steps, --pairs and --batch-size must be >= 1")
    return args


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse_args(argv)
    if args.trainer == "hf":
        require_accelerate()  # before loading a checkpoint that may take minutes
    torch.manual_seed(args.seed)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    model = load_model(args.model, dtype)
    model.generation_config.pad_token_id = PAD
    age = None if args.age == "none" else args.age
    ropekit.patch_model(model, args.design, age=age, allocation=args.allocation)
    layers = layer_designs(model)
    print(f"patched: {args.design} (age={age}) → layers {layers}", flush=True)

    image_token = _vision(model)[0]
    dataset = PairDataset(synthetic_pairs(model, args.pairs, seed=args.seed), image_token)
    use_hf = args.trainer == "hf" or (args.trainer == "auto" and accelerate_available())
    if use_hf:
        losses = train_hf(model, dataset, args)
    else:
        if args.gradient_checkpointing:  # the 5.23+ name, else the older one
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        if torch.cuda.is_available() and not args.cpu:
            model.cuda()
        losses = train_loop(model, dataset, args)
    print(f"trained {len(losses)} steps with {'Trainer' if use_hf else 'a PyTorch loop'}: "
          f"loss {losses[0]:.3f} → {losses[-1]:.3f}", flush=True)

    out = Path(args.output_dir)
    model.save_pretrained(out)
    # transformers' Auto classes load the checkpoint patched, from the design recorded in out/config.json
    from transformers import AutoModelForImageTextToText

    reloaded = AutoModelForImageTextToText.from_pretrained(out, dtype=dtype).to(next(model.parameters()).device).eval()
    reloaded.generation_config.pad_token_id = PAD
    probe = collate([dataset[i] for i in range(min(len(dataset), CLASSES))])
    probe = {k: v.to(next(model.parameters()).device) for k, v in probe.items() if k != "labels"}
    with torch.no_grad():
        same = torch.equal(model(**probe).logits, reloaded(**probe).logits)
    answers = generate_answers(reloaded, dataset, args.max_new_tokens)
    print(f"reloaded from {out}: layers {layer_designs(reloaded)}, same logits as trained: {same}")
    print(f"answers (class token, expected): {[(a[0], ANSWER_BASE + i % CLASSES) for i, a in enumerate(answers)]}")
    return dict(losses=losses, layers=layers, reloaded_layers=layer_designs(reloaded), same_logits=same,
                answers=answers, trainer="hf" if use_hf else "loop", output_dir=str(out), model=reloaded,
                dataset=dataset)


def generate_answers(model, dataset: PairDataset, max_new_tokens: int) -> list[list[int]]:
    """Greedy answers to each pair's prompt (one prompt at a time: no padding to reason about)."""
    device = next(model.parameters()).device
    answers = []
    for p in dataset.pairs:
        inputs = dict(input_ids=p.prompt[None], attention_mask=torch.ones(1, p.prompt.numel(), dtype=torch.long),
                      mm_token_type_ids=(p.prompt == dataset.image_token).long()[None],
                      pixel_values=p.pixel_values.to(model.dtype), image_grid_thw=p.grid[None])
        inputs = {k: v.to(device) for k, v in inputs.items()}
        with torch.no_grad():
            seq = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        answers.append(seq[0, p.prompt.numel():].tolist())
    return answers


if __name__ == "__main__":
    try:
        result = main()
    except MissingAccelerate as e:
        sys.exit(f"{Path(__file__).name}: error: {e}")  # one line on stderr, exit status 1
    sys.exit(0 if result["same_logits"] and not math.isnan(result["losses"][-1]) else 1)
