"""Progress lines with percent done and time left, for loops that run longer than a few seconds.

One format for every stage that reports progress (sampling's minibatches, training's epochs),
written through whatever `log` callable the caller has (``context.log.info`` in an asset, the
dagster-pipes reporter in training), e.g.

    sampling 120/270 minibatches (44%), 6 s elapsed, ETA 8 s
    epoch 3/14 (21%), 11 s elapsed, ETA 41 s: loss 0.7189, ...

A line is written at most every ``every`` seconds (the last step always), so a quick loop
prints one line and a long one a steady trickle. The ETA assumes the remaining steps take as
long as the ones done so far in this run (steps done before it, e.g. epochs restored from a
checkpoint, count towards the percent, not the rate).
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["Progress", "format_seconds"]


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3 min 5 s``, ``2 h 10 min``: a duration to the precision a reader uses."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Progress:
    """Counts steps towards ``total`` and logs ``label done/total unit (p%), elapsed, ETA``."""

    def __init__(
        self,
        label: str,
        total: int,
        log: Callable[[str], None],
        *,
        unit: str = "",
        start: int = 0,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if total < 0 or not 0 <= start <= max(total, 0):
            raise ValueError(f"progress {label!r}: start={start} must lie in 0..total={total}")
        self.label, self.total, self.log, self.unit = label, total, log, unit
        self.done = self.start = start
        self.every, self.clock = every, clock
        self.t0 = clock()
        self.last_line = self.t0  # the first line after `every` seconds (or at the end)

    def line(self, detail: str = "") -> str:
        """The progress line for the steps done so far (``detail`` appended after a colon)."""
        elapsed = self.clock() - self.t0
        pct = 100.0 * self.done / self.total if self.total else 100.0
        count = f"{self.done}/{self.total}" + (f" {self.unit}" if self.unit else "")
        text = f"{self.label} {count} ({pct:.0f}%), {format_seconds(elapsed)} elapsed"
        ran = self.done - self.start
        if self.done < self.total and ran > 0:
            text += f", ETA {format_seconds(elapsed / ran * (self.total - self.done))}"
        return f"{text}: {detail}" if detail else text

    def advance(self, steps: int = 1, detail: str = "") -> bool:
        """Count ``steps`` more; log a line when ``every`` seconds passed since the last one or the
        loop is complete. Returns whether a line was logged."""
        self.done = min(self.done + steps, self.total)
        now = self.clock()
        if self.done < self.total and now - self.last_line < self.every:
            return False
        self.last_line = now
        self.log(self.line(detail))
        return True
