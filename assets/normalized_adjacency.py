"""normalized_adjacency: the GCN propagation matrix Â of the canonical graph as CSR arrays.

Calls `graphs.normalize.build_normalized_adjacency` (see that module for the files, dtypes
and the streaming build) and evaluates four blocking asset checks on the written files before publishing them: Â is
symmetric (for degree_norm='both' on a symmetrized graph), has no NaN/inf, every weight lies in
(0, 1], and its largest eigenvalue, estimated by power iteration, is at most 1 + 1e-4.
"""

import dagster as dg

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions, disk_metadata, refuse_failed_checks
from assets.config import dagster_config
from assets.reporting import stage_result
from assets.settings import register_config
from graphs.normalize import (
    AdjacencyConfig,
    asymmetric_entries,
    build_normalized_adjacency,
    largest_eigenvalue,
    load_csr,
    weight_stats,
)

NormalizedAdjacencyConfig = dagster_config(AdjacencyConfig, "NormalizedAdjacencyConfig")

SYMMETRIC = "symmetric"
FINITE = "finite_weights"
WEIGHTS_IN_RANGE = "weights_in_0_1"
SPECTRAL_RADIUS = "largest_eigenvalue_at_most_1"
EIGENVALUE_TOLERANCE = 1e-4

_ASSET = "normalized_adjacency"
register_config(_ASSET, NormalizedAdjacencyConfig)


@dg.asset(
    partitions_def=dataset_partitions,
    deps=[canonical_graph],
    group_name="preprocess",
    kinds={"numpy"},
    check_specs=[
        dg.AssetCheckSpec(
            SYMMETRIC,
            asset=_ASSET,
            description="Â equals its transpose (entries and weights); applies to degree_norm='both' on a symmetrized graph.",
            blocking=True,
        ),
        dg.AssetCheckSpec(FINITE, asset=_ASSET, description="No weight is NaN or infinite.", blocking=True),
        dg.AssetCheckSpec(WEIGHTS_IN_RANGE, asset=_ASSET, description="Every weight lies in (0, 1].", blocking=True),
        dg.AssetCheckSpec(
            SPECTRAL_RADIUS,
            asset=_ASSET,
            description="The largest eigenvalue of Â, estimated "
            f"by power iteration, is at most 1 + {EIGENVALUE_TOLERANCE:g}.",
            blocking=True,
        ),
    ],
)
def normalized_adjacency(
    context: dg.AssetExecutionContext, config: NormalizedAdjacencyConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """Â = D^-1/2 (A_w + sI) D^-1/2 (or D^-1 (A_w + sI)), weighted degrees when the graph is weighted,
    as int64 indptr / int32 indices / float32 weights."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, _ASSET, config)
    cfg = config.to_dataclass()
    with storage.lock(dataset, context.log.info), storage.publishing(dataset, _ASSET) as out:
        canonical = storage.upstream_dir(dataset, "canonical_graph")
        s = build_normalized_adjacency(canonical, out, cfg)
        checks = check_adjacency(out, cfg, s["symmetrized"])
        refuse_failed_checks(dataset, _ASSET, checks)
        disk = disk_metadata(out)
    metadata = {
        "path": dg.MetadataValue.path(str(storage.asset_dir(dataset, _ASSET))),
        "nodes": s["nodes"],
        "edges": s["edges"],
        "nnz": s["nnz"],
        "degree_norm": s["degree_norm"],
        "add_self_loops": s["add_self_loops"],
        "self_loop_weight": s["self_loop_weight"],
        "weighted": s["weighted"],
        "index_dtype": s["index_dtype"],
        "isolated_nodes": s["isolated_nodes"],
        "max_row_length": s["max_row_length"],
        "seconds": s["seconds"],
        "degree_seconds": s["degree_seconds"],
        "edges_per_second": s["edges_per_second"],
        "peak_rss_mb": s["peak_rss_bytes"] / 2**20,
        **disk,
    }
    metadata.update(config_metadata)
    return stage_result(
        context, _ASSET, metadata, headline=("nodes", "nnz", "degree_norm", "seconds"), check_results=checks
    )


def check_adjacency(out, cfg: AdjacencyConfig, symmetrized: bool) -> list[dg.AssetCheckResult]:
    """The four asset checks, evaluated on the files in `out`."""
    csr = load_csr(out)
    if cfg.degree_norm == "both" and symmetrized:
        bad = asymmetric_entries(csr)
        symmetric = dg.AssetCheckResult(check_name=SYMMETRIC, passed=bad == 0, metadata={"asymmetric_entries": bad})
    else:
        why = (
            "degree_norm='right' is row-normalized" if cfg.degree_norm != "both" else "the canonical graph is directed"
        )
        symmetric = dg.AssetCheckResult(check_name=SYMMETRIC, passed=True, metadata={"applies": False, "why": why})
    w = weight_stats(csr)
    finite = dg.AssetCheckResult(check_name=FINITE, passed=w["nonfinite"] == 0, metadata={"nonfinite": w["nonfinite"]})
    in_range = dg.AssetCheckResult(
        check_name=WEIGHTS_IN_RANGE,
        passed=w["outside_0_1"] == 0 and w["nonfinite"] == 0,
        metadata={"outside_0_1": w["outside_0_1"], "min": w["min"], "max": w["max"]},
    )
    lam = largest_eigenvalue(csr, cfg.power_iterations)
    radius = dg.AssetCheckResult(
        check_name=SPECTRAL_RADIUS,
        passed=bool(lam <= 1 + EIGENVALUE_TOLERANCE),
        metadata={"largest_eigenvalue": lam, "power_iterations": cfg.power_iterations},
    )
    return [symmetric, finite, in_range, radius]
