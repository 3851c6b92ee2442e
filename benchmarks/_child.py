"""Run one benchmark variant in a fresh spawned process, so its peak RSS is its own."""

import multiprocessing as mp


def run_in_child(target, *args) -> dict:
    """Call target(*args, queue) in a spawned child and return the dict it puts on the queue."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    result = q.get()
    p.join()
    return result
