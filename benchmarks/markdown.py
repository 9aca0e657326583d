"""Render benchmarks/results/*.json as the Markdown tables of docs/benchmarks.md:
``python -m benchmarks.markdown``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ORDER = ["transformers_qwen2vl", "rotary_embedding_torch", "ropekit_eager", "ropekit_blocks", "ropekit_fused",
         "ropekit_compiled"]


def machine_line(data: dict) -> str:
    m, bw = data["machine"], data["copy_bandwidth"]
    return (f"{m['cpu']}, {m['cpu_count']} cores, torch {m['torch']} with {m['torch_threads']} thread(s), "
            f"transformers {m['transformers']}, rotary-embedding-torch {m['rotary_embedding_torch']}; "
            f"copy bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s; median of {data['repeat']} interleaved runs")


def apply_table(data: dict) -> str:
    bw = data["copy_bandwidth"]["bytes_per_s"]
    names = [n for n in ORDER if any(n in r["cases"] for r in data["results"])]
    head = "| shape (B,H,L,D) | dtype | positions | " + " | ".join(names) + " |"
    rows = [head, "|" + "---|" * (3 + len(names))]
    for r in data["results"]:
        hf = r["cases"]["transformers_qwen2vl"]["median_s"]
        cells = []
        for n in names:
            c = r["cases"].get(n)
            cells.append("–" if c is None else
                         f"{c['median_s'] * 1e3:.1f} ms ×{hf / c['median_s']:.2f} ({c['bytes_per_s'] / bw:.0%})")
        rows.append(f"| {tuple(r['shape'])} | {r['dtype']} | {r['positions']} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


PREALLOC_ORDER = ["clone", "transformers_qwen2vl", "ropekit_fused", "ropekit_fused_out", "ropekit_fused_inplace"]


def prealloc_table(data: dict) -> str:
    """Each case's speed as a fraction of ``copy_`` into preallocated buffers of the same shape (same run)."""
    names = [n for n in PREALLOC_ORDER if any(n in r["cases"] for r in data["results"])]
    rows = ["| shape (B,H,L,D) | dtype | positions | copy_ (preallocated) | " + " | ".join(names) + " |",
            "|" + "---|" * (4 + len(names))]
    for r in data["results"]:
        c = r["cases"]
        if "copy_prealloc" not in c:
            continue
        cells = [f"{c[n]['median_s'] * 1e3:.1f} ms ({c[n]['vs_copy_prealloc']:.2f})" if n in c else "–" for n in names]
        rows.append(f"| {tuple(r['shape'])} | {r['dtype']} | {r['positions']} | "
                    f"{c['copy_prealloc']['median_s'] * 1e3:.1f} ms | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def cos_sin_table(data: dict) -> str:
    rows = ["| shape | dtype | positions | ropekit cos/sin | transformers cos/sin | ropekit apply (fused) | cos/sin ÷ apply |",
            "|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        cs = r["cos_sin"]["ropekit"]["median_s"]
        hf = r["cos_sin"]["transformers_qwen2vl"]["median_s"]
        ap = r["cases"]["ropekit_fused"]["median_s"]
        rows.append(f"| {tuple(r['shape'])} | {r['dtype']} | {r['positions']} | {cs * 1e3:.2f} ms | "
                    f"{hf * 1e3:.2f} ms | {ap * 1e3:.1f} ms | {cs / ap:.1%} |")
    return "\n".join(rows)


def index_table(data: dict) -> str:
    rows = ["| batch | samples | tokens | images | videos | transformers get_rope_index | ropekit rope_index | "
            "speed-up (wall) | speed-up (CPU time) |",
            "|---|---|---|---|---|---|---|---|---|"]
    designs = None
    for r in data["results"]:
        if "circle" in r:  # the Circle-RoPE comparison has a table of its own (docs/benchmarks.md)
            continue
        if "designs" in r:
            designs = r["designs"]
            continue
        cpu = f"×{r['speedup_cpu']:.2f}" if "speedup_cpu" in r else ""
        rows.append(f"| {r['batch']} | {r.get('samples', '2k-8k')} | {r['tokens']} | {r['images']} | {r['videos']} | "
                    f"{r['transformers_get_rope_index']['median_s'] * 1e3:.1f} ms | "
                    f"{r['ropekit_rope_index']['median_s'] * 1e3:.1f} ms | ×{r['speedup']:.2f} | {cpu} |")
    if designs:
        rows += ["", f"Every design with a block rule on the ~2.5k batch ({designs['tokens']} tokens, "
                     f"{designs['images']} images, {designs['videos']} videos), each in its own pair with transformers "
                     f"(CPU time, medians):", "",
                 "| design | ropekit rope_index | transformers get_rope_index | speed-up (CPU time) | speed-up (wall) |",
                 "|---|---|---|---|---|"]
        for name, d in designs["designs"].items():
            opts = ", ".join(f"{k}={v!r}" for k, v in d["options"].items())
            rows.append(f"| `{name}`{f' ({opts})' if opts else ''} | {d['ropekit']['cpu_median_s'] * 1e3:.2f} ms | "
                        f"{d['transformers']['cpu_median_s'] * 1e3:.1f} ms | ×{d['speedup_cpu']:.1f} | "
                        f"×{d['speedup']:.1f} |")
    return "\n".join(rows)


GEOPE_ORDER = ["planar_eager", "planar_fused", "directional_fused", "geope_eager", "geope_functional",
               "thirds_eager", "planar_compiled", "geope_compiled", "thirds_compiled"]


def geope_table(data: dict) -> str:
    """GeoPE / N-D apply times with the ratio to planar RoPE's fused path, rotation builds, Linear GeoPE."""
    res = data["results"]
    names = [n for n in GEOPE_ORDER if any(n in r["cases"] for r in res["apply"])]
    rows = ["| shape (B,H,L,D) | dtype | " + " | ".join(names) + " |", "|" + "---|" * (2 + len(names))]
    for r in res["apply"]:
        cells = []
        for n in names:
            c = r["cases"].get(n)
            cells.append("–" if c is None else f"{c['median_s'] * 1e3:.1f} ms ×{r['ratio_vs_planar_fused'][n]:.2f}")
        rows.append(f"| {tuple(r['shape'])} | {r['dtype']} | " + " | ".join(cells) + " |")
    compiled = [r for r in res["apply"] if "geope_compiled_vs_planar_compiled" in r]
    if compiled:
        rows += ["", "| shape (B,H,L,D) | dtype | compiled GeoPE / compiled planar: interleaved | thirds |",
                 "|---|---|---|---|"]
        rows += [f"| {tuple(r['shape'])} | {r['dtype']} | ×{r['geope_compiled_vs_planar_compiled']:.2f} | "
                 + (f"×{r['thirds_compiled_vs_planar_compiled']:.2f} |" if "thirds_compiled_vs_planar_compiled" in r
                    else "– |") for r in compiled]
    rows += ["", "| L | axial cos/sin | directional cos/sin | GeoPE rotation |", "|---|---|---|---|"]
    for b in res["build"]:
        c = b["cases"]
        rows.append(f"| {b['L']} | {c['axial']['median_s'] * 1e3:.2f} ms | {c['directional']['median_s'] * 1e3:.2f} ms | "
                    f"{c['geope']['median_s'] * 1e3:.2f} ms |")
    rows += ["", "| L (grid) | heads | SDPA + axial RoPE | Linear GeoPE | time ratio | peak extra memory (SDPA / Linear) |",
             "|---|---|---|---|---|---|"]
    for r in res["linear"]:
        a, b = r["sdpa_rope"], r["linear_geope"]
        if "error" in a or "error" in b:
            rows.append(f"| {r['L']} | {r['heads']} | {a.get('error', '')} | {b.get('error', '')} | – | – |")
            continue
        rows.append(f"| {r['L']} ({r['side']}×{r['side']}) | {r['heads']}{' fwd+bwd' if r.get('grad') else ''} | "
                    f"{a['median_s'] * 1e3:.1f} ms | "
                    f"{b['median_s']:.2f} s{' (1 call)' if b['calls'] == 1 else ''} | ×{r['time_ratio']:.1f} | "
                    f"{a['peak_extra_mib']:.0f} / {b['peak_extra_mib']:.0f} MiB |")
    return "\n".join(rows)


def curves_table(data: dict) -> str:
    """Per sweep and case: fitted log-log slope, and the median time at the smallest and largest size."""
    rows = ["| sweep | case | slope (fit from) | smallest size | largest size |", "|---|---|---|---|---|"]
    for sweep, res in data["results"].items():
        first, last = res["points"][0], res["points"][-1]
        for case, slope in res["slopes"].items():
            s = "–" if slope is None else f"{slope:.2f}"
            rows.append(f"| {sweep} | {case} | {s} (≥ {res['fit_from']}) | "
                        f"{first['size']}: {first['cases'][case]['median_s'] * 1e3:.1f} ms | "
                        f"{last['size']}: {last['cases'][case]['median_s'] * 1e3:.1f} ms |")
    return "\n".join(rows)


def pointcloud_table(data: dict) -> str:
    """Per point count and family: step time (wall, CPU), CPU ratio to axial, peak extra memory, and the
    computed L² attention an unblocked layer would keep."""
    rows = ["| points | family | step (wall) | step (CPU) | CPU × axial | peak extra memory | unblocked L² attention |",
            "|---|---|---|---|---|---|---|"]
    for r in data["results"][0]["rows"]:
        if "error" in r:
            rows.append(f"| {r['points']} | {r['family']} | failed: {r['error']} | | | | |")
            continue
        rows.append(f"| {r['points']} | {r['family']} | {r['step_s']:.2f} s | {r['step_cpu_s']:.2f} s | "
                    f"×{r.get('cpu_vs_axial', float('nan')):.1f} | {r['extra_mib']:.0f} MiB | "
                    f"{r['unblocked_attention_mib']:.0f} MiB |")
    return "\n".join(rows)


def main() -> int:
    for name, render in (("apply", apply_table), ("index", index_table), ("geope", geope_table),
                         ("curves", curves_table), ("pointcloud", pointcloud_table)):
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        print(f"### {name}\n\n{machine_line(data)}\n\n{render(data)}\n")
        if name == "apply":
            print(f"### cos/sin vs apply\n\n{cos_sin_table(data)}\n")
            print(f"### apply vs a preallocated copy\n\n{prealloc_table(data)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
