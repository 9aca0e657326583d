"""Timing, machine description and copy bandwidth shared by every benchmark."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import resource
import statistics
import time
from typing import Callable

import torch

__all__ = ["timeit", "timeit_many", "machine", "copy_bandwidth", "pin_allocator", "ALLOCATOR_MODES"]

ALLOCATOR_MODES = ("steady", "default")
_MMAP_MAX = 32 * 2**20  # glibc's largest mmap threshold on 64-bit systems
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)


def pin_allocator(mode: str = "steady") -> str:
    """Put glibc's malloc in one fixed regime for large blocks, so that every case is timed alike.

    glibc serves a block above its mmap threshold with freshly mapped pages, and the first touch of each
    4 KiB page is a page fault (1-2 µs, the kernel zeroing it). By default it raises that threshold, up
    to 32 MiB, each time such a block is freed, so whether a 16-32 MiB temporary costs thousands of faults
    on every call depends on what the process allocated and freed before. Measured on this machine:
    transformers' bfloat16 apply of (1, 16, 4096, 128) took 12 ms in one process and 44 ms in another
    (about 16 000 faults per call), and that flipped the ratio of a row. ``"steady"`` fixes the threshold
    at 32 MiB and stops returning freed memory to the system, so blocks up to 32 MiB are reused from the
    heap by every case, and larger ones are mapped afresh by every case. Only this process: the suites
    that measure peak memory run their cases in child processes with glibc's defaults, since memory kept
    for reuse would hide a call's peak. ``"default"`` leaves malloc as it is. Returns what was done.
    """
    if mode not in ALLOCATOR_MODES:
        raise ValueError(f"allocator mode must be one of {ALLOCATOR_MODES}, got {mode!r}")
    if mode == "default":
        return "default (glibc's dynamic mmap threshold)"
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallopt") or platform.libc_ver()[0] != "glibc":
        return "default (not glibc: nothing pinned)"
    libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX)
    libc.mallopt(_M_TRIM_THRESHOLD, 2**30)
    return f"steady (glibc mmap threshold {_MMAP_MAX // 2**20} MiB, trim threshold 1 GiB)"


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt



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
    on a shared machine falls on every case alike rather than on whichever ran at a bad moment.
    ``cpu_median_s`` is the median CPU time of the process (``time.process_time``) per call: with one
    torch thread it leaves out the time the process spent descheduled by other jobs."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    faults: dict[str, list[int]] = {name: [] for name in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            f0 = _minor_faults()
            c0 = time.process_time()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            faults[name].append(_minor_faults() - f0)
    return {
        name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t), "repeat": repeat,
               "cpu_median_s": statistics.median(cpu[name]), "page_faults": statistics.median(faults[name])}
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
