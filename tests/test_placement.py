"""placement='partition': ranks take their seeds from their METIS parts; remote feature rows measured."""

import json
from pathlib import Path

import numpy as np
import pytest

from graphs.sampling import (
    Placement,
    PlacementTraits,
    ShardConfig,
    epoch_seed_batches,
    load_shard_inputs,
    placement_class,
    placement_names,
    ranks_of_parts,
    register_placement,
    remote_rows,
    write_minibatch_shards,
)
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from graphs.stages.partition import PartitionConfig, build_partitions
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training.config import RunConfig
from training.data import ShardStream
from training.train import train


def test_ranks_of_parts_balances_training_nodes_not_nodes():
    # parts 0..3 hold 50, 10, 30, 10 training nodes: greedy gives {0} and {1, 2, 3} = 50 / 50
    part_id = np.repeat(np.arange(4), [60, 60, 60, 60]).astype(np.int32)
    train = np.concatenate([np.arange(0, 50), np.arange(60, 70), np.arange(120, 150), np.arange(180, 190)])
    owner = ranks_of_parts(part_id, train, 2)
    loads = np.bincount(owner[part_id[train]], minlength=2)
    assert loads.tolist() == [50, 50]
    assert owner[0] != owner[2]
    with pytest.raises(ValueError, match="num_parts to a multiple of world_size"):
        ranks_of_parts(part_id, train, 5)


@pytest.mark.parametrize("w", [2, 3])
def test_partition_placement_keeps_own_nodes_and_random_share_sizes(w):
    rng = np.random.default_rng(3)
    n = 900
    train = np.sort(rng.choice(n, 500, replace=False))
    # deliberately unbalanced: rank 0 owns 60% of the training nodes
    rank_of_node = np.where(rng.random(n) < 0.6, 0, rng.integers(1, w, n))
    cfg = ShardConfig(world_size=w, batch_size=40, seed=1)
    for epoch in range(2):
        placed = epoch_seed_batches(train, epoch, cfg, rank_of_node)
        plain = epoch_seed_batches(train, epoch, cfg)
        # same step counts and batch sizes as the default placement
        assert [[len(b) for b in r] for r in placed] == [[len(b) for b in r] for r in plain]
        per_rank = [np.concatenate(r) for r in placed]
        assert np.array_equal(np.sort(np.concatenate(per_rank)), train)  # every node once
        quota = [len(p) for p in per_rank]
        for r, seeds in enumerate(per_rank):
            own = np.count_nonzero(rank_of_node[train] == r)
            kept = np.count_nonzero(rank_of_node[seeds] == r)
            assert kept == min(own, quota[r])  # a rank keeps all of its own nodes its share allows
        # only the surplus moved: the nodes off their owner number exactly the over-quota counts
        moved = sum(np.count_nonzero(rank_of_node[s] != r) for r, s in enumerate(per_rank))
        owns = np.bincount(rank_of_node[train], minlength=w)
        assert moved == int(np.maximum(owns - np.array(quota), 0).sum())


def test_remote_rows_counts_rows_of_other_ranks():
    rank_of_node = np.array([0, 0, 1, 1, 2])
    assert remote_rows(np.array([0, 1, 2, 4]), rank_of_node, 0) == 2
    assert remote_rows(np.array([2, 3]), rank_of_node, 1) == 0


def test_config_refuses_partition_placement_for_subgraph_samplers():
    with pytest.raises(ValueError, match="placement='metis' is not one of"):
        ShardConfig(placement="metis")
    with pytest.raises(ValueError, match="sampler='saint'.*or a placement that places none: 'random'"):
        ShardConfig(placement="partition", sampler="saint")


@register_placement
class ParityPlacement(Placement):
    """A toy strategy registered from this module: rank r owns the nodes whose id is r modulo W."""

    name = "toy_parity"
    traits = PlacementTraits(needs_parts=False, places_seeds=True)

    @classmethod
    def owners(cls, inputs, cfg):
        return np.arange(cfg.world_size, dtype=np.int64), np.arange(inputs.n, dtype=np.int64) % cfg.world_size


def test_the_built_in_placements_declare_their_traits():
    assert {"random", "partition"} <= set(placement_names())
    rnd, part = placement_class("random").traits, placement_class("partition").traits
    assert (rnd.needs_parts, rnd.places_seeds, part.needs_parts, part.places_seeds) == (False, False, True, True)
    with pytest.raises(TypeError, match="declares no PlacementTraits"):
        register_placement(type("NoTraits", (Placement,), {"name": "toy_no_traits"}))


@pytest.fixture(scope="module")
def metis_graph(tmp_path_factory) -> dict:
    """A 2000-node homophilous DC-SBM graph, METIS into 4 parts."""
    root = tmp_path_factory.mktemp("placement")
    gen = GenerateConfig(num_nodes=2000, num_edges=16000, feature_dim=8, num_classes=4, num_edge_files=1, homophily=0.9)
    generate_dataset(gen, root / "landing", progress=False)
    can, adj, part = root / "canonical_graph", root / "normalized_adjacency", root / "metis_partitions"
    build_canonical_graph(root / "landing", can)
    build_normalized_adjacency(can, adj)
    build_partitions(can, part, PartitionConfig(num_parts=4, clusters_per_part=2, write_distdgl=False))
    return {"can": can, "adj": adj, "part": part, "root": root}


def _write(g, out: Path, parts: bool, **kw) -> dict:
    inputs = load_shard_inputs(g["can"], g["adj"], g["part"] if parts else None)
    cfg = ShardConfig(**{"fanouts": "5,5", "batch_size": 128, "epochs": 2, "world_size": 2, **kw})
    return write_minibatch_shards(inputs, out, cfg)


def test_partition_placement_cuts_remote_feature_rows(metis_graph, tmp_path):
    g = metis_graph
    rnd = _write(g, tmp_path / "random", True)
    met = _write(g, tmp_path / "partition", True, placement="partition")
    assert rnd["placement"]["mode"] == "random" and met["placement"]["mode"] == "partition"
    assert met["minibatches_per_epoch_per_rank"] == rnd["minibatches_per_epoch_per_rank"]
    # random seeds: about half the rows of 2 ranks live elsewhere; METIS placement keeps most local
    assert 0.35 < rnd["placement"]["remote_row_share_mean"] < 0.65
    # (a DC-SBM does not cluster as tightly as a citation graph: 0.26 vs 0.50 is typical, see
    # BENCHMARKS.md; the seeded METIS gives 0.256 here, the same edge cut as DGL's METIS)
    assert met["placement"]["remote_row_share_mean"] < 0.6 * rnd["placement"]["remote_row_share_mean"]
    # the manifest's counts are those of the stored minibatches
    part_id = np.load(g["part"] / "part_id.npy")
    rank_of_node = np.asarray(met["placement"]["rank_of_part"])[part_id]
    for s in met["streams"]:
        mbs = list(ShardStream(tmp_path / "partition", s["rank"], s["epoch"]))
        assert sum(len(mb.input_nodes) for mb in mbs) == s["gathered_rows"]
        assert sum(remote_rows(mb.input_nodes.numpy(), rank_of_node, s["rank"]) for mb in mbs) == s["remote_rows"]
    # every epoch still covers the training nodes once
    train = load_shard_inputs(g["can"], g["adj"]).train_nodes
    for epoch in range(2):
        seeds = np.concatenate(
            [mb.seeds.numpy() for r in range(2) for mb in ShardStream(tmp_path / "partition", r, epoch)]
        )
        assert np.array_equal(np.sort(seeds), train)


def test_default_placement_shards_do_not_depend_on_the_parts(metis_graph, tmp_path):
    with_parts = _write(metis_graph, tmp_path / "a", True)
    without = _write(metis_graph, tmp_path / "b", False)
    assert "placement" not in without
    digests = [[f["sha256"] for s in m["streams"] for f in s["files"]] for m in (with_parts, without)]
    assert digests[0] == digests[1]
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["placement"]["mode"] == "random"


def test_a_placement_registered_from_a_test_places_the_seeds_and_is_measured(metis_graph, tmp_path):
    m = _write(metis_graph, tmp_path / "parity", False, placement="toy_parity")
    assert m["placement"]["mode"] == "toy_parity" and m["placement"]["rank_of_part"] == [0, 1]
    train = load_shard_inputs(metis_graph["can"], metis_graph["adj"]).train_nodes
    per_rank = [np.concatenate([mb.seeds.numpy() for mb in ShardStream(tmp_path / "parity", r, 0)]) for r in (0, 1)]
    for r, seeds in enumerate(per_rank):  # a rank keeps all of its own nodes its share allows
        assert np.count_nonzero(seeds % 2 == r) == min(np.count_nonzero(train % 2 == r), len(seeds))
    assert 0 < m["placement"]["remote_row_share_mean"] < 1
    with pytest.raises(ValueError, match="placement='toy_parity' places seed nodes"):
        ShardConfig(placement="toy_parity", sampler="cluster_gcn")


def test_replicated_hot_rows_count_as_local_and_change_no_shard_file(metis_graph, tmp_path):
    """replicate (hybrid partitioning): the top-degree rows every rank holds are never remote; the
    sampling itself is unchanged, and training keeps those rows in its hot tier."""
    g = metis_graph
    part = _write(g, tmp_path / "partition", True, placement="partition")
    hybrid = _write(g, tmp_path / "hybrid", True, placement="partition", replicate=0.1)
    assert [f["sha256"] for s in part["streams"] for f in s["files"]] == [
        f["sha256"] for s in hybrid["streams"] for f in s["files"]
    ]
    assert hybrid["placement"]["replicated_rows"] == 200 and part["placement"]["replicated_rows"] == 0
    assert hybrid["placement"]["remote_row_share_mean"] < part["placement"]["remote_row_share_mean"]
    inputs = load_shard_inputs(g["can"], g["adj"])
    replicated = np.zeros(inputs.n, dtype=bool)
    replicated[np.argsort(-np.diff(inputs.indptr), kind="stable")[:200]] = True
    rank_of_node = np.asarray(hybrid["placement"]["rank_of_part"])[np.load(g["part"] / "part_id.npy")]
    for s in hybrid["streams"]:
        mbs = list(ShardStream(tmp_path / "hybrid", s["rank"], s["epoch"]))
        remote = [
            (rank_of_node[mb.input_nodes.numpy()] != s["rank"]) & ~replicated[mb.input_nodes.numpy()] for mb in mbs
        ]
        assert sum(int(r.sum()) for r in remote) == s["remote_rows"]
    with pytest.raises(ValueError, match="replicate=0.1 .*metis_partitions"):
        _write(g, tmp_path / "no-parts", False, replicate=0.1)

    out = tmp_path / "trained_model"
    run = RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 8, "num_layers": 2},
            "training": {"epochs": 1, "profiler": "none"},
            "paths": {"shards": str(tmp_path / "hybrid"), "out": str(out)},
        }
    )
    assert train(run)["feature_cache_hot_rows"] == 200
