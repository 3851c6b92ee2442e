"""Processes for tests/test_training_lifetime.py, each in a process of its own.

python -m tests.lifetime_worker step HOME LANDING DATASET EPOCHS
    the trained_model asset through Dagster, as a run's step does (the process a test kills)
python -m tests.lifetime_worker hold FOLDER OUT TRIGGER
    hold the dataset lock of FOLDER and start `under` below, then sleep until killed
python -m tests.lifetime_worker under FOLDER OUT TRIGGER
    run under the ancestor's lock of FOLDER: write `verify_lock_held`'s answer to OUT, once
    at once and once more when TRIGGER exists
python -m tests.lifetime_worker share FOLDER OUT
    hold the dataset lock of FOLDER, start a sleeping child that shares it (`held_lock_fd`),
    write the child's pid to OUT, then sleep until killed
"""

import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("DGLBACKEND", "pytorch")


def step(home: str, landing: str, dataset: str, epochs: int) -> int:
    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions
    from assets.trained_model import trained_model

    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, [dataset])
    training = {"epochs": epochs, "device": "cpu", "profiler": "none", "checkpoint_every": 1}
    training["early_stopping_patience"] = 0  # every epoch runs
    run_config = {"ops": {"trained_model": {"config": {"model": {"hidden": 8}, "training": training}}}}
    result = dg.materialize(
        [trained_model],
        partition_key=dataset,
        instance=instance,
        resources={"storage": GnnflowStorage(home=home, landing=landing)},
        run_config=run_config,
        raise_on_error=False,
    )
    return 0 if result.success else 1


def _answer(folder: str) -> str:
    from graphs.infra.storage import DatasetLockLost, verify_lock_held

    try:
        verify_lock_held(folder)
    except DatasetLockLost as exc:
        return f"lost: {exc}"
    return "held"


def hold(folder: str, out: str, trigger: str) -> None:
    from graphs.infra.storage import dataset_lock

    with dataset_lock(folder):
        cmd = [sys.executable, "-m", "tests.lifetime_worker", "under", folder, out, trigger]
        subprocess.Popen(cmd, start_new_session=True)  # outlives this process
        while True:
            time.sleep(1)


def under(folder: str, out: str, trigger: str) -> None:
    from graphs.infra.storage import dataset_lock

    with dataset_lock(folder, timeout_s=10):  # the ancestor holds it: entered at once
        Path(out).write_text(_answer(folder) + "\n")
        while not Path(trigger).exists():
            time.sleep(0.05)
        with open(out, "a") as f:
            f.write(_answer(folder) + "\n")


def share(folder: str, out: str) -> None:
    from graphs.infra.storage import dataset_lock, held_lock_fd

    with dataset_lock(folder):
        cmd = [sys.executable, "-c", "import time; time.sleep(120)"]
        child = subprocess.Popen(cmd, pass_fds=(held_lock_fd(folder),), start_new_session=True)
        Path(out).write_text(str(child.pid))
        while True:
            time.sleep(1)


if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    if what == "step":
        sys.exit(step(args[0], args[1], args[2], int(args[3])))
    {"hold": hold, "under": under, "share": share}[what](*args)
