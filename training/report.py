"""Progress and results of rank 0: to the log, and to Dagster when launched through dagster-pipes.

When the trained_model asset launches training in a dagster-pipes session (`assets.trained_model.run_tied`),
the environment carries ``DAGSTER_PIPES_CONTEXT``/``DAGSTER_PIPES_MESSAGES``; rank 0 then
opens ``dagster_pipes.open_dagster_pipes()``, forwards its log lines to the Dagster run
and reports the final metrics as the asset materialization's metadata. Otherwise (plain
``torchrun``, tests) nothing of Dagster is imported: ``dagster_pipes`` is only imported
when the environment says a pipes session is waiting, so training runs without it.
"""

from __future__ import annotations

import contextlib
import logging
import os

__all__ = ["PIPES_ENV", "Reporter", "open_reporter"]

PIPES_ENV = "DAGSTER_PIPES_CONTEXT"

log = logging.getLogger("training")


class Reporter:
    """``info`` lines and the final ``materialization`` metadata of rank 0.

    Under dagster-pipes a line goes to the Dagster run only (its event log, and the console of
    `dagster asset materialize`), not also to this process's stdout, which the run's console
    shows too: one line per message. Otherwise it goes to the ``training`` logger."""

    def __init__(self, pipes=None):
        self.pipes = pipes

    def info(self, msg: str) -> None:
        if self.pipes is not None:
            self.pipes.log.info(msg)
        else:
            log.info(msg)

    def warning(self, msg: str) -> None:
        if self.pipes is not None:
            self.pipes.log.warning(msg)
        else:
            log.warning(msg)

    def materialization(self, metadata: dict) -> None:
        if self.pipes is not None:
            self.pipes.report_asset_materialization(metadata=metadata)


@contextlib.contextmanager
def open_reporter(is_main: bool):
    """A :class:`Reporter`; on rank 0 under dagster-pipes it talks to the Dagster run."""
    if not is_main or not os.environ.get(PIPES_ENV):
        yield Reporter()
        return
    from dagster_pipes import open_dagster_pipes  # only here: training must run without it

    with open_dagster_pipes() as pipes:
        yield Reporter(pipes)
