"""Each rank's OpenMP teams get its share of the cores and sleep when idle; a user's settings win."""

import os
import subprocess
import sys
from pathlib import Path

from training.threads import set_thread_env, thread_env, threads_per_rank, usable_cores

ROOT = Path(__file__).resolve().parents[1]


def test_threads_are_the_ranks_share_of_the_cores():
    assert threads_per_rank(1, cores=16) == 16
    assert threads_per_rank(4, cores=16) == 4
    assert threads_per_rank(3, cores=16) == 5
    assert threads_per_rank(8, cores=2) == 1  # never 0
    assert threads_per_rank(1) == usable_cores() == len(os.sched_getaffinity(0))


def test_thread_env_defaults_and_keeps_the_users_values():
    assert thread_env(2, environ={}) == {
        "OMP_NUM_THREADS": str(max(1, usable_cores() // 2)),
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    mine = {"OMP_NUM_THREADS": "7", "OMP_WAIT_POLICY": "ACTIVE"}
    assert thread_env(2, environ=mine) == mine
    assert thread_env(1, environ={"OMP_NUM_THREADS": ""})["OMP_NUM_THREADS"] == str(usable_cores())


def test_set_thread_env_divides_by_torchruns_local_world_size():
    env = {"LOCAL_WORLD_SIZE": "2", "PATH": "/bin"}
    set_thread_env(env)
    assert env == {
        "LOCAL_WORLD_SIZE": "2",
        "PATH": "/bin",
        "OMP_NUM_THREADS": str(max(1, usable_cores() // 2)),
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    env = {"LOCAL_WORLD_SIZE": "x"}  # not a count: one rank
    set_thread_env(env)
    assert env["OMP_NUM_THREADS"] == str(usable_cores())


def _runtime_settings(extra_env: dict, argv: tuple = ("-m", "training", "--help-config")) -> str:
    """What torch's OpenMP runtime read as it loaded in ``python -m training`` (libgomp prints its
    settings, spin count included, with OMP_DISPLAY_ENV=VERBOSE)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env |= {"OMP_DISPLAY_ENV": "VERBOSE", "PYTHONPATH": str(ROOT)} | extra_env
    proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, check=True)
    return proc.stderr


def test_python_m_training_loads_torch_with_idle_threads_asleep():
    shown = _runtime_settings({})
    assert "GOMP_SPINCOUNT = '0'" in shown  # PASSIVE: no spinning at all
    assert f"OMP_NUM_THREADS = '{usable_cores()}'" in shown
    # the runtime's default, which the trainer overrides: a spin of 300000 before sleeping
    assert "GOMP_SPINCOUNT = '300000'" in _runtime_settings({}, ("-c", "import torch"))
    # a user's own choice is what the runtime reads
    assert "OMP_NUM_THREADS = '1'" in _runtime_settings({"OMP_NUM_THREADS": "1", "LOCAL_WORLD_SIZE": "2"})
