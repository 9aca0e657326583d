"""A saved ropekit checkpoint evaluated by lmms-eval: loading and one generation, offline, on a tiny model.

``python dev/lmms_eval_check.py [--workdir DIR]``, with a Python that has lmms-eval 0.7.3 and ropekit (``make
test-lmms`` builds one in ``.venv-lmms``; docs/finetune.md, "Evaluating with lmms-eval"). Nothing is downloaded:

1. a tiny random Qwen2-VL (2 layers, hidden 64, head_dim 32) with a byte-level BPE tokenizer trained here with
   ``tokenizers`` on a few sentences, a chat template and Qwen2-VL's image and video processors, all saved with the
   checkpoint;
2. the model patched with Circle-RoPE under AGE and saved (``config.json``: model type ``"ropekit"``);
3. lmms-eval's own CLI (``python -m lmms_eval``) with ``--model ropekit`` (the model ropekit registers through
   lmms-eval's ``lmms_eval.models`` entry points) on a local task made here: one document, one image made with
   PIL, a text question, greedy generation of 8 tokens, ``--log_samples``;
4. the answer lmms-eval logged is compared with the patched model's own greedy generation from the same
   processor inputs (loaded with ``ropekit.hf.from_pretrained``), and with the stock model's
   (``ropekit.hf.load_stock``), which must differ somewhere on a set of prompts so that the comparison means
   something. It also checks that the call lmms-eval's Qwen-specific backends load with (the family's own class)
   refuses the checkpoint by name.

Exit status 0 and a last line ``lmms-eval check: ok`` when everything holds.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
CORPUS = ["You are a helpful assistant.", "Describe the image in one word.", "What colour is the square?",
          "user assistant system", "The square is red. The square is blue. A cat sat on a mat.",
          "0 1 2 3 4 5 6 7 8 9 yes no maybe image video frame"]
#: Qwen2-VL's prompt layout in a short Jinja template: each image is <|vision_start|><|image_pad|><|vision_end|>
#: (the processor repeats <|image_pad|> once per merged patch)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QUESTION = "Describe the image in one word."
MAX_NEW_TOKENS = 8


def build_processor():
    """Qwen2-VL's processor with a tokenizer trained here (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (PreTrainedTokenizerFast, Qwen2VLImageProcessor, Qwen2VLProcessor,
                              Qwen2VLVideoProcessor)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        chat_template=CHAT_TEMPLATE)
    pixels = dict(patch_size=2, temporal_patch_size=2, merge_size=2, min_pixels=16 * 16, max_pixels=32 * 32)
    return Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**pixels),
                            video_processor=Qwen2VLVideoProcessor(**pixels), tokenizer=tokenizer,
                            chat_template=CHAT_TEMPLATE)


def build_checkpoint(path: Path) -> None:
    """The tiny Qwen2-VL, patched (Circle-RoPE, AGE) and saved with its processor."""
    import ropekit
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    processor = build_processor()
    tok = processor.tokenizer
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    cfg = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
                         bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=1, spatial_merge_size=2,
                           patch_size=2, temporal_patch_size=2),  # head_dim 32: the smallest vLLM's CPU attention takes
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # larger random weights than the initialiser's, so that positions move the greedy tokens
        for p in model.model.language_model.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.5)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    ropekit.patch_model(model, "circle", age="alternate")
    model.save_pretrained(path)
    processor.save_pretrained(path)


def make_task(folder: Path, image: Path) -> None:
    """A one-document lmms-eval task read from a local JSON file (the image as a file path)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.jsonl").write_text(json.dumps({"id": 0, "image": str(image), "question": QUESTION,
                                                   "answer": "red"}) + "\n")
    (folder / "ropekit_tiny.yaml").write_text(f"""task: ropekit_tiny
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / 'data.jsonl'}
test_split: test
output_type: generate_until
doc_to_messages: !function utils.doc_to_messages
doc_to_text: !function utils.doc_to_text
doc_to_visual: !function utils.doc_to_visual
doc_to_target: answer
generation_kwargs:
  max_new_tokens: {MAX_NEW_TOKENS}
  temperature: 0
  do_sample: false
process_results: !function utils.process_results
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""")
    (folder / "utils.py").write_text('''from PIL import Image


def doc_to_visual(doc):
    return [Image.open(doc["image"]).convert("RGB")]


def doc_to_text(doc):
    return doc["question"]


def doc_to_messages(doc):
    return [{"role": "user", "content": [{"type": "image", "url": doc_to_visual(doc)[0]},
                                         {"type": "text", "text": doc["question"]}]}]


def process_results(doc, results):
    return {"exact_match": float(results[0].strip() == doc["answer"])}
''')


def reference_answers(ckpt: Path, image: Path, questions: list[str]) -> tuple[list[str], list[str]]:
    """Greedy answers of the patched model (loaded with ropekit) and of the stock model, from the processor."""
    from PIL import Image
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    from ropekit.hf import from_pretrained, is_patched, load_stock

    processor = AutoProcessor.from_pretrained(ckpt)
    patched = from_pretrained(str(ckpt), Qwen2VLForConditionalGeneration).eval()
    stock = load_stock(str(ckpt), Qwen2VLForConditionalGeneration).eval()
    assert is_patched(patched) and not is_patched(stock)
    img = Image.open(image).convert("RGB")
    out = ([], [])
    for q in questions:
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        inputs = processor(text=[text], images=[img], return_tensors="pt")
        for model, answers in zip((patched, stock), out):
            with torch.no_grad():
                ids = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
            answers.append(processor.batch_decode(ids[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)[0])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default=None, help="folder for the checkpoint, the task and the logs (default: a "
                                                   "temporary one); they are kept there")
    args = p.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="ropekit-lmms-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(work / "hf-home"),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    os.environ.update(env)

    from PIL import Image

    ckpt, image = work / "ckpt-circle", work / "square.png"
    build_checkpoint(ckpt)
    img = Image.new("RGB", (32, 32), (200, 30, 30))
    img.paste((20, 20, 220), (8, 8, 24, 24))
    img.save(image)
    saved = json.loads((ckpt / "config.json").read_text())
    assert saved["model_type"] == "ropekit", saved["model_type"]
    make_task(work / "task", image)

    # 1. lmms-eval's CLI with ropekit's model, on the local task
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "ropekit", "--model_args",
           f"pretrained={ckpt},device=cpu,device_map=cpu,dtype=float32", "--tasks", "ropekit_tiny", "--include_path",
           str(work / "task"), "--batch_size", "1", "--log_samples", "--output_path", str(work / "logs")]
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or "Error during evaluation" in done.stdout + done.stderr:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")  # (lmms-eval 0.7.3 exits 0 after such an error)
        raise SystemExit(f"lmms-eval failed (exit status {done.returncode})")
    logged = sorted(glob.glob(str(work / "logs" / "**" / "*samples_ropekit_tiny*.jsonl"), recursive=True))
    assert logged, f"no sample log under {work / 'logs'}"
    sample = json.loads(Path(logged[-1]).read_text().splitlines()[0])
    answer = sample["filtered_resps"][0] if isinstance(sample["filtered_resps"], list) else sample["filtered_resps"]
    answer = answer[0] if isinstance(answer, list) else answer
    print(f"lmms-eval answered {answer!r}", flush=True)

    # 2. the same generation from the patched model directly; the stock model must answer differently somewhere
    questions = [QUESTION, "What colour is the square?", "Describe the image.", "yes or no?"]
    patched, stock = reference_answers(ckpt, image, questions)
    assert answer == patched[0], f"lmms-eval's answer {answer!r} is not the patched model's {patched[0]!r}"
    assert patched != stock, "the stock model answers as the patched one on every prompt: the check cannot see positions"
    print(f"patched model answered {patched[0]!r}; stock model {stock[0]!r} (differs on "
          f"{sum(a != b for a, b in zip(patched, stock))} of {len(questions)} prompts)", flush=True)

    # 3. lmms-eval's Qwen-specific backends load with the family's own class (qwen2_vl:
    #    Qwen2VLForConditionalGeneration.from_pretrained(pretrained, ...)): refused by name, never the stock model
    code = ("import lmms_eval.models, ropekit\nfrom transformers import Qwen2VLForConditionalGeneration\n"
            f"Qwen2VLForConditionalGeneration.from_pretrained({str(ckpt)!r}, dtype='auto', device_map='cpu')")
    refused = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "saved from a model patched by ropekit" in refused.stderr, refused.stderr[-2000:]
    print("the family class lmms-eval's qwen2_vl backend loads with refuses the checkpoint by name", flush=True)
    print("lmms-eval check: ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
