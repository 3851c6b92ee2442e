"""Training processes live no longer than the step that launched them.

The chain is step -> launcher (``python -m training.launch`` or torchrun, possibly under
nsys) -> ranks, and each link dies with the one above it:

- `tied_process` starts the launcher from the step: in a process group of its own, with
  ``PR_SET_PDEATHSIG`` = SIGKILL (the kernel kills it when the step dies, even of SIGKILL or
  the OOM killer), and on any exit of the block while it still runs (an exception, an
  interrupted run) its group gets SIGTERM, then SIGKILL after a grace period. Its `pass_fds`
  hand it open descriptors, such as the step's dataset lock.
- `die_with_parent` is what a launcher and every rank call first: the same death signal,
  tied to their own parent (torchrun starts each rank in a session of its own, so the
  launcher's group does not include them). The launcher names itself to the ranks in
  `LAUNCHER_PID_ENV`, so a rank whose launcher died before the rank was tied notices it.

So a killed step leaves no training behind to write into the work folder that the next run
of the step resumes from, or to publish a model the step never recorded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Iterator, Mapping, Sequence

from graphs.infra.processes import die_with_parent

__all__ = ["LAUNCHER_PID_ENV", "die_with_parent", "tied_process"]

LAUNCHER_PID_ENV = "GNNFLOW_LAUNCHER_PID"  # set by the launcher for its ranks: the parent they must outlive never


def _tie_to(parent: int) -> None:
    """`preexec_fn` of `tied_process`: runs in the child between fork and exec."""
    if not die_with_parent(parent):
        os._exit(1)


@contextlib.contextmanager
def tied_process(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
    grace_s: float = 20.0,
) -> Iterator[subprocess.Popen]:
    """`command` started as a child that dies with this process (module docstring); yields the
    `Popen`. Leaving the block while the child still runs stops its process group: SIGTERM
    (torchrun then stops its ranks), SIGKILL after `grace_s` seconds."""
    proc = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=dict(env),
        pass_fds=tuple(pass_fds),
        start_new_session=True,  # its own process group, which the step stops as a whole
        preexec_fn=lambda parent=os.getpid(): _tie_to(parent),
    )
    try:
        yield proc
    finally:
        _stop_group(proc, grace_s)


def _stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL, to the process group of a child that has not been reaped (a
    reaped child's group id may belong to someone else by now)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
