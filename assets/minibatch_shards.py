"""minibatch_shards: sampled blocks for E epochs, one shard stream per DDP rank.

Calls `graphs.sampling.write_minibatch_shards` (samplers, file layout and manifest are
documented there) on the canonical graph, the normalized adjacency, for Cluster-GCN the
METIS clusters, and with feature_encoding 'compressed' compressed_graph's feature codes
(referenced by the manifest, not copied).
trained_model reads the shards with `training.data.ShardStream` and
takes its world size and batch size from the manifest. A dataset without labels is
skipped with a message (nothing to train on), not failed — unless its task is link
prediction: then edge-seed shards of edge_split's message-passing graph are written
(`graphs.sampling.link.write_link_shards`), negatives rejected by compressed_graph's Bloom
filters, and the metadata counts the rejected candidates.
"""

from pathlib import Path

import dagster as dg
import numpy as np

from assets.common import (
    NEEDS_LABELS_TAG,
    GnnflowStorage,
    dataset_partitions,
    disk_metadata,
    refuse_failed_checks,
    skip_without_labels,
)
from assets.config import dagster_config
from assets.integrity import file_errors_as_failures
from assets.reporting import stage_result
from assets.settings import register_config
from assets.task_registry import task_class
from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.node_scores import NODE_SCORES_NAME
from graphs.formats.partition_files import Partitions
from graphs.formats.shard_format import STAGE as MINIBATCH_SHARDS
from graphs.formats.shard_manifest import ShardManifest
from graphs.sampling import ShardConfig, load_shard_inputs, sampler_class
from graphs.sampling.placement import placement_class
from graphs.sampling.rebalance import rank_shares
from graphs.stages.canonical import read_summary
from graphs.stages.normalize import Adjacency
from training.outputs import METRICS, rank_seeds_per_second
from training.outputs import STAGE as TRAINED_MODEL

MinibatchShardsConfig = dagster_config(ShardConfig, "MinibatchShardsConfig")

BALANCED = "equal_minibatches_per_rank"
FILES_INTACT = "files_match_manifest"

_ASSET = MINIBATCH_SHARDS
register_config(_ASSET, MinibatchShardsConfig)


@dg.asset(
    name=_ASSET,  # the asset key: the stage's constant (also the function's name)
    partitions_def=dataset_partitions,
    deps=[CanonicalGraph.STAGE, Adjacency.STAGE, Partitions.STAGE, CompressedGraph.STAGE],
    group_name="training_data",
    kinds={"numpy", "dgl"},
    tags={NEEDS_LABELS_TAG: "labels"},
    check_specs=[
        dg.AssetCheckSpec(
            BALANCED,
            asset=_ASSET,
            description="Every (epoch, rank) stream holds the same number "
            "of minibatches (unequal step counts hang DDP); for neighbor/importance each epoch's "
            "seeds over all ranks number exactly the training nodes.",
            blocking=True,
        ),
        dg.AssetCheckSpec(
            FILES_INTACT,
            asset=_ASSET,
            description="Every shard file the manifest lists exists with the byte size the manifest records.",
            blocking=True,
        ),
    ],
)
def minibatch_shards(
    context: dg.AssetExecutionContext, config: MinibatchShardsConfig, storage: GnnflowStorage
) -> dg.MaterializeResult:
    """Sampled minibatch blocks (neighbor / importance / Cluster-GCN / GraphSAINT) written as shards per rank."""
    dataset = storage.dataset(context)
    config, config_metadata = storage.settings(context, dataset, _ASSET, config)
    cfg = config.to_dataclass()
    with storage.lock(dataset, context.log.info):
        canonical = storage.upstream_dir(dataset, CanonicalGraph.STAGE)
        adjacency = storage.upstream_dir(dataset, Adjacency.STAGE)
        partitions = storage.asset_dir(dataset, Partitions.STAGE)
        compressed = storage.asset_dir(dataset, CompressedGraph.STAGE)
        task = storage.task(dataset)
        if task.traits.needs_labels:
            skipped = skip_without_labels(
                context, read_summary(canonical), "sample for training", [BALANCED, FILES_INTACT]
            )
            if skipped is not None:
                return skipped
        _require_partition_files(dataset, cfg, partitions)
        scores = _adaptive_node_scores(context, storage, dataset, cfg)
        shares = _rank_shares(context, storage, dataset, cfg, task)
        with file_errors_as_failures(dataset), storage.publishing(dataset, _ASSET) as out:
            try:
                inputs = load_shard_inputs(
                    storage.graph_dir(dataset),  # the task's message-passing graph
                    adjacency,
                    partitions if partitions.is_dir() else None,
                    compressed if compressed.is_dir() else None,
                    node_scores=scores,
                    rank_shares=shares,
                )
                m = task.write_shards(inputs, out, cfg, canonical=canonical, log=context.log.info)
            except (ValueError, FileNotFoundError) as exc:
                raise dg.Failure(description=f"dataset '{dataset}': {exc}") from exc
            checks = check_shards(out)
            refuse_failed_checks(dataset, _ASSET, checks)
            disk = disk_metadata(out)
        out = storage.asset_dir(dataset, _ASSET)

    metadata = {"path": dg.MetadataValue.path(str(out))} | _shard_metadata(m, cfg, disk)
    metadata.update(config_metadata)
    headline = ("sampler", "epochs", "world_size", "minibatches_per_rank_per_epoch", "sampled_edges", "seconds")
    return stage_result(context, _ASSET, metadata, headline=headline, check_results=checks)


def _require_partition_files(dataset: str, cfg: ShardConfig, partitions: Path) -> None:
    """dg.Failure when partition placement or Cluster-GCN needs a metis_partitions file that is missing."""
    if placement_class(cfg.placement).traits.needs_parts and not (partitions / Partitions.PART_ID).is_file():
        raise dg.Failure(
            description=f"dataset '{dataset}': placement {cfg.placement!r} needs {partitions / Partitions.PART_ID}; "
            "materialize metis_partitions first"
        )
    if sampler_class(cfg.sampler).traits.needs_clusters and not (partitions / Partitions.CLUSTER_ID).is_file():
        raise dg.Failure(
            description=f"dataset '{dataset}': sampler {cfg.sampler!r} needs {partitions / Partitions.CLUSTER_ID}; "
            "materialize metis_partitions first"
        )


def _adaptive_node_scores(context, storage: GnnflowStorage, dataset: str, cfg: ShardConfig) -> Path | None:
    """The node scores adaptive sampling reads: the gradient statistics of the dataset's last training run."""
    scores = storage.asset_dir(dataset, TRAINED_MODEL) / NODE_SCORES_NAME
    wanted = sampler_class(cfg.sampler).reads_node_scores(cfg)
    scores = scores if wanted and scores.is_file() else None
    if wanted and scores is None:
        context.log.info(
            f"sampler {cfg.sampler!r}: no {NODE_SCORES_NAME} in trained_model yet (train with "
            "training.node_grad_stats on); sampling by degree alone this round"
        )
    return scores


def _rank_shares(context, storage: GnnflowStorage, dataset: str, cfg: ShardConfig, task) -> np.ndarray | None:
    """Each rank's share of an epoch's seeds (``rebalance: true``): by the rank speeds of the
    dataset's last training run (`graphs.sampling.rebalance`); None = equal shares."""
    if not cfg.rebalance:
        return None
    if task.traits.seeds != "nodes":
        context.log.info(f"rebalance: shares node seeds; task {task.name!r} seeds edges, equal shares")
        return None
    metrics = storage.asset_dir(dataset, TRAINED_MODEL) / METRICS
    if not metrics.is_file():
        context.log.info(f"rebalance: no {metrics} yet; equal shares this round")
        return None
    try:
        speeds = rank_seeds_per_second(metrics)
    except ValueError as exc:
        raise dg.Failure(description=f"dataset '{dataset}': {exc}; re-materialize trained_model") from None
    if sorted(speeds) != list(range(cfg.world_size)):
        context.log.info(
            f"rebalance: {metrics} times ranks {sorted(speeds)}, not one process per rank of world_size="
            f"{cfg.world_size}; equal shares this round"
        )
        return None
    rates = [speeds[r] for r in range(cfg.world_size)]
    shares = rank_shares(rates, cfg.rebalance_tolerance)
    said = "equal shares (within rebalance_tolerance)" if shares is None else f"shares {np.round(shares, 4).tolist()}"
    context.log.info(f"rebalance: rank speeds {np.round(rates, 1).tolist()} seeds/s in the last run -> {said}")
    return shares


def _rank_load(m: dict) -> dict:
    """Each rank's seeds and sampled edges per epoch (mean over the sampled epochs) and their
    imbalance (largest rank over the mean), from the manifest's streams."""
    w, epochs = m["world_size"], m["epochs"]
    load = np.zeros((2, w), dtype=np.float64)
    for s in m["streams"]:
        load[:, s["rank"]] += (s["seeds"], s["sampled_edges"])
    seeds, edges = load / epochs
    return {
        "seeds_per_rank": str([round(x, 1) for x in seeds]),
        "sampled_edges_per_rank": str([round(x, 1) for x in edges]),
        "sampled_edge_imbalance": round(float(edges.max() / edges.mean()), 4) if edges.mean() > 0 else 1.0,
    }


def _shard_metadata(m: dict, cfg: ShardConfig, disk: dict) -> dict:
    """The materialization's metadata from the shards' manifest `m`: counts, sizes, rates and sampler facts."""
    metadata = {
        "sampler": m["sampler"],
        "num_layers": m["num_layers"],
        "fanouts": cfg.fanouts,
        "epochs": m["epochs"],
        "world_size": m["world_size"],
        "batch_size": m["batch_size"],
        "weight_encoding": m["weight_encoding"],
        "feature_encoding": cfg.feature_encoding,
        "train_nodes": m["train_nodes"],
        "minibatches_per_rank_per_epoch": m["minibatches_per_epoch_per_rank"],
        "shard_files": sum(len(s["files"]) for s in m["streams"]),
        "sampled_edges": m["sampled_edges"],
        "seeds": m["seeds"],
        **disk,
        "bytes_per_sampled_edge": m["bytes_per_sampled_edge"],
        "seconds": m["seconds"],
        "seeds_per_second": m["seeds_per_second"],
        "sampled_edges_per_second": m["sampled_edges_per_second"],
        "peak_rss_mb": m["peak_rss_bytes"] / 2**20,
        "sampling_processes": m["sampling_processes"],
        "workers_private_rss_mb": m["workers_private_rss_bytes"] / 2**20,
        "placement": cfg.placement,
    }
    if "placement" in m:
        metadata["remote_feature_row_share"] = m["placement"]["remote_row_share_mean"]
        metadata["rank_of_part"] = str(m["placement"]["rank_of_part"])
    metadata.update(_rank_load(m))
    if "rebalance" in m:
        metadata["rebalance_shares"] = str([round(s, 4) for s in m["rebalance"]["shares"]])
    if "adaptive" in m:
        metadata["adaptive_alpha"] = m["adaptive"]["alpha"]
        metadata["adaptive_node_scores"] = m["adaptive"]["node_scores"]
    if "saint" in m:
        metadata["saint_presamples"] = m["saint"]["presamples"]
        metadata["saint_mean_subgraph_nodes"] = m["saint"]["mean_subgraph_nodes"]
    if "graphs" in m:  # minibatches of a collection's graphs: the node-level settings do not apply
        for key in ("fanouts", "num_layers", "batch_size", "train_nodes", "placement"):
            metadata.pop(key)
        metadata["graphs_sampled"] = metadata.pop("seeds")
        metadata.update(task=m["task"], **m["graphs"])
    if "link" in m:
        ns = m["link"]["negative_sampling"]
        metadata.update(
            task=m["task"],
            seed_edges=m["link"]["seed_edges"],
            negative_filter=m["link"]["negative_filter"],
            negative_candidates=ns["candidates"],
            negatives_rejected_as_edge=ns["rejected_as_edge"],
            negative_rejection_rate=round(ns["rejection_rate"], 6),
        )
    return metadata


def check_shards(out: Path) -> list[dg.AssetCheckResult]:
    """The two asset checks, evaluated on the manifest.json and the shard files in `out`."""
    manifest = ShardManifest.open(out)
    counts = sorted(set(manifest.stream_minibatches()))
    balanced = len(counts) == 1
    meta = {"minibatches_per_stream": counts}
    # a seed sampler takes every training node once per epoch (class-balanced: as many draws)
    if sampler_class(manifest.sampler).traits.seeds and task_class(manifest.task).traits.seeds == "nodes":
        per_epoch = {}
        for s in manifest.doc["streams"]:
            per_epoch[s["epoch"]] = per_epoch.get(s["epoch"], 0) + s["seeds"]
        wrong = {e: c for e, c in per_epoch.items() if c != manifest.train_nodes}
        balanced = balanced and not wrong
        meta["epochs_with_wrong_seed_count"] = len(wrong)
    missing = []
    for s in manifest.doc["streams"]:
        for f in s["files"]:
            p = out / f["path"]
            if not p.is_file() or p.stat().st_size != f["bytes"]:
                missing.append(f["path"])
    return [
        dg.AssetCheckResult(check_name=BALANCED, passed=balanced, metadata=meta),
        dg.AssetCheckResult(
            check_name=FILES_INTACT,
            passed=not missing,
            metadata={"bad_files": len(missing), "first_bad": missing[0] if missing else ""},
        ),
    ]
