"""Distributed training of a patched model with torch's own engines, two processes against one (gloo, CPU).

tests/dist_worker.py trains a patched tiny Qwen2-VL (Circle-RoPE with AGE) two steps under DDP and FSDP2 in float32,
FSDP2 with bfloat16 mixed precision (``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``), and FSDP2 on packed rows;
and reloads a sharded (DCP) and a full checkpoint. Reference: the same script in one process.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _run(world: int, out: Path) -> dict:
    src = str(HERE.parent / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(world), str(HERE / "dist_worker.py"), str(out)], env=env, timeout=400,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / f"world{world}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    return _run(1, out), _run(2, out)


@pytest.mark.parametrize("mode", ["ddp", "fsdp2", "fsdp2-packed"])
def test_two_processes_equal_one_in_float32(runs, mode):
    one, two = runs
    assert two[mode] == pytest.approx(one[mode], rel=2e-6, abs=1e-6)


def test_packed_rows_train_as_padded_ones(runs):
    """The same samples packed (one row per process) or run one by one: the same losses, step after step."""
    one, two = runs
    assert one["fsdp2-packed"] == pytest.approx(one["fsdp2"], rel=2e-6)
    assert two["fsdp2-packed"] == pytest.approx(two["fsdp2"], rel=2e-6)


def test_bfloat16_mixed_precision_trains_the_patched_model(runs):
    """FSDP2 casting the layers' arguments to bfloat16 keeps every geometry's tables (AGE): two processes equal one
    within bfloat16's resolution, and both stay near the float32 run."""
    one, two = runs
    assert two["fsdp2-bf16"] == pytest.approx(one["fsdp2-bf16"], rel=1e-2)
    assert one["fsdp2-bf16"] == pytest.approx(one["fsdp2"], rel=1e-2)


def test_checkpoints_restore_the_patched_model(runs):
    one, two = runs
    for r in (one, two):
        assert r["dcp-reloaded"] == pytest.approx(r["trained"], rel=1e-6)
        assert r["full-reloaded-patched"] is True
        assert r["full-reloaded"] == pytest.approx(r["trained"], rel=1e-5)
    assert two["trained"] == pytest.approx(one["trained"], rel=1e-5)
