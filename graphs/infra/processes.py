"""Child processes that die with their parent: the one `prctl(PR_SET_PDEATHSIG)` call shared by
the shard-writing workers (`graphs.sampling.writer`) and training's launcher and ranks
(`training.lifetime`), so a stage killed for memory or by a user leaves nothing running behind."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies
# resolved once at import, not in a freshly forked child (where loading a library may deadlock)
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def die_with_parent(parent: int | None = None) -> bool:
    """Have the kernel SIGKILL this process when its parent dies; False when the parent
    (`parent`, default the current one) is already gone, and the caller should exit.

    Linux only (elsewhere a no-op that returns True). The signal follows the parent *thread*
    that started this process."""
    expected = os.getppid() if parent is None else parent
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == expected  # re-read after prctl: a parent that died before it is caught here
