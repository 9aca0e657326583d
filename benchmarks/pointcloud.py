"""Training-step time and peak memory of the point transformer with Linear GeoPE vs axial 3-D RoPE, by points.

One case = one family at one point count: the ``quick`` point transformer of ``ropekit experiment
pointcloud`` (width 48, depth 2, 2 heads), a batch of ``BATCH`` procedural scenes, and full training steps
(forward, cross-entropy, backward, AdamW). Each case runs in a fresh process: one warm-up step (Linear
GeoPE compiles its fused kernel there), then the resident high-water mark is reset
(``/proc/self/clear_refs``) and ``steps`` more steps are timed; ``extra_mib`` is the high-water mark minus
the resident size before them, the memory the steps needed at their peak.

Linear GeoPE runs in query blocks of 256 and checkpoints each block (as the model does once a sequence
has more than one block), so its working set is ``O(block · L)`` per layer; the ``linear-geope-nockpt``
case turns the checkpointing off, which keeps every block's attention probabilities for backward, the
``O(L²)`` an unblocked attention needs. ``unblocked_attention_mib`` is that ``L²`` term computed (float32
scores and probabilities of every layer, batch and head, kept for backward); ``block_working_set_mib``
the blocked kernel's ``(block, L)`` float32 temporaries. Axial RoPE uses
``F.scaled_dot_product_attention`` (the fused CPU kernel where torch picks it).

Run: ``python -m benchmarks.run --only pointcloud`` (``--quick``: 512 and 1 024 points only).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
FAMILIES = ("axial", "linear-geope", "linear-geope-nockpt")
POINTS = (512, 1024, 2048)
BATCH = 2
BLOCK = 256  # the query block the point transformer passes to linear_geope_attention

CHILD = r"""
import json, sys, time, torch
import ropekit.experiments.vision as V
from ropekit.experiments.pointcloud import PRESETS, make_model
from ropekit.experiments.tasks.points import scene_batch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
family = cfg["family"]
if family.endswith("-nockpt"):  # the same kernel, every block's probabilities kept for backward
    inner = V.linear_geope_attention
    V.linear_geope_attention = lambda *a, **kw: inner(*a, **{**kw, "use_checkpoint": False})
    family = family[: -len("-nockpt")]
preset = PRESETS["quick"]
torch.manual_seed(0)
model = make_model(family, preset)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
t = preset["task"]
batch = scene_batch(cfg["batch"], cfg["points"], g=torch.Generator().manual_seed(0), primitives=4,
                    extent=t["extent"], noise=t["noise"])  # 4 primitives (as `full`): the point counts divide by 4
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) / 1024.0 for l in f if l.startswith(key))
def step():
    loss = torch.nn.functional.cross_entropy(model(batch.tokens), batch.target)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
t0 = time.perf_counter()
step()
first = time.perf_counter() - t0
base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # reset the resident high-water mark (Linux)
times = []
for _ in range(cfg["steps"]):
    t0, c0 = time.perf_counter(), time.process_time()
    step()
    times.append((time.perf_counter() - t0, time.process_time() - c0))
peak = status("VmHWM")
wall = sorted(w for w, _ in times)[len(times) // 2]
cpu = sorted(c for _, c in times)[len(times) // 2]
print(json.dumps({"first_step_s": round(first, 3), "step_s": round(wall, 4), "step_cpu_s": round(cpu, 4),
                  "baseline_mib": round(base, 1), "extra_mib": round(peak - base, 1)}))
"""


def _case(cfg: dict) -> dict:
    # a fixed mmap threshold hands large freed buffers back to the system at once, so the high-water mark
    # follows the live tensors rather than the allocator's cache
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": str(cfg["threads"]),
           "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {**cfg, "error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return {**cfg, **json.loads(proc.stdout.strip().splitlines()[-1])}


def analytic_mib(points: int, *, batch: int = BATCH, heads: int = 2, depth: int = 2, block: int = BLOCK) -> dict:
    """float32 MiB of the ``L²`` attention an unblocked layer keeps for backward (scores and probabilities,
    every layer), and of one query block's ``(block, L)`` scores in the blocked kernel."""
    mib = 4 / 2**20
    return {"unblocked_attention_mib": round(2 * depth * batch * heads * points * points * mib, 1),
            "block_working_set_mib": round(batch * heads * min(block, points) * points * mib, 1)}


def run(*, quick: bool = False, repeat: int = 3, log=print, threads: int | None = None) -> list[dict]:
    import torch

    threads = threads or torch.get_num_threads()
    rows = []
    for points in POINTS[:2] if quick else POINTS:
        for family in FAMILIES:
            row = _case({"family": family, "points": points, "batch": BATCH, "steps": repeat, "threads": threads})
            row.update(analytic_mib(points))
            rows.append(row)
            log(json.dumps(row))
    by = {(r["family"], r["points"]): r for r in rows}
    for r in rows:
        ref = by.get(("axial", r["points"]), {})
        if "step_s" in r and "step_s" in ref:
            r["step_vs_axial"] = round(r["step_s"] / ref["step_s"], 2)
            r["cpu_vs_axial"] = round(r["step_cpu_s"] / ref["step_cpu_s"], 2)
    log("point transformer training step, Linear GeoPE / axial: " + ", ".join(
        f"{r['points']} points {r['cpu_vs_axial']:.1f}x CPU, {r['extra_mib']:.0f} MiB"
        for r in rows if r["family"] == "linear-geope" and "cpu_vs_axial" in r))
    return [{"model": "pointcloud quick (width 48, depth 2, 2 heads)", "batch": BATCH, "block": BLOCK, "rows": rows}]


if __name__ == "__main__":
    out = run(quick="--quick" in sys.argv)
    print(json.dumps(out, indent=1))
