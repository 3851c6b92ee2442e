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


def _burn(cpu: int, seconds: float) -> None:
    """Spin on core `cpu` for at most `seconds` (a child's whole life)."""
    import os
    import time

    os.sched_setaffinity(0, {cpu})
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(100_000):
            pass


class Burner:
    """A fixed background load: one spawned process spinning on one core (the last this process
    may run on) while the ``with`` block runs, for at most `max_seconds`. ``enabled=False``: no load."""

    def __init__(self, enabled: bool = True, max_seconds: float = 6 * 3600):
        import os

        self.enabled, self.max_seconds = enabled, max_seconds
        self.cpu = max(os.sched_getaffinity(0))
        self._process = None

    def __enter__(self) -> "Burner":
        if self.enabled:
            self._process = mp.get_context("spawn").Process(
                target=_burn, args=(self.cpu, self.max_seconds), daemon=True
            )
            self._process.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.join()
            self._process = None
