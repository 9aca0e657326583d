"""Peak extra memory of Linear GeoPE attention on a 64×64 grid (L = 4096), head_dim 96, one head.

Each case runs in a fresh Python process: it builds its inputs, runs Linear GeoPE once to warm up (its
fused kernel compiles there, which needs memory of its own), resets the resident high-water mark
(``/proc/self/clear_refs``), runs the attention, and reads the mark (``VmHWM``) minus the resident size
before the call: the extra memory the call needed at its peak. ``fused`` false rows time the eager path. The paper's way (materialise every relative rotation, ``(L, L, n, 3, 3)``) cannot
run at this size on this machine, so its size is computed, and it is measured at smaller grids.
Memory is measured on the CPU (the project's reference platform); GPU kernels would change the
constant, not the O(block × L) shape.

Run: ``python benchmarks/linear_geope_memory.py`` → ``benchmarks/results/linear_geope_memory.json``.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

RESULT = Path(__file__).resolve().parent / "results" / "linear_geope_memory.json"

CHILD = r"""
import json, sys, time, torch
from ropekit.apply.linear_geope import linear_geope_attention
from ropekit.rotations.geope import geope_frequencies, geope_rotation
from ropekit.apply.geope import apply_geope
cfg = json.loads(sys.argv[1])
torch.manual_seed(0)
torch.set_num_threads(cfg.get("threads", 2))
side, D, mode = cfg["side"], cfg["head_dim"], cfg["mode"]
L = side * side
ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
pos = torch.stack((ys.flatten(), xs.flatten()), -1).float()
grad = cfg.get("backward", False)
q, k, v = (torch.randn(1, 1, L, D, requires_grad=grad) for _ in range(3))
def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) / 1024.0 for l in f if l.startswith(key))
def run():
    if mode == "linear":
        return linear_geope_attention(q, k, v, pos, block_size=cfg["block"], fused=cfg.get("fused"))
    if mode == "geope_sdpa":
        rot = geope_rotation(pos, D)
        return torch.nn.functional.scaled_dot_product_attention(apply_geope(q, rot), apply_geope(k, rot), v)
    if mode == "sdpa":
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    if mode == "materialised":  # the paper's way: every relative rotation as a 3x3 matrix
        n = D // 3
        f = geope_frequencies(D)
        u = torch.cat((torch.zeros(L, n, 1), pos[:, None, :] * f[None, :, None] / 4), -1)
        rel = 2 * (u[None] - u[:, None])                            # (L, L, n, 3) rotation vectors
        ang = rel.norm(dim=-1, keepdim=True)
        a = rel / ang.clamp_min(1e-30)
        K = torch.zeros(L, L, n, 3, 3)
        K[..., 0, 1], K[..., 0, 2], K[..., 1, 2] = -a[..., 2], a[..., 1], -a[..., 0]
        K = K - K.transpose(-1, -2)
        s, c = torch.sin(ang)[..., None], torch.cos(ang)[..., None]
        R = torch.eye(3) + s * K + (1 - c) * (K @ K)                  # (L, L, n, 3, 3)
        qt, kt = q[0, 0].unflatten(-1, (n, 3)), k[0, 0].unflatten(-1, (n, 3))
        scores = torch.einsum("mic,mnicd,nid->mn", qt, R, kt) / D ** 0.5
        return (torch.softmax(scores, -1) @ v[0, 0])[None, None]
    raise ValueError(mode)
def call():
    with torch.no_grad() if not grad else torch.enable_grad():
        out = run()
        if grad:
            torch.autograd.grad(out.sum(), (q, k, v))
if mode == "linear":
    call()
base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # reset the resident high-water mark (Linux)
t0 = time.perf_counter()
call()
secs = time.perf_counter() - t0
peak = status("VmHWM")
print(json.dumps({"baseline_mib": round(base, 1), "peak_mib": round(peak, 1),
                  "extra_mib": round(peak - base, 1), "seconds": round(secs, 2)}))
"""


def _run(cfg: dict) -> dict:
    # a fixed mmap threshold makes glibc hand large freed buffers back at once, so the peak resident
    # size follows the peak of live tensors instead of the allocator's cache
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {**cfg, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return {**cfg, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> dict:
    D = 96
    n = D // 3
    cases = []
    for side in (64,):
        L = side * side
        cases.append({"mode": "sdpa", "side": side, "head_dim": D})
        cases.append({"mode": "geope_sdpa", "side": side, "head_dim": D})
        for block in (32, 128, 256):
            cases.append({"mode": "linear", "side": side, "head_dim": D, "block": block})
        cases.append({"mode": "linear", "side": side, "head_dim": D, "block": 128, "fused": False})
        cases.append({"mode": "linear", "side": side, "head_dim": D, "block": 128, "backward": True})
    for side in (16, 24):  # the materialising way fits only at small grids
        cases.append({"mode": "materialised", "side": side, "head_dim": D})
        cases.append({"mode": "linear", "side": side, "head_dim": D, "block": 128})
    rows = []
    for cfg in cases:
        row = _run(cfg)
        L = cfg["side"] ** 2
        if cfg["mode"] == "linear" and cfg.get("fused") is False:
            # the eager path's largest temporary: (block, L, triple_chunk) float32, triple_chunk = 32 by default
            row["largest_temporary_mib"] = round(min(cfg["block"], L) * L * min(32, n) * 4 / 2**20, 1)
        elif cfg["mode"] == "linear":  # the fused kernel's: the (block, L) float32 scores
            row["largest_temporary_mib"] = round(min(cfg["block"], L) * L * 4 / 2**20, 1)
        if cfg["mode"] == "materialised":
            row["rotation_matrices_mib"] = round(L * L * n * 9 * 4 / 2**20, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    L = 64 * 64
    result = {
        "what": "peak extra resident memory (MiB) of one attention call, B=1, H=1, float32, CPU",
        "grid": "64x64 (L = 4096) unless 'side' says otherwise",
        "head_dim": D,
        "materialised_rotations_at_4096_mib": round(L * L * n * 9 * 4 / 2**20, 1),
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
        "rows": rows,
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
