"""Vertex cut: edge partitioners (HDRF, DBH) in metis_partitions, and placement 'vertex_cut' in
minibatch_shards, where each rank samples its own edges and holds the rows they touch."""

import json
from dataclasses import replace

import numpy as np
import pytest

from graphs.formats.canonical_files import CanonicalGraph
from graphs.sampling import ShardConfig, load_shard_inputs, placement_class, write_minibatch_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from graphs.stages.partition import PartitionConfig, build_partitions, read_csr, read_edges
from graphs.stages.vertex_cut import edge_partitioner_class, edge_partitioner_names, vertex_cut
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training.data import ShardStream

K = 4


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> dict:
    """A 3000-node power-law DC-SBM, its canonical graph, Â and METIS parts with an HDRF vertex cut."""
    root = tmp_path_factory.mktemp("vertex_cut")
    gen = GenerateConfig(num_nodes=3000, num_edges=24000, feature_dim=8, num_classes=4, num_edge_files=2)
    generate_dataset(gen, root / "landing", progress=False)
    can, adj = root / "canonical_graph", root / "normalized_adjacency"
    build_canonical_graph(root / "landing", can)
    build_normalized_adjacency(can, adj)
    n, src, dst = read_edges(can)
    return {"root": root, "can": can, "adj": adj, "n": n, "src": src, "dst": dst}


def _partitions(g, name: str, vertex_cut_name: str, k: int = K) -> tuple:
    out = g["root"] / name
    cfg = PartitionConfig(num_parts=k, clusters_per_part=2, write_distdgl=False, vertex_cut=vertex_cut_name)
    return out, build_partitions(g["can"], out, cfg)


def _brute_force(n: int, src: np.ndarray, dst: np.ndarray, edge_part: np.ndarray, k: int) -> np.ndarray:
    """bool [n, k]: part p holds node v (an edge of v in p), one edge at a time."""
    holds = np.zeros((n, k), dtype=bool)
    holds[src, edge_part] = True
    holds[dst, edge_part] = True
    return holds


@pytest.mark.parametrize("name", ["hdrf", "dbh"])
def test_edge_partitioners_place_every_edge_and_report_true_replication(graph, name):
    n, src, dst = graph["n"], graph["src"], graph["dst"]
    _, indptr, indices = read_csr(graph["can"])
    train = np.zeros(n, dtype=bool)
    train[::7] = True
    cut = vertex_cut(name, indptr, indices, K, 0, True, train, np.zeros(n, dtype=np.int32))
    part = cut.edge_part
    assert len(part) == len(src) and part.min() >= 0 and part.max() < K
    # both directions of every undirected edge in the same part
    key = src * n + dst
    reverse = np.searchsorted(key, dst * n + src)
    assert np.array_equal(part[reverse], part)
    holds = _brute_force(n, src, dst, part, K)
    holds[np.arange(n), cut.master] = True
    for p in range(K):
        assert np.array_equal(((cut.holders >> np.uint64(p)) & np.uint64(1)).astype(bool), holds[:, p])
    m = cut.metrics
    assert m["replication_factor"] == pytest.approx(holds.sum() / n, abs=1e-4)
    assert m["edges_per_part"] == np.bincount(part, minlength=K).tolist()
    assert m["vertices_per_part"] == holds.sum(axis=0).tolist()
    # a node's master holds the most of its edges
    counts = np.zeros((n, K), dtype=np.int64)
    np.add.at(counts, (src, part), 1)
    has_edges = counts.sum(axis=1) > 0
    assert np.array_equal(counts[has_edges, cut.master[has_edges]], counts[has_edges].max(axis=1))
    assert m["train_nodes"] == np.bincount(cut.master[train], minlength=K).tolist()
    assert m["edge_imbalance"] < (1.01 if name == "hdrf" else 1.2)  # HDRF balances edges by construction


def test_both_partitioners_replicate_less_than_a_random_edge_assignment(graph):
    n, src, dst = graph["n"], graph["src"], graph["dst"]
    _, indptr, indices = read_csr(graph["can"])
    none, zeros = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int32)
    hdrf = vertex_cut("hdrf", indptr, indices, K, 0, True, none, zeros).metrics["replication_factor"]
    dbh = vertex_cut("dbh", indptr, indices, K, 0, True, none, zeros).metrics["replication_factor"]
    # a random edge assignment (both directions together): what a partitioner must beat
    lo, hi = np.minimum(src, dst), np.maximum(src, dst)
    rand = (np.random.default_rng(0).integers(0, 1 << 30, n)[lo] ^ hi) % K
    random_rf = _brute_force(n, src, dst, rand, K).sum() / n
    assert max(hdrf, dbh) < 0.9 * random_rf


def test_edge_partitioners_are_registered_with_traits_and_refuse_too_many_parts():
    assert {"hdrf", "dbh"} <= set(edge_partitioner_names())
    assert edge_partitioner_class("dbh").traits.full_degrees and not edge_partitioner_class("hdrf").traits.full_degrees
    with pytest.raises(ValueError, match="vertex_cut='metis' is not one of"):
        PartitionConfig(vertex_cut="metis")
    with pytest.raises(ValueError, match="at most 64 parts; num_parts=65"):
        PartitionConfig(num_parts=65, vertex_cut="hdrf")


def test_the_stage_writes_the_vertex_cut_only_when_asked_and_the_rest_is_unchanged(graph):
    plain, s_plain = _partitions(graph, "plain", "none")
    cut, s_cut = _partitions(graph, "hdrf", "hdrf")
    assert "vertex_cut" not in s_plain and not (plain / "vertex_cut").exists()
    assert s_cut["vertex_cut"]["partitioner"] == "hdrf" and s_cut["vertex_cut"]["replication_factor"] > 1
    for f in ("part_id.npy", "cluster_id.npy", "part-0/core_nodes.npy", "part-3/halo_nodes.npy"):
        assert (plain / f).read_bytes() == (cut / f).read_bytes()
    again, _ = _partitions(graph, "hdrf-again", "hdrf")
    for f in ("vertex_cut/edge_part.npy", "vertex_cut/master.npy"):
        assert (cut / f).read_bytes() == (again / f).read_bytes()


@pytest.fixture(scope="module")
def hdrf_parts(graph):
    return _partitions(graph, "hdrf-shards", "hdrf")[0]


def _local_keys(mb, n: int) -> np.ndarray:
    """Canonical keys src * n + dst of a stored minibatch's sampled edges (self loops left out):
    destination v sampled neighbour u through Â[v, u], the canonical edge v -> u."""
    nodes = mb.input_nodes.numpy()
    keys = []
    for b in mb.blocks:
        indptr, idx = b.indptr.numpy(), b.indices.numpy()
        dst = np.repeat(nodes[: b.num_dst], np.diff(indptr))
        src = nodes[idx]
        keep = src != dst
        keys.append(dst[keep] * n + src[keep])
    return np.concatenate(keys)


def test_each_rank_samples_only_its_own_edges_and_holds_their_rows(graph, hdrf_parts, tmp_path):
    graph = {**graph, "parts": hdrf_parts}
    n, src, dst = graph["n"], graph["src"], graph["dst"]
    inputs = load_shard_inputs(graph["can"], graph["adj"], graph["parts"])
    cfg = ShardConfig(fanouts="5,5", batch_size=64, epochs=2, world_size=2, placement="vertex_cut")
    m = write_minibatch_shards(inputs, tmp_path / "vc", cfg)
    metis = write_minibatch_shards(inputs, tmp_path / "metis", replace(cfg, placement="partition"))
    placement = m["placement"]
    assert placement["mode"] == "vertex_cut" and placement["own_edges"]["replication_factor"] > 1
    rank_of_part = np.asarray(placement["rank_of_part"])
    edge_rank = rank_of_part[np.load(graph["parts"] / "vertex_cut" / "edge_part.npy")]
    key = src * n + dst
    held = np.zeros((n, 2), dtype=bool)
    held[src, edge_rank] = True
    held[dst, edge_rank] = True
    held[np.arange(n), rank_of_part[np.load(graph["parts"] / "vertex_cut" / "master.npy")]] = True
    assert placement["own_edges"]["rows_held_per_rank"] == held.sum(axis=0).tolist()
    train = inputs.train_nodes
    for s in m["streams"]:
        mbs = list(ShardStream(tmp_path / "vc", s["rank"], s["epoch"]))
        for mb in mbs:
            keys = _local_keys(mb, n)
            pos = np.searchsorted(key, keys)
            assert np.array_equal(key[pos], keys)  # real edges
            assert (edge_rank[pos] == s["rank"]).all()  # of this rank only
        remote = sum(int(np.count_nonzero(~held[mb.input_nodes.numpy(), s["rank"]])) for mb in mbs)
        assert remote == s["remote_rows"]
    for epoch in range(2):  # every training node once per epoch
        seeds = np.concatenate([mb.seeds.numpy() for r in range(2) for mb in ShardStream(tmp_path / "vc", r, epoch)])
        assert np.array_equal(np.sort(seeds), train)
    # remote rows only for seeds moved off their master's rank: far fewer than METIS's halo rows
    assert placement["remote_row_share_total"] < 0.1 * metis["placement"]["remote_row_share_total"]
    manifest = json.loads((tmp_path / "vc" / "manifest.json").read_text())
    assert manifest["placement"]["own_edges"]["edges_per_rank"] == np.bincount(edge_rank, minlength=2).tolist()
    # byte-identical whatever the number of sampling processes
    one = write_minibatch_shards(inputs, tmp_path / "vc1", replace(cfg, workers=1))
    assert [f["sha256"] for s in one["streams"] for f in s["files"]] == [
        f["sha256"] for s in m["streams"] for f in s["files"]
    ]


def test_vertex_cut_placement_refusals(graph, hdrf_parts, tmp_path):
    assert placement_class("vertex_cut").traits.own_edges
    with pytest.raises(ValueError, match="placement='vertex_cut' samples each rank's own edges; sampler='importance'"):
        ShardConfig(placement="vertex_cut", sampler="importance")
    with pytest.raises(ValueError, match="replicate=0.1 adds rows"):
        ShardConfig(placement="vertex_cut", replicate=0.1)
    plain, _ = _partitions(graph, "plain-refusals", "none")
    inputs = load_shard_inputs(graph["can"], graph["adj"], plain)
    with pytest.raises(
        ValueError, match=r"vertex_cut/master.npy: missing; materialize metis_partitions with vertex_cut"
    ):
        write_minibatch_shards(inputs, tmp_path / "x", ShardConfig(placement="vertex_cut"))
    inputs = load_shard_inputs(graph["can"], graph["adj"], hdrf_parts)
    cfg = ShardConfig(placement="vertex_cut", samplers={"neighbor": {"prob": "weight"}})
    with pytest.raises(ValueError, match="samples each rank's own edges uniformly"):
        write_minibatch_shards(inputs, tmp_path / "y", cfg)
    assert CanonicalGraph.open(graph["can"]).num_edges == len(graph["src"])


def test_a_user_turns_the_vertex_cut_on_in_dagster_and_trains_from_its_shards(shared_datasets, tmp_path):
    """metis_partitions with vertex_cut and minibatch_shards with placement vertex_cut, through
    Dagster's run config on Cora; training reads the shards."""
    import dagster as dg

    from assets.canonical_graph import canonical_graph
    from assets.common import GnnflowStorage, dataset_partitions
    from assets.metis_partitions import metis_partitions
    from assets.minibatch_shards import minibatch_shards
    from assets.normalized_adjacency import normalized_adjacency
    from training.config import RunConfig
    from training.train import train

    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(shared_datasets))
    config = {
        "metis_partitions": {"config": {"num_parts": 4, "vertex_cut": "hdrf", "write_distdgl": False}},
        "minibatch_shards": {"config": {"placement": "vertex_cut", "fanouts": "10,5", "batch_size": 32}},
    }
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(dataset_partitions.name, ["cora"])
        result = dg.materialize(
            [canonical_graph, normalized_adjacency, metis_partitions, minibatch_shards],
            partition_key="cora",
            instance=instance,
            resources={"storage": storage},
            run_config={"ops": config},
        )
    assert result.success
    parts = result.asset_materializations_for_node("metis_partitions")[0].metadata
    assert parts["vertex_cut"].value == "hdrf" and 1 < parts["vertex_cut_replication_factor"].value < 4
    assert sum(parts["vertex_cut_edges_per_part"].value) == parts["edges"].value
    shards = result.asset_materializations_for_node("minibatch_shards")[0].metadata
    assert shards["placement"].value == "vertex_cut" and shards["remote_feature_row_share"].value < 0.05
    out = tmp_path / "home" / "cora"
    run = RunConfig.from_dict(
        {
            "model": {"conv": "gcn", "hidden": 16, "num_layers": 2},
            "training": {"epochs": 1, "profiler": "none"},
            "paths": {"shards": str(out / "minibatch_shards"), "out": str(tmp_path / "run")},
        }
    )
    assert train(run)["epochs_trained"] == 1
