"""examples/finetune_vlm.py runs end to end on a tiny random Qwen2.5-VL: patch, train, save, reload, generate.

References: the loss the model starts from (training on the same full batch must lower it), the design
requested (every layer of the reloaded model must carry its AGE schedule), the trained model's logits
(the reloaded model must reproduce them bit for bit) and the example's own greedy answers (generate must
return them after the prompt).
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "finetune_vlm.py"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("finetune_vlm", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(recipe, tmp_path, *extra):
    args = ["--model", "tiny", "--pairs", "4", "--batch-size", "4", "--steps", "6", "--lr", "3e-3", "--cpu",
            "--output-dir", str(tmp_path / "out"), *extra]
    return recipe.main(args)


def test_recipe_trains_saves_reloads_and_generates(recipe, tmp_path):
    res = _run(recipe, tmp_path, "--trainer", "loop", "--design", "circle", "--age", "alternate")
    assert res["trainer"] == "loop" and len(res["losses"]) == 6
    assert res["losses"][-1] < res["losses"][0]  # one full batch, six AdamW steps: the loss goes down
    assert res["layers"] == res["reloaded_layers"] == ["circle", "mrope", "circle", "mrope"]
    assert res["same_logits"]
    saved = json.loads((tmp_path / "out" / "config.json").read_text())["ropekit"]
    assert (saved["design"], saved["age"]) == ("circle", "alternate")
    # generate (cached decoding of the patched model) starts with the teacher-forced argmax after the prompt
    model, data = res["model"], res["dataset"]
    eos = model.config.get_text_config().eos_token_id
    for pair, answer in zip(data.pairs, res["answers"]):
        ids = pair.prompt[None]
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), image_grid_thw=pair.grid[None],
                           mm_token_type_ids=(ids == data.image_token).long(), pixel_values=pair.pixel_values).logits
        assert answer[0] == int(logits[0, -1].argmax())
        assert len(answer) == 2 or answer == [eos]  # two new tokens unless the first ends the sequence


def test_recipe_takes_any_design(recipe, tmp_path):
    res = _run(recipe, tmp_path, "--trainer", "loop", "--design", "vrope", "--age", "none", "--steps", "2")
    assert res["reloaded_layers"] == ["vrope"] * 4 and res["same_logits"]


def test_synthetic_pairs_mask_the_prompt(recipe):
    model = recipe.tiny_model()
    image_token = model.config.image_token_id
    pairs = recipe.synthetic_pairs(model, 3)
    batch = recipe.collate([recipe.PairDataset(pairs, image_token)[i] for i in range(3)])
    for b, p in enumerate(pairs):
        n, P = p.prompt.numel(), p.prompt.numel() + 2
        assert (batch["labels"][b, :n] == -100).all() and (batch["labels"][b, P:] == -100).all()
        assert torch.equal(batch["labels"][b, n:P], p.answer)
        assert int(batch["attention_mask"][b].sum()) == P
        # image tokens: one per merge² patches of the grid, and the pixel rows match the grid
        assert int((p.prompt == image_token).sum()) == int(p.grid.prod()) // 4 == p.pixel_values.shape[0] // 4
    assert batch["pixel_values"].shape[0] == int(batch["image_grid_thw"].prod(1).sum())


def test_trainer_path(recipe, tmp_path):
    """With accelerate installed the transformers Trainer runs the recipe; without it, a clear error."""
    if recipe.accelerate_available():
        res = _run(recipe, tmp_path, "--trainer", "hf")
        assert res["trainer"] == "hf" and res["same_logits"] and res["losses"][-1] < res["losses"][0]
    else:
        with pytest.raises(RuntimeError, match="needs the `accelerate` package.*--trainer loop"):
            _run(recipe, tmp_path, "--trainer", "hf")


def test_trainer_hf_without_accelerate_fails_first_with_one_line(recipe, tmp_path, monkeypatch):
    """The check comes before the (possibly minutes-long) model load, and the script prints one line."""
    monkeypatch.setattr(recipe, "accelerate_available", lambda: False)
    monkeypatch.setattr(recipe, "load_model", lambda *a: pytest.fail("loaded the model before the check"))
    with pytest.raises(recipe.MissingAccelerate, match="python -m pip install 'accelerate>=1.1'"):
        _run(recipe, tmp_path, "--trainer", "hf")
    # as a script, with accelerate hidden from the import system (a None entry makes find_spec return None)
    code = ("import runpy, sys; sys.modules['accelerate'] = None; "
            f"sys.argv = ['finetune_vlm.py', '--trainer', 'hf', '--output-dir', {str(tmp_path / 'out')!r}]; "
            f"runpy.run_path({str(EXAMPLE)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "finetune_vlm.py: error: --trainer hf: the transformers Trainer needs the `accelerate` package, which is "
        "not installed; install it with `python -m pip install 'accelerate>=1.1'`, or use --trainer loop")
