"""Run independent cache-sized blocks of eager work on torch's intra-op threads.

Element-wise torch ops on a 1 MiB block each open an OpenMP parallel region; with several threads that
is one fork/join per op and block, hundreds per call, and each join waits for the slowest thread (on a
busy machine, a descheduled one). Here the blocks themselves are the parallel unit instead. With N torch
threads, the caller and N - 1 pool workers take blocks from one shared counter until none is left, and
every op inside runs single-threaded. A thread that is slow or not scheduled simply takes fewer blocks;
the caller starts at once, so if no worker gets a core in time it does all the work itself, at the
single-thread cost. Torch ops release the GIL, so the threads compute concurrently. Which thread runs a
block does not change any result: every block is computed by the same ops on the same inputs.

Worker threads are made single-threaded once, when the pool is built: ``torch.set_num_threads(1)`` on
the worker fixes its own OpenMP thread count for good, after which the caller's setting is restored. The
caller's ops run single-threaded while it takes blocks (the setting is put back before returning).
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
_WORKER_PREFIX = "ropekit-blocks"


def _make_serial(barrier: threading.Barrier) -> None:
    """Worker initializer: this thread's torch ops run on one thread from now on."""
    torch.set_num_threads(1)
    torch.ones(1 << 16).add_(1)  # first parallel-capable op fixes the thread's count while the setting is 1
    barrier.wait()


def _pool(workers: int) -> ThreadPoolExecutor:
    with _lock:
        pool = _pools.get(workers)
        if pool is None:
            before = torch.get_num_threads()
            barrier = threading.Barrier(workers + 1)
            pool = ThreadPoolExecutor(workers, thread_name_prefix=_WORKER_PREFIX)
            try:
                for _ in range(workers):  # each task blocks on the barrier, so every worker thread starts
                    pool.submit(_make_serial, barrier)
                barrier.wait()
            finally:
                torch.set_num_threads(before)  # the workers changed the process-wide default; put it back
            _pools[workers] = pool
        return pool


def _forget_pools() -> None:
    """After fork the child has no worker threads: build fresh pools on first use."""
    _pools.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


class _Batch:
    """Jobs handed out one at a time to whichever thread asks next; ``done`` is set when all have run."""

    def __init__(self, jobs: Sequence[Callable[[], object]]) -> None:
        self.jobs = jobs
        self.taken = 0
        self.left = len(jobs)
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.done = threading.Event()

    def _take(self) -> int:
        with self.lock:
            i, self.taken = self.taken, self.taken + 1
            return i

    def _finish(self, error: BaseException | None) -> None:
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def drain(self) -> None:
        """Run jobs until none is left to take (a late worker finds none and returns at once)."""
        while (i := self._take()) < len(self.jobs):
            try:
                self.jobs[i]()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                self._finish(e)
            else:
                self._finish(None)


def run_blocks(jobs: Sequence[Callable[[], object]]) -> None:
    """Run ``jobs`` (independent, writing disjoint outputs) on torch's intra-op threads; return when all are done.

    With one intra-op thread, a single job, or when called from a worker itself, they run here in order.
    The first error raised by a job is raised here once every job has finished.
    """
    threads = torch.get_num_threads()
    if threads <= 1 or len(jobs) <= 1 or threading.current_thread().name.startswith(_WORKER_PREFIX):
        for job in jobs:
            job()
        return
    batch = _Batch(jobs)
    helpers = min(threads, len(jobs)) - 1
    pool = _pool(threads - 1)
    for _ in range(helpers):
        pool.submit(batch.drain)
    torch.set_num_threads(1)  # the caller's own blocks run single-threaded like the workers'
    try:
        batch.drain()
    finally:
        torch.set_num_threads(threads)
    batch.done.wait()
    if batch.error is not None:
        raise batch.error
