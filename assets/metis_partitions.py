"""metis_partitions: METIS parts with 1-hop halos, Cluster-GCN clusters and the DistDGL format.

Calls `graphs.stages.partition.build_partitions` (see that module for the files) and reports
METIS next to a seeded random (hash) partition of the same graph: edge-cut ratio, node
and edge balance, halo replication factor, time and peak RSS, plus a bar chart. Asset
checks, evaluated on the written files: every node is in exactly one part, and METIS
cuts fewer edges than the random baseline.
"""

import dagster as dg
import numpy as np

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions, disk_metadata, png_markdown, refuse_failed_checks
from assets.config import dagster_config
from assets.integrity import file_errors_as_failures
from assets.reporting import stage_result
from assets.settings import register_config
from graphs.formats.canonical_files import CanonicalGraph
from graphs.stages.canonical import edge_batches, read_summary
from graphs.stages.partition import (
    PartitionConfig,
    Partitions,
    build_partitions,
    load_parts,
    random_assign,
)
from graphs.stages.partition_metrics import partition_problems

MetisPartitionsConfig = dagster_config(PartitionConfig, "MetisPartitionsConfig")

ONE_PART_PER_NODE = "every_node_in_one_part"
BEATS_RANDOM = "metis_cut_below_random"

_ASSET = Partitions.STAGE
register_config(_ASSET, MetisPartitionsConfig)
_COMPARED = ("edge_cut_ratio", "node_balance", "edge_balance", "halo_replication", "seconds")


@dg.asset(
    name=_ASSET,  # the asset key: the stage's constant (also the function's name)
    partitions_def=dataset_partitions,
    deps=[canonical_graph],
    group_name="preprocess",
    kinds={"numpy"},
    check_specs=[
        dg.AssetCheckSpec(
            ONE_PART_PER_NODE,
            asset=_ASSET,
            description="Part ids lie in 0..k-1 and the parts' core node sets are disjoint and cover every node.",
            blocking=True,
        ),
        dg.AssetCheckSpec(
            BEATS_RANDOM,
            asset=_ASSET,
            description="METIS's edge-cut ratio, recounted from part_id.npy and the canonical edges, "
            "is below the seeded random partition's (a quality check: it warns, it does not block).",
        ),
    ],
)
def metis_partitions(
    context: dg.AssetExecutionContext, config: MetisPartitionsConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """K METIS parts (core + 1-hop halo per part), C clusters per part, DistDGL partition files."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, _ASSET, config)
    cfg = config.to_dataclass()
    with (
        storage.lock(dataset, context.log.info),
        file_errors_as_failures(dataset),
        storage.publishing(dataset, _ASSET) as out,
    ):
        canonical = storage.upstream_dir(dataset, CanonicalGraph.STAGE)
        s = build_partitions(canonical, out, cfg, graph_name=dataset)
        checks = check_partitions(out, canonical, cfg.seed)
        refuse_failed_checks(dataset, _ASSET, checks)
        metadata = _metadata(out, s)
    metadata["path"] = dg.MetadataValue.path(str(storage.asset_dir(dataset, _ASSET)))
    metadata.update(config_metadata)
    headline = ("num_parts", "metis_edge_cut_ratio", "random_edge_cut_ratio", "clusters")
    return stage_result(context, _ASSET, metadata, headline=headline, check_results=checks)


def _metadata(out, s: dict) -> dict:
    metis, random = s["metis"], s["random"]
    compared = (("weight_cut_ratio",) if s["weighted"] else ()) + _COMPARED
    compared += ("train_imbalance",) if "train_imbalance" in metis else ()

    table = (
        "| metric | METIS | random |\n|---|---|---|\n"
        + "".join(f"| {name} | {metis[name]:.4g} | {random[name]:.4g} |\n" for name in compared)
        + f"| peak_rss_mb | {metis['peak_rss_bytes'] / 2**20:.0f} | {random['peak_rss_bytes'] / 2**20:.0f} |\n"
    )
    return {
        "nodes": s["nodes"],
        "edges": s["edges"],
        "num_parts": s["num_parts"],
        "clusters": s["clusters"],
        "metis_vs_random": dg.MetadataValue.md(table),
        "weighted": s["weighted"],
        **{f"metis_{name}": metis[name] for name in compared},
        **{f"random_{name}": random[name] for name in compared},
        "nodes_per_part": dg.MetadataValue.json(metis["nodes_per_part"]),
        "halo_per_part": dg.MetadataValue.json(metis["halo_per_part"]),
        "balance_train_nodes": bool(s.get("balance_train_nodes", False)),
        **({"train_nodes_per_part": dg.MetadataValue.json(metis["train_nodes"])} if "train_nodes" in metis else {}),
        **_vertex_cut_metadata(s.get("vertex_cut")),
        "seconds": dg.MetadataValue.json(s["seconds"]),
        "peak_rss_mb": s["peak_rss_bytes"] / 2**20,
        "distdgl_config": s["distdgl_config"] or "not written",
        **disk_metadata(out),
        "partition_sizes": png_markdown(out / Partitions.SIZES_PLOT, "core and halo nodes per part"),
    }


def _vertex_cut_metadata(cut: dict | None) -> dict:
    """The vertex cut's figures (`graphs.stages.vertex_cut`), when one was written."""
    if cut is None:
        return {}
    return {
        "vertex_cut": cut["partitioner"],
        "vertex_cut_replication_factor": cut["replication_factor"],
        "vertex_cut_edge_imbalance": cut["edge_imbalance"],
        "vertex_cut_edges_per_part": dg.MetadataValue.json(cut["edges_per_part"]),
        "vertex_cut_vertices_per_part": dg.MetadataValue.json(cut["vertices_per_part"]),
        **({"vertex_cut_train_imbalance": cut["train_imbalance"]} if "train_imbalance" in cut else {}),
    }


def check_partitions(out, canonical, seed: int) -> list[dg.AssetCheckResult]:
    """The two asset checks, recomputed from the files in `out` and the canonical edges."""
    k = Partitions.open(out).num_parts
    part, cores, _halos = load_parts(out)
    problems = partition_problems(part, k, cores)
    one_part = dg.AssetCheckResult(
        check_name=ONE_PART_PER_NODE,
        passed=not problems,
        metadata={"problems": "; ".join(problems) or "none", "parts": len(cores)},
    )
    n = int(read_summary(canonical)["nodes"])
    baseline = random_assign(n, k, seed)
    cut_ours = cut_theirs = m = 0
    for src, dst in edge_batches(canonical):  # streamed: the check never holds the whole edge list
        m += len(src)
        if len(part) == n:
            cut_ours += int(np.count_nonzero(part[src] != part[dst]))
        cut_theirs += int(np.count_nonzero(baseline[src] != baseline[dst]))
    m = max(m, 1)
    ours = cut_ours / m if len(part) == n else 1.0
    theirs = cut_theirs / m
    beats = dg.AssetCheckResult(
        check_name=BEATS_RANDOM,
        # a graph the random partition does not cut (no edges, one part) leaves nothing to beat
        passed=bool(ours < theirs or theirs == 0),
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"metis_edge_cut_ratio": ours, "random_edge_cut_ratio": theirs},
    )
    return [one_part, beats]
