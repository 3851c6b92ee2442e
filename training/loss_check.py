"""A loss that is NaN or infinite stops training.

Once a minibatch's loss is not finite its gradient poisons the parameters, and every later
step trains on NaN; a run that went on would publish a model that predicts nothing. So the
training loops (`training.epoch_loop` for node classification, `training.link`) check each
minibatch's loss value, which they read for their epoch statistics anyway (no extra device
synchronization), before its backward pass, and stop with `NonFiniteLossError`: it names
the epoch and the optimizer step (both counted from 1) and the likely causes with the
run's own settings. Nothing is published: the model folder keeps its previous version.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["NonFiniteLossError", "non_finite_loss"]


class NonFiniteLossError(ValueError):
    """Training stopped: a minibatch's loss was NaN or infinite."""


def non_finite_loss(value: float, *, epoch: int, step: int, steps: int, causes: Sequence[str]) -> NonFiniteLossError:
    """The error for a non-finite loss `value` at `epoch` and optimizer `step` of `steps` (each
    from 1), listing the `causes` to check; the loops raise it when ``not math.isfinite(value)``."""
    listed = "; ".join(f"({i}) {cause}" for i, cause in enumerate(causes, 1))
    return NonFiniteLossError(
        f"the training loss is {value} at epoch {epoch}, optimizer step {step} of {steps}: training stopped and "
        f"nothing was published (the model folder keeps its previous version). Likely causes: {listed}"
    )
