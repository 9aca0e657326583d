"""Timing, machine description and copy bandwidth shared by every benchmark."""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable

import torch

__all__ = ["timeit", "timeit_many", "machine", "copy_bandwidth"]


def timeit(fn: Callable[[], object], *, warmup: int = 1, repeat: int = 5) -> dict:
    """Median (and min/max) wall time in seconds of ``fn()`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeat": repeat}


def timeit_many(cases: dict[str, Callable[[], object]], *, warmup: int = 1, repeat: int = 5) -> dict[str, dict]:
    """Like :func:`timeit` for several cases, interleaved round-robin so that load from other processes
    on a shared machine falls on every case alike rather than on whichever ran at a bad moment."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {
        name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "repeat": repeat}
        for name, t in times.items()
    }


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict:
    """What the numbers were measured on: CPU, cores, torch threads and versions."""
    import numpy

    info = {
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    from importlib import metadata

    for dist in ("transformers", "rotary-embedding-torch", "triton"):
        try:
            info[dist.replace("-", "_")] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist.replace("-", "_")] = None
    return info


def copy_bandwidth(nbytes: int = 256 * 2**20, *, repeat: int = 5, device: str = "cpu") -> dict:
    """Achieved bytes/s of a large tensor copy (read + write counted), the ceiling for memory-bound ops."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run():
        dst.copy_(src)
        sync()

    t = timeit(run, warmup=2, repeat=repeat)
    return {"bytes_moved": 2 * nbytes, "bytes_per_s": 2 * nbytes / t["median_s"], **t}
