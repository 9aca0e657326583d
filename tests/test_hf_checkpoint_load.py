"""A saved patched model loads as itself, in fresh interpreters: patched through transformers' Auto classes once
ropekit is imported (before or after transformers), refused by name where ropekit is not imported, never the stock
model by accident; the stock model only on purpose. Reference: the logits of the model that was saved."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import Qwen2VLForConditionalGeneration

import ropekit
from ropekit.hf import layer_designs, patch_model

from test_hf import STOCK_SAMPLES, _qwen2_cfg, make_batch

SRC = str(Path(__file__).resolve().parents[1] / "src")
TESTS = str(Path(__file__).resolve().parent)


def _run(code: str, tmp: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS]), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=tmp, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(_qwen2_cfg(3)).eval()
    inputs, _ = make_batch(STOCK_SAMPLES, pad="left")
    with torch.no_grad():
        stock = model(**inputs).logits
        patch_model(model, "circle", age="alternate")
        patched = model(**inputs).logits
    assert (patched - stock).abs().max() > 1e-4  # the check below can tell them apart
    model.save_pretrained(tmp / "model")
    saved_config = json.loads((tmp / "model" / "config.json").read_text())
    # the class names a serving engine dispatches on are ropekit's, so an engine without ropekit's plugin finds no
    # class for them instead of serving the family's stock positions (vLLM: tests_vllm/test_vllm_plugin.py)
    assert saved_config["architectures"] == ["RopekitQwen2VLForConditionalGeneration"]
    torch.save({"inputs": inputs, "patched": patched, "stock": stock, "layers": layer_designs(model)},
               tmp / "expected.pt")
    return tmp


PRELUDE = """
import sys, torch
def expected():
    return torch.load("expected.pt", weights_only=True)
def logits(model):
    with torch.no_grad():
        return model(**expected()["inputs"]).logits
"""


def test_without_ropekit_the_checkpoint_is_refused_by_name(saved):
    out = _run(PRELUDE + """
    import transformers
    for load in (transformers.AutoModelForImageTextToText.from_pretrained,
                 transformers.Qwen2VLForConditionalGeneration.from_pretrained):
        try:
            load("model")
        except Exception as e:
            assert "ropekit" in str(e), e
            print("refused", type(e).__name__)
        else:
            raise AssertionError("loaded without ropekit")
    assert "ropekit" not in sys.modules
    """.replace("\n    ", "\n"), saved)
    assert out.count("refused") == 2


@pytest.mark.parametrize("order", ["ropekit first", "transformers first"])
def test_auto_classes_load_it_patched(saved, order):
    imports = "import ropekit\nimport transformers\n" if order == "ropekit first" else \
        "import transformers\nimport ropekit\n"
    out = _run(PRELUDE + imports + """
model = transformers.AutoModelForImageTextToText.from_pretrained("model").eval()
assert ropekit.hf.is_patched(model)
assert isinstance(model, transformers.Qwen2VLForConditionalGeneration)
assert ropekit.hf.layer_designs(model) == expected()["layers"]
torch.testing.assert_close(logits(model), expected()["patched"], rtol=1e-6, atol=1e-6)
assert model.config.model_type == "qwen2_vl"
assert model.config.architectures == ["RopekitQwen2VLForConditionalGeneration"]  # what a server reads stays ropekit's
print("ok")
""", saved)
    assert out.strip().endswith("ok")


def test_a_second_save_round_trips_and_the_bare_model_loads_patched(saved):
    out = _run(PRELUDE + """
import ropekit, transformers
model = transformers.AutoModelForImageTextToText.from_pretrained("model").eval()
model.save_pretrained("again")
again = transformers.AutoModelForImageTextToText.from_pretrained("again").eval()
torch.testing.assert_close(logits(again), expected()["patched"], rtol=1e-6, atol=1e-6)
bare = transformers.AutoModel.from_pretrained("again")
assert ropekit.hf.is_patched(bare) and isinstance(bare, transformers.Qwen2VLModel)
print("ok")
""", saved)
    assert out.strip().endswith("ok")


def test_the_family_class_is_refused_and_the_stock_model_loads_on_purpose(saved):
    out = _run(PRELUDE + """
import ropekit, transformers
try:
    transformers.Qwen2VLForConditionalGeneration.from_pretrained("model")
except ValueError as e:
    assert "AutoModelForImageTextToText" in str(e) and "load_stock" in str(e), e
else:
    raise AssertionError("the family class built a model")
stock = ropekit.hf.load_stock("model").eval()
assert not ropekit.hf.is_patched(stock) and type(stock) is transformers.Qwen2VLForConditionalGeneration
assert stock.config.architectures == ["Qwen2VLForConditionalGeneration"]
torch.testing.assert_close(logits(stock), expected()["stock"], rtol=1e-6, atol=1e-6)
print("ok")
""", saved)
    assert out.strip().endswith("ok")


def test_in_memory_the_config_keeps_its_family_and_unpatching_saves_the_stock_form(tmp_path):
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(_qwen2_cfg(1))
    patch_model(model, "vrope")
    assert model.config.model_type == "qwen2_vl"
    assert model.config.to_dict()["model_type"] == "ropekit"
    ropekit.unpatch_model(model)
    assert model.config.to_dict()["model_type"] == "qwen2_vl"
    assert type(model.config).__name__ == "Qwen2VLConfig"
