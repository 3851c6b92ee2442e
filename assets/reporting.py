"""How every asset ends: metadata numbers rounded to what means something, and one summary line.

Each asset returns ``stage_result(context, ASSET, metadata, headline=(...), check_results=...)``
instead of building its `MaterializeResult` itself, so that

- every float in the metadata (also inside JSON values and the metrics training reports over
  dagster-pipes) keeps `SIGNIFICANT_DIGITS` significant digits: ``seconds: 8.123``, not
  ``8.123456789``; an accuracy ``0.9959``; a rate ``1.479e+06``. Integers, strings, flags,
  paths, tables and plots are left as they are. This is the one rounding rule of the metadata
  panel (`rounded`); assets do not round on their own.
- the run's log gets one INFO line per stage with its headline figures, e.g.
  ``canonical_graph (cora): nodes 2708, edges 10556, seconds 0.41`` (the keys named by the
  asset, in its order, taken from the rounded metadata, so the line and the panel agree).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import dagster as dg

SIGNIFICANT_DIGITS = 4

__all__ = ["SIGNIFICANT_DIGITS", "rounded", "rounded_metadata", "stage_result", "summary_line"]


def rounded(value: Any, digits: int = SIGNIFICANT_DIGITS) -> Any:
    """`value` with every float (also in nested lists, tuples and dicts) kept to `digits`
    significant digits; other values unchanged. NaN and infinities stay as they are."""
    if isinstance(value, int):  # bools too
        return value
    if isinstance(value, float):
        return float(f"{value:.{digits}g}") if math.isfinite(value) else value
    if isinstance(value, Mapping):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def _rounded_entry(value: Any) -> Any:
    if isinstance(value, dg.FloatMetadataValue) and value.value is not None:
        return dg.MetadataValue.float(rounded(float(value.value)))
    if isinstance(value, dg.JsonMetadataValue):
        return dg.MetadataValue.json(rounded(value.data))
    if isinstance(value, dg.MetadataValue):
        return value
    return rounded(value)


def rounded_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A metadata dict with `rounded` applied to every number (plain or a float/JSON MetadataValue)."""
    return {k: _rounded_entry(v) for k, v in metadata.items()}


def _plain(value: Any) -> Any:
    """What a metadata value reads as in a log line."""
    if isinstance(value, dg.JsonMetadataValue):
        return value.data
    if isinstance(value, dg.MetadataValue):
        return getattr(value, "value", value)
    return value


def summary_line(asset: str, dataset: str, metadata: Mapping[str, Any], headline: Iterable[str]) -> str:
    """``asset (dataset): key value, key value`` for the headline keys present in `metadata`."""
    parts = [f"{k} {_plain(metadata[k])}" for k in headline if k in metadata]
    return f"{asset} ({dataset}): " + (", ".join(parts) if parts else "done")


def stage_result(
    context: dg.AssetExecutionContext,
    asset: str,
    metadata: Mapping[str, Any],
    *,
    headline: Sequence[str] = (),
    line: str | None = None,
    check_results: Sequence[dg.AssetCheckResult] | None = None,
) -> dg.MaterializeResult:
    """The asset's `MaterializeResult` with rounded metadata, after logging its summary line: the
    `headline` keys of the metadata, or `line` when a sentence says it better."""
    md = rounded_metadata(metadata)
    summary = (
        f"{asset} ({context.partition_key}): {line}"
        if line
        else summary_line(asset, context.partition_key, md, headline)
    )
    context.log.info(summary)
    return dg.MaterializeResult(metadata=md, check_results=list(check_results or []))
