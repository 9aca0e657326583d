"""Run independent cache-sized blocks of eager work on torch's intra-op threads.

Element-wise torch ops on a 1 MiB block each open an OpenMP parallel region; with several threads that
is one fork/join per op and block, hundreds per call, and each join waits for the slowest thread (on a
busy machine, a descheduled one). Here the blocks themselves are the parallel unit instead: a small pool
of worker threads, one per torch intra-op thread, takes blocks from a shared queue (so a slow thread
simply takes fewer), and every op inside a worker runs single-threaded. Torch ops release the GIL, so the
workers compute concurrently. Which thread runs a block does not change any result: every block is
computed by the same ops on the same inputs.

Worker threads are made single-threaded once, when the pool is built: ``torch.set_num_threads(1)`` on
the worker fixes its own OpenMP thread count for good, after which the caller's setting is restored.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import torch

__all__ = ["run_blocks"]

_pools: dict[int, ThreadPoolExecutor] = {}
_lock = threading.Lock()


def _make_serial(barrier: threading.Barrier) -> None:
    """Worker initializer: this thread's torch ops run on one thread from now on."""
    torch.set_num_threads(1)
    torch.ones(1 << 16).add_(1)  # first parallel-capable op fixes the thread's count while the setting is 1
    barrier.wait()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _lock:
        pool = _pools.get(threads)
        if pool is None:
            barrier = threading.Barrier(threads + 1)
            pool = ThreadPoolExecutor(threads, thread_name_prefix="ropekit-blocks")
            try:
                for _ in range(threads):  # each task blocks on the barrier, so every worker thread starts
                    pool.submit(_make_serial, barrier)
                barrier.wait()
            finally:
                torch.set_num_threads(threads)  # the workers changed the process-wide default; put it back
            _pools[threads] = pool
        return pool


def _forget_pools() -> None:
    """After fork the child has no worker threads: build fresh pools on first use."""
    _pools.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def run_blocks(jobs: Sequence[Callable[[], object]]) -> None:
    """Run ``jobs`` (independent, writing disjoint outputs) on torch's intra-op threads; return when all are done.

    With one intra-op thread, a single job, or when called from a worker itself, they run here in order.
    """
    threads = torch.get_num_threads()
    if threads <= 1 or len(jobs) <= 1 or threading.current_thread().name.startswith("ropekit-blocks"):
        for job in jobs:
            job()
        return
    futures = [_pool(threads).submit(job) for job in jobs]
    for f in futures:
        f.result()
