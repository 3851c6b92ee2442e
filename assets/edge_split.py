"""edge_split: held-out edges and the message-passing graph of a link-prediction dataset.

An asset of its own in the catalog and the lineage (canonical_graph -> edge_split ->
normalized_adjacency), produced by the normalized_adjacency step
(`assets.normalized_adjacency`, a multi-asset) rather than by a step of its own: node
classification, the default, then runs exactly the steps it ran before (each step of
``dagster asset materialize`` is a process of its own), and edge_split is simply not
materialized for it.

For a dataset whose gnnflow.yaml says ``task: link_prediction`` the step runs
`graphs.stages.edge_split.build_edge_split` (files and format in that module) before building Â
from its message-passing graph; minibatch_shards reads that graph too
(`GnnflowStorage.graph_dir`), while compressed_graph keeps building its Bloom filters from
canonical_graph, i.e. over every edge, held-out ones included. The split is made once: a
later run whose canonical edges (SHA-256 of edges.parquet) and settings are unchanged keeps
the written split and does not materialize edge_split again.

Settings: ``ops.edge_split.config`` of the dataset's gnnflow.yaml (`EdgeSplitConfig`); the
step's run config is normalized_adjacency's.

Blocking check ``no_held_out_edge_in_message_passing``: no validation or test pair, in
either direction, is an edge of the written message-passing graph, and no evaluation
negative is an edge of the full graph.
"""

import json
from dataclasses import asdict

import dagster as dg
import numpy as np

from assets.common import GnnflowStorage, disk_metadata, refuse_failed_checks
from assets.config import dagster_config
from assets.integrity import file_errors_as_failures
from assets.settings import register_config
from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.shard_manifest import LINK_PREDICTION
from graphs.infra.storage import read_file_hashes, verified
from graphs.stages.edge_split import EdgeSplit, EdgeSplitConfig, build_edge_split, load_edge_split
from graphs.stages.edge_split_typed import TargetRelation, relation_edge_keys
from graphs.stages.negatives import EdgeKeys

EdgeSplitRunConfig = dagster_config(EdgeSplitConfig, "EdgeSplitRunConfig")

SPLIT_ASSET = EdgeSplit.STAGE
NO_LEAK = "no_held_out_edge_in_message_passing"
SPLIT_DESCRIPTION = (
    "Link prediction only: seeded train/val/test split of the undirected edges, fixed evaluation negatives, "
    "and the message-passing graph without held-out edges (made by the normalized_adjacency step)."
)
SPLIT_CHECK_SPEC = dg.AssetCheckSpec(
    NO_LEAK,
    asset=SPLIT_ASSET,
    description="No held-out (validation/test) pair is an edge of the message-passing graph in either "
    "direction, and no evaluation negative is an edge of the full graph.",
    blocking=True,
)
register_config(SPLIT_ASSET, EdgeSplitRunConfig)


def skipped_check(why: str) -> dg.AssetCheckResult:
    """The check's result when edge_split is not materialized by a run (the step must report it)."""
    return dg.AssetCheckResult(
        asset_key=SPLIT_ASSET, check_name=NO_LEAK, passed=True, metadata={"evaluated": False, "why": why}
    )


def _is_current(storage: GnnflowStorage, dataset: str, cfg, edges_sha: str) -> bool:
    """Whether the published split was made from these canonical edges with these settings."""
    current = storage.asset_dir(dataset, SPLIT_ASSET) / EdgeSplit.SUMMARY
    if not current.is_file():
        return False
    split = json.loads(current.read_text()).get("split", {})
    return split.get("canonical_edges_sha256") == edges_sha and split.get("config") == asdict(cfg)


def edge_split_is_current(context: dg.AssetExecutionContext, storage: GnnflowStorage, dataset: str) -> bool:
    """Whether `materialize_edge_split` would keep the published split (same canonical edges and settings)."""
    config, _ = storage.settings(context, dataset, SPLIT_ASSET, EdgeSplitRunConfig())
    with file_errors_as_failures(dataset):
        edges_sha = _canonical_edges_sha(storage.upstream_dir(dataset, CanonicalGraph.STAGE))
    return _is_current(storage, dataset, config.to_dataclass(), edges_sha)


def _canonical_edges_sha(canonical) -> str:
    """The SHA-256 canonical_graph recorded for its edges.parquet, once the file is checked against it."""
    verified(canonical, CanonicalGraph.EDGES)
    return read_file_hashes(canonical, stage=CanonicalGraph.STAGE)[CanonicalGraph.EDGES]["sha256"]


def materialize_edge_split(
    context: dg.AssetExecutionContext, storage: GnnflowStorage, dataset: str
) -> dg.MaterializeResult | dg.AssetCheckResult:
    """Build and publish the split (checked first); only the check's result (`skipped_check`)
    when the written split is current."""
    config, config_metadata = storage.settings(context, dataset, SPLIT_ASSET, EdgeSplitRunConfig())
    cfg = config.to_dataclass()
    with storage.lock(dataset, context.log.info), file_errors_as_failures(dataset):
        canonical = storage.upstream_dir(dataset, CanonicalGraph.STAGE)
        edges_sha = _canonical_edges_sha(canonical)
        if _is_current(storage, dataset, cfg, edges_sha):
            context.log.info(f"edge_split of '{dataset}' is current (same canonical edges and settings): kept")
            return skipped_check("the split is unchanged since it was written and checked")
        with storage.publishing(dataset, SPLIT_ASSET) as out:
            try:
                s = build_edge_split(canonical, out, cfg)
            except ValueError as exc:
                raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc
            check = check_split(out, canonical)
            refuse_failed_checks(dataset, SPLIT_ASSET, [check])
            _record_canonical(out, edges_sha)
            disk = disk_metadata(out)
    split = s["split"]
    metadata = {
        "task": LINK_PREDICTION,
        "path": dg.MetadataValue.path(str(storage.asset_dir(dataset, SPLIT_ASSET))),
        "undirected_edges": split["undirected_edges"],
        "train_edges": split["train"],
        "val_edges": split["val"],
        "test_edges": split["test"],
        "eval_negatives": split["eval_negatives"],
        "message_passing_edges": s["edges"],
        "seconds": s["seconds"],
        **disk,
        **config_metadata,
    }
    return dg.MaterializeResult(asset_key=SPLIT_ASSET, metadata=metadata, check_results=[check])


def _record_canonical(out, edges_sha: str) -> None:
    """Note in the split's summary which canonical edges it was made from (the 'made once' test)."""
    path = out / EdgeSplit.SUMMARY
    summary = json.loads(path.read_text())
    summary["split"]["canonical_edges_sha256"] = edges_sha
    path.write_text(json.dumps(summary, indent=2))


def check_split(out, canonical) -> dg.AssetCheckResult:
    """The blocking check, evaluated on the written files (vectorised key lookups)."""
    split = load_edge_split(out)
    target = split.summary["split"].get("relation")  # a typed graph: the target relation's edges only
    mp = (
        EdgeKeys.from_canonical(out, split.n)
        if target is None
        else relation_edge_keys(out, TargetRelation.from_json(target))
    )
    held = np.concatenate([split.val, split.test])
    leaked = int(mp.contains(held[:, 0], held[:, 1]).sum())
    if target is None:  # an undirected pair: neither direction (a typed relation's keys hold its reverse's)
        leaked += int(mp.contains(held[:, 1], held[:, 0]).sum())
    full = EdgeKeys.from_canonical(canonical, split.n)
    neg = np.concatenate([split.val_negatives, split.test_negatives])
    bad_negatives = int(full.contains(neg[:, 0], neg[:, 1]).sum())
    return dg.AssetCheckResult(
        asset_key=SPLIT_ASSET,
        check_name=NO_LEAK,
        passed=leaked == 0 and bad_negatives == 0,
        metadata={"held_out_edges_in_message_passing": leaked, "negatives_that_are_edges": bad_negatives},
    )
