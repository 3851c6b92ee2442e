"""The threads of a training process: how many each pool gets and how an idle one waits.

A rank training on the CPU runs three pools:

- torch's intra-op OpenMP team (the libgomp torch bundles): the dense layers, the loss, the
  optimizer step;
- DGL's OpenMP team (DGL links the system's libgomp, a second runtime with its own threads):
  the neighbour aggregation (`training.aggregate`, when DGL is importable);
- the shard stream's prefetch thread (`training.data.ShardStream`): NumPy and zlib, one thread.

What is chosen, and why:

- **Each team gets the rank's share of the cores** (`threads_per_rank`: the cores this process
  may run on, its affinity mask, divided by the ranks on this node). The two teams are both
  called from the training thread, one kernel after the other, so they never run at the same
  time and each may use every core of the share. The prefetch thread is the one thread beyond
  it: it spends most of its time in zlib and file reads, and giving the teams one core less
  for it costs more than it saves (`benchmarks/train_vs_dgl.py --threads`).
- **An idle team thread sleeps (``OMP_WAIT_POLICY=PASSIVE``)**. libgomp's default spins a
  finished team's threads for a while before they sleep. With two runtimes in one process
  the spinning threads of one team hold the cores the other team's threads need next, and
  with any other load on the host a spinning thread takes a core from a working one:
  on a 2-core host with one core busy, epochs were many times slower with spinning than
  with sleeping threads (the loaded table of BENCHMARKS.md's training rows, measured
  with both settings).

Both settings are environment variables the runtimes read when they load, so a launcher
sets them for its ranks (`thread_env`) and ``python -m training`` sets them before torch
loads (`set_thread_env`); a value the user set is kept. `apply_threads` sets the team sizes
in a process whose runtimes are loaded already (the benchmarks' children, a notebook).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

__all__ = ["WAIT_POLICY", "apply_threads", "set_thread_env", "thread_env", "threads_per_rank"]

WAIT_POLICY = "PASSIVE"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(ranks_on_node: int = 1, cores: int | None = None) -> int:
    """Threads of each OpenMP team of one rank: its share of the node's cores, at least 1."""
    return max(1, (usable_cores() if cores is None else cores) // max(1, ranks_on_node))


def thread_env(ranks_on_node: int = 1, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that gives each of `ranks_on_node` ranks its threads, the user's
    ``OMP_NUM_THREADS`` / ``OMP_WAIT_POLICY`` (in `environ`, default this process's) kept."""
    environ = os.environ if environ is None else environ
    return {
        "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS") or str(threads_per_rank(ranks_on_node)),
        "OMP_WAIT_POLICY": environ.get("OMP_WAIT_POLICY") or WAIT_POLICY,
    }


def set_thread_env(environ: MutableMapping[str, str] | None = None) -> None:
    """Put `thread_env` into `environ` (default this process's) for this rank, one of torchrun's
    ``LOCAL_WORLD_SIZE`` on this node (1 without torchrun); before torch and DGL load."""
    environ = os.environ if environ is None else environ
    local = environ.get("LOCAL_WORLD_SIZE", "1")
    environ.update(thread_env(int(local) if local.isdigit() else 1, environ))


def apply_threads(threads: int) -> None:
    """Set both teams to `threads` threads in this process (torch's, and DGL's where DGL is loaded)."""
    import sys

    import torch

    torch.set_num_threads(threads)
    if "dgl" in sys.modules:  # DGL's own runtime; not imported here only for this
        from dgl.utils import set_num_threads

        set_num_threads(threads)
