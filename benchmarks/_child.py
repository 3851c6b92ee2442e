"""Run one benchmark variant in a fresh spawned process, so its peak RSS is its own."""

import multiprocessing as mp
import queue as queue_module


def run_in_child(target, *args) -> dict:
    """Call target(*args, queue) in a spawned child and return the dict it puts on the queue;
    a child that dies without answering raises instead of leaving the parent waiting."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    while True:
        try:
            result = q.get(timeout=1.0)
            break
        except queue_module.Empty:
            if not p.is_alive() and q.empty():
                raise RuntimeError(
                    f"benchmark child {target.__name__} exited with code {p.exitcode} and no result"
                ) from None
    p.join()
    return result
