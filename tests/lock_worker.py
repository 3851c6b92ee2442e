"""Processes for tests/test_reliability.py, in their own small module so that spawned
children import only graphs.infra.storage (not Dagster or the tests)."""

import time

from graphs.infra.storage import dataset_lock


def hold_lock(folder: str, seconds: float, ready) -> None:
    """Hold the dataset lock of `folder` for `seconds`, setting `ready` once it is held."""
    with dataset_lock(folder):
        ready.set()
        time.sleep(seconds)
