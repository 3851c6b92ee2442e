"""When a newly trained model replaces the promoted one (the `promotion` asset's rule).

The promoted model of a dataset is `<GNNFLOW_HOME>/<dataset>/promoted`, a symlink to one
folder of `<dataset>/model_versions/` (the same files as a `trained_model/` folder). A new
model is promoted when there is no promoted model yet, or when its headline test metric
(from `training.metrics`) is not lower than the promoted model's by more than `margin`
(absolute, on the 0..1 scale: 0.01 = one percentage point). Otherwise the promoted model
stays, so consumers of `promoted/predictions.parquet` keep the good one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphs.config_checks import bounded_repr, check_fields

HEADLINE_METRICS = ("accuracy", "macro_f1")


@dataclass(frozen=True, kw_only=True)
class PromotionConfig:
    metric: str = field(
        default="accuracy", metadata={"help": f"headline test metric compared, one of {HEADLINE_METRICS}"}
    )
    margin: float = field(
        default=0.01,
        metadata={"help": "largest drop of the headline metric (0..1 scale; 0.01 = 1 point) that still promotes"},
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.metric not in HEADLINE_METRICS:
            raise ValueError(f"metric={bounded_repr(self.metric)} must be one of {HEADLINE_METRICS}")
        if not 0 <= self.margin <= 1:
            raise ValueError(f"margin={self.margin} must lie in [0, 1]")


def decide(candidate: float, promoted: float | None, cfg: PromotionConfig) -> tuple[bool, str]:
    """(promote?, why) for a candidate headline value against the promoted model's (None: none)."""
    if math.isnan(candidate):
        return False, f"the new model's test {cfg.metric} is undefined (no labelled test nodes)"
    if promoted is None or math.isnan(promoted):
        return True, "no promoted model yet"
    drop = promoted - candidate
    if drop > cfg.margin:
        return False, (
            f"test {cfg.metric} {candidate:.4f} is {drop * 100:.2f} points below the promoted model's "
            f"{promoted:.4f} (margin {cfg.margin * 100:.2f})"
        )
    return True, f"test {cfg.metric} {candidate:.4f} vs promoted {promoted:.4f} (margin {cfg.margin * 100:.2f} points)"
