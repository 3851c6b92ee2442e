"""Pieces of work run in threads: numba kernels compiled with ``nogil=True`` (and Arrow's
compute functions) release the GIL, so pieces of one call run on every core."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

MAX_THREADS = 4  # the kernels are bound by memory: more threads than this gain nothing on a few cores


def kernel_threads() -> int:
    """The threads a call spreads its pieces over: the cores, at most `MAX_THREADS`."""
    return max(1, min(os.cpu_count() or 1, MAX_THREADS))


def run_each(kernel, calls: list[tuple], threads: int | None = None) -> list:
    """[kernel(*args) for args in calls], the calls spread over `threads` threads (default
    `kernel_threads()`); in this thread when there is one call or one thread."""
    threads = threads or kernel_threads()
    if threads == 1 or len(calls) <= 1:
        return [kernel(*args) for args in calls]
    with ThreadPoolExecutor(min(threads, len(calls))) as pool:
        return list(pool.map(lambda args: kernel(*args), calls))


__all__ = ["MAX_THREADS", "kernel_threads", "run_each"]
