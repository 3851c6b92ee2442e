"""A training rank for tests/test_rebalance.py: `python -m training` as usual, with rank 1 (torchrun's
RANK=1) slower per seed by a sleep of SLOW_SECONDS_PER_SEED x the minibatch's seeds in its loss
(inside the forward time that metrics.parquet records) — a slower device, in a module of its own so
that the ranks import only torch and training."""

import os
import sys
import time

import training.epoch_loop as epoch_loop
from training.__main__ import main


def _slowed(cross_entropy, seconds_per_seed: float):
    def slow_cross_entropy(mb, logits, *args, **kwargs):
        time.sleep(seconds_per_seed * mb.num_seeds)
        return cross_entropy(mb, logits, *args, **kwargs)

    return slow_cross_entropy


if __name__ == "__main__":
    if os.environ.get("RANK") == "1":
        epoch_loop.cross_entropy = _slowed(epoch_loop.cross_entropy, float(os.environ["SLOW_SECONDS_PER_SEED"]))
    sys.exit(main())
