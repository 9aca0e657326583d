"""The README's Python examples run as written (the Hugging Face one needs a model: docs/hf.md)."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_examples_run():
    runnable = [b for b in BLOCKS if "patch_model" not in b]
    assert len(runnable) >= 2
    namespace: dict = {}
    for block in runnable:  # blocks share a namespace, as in a notebook
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["ropekit"].ptd(namespace["pos"][namespace["is_text"]],
                                   namespace["pos"][~namespace["is_text"]]) == pytest.approx(0.0, abs=1e-5)
