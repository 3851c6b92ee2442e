"""normalized_adjacency: the GCN propagation matrix Â of the canonical graph as CSR arrays.

For a link-prediction dataset (gnnflow.yaml ``task: link_prediction``) this step first
materializes the ``edge_split`` asset (`assets.edge_split`; the same step, so node
classification gains no step) and builds Â from its message-passing graph, so no held-out
edge is ever aggregated over.

Calls `graphs.stages.normalize.build_normalized_adjacency` (see that module for the files, dtypes
and the streaming build) and evaluates four blocking asset checks on the written files before publishing them: Â is
symmetric (for degree_norm='both' on a symmetrized graph), has no NaN/inf, every weight lies in
(0, 1], and its largest eigenvalue is at most 1 + 1e-4 (proved by one product with Â's Perron
vector, or estimated by power iteration when that bound does not hold).
"""

import dagster as dg

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions, disk_metadata, refuse_failed_checks
from assets.config import dagster_config
from assets.edge_split import (
    SPLIT_ASSET,
    SPLIT_CHECK_SPEC,
    SPLIT_DESCRIPTION,
    edge_split_is_current,
    materialize_edge_split,
    skipped_check,
)
from assets.integrity import file_errors_as_failures
from assets.reporting import stage_result
from assets.settings import register_config
from graphs.stages.normalize import (
    Adjacency,
    AdjacencyConfig,
    asymmetric_entries,
    build_normalized_adjacency,
    largest_eigenvalue,
    load_csr,
    perron_guess,
    spectral_radius_bound,
    weight_stats,
)

NormalizedAdjacencyConfig = dagster_config(AdjacencyConfig, "NormalizedAdjacencyConfig")

SYMMETRIC = "symmetric"
FINITE = "finite_weights"
WEIGHTS_IN_RANGE = "weights_in_0_1"
SPECTRAL_RADIUS = "largest_eigenvalue_at_most_1"
EIGENVALUE_TOLERANCE = 1e-4

_ASSET = Adjacency.STAGE
register_config(_ASSET, NormalizedAdjacencyConfig)


@dg.multi_asset(
    name=_ASSET,
    partitions_def=dataset_partitions,
    # `--select normalized_adjacency` alone runs the step for Â only (edge_split: see the body)
    can_subset=True,
    specs=[
        # link prediction's split: produced by this step (one step, so node classification's
        # default path gains none), skipped for node classification and when unchanged
        dg.AssetSpec(
            SPLIT_ASSET,
            deps=[canonical_graph],
            group_name="preprocess",
            kinds={"numpy"},
            skippable=True,
            description=SPLIT_DESCRIPTION,
        ),
        dg.AssetSpec(
            _ASSET,
            deps=[canonical_graph, SPLIT_ASSET],
            group_name="preprocess",
            kinds={"numpy"},
            description="Â = D^-1/2 (A_w + sI) D^-1/2 (or D^-1 (A_w + sI)) of the message-passing graph as CSR arrays.",
        ),
    ],
    check_specs=[
        SPLIT_CHECK_SPEC,
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
            description=f"The largest eigenvalue of Â is at most 1 + {EIGENVALUE_TOLERANCE:g}: proved by one product "
            "with Â's Perron vector (Collatz-Wielandt bound), else estimated by power iteration.",
            blocking=True,
        ),
    ],
)
def normalized_adjacency(context: dg.AssetExecutionContext, config: NormalizedAdjacencyConfig, storage: GnnflowStorage):
    """Â = D^-1/2 (A_w + sI) D^-1/2 (or D^-1 (A_w + sI)), weighted degrees when the graph is weighted,
    as int64 indptr / int32 indices / float32 weights; for link prediction first edge_split."""
    dataset = storage.dataset(context)
    selected = context.selected_asset_keys
    holds_out_edges = storage.task(dataset).traits.holds_out_edges
    if dg.AssetKey(SPLIT_ASSET) in selected:
        if holds_out_edges:
            yield materialize_edge_split(context, storage, dataset)
        else:
            yield skipped_check(f"{storage.task(dataset).name}: no edges are held out")
    elif holds_out_edges and not edge_split_is_current(context, storage, dataset):
        raise dg.Failure(
            description=f"dataset '{dataset}' (link prediction): its edge_split is missing, or was made from other "
            "canonical edges or settings; materialize it with this asset: --select edge_split,normalized_adjacency"
        )
    if dg.AssetKey(_ASSET) not in selected:
        return
    config, config_metadata = storage.settings(context, dataset, _ASSET, config)
    cfg = config.to_dataclass()
    with (
        storage.lock(dataset, context.log.info),
        file_errors_as_failures(dataset),
        storage.publishing(dataset, _ASSET) as out,
    ):
        canonical = storage.graph_dir(dataset)  # edge_split's message-passing graph for link prediction
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
    result = stage_result(
        context, _ASSET, metadata, headline=("nodes", "nnz", "degree_norm", "seconds"), check_results=checks
    )
    # a multi-asset step names the asset each result is for
    yield dg.MaterializeResult(asset_key=_ASSET, metadata=result.metadata, check_results=result.check_results)


def check_adjacency(out, cfg: AdjacencyConfig, symmetrized: bool) -> list[dg.AssetCheckResult]:
    """The four asset checks, evaluated on the files in `out`."""
    csr = load_csr(out)
    if cfg.degree_norm == "both" and symmetrized:
        bad = asymmetric_entries(csr)
        symmetric = dg.AssetCheckResult(
            asset_key=_ASSET, check_name=SYMMETRIC, passed=bad == 0, metadata={"asymmetric_entries": bad}
        )
    else:
        why = (
            "degree_norm='right' is row-normalized" if cfg.degree_norm != "both" else "the canonical graph is directed"
        )
        symmetric = dg.AssetCheckResult(
            asset_key=_ASSET, check_name=SYMMETRIC, passed=True, metadata={"applies": False, "why": why}
        )
    w = weight_stats(csr)
    finite = dg.AssetCheckResult(
        asset_key=_ASSET, check_name=FINITE, passed=w["nonfinite"] == 0, metadata={"nonfinite": w["nonfinite"]}
    )
    in_range = dg.AssetCheckResult(
        asset_key=_ASSET,
        check_name=WEIGHTS_IN_RANGE,
        passed=w["outside_0_1"] == 0 and w["nonfinite"] == 0,
        metadata={"outside_0_1": w["outside_0_1"], "min": w["min"], "max": w["max"]},
    )
    # One product proves the bound when Â is what cfg says (Collatz-Wielandt with its Perron vector);
    # only when that bound exceeds 1 (a wrong Â, or a guess that does not fit) does power iteration decide.
    bound = float("inf")
    if w["nonfinite"] == 0 and w["outside_0_1"] == 0:
        bound = spectral_radius_bound(csr, perron_guess(csr, cfg))
    if bound <= 1 + EIGENVALUE_TOLERANCE:
        passed, radius_meta = True, {"largest_eigenvalue_at_most": bound, "method": "Collatz-Wielandt bound"}
    else:
        lam = largest_eigenvalue(csr, cfg.power_iterations)
        passed = bool(lam <= 1 + EIGENVALUE_TOLERANCE)
        radius_meta = {"largest_eigenvalue": lam, "power_iterations": cfg.power_iterations, "method": "power iteration"}
    radius = dg.AssetCheckResult(asset_key=_ASSET, check_name=SPECTRAL_RADIUS, passed=passed, metadata=radius_meta)
    return [symmetric, finite, in_range, radius]
