"""A torch.profiler trace of a few training steps (rank 0).

With ``training.profiler: torch`` the first optimizer steps of the run are profiled with
the schedule ``wait=1, warmup=1, active=3`` (step 1 skipped, step 2 warms the profiler
up, steps 3-5 are recorded), then the profiler stops and training continues at full
speed. The loop marks ``data``, ``forward``, ``backward`` and ``update`` with
``record_function``, so those spans show in the trace. Written into ``out_dir``:

    trace.json          Chrome trace (open in https://ui.perfetto.dev or chrome://tracing)
    key_averages.txt    the operator table, sorted by total self time (CUDA when present)

With ``training.profiler: nsys`` the launcher wraps the whole command in ``nsys profile``
(see assets/trained_model.py) and, on CUDA, the loop runs inside
``torch.autograd.profiler.emit_nvtx()`` so operators and those spans appear as NVTX
ranges in the nsys timeline (:func:`nvtx_context`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

__all__ = ["PROFILE_DIR", "PROFILE_SCHEDULE", "StepProfiler", "TRACE_FILE", "nvtx_context"]

PROFILE_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}
PROFILE_DIR = "profile"  # the run's folder of profiler outputs
TRACE_FILE = "trace.json"  # the profiler's Chrome trace, in PROFILE_DIR


class StepProfiler:
    """Call :meth:`step` after every optimizer step; it stops itself once the trace is written."""

    def __init__(self, enabled: bool, out_dir: str | os.PathLike, device: torch.device):
        self.out_dir = Path(out_dir)
        self.done = False
        self.steps = 0
        self.written: list[Path] = []
        self._prof = None
        if not enabled:
            return
        self.cuda = torch.device(device).type == "cuda"
        if not self.cuda:
            quiet_kineto()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(
            activities=activities,
            schedule=schedule(**PROFILE_SCHEDULE, repeat=1),
            on_trace_ready=self._write,
            record_shapes=True,
            profile_memory=True,
        )
        self._prof.__enter__()

    @property
    def total_steps(self) -> int:
        return sum(PROFILE_SCHEDULE.values())

    def _write(self, prof) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        trace = self.out_dir / TRACE_FILE
        prof.export_chrome_trace(str(trace))
        sort = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=40)
        (self.out_dir / "key_averages.txt").write_text(
            f"torch.profiler, schedule {PROFILE_SCHEDULE}, sorted by {sort}\n\n{table}\n"
        )
        self.written = [trace, self.out_dir / "key_averages.txt"]

    def step(self) -> None:
        if self._prof is None or self.done:
            return
        self._prof.step()
        self.steps += 1
        if self.steps >= self.total_steps:
            self.close()

    def close(self) -> None:
        """Stop profiling (a run with fewer steps than the schedule writes no trace)."""
        if self._prof is not None and not self.done:
            self.done = True
            self._prof.__exit__(None, None, None)


# Kineto's minimum log level: above its STAGE level, so nothing (see `quiet_kineto`).
KINETO_SILENT = "5"


def quiet_kineto() -> None:
    """Silence Kineto (the profiler's C++ backend) for a CPU-only trace, unless KINETO_LOG_LEVEL is set.

    Kineto prints its progress ("STAGE: Completed Stage: Warm Up") at its highest level, above
    ERROR, and, in a CUDA build of torch, probes the GPUs when it writes the trace: on a machine
    without a CUDA driver that prints "ERROR: cudaGetDeviceCount failed with code 35" although
    nothing failed and the trace is complete. With a CUDA device the default level stays, so
    real CUPTI errors show. Kineto reads the variable when profiling starts, so setting it here,
    in the process that profiles, is enough."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_SILENT)


def nvtx_context(profiler: str, device: torch.device):
    """``emit_nvtx()`` for an nsys run on CUDA, else a no-op context."""
    if profiler == "nsys" and torch.device(device).type == "cuda":
        return torch.autograd.profiler.emit_nvtx()
    return contextlib.nullcontext()
