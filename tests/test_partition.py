"""metis_partitions library and both preprocess assets: planted blocks, halos, the DistDGL
round trip, Cluster-GCN clusters, the checks, and materialization through Dagster."""

import json

import dagster as dg
import dgl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from assets.metis_partitions import metis_partitions
from assets.normalized_adjacency import normalized_adjacency
from graphs.infra.storage import write_file_hashes
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.partition import (
    PartitionConfig,
    build_partitions,
    csr_clusters,
    csr_indptr,
    load_parts,
    metis_assign,
    metis_assign_csr,
    random_assign,
    read_csr,
    read_edges,
)
from graphs.stages.partition_metrics import (
    core_and_halo,
    csr_halos,
    csr_metrics,
    partition_metrics,
    partition_problems,
)
from tests.conftest import write_edges

BLOCKS, BLOCK_SIZE = 4, 200


def planted_landing(folder, seed=0, intra=2400, inter=60):
    """4 dense blocks of 200 nodes (ids shuffled), `inter` random edges between blocks.

    Returns the block of every original id 0..799.
    """
    rng = np.random.default_rng(seed)
    n = BLOCKS * BLOCK_SIZE
    block = rng.permutation(np.repeat(np.arange(BLOCKS), BLOCK_SIZE))
    members = [np.flatnonzero(block == b) for b in range(BLOCKS)]
    src, dst = [], []
    for b in range(BLOCKS):
        src.append(rng.choice(members[b], intra))
        dst.append(rng.choice(members[b], intra))
    a = rng.integers(0, BLOCKS, inter)
    c = (a + rng.integers(1, BLOCKS, inter)) % BLOCKS
    src.append(np.array([rng.choice(members[x]) for x in a]))
    dst.append(np.array([rng.choice(members[x]) for x in c]))
    write_edges(folder / "edges.parquet", np.concatenate(src), np.concatenate(dst))
    split = np.array(["train", "val", "test"])[rng.integers(0, 3, n)]
    pq.write_table(
        pa.table({"node_id": np.arange(n), "label": pa.array(block, pa.int32()), "split": split}),
        folder / "nodes.parquet",
    )
    feat = rng.normal(size=(n, 6)).astype(np.float32)
    pq.write_table(
        pa.table({"node_id": np.arange(n), "feat": pa.FixedSizeListArray.from_arrays(pa.array(feat.ravel()), 6)}),
        folder / "features.parquet",
    )
    return block


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(canonical dir, block per node, partitions dir) of the planted graph, built once."""
    tmp = tmp_path_factory.mktemp("planted")
    block = planted_landing(tmp / "landing")
    build_canonical_graph(tmp / "landing", tmp / "canonical")  # integer ids 0..799 keep their order
    build_partitions(tmp / "canonical", tmp / "parts", PartitionConfig(num_parts=4, clusters_per_part=8), "planted")
    return tmp / "canonical", block, tmp / "parts"


def test_metis_recovers_planted_blocks(planted):
    canonical, block, _ = planted
    n, src, dst = read_edges(canonical)
    planted_cut = int(np.count_nonzero(block[src] != block[dst]))
    part = metis_assign((csr_indptr(src, n), dst), 4)
    assert part.dtype == np.int32 and part.shape == (n,)
    cut = int(np.count_nonzero(part[src] != part[dst]))
    assert 0 < planted_cut and cut <= 1.5 * planted_cut
    # each block lands (almost) entirely in its own part
    for b in range(BLOCKS):
        counts = np.bincount(part[block == b], minlength=4)
        assert counts.max() >= 0.95 * BLOCK_SIZE
    assert len({int(np.bincount(part[block == b]).argmax()) for b in range(BLOCKS)}) == BLOCKS


def test_random_assign_is_seeded_and_balanced():
    a, b, c = random_assign(100_000, 4, seed=0), random_assign(100_000, 4, seed=0), random_assign(100_000, 4, seed=1)
    assert a.dtype == np.int32 and np.array_equal(a, b) and not np.array_equal(a, c)
    assert set(np.unique(a)) == {0, 1, 2, 3}
    assert np.bincount(a).max() / 25_000 < 1.02
    assert np.all(random_assign(10, 1) == 0)


def test_core_halo_and_metrics_hand_checked():
    # 0-1-2-3 path plus 3-4, symmetrized; parts {0,1}, {2,3,4}
    pairs = [(0, 1), (1, 2), (2, 3), (3, 4)]
    src = np.array([u for u, v in pairs] + [v for u, v in pairs])
    dst = np.array([v for u, v in pairs] + [u for u, v in pairs])
    part = np.array([0, 0, 1, 1, 1], dtype=np.int32)
    cores, halos = core_and_halo(src, dst, part, 2)
    assert [c.tolist() for c in cores] == [[0, 1], [2, 3, 4]]
    assert [h.tolist() for h in halos] == [[2], [1]]
    m = partition_metrics(src, dst, part, 2, halos)
    assert m["edge_cut"] == 2 and m["edge_cut_ratio"] == pytest.approx(2 / 8)
    assert m["node_balance"] == pytest.approx(3 / 2.5)
    assert m["edges_per_part"] == [3, 5] and m["edge_balance"] == pytest.approx(5 / 4)
    assert m["halo_replication"] == pytest.approx(2 / 5)
    assert partition_problems(part, 2, cores) == []


def test_partition_problems_catch_bad_partitions():
    part = np.array([0, 0, 1, 1], dtype=np.int32)
    good = [np.array([0, 1]), np.array([2, 3])]
    assert partition_problems(part, 2, good) == []
    assert any("outside 0..1" in p for p in partition_problems(np.array([0, 0, 1, 2], np.int32), 2, good))
    overlap = partition_problems(part, 2, [np.array([0, 1, 2]), np.array([2, 3])])
    assert any("more than one" in p for p in overlap) and any("another part_id" in p for p in overlap)
    assert any("in no core set" in p for p in partition_problems(part, 2, [np.array([0, 1]), np.array([3])]))


def test_summary_files_and_metis_beats_random(planted):
    canonical, block, parts = planted
    s = json.loads((parts / "summary.json").read_text())
    n = s["nodes"]
    part, cores, halos = load_parts(parts)
    assert part.dtype == np.int32 and part.shape == (n,)
    assert partition_problems(part, 4, cores) == []
    assert s["metis"]["edge_cut_ratio"] < 0.1 < 0.5 < s["random"]["edge_cut_ratio"]
    assert s["metis"]["halo_replication"] < s["random"]["halo_replication"]
    assert s["metis"]["nodes_per_part"] == [len(c) for c in cores]
    assert s["metis"]["halo_per_part"] == [len(h) for h in halos]
    # halos: outside the part, and each has an edge into the part
    _, src, dst = read_edges(canonical)
    for p in range(4):
        assert not np.isin(halos[p], cores[p]).any()
        assert np.array_equal(halos[p], np.unique(src[(part[dst] == p) & (part[src] != p)]))


def test_clusters_are_nested_in_parts(planted):
    _, _, parts = planted
    part = np.load(parts / "part_id.npy")
    cluster = np.load(parts / "cluster_id.npy")
    assert cluster.dtype == np.int32
    assert np.array_equal(cluster // 8, part)  # global id p * C + c
    assert len(np.unique(cluster)) == 32
    assert json.loads((parts / "summary.json").read_text())["clusters"] == 32


def test_cluster_assign_small_parts_get_fewer_clusters():
    # part 0: a 10-node path; part 1: 3 nodes, fewer than C = 4
    src = np.concatenate([np.arange(9), np.arange(1, 10), [10, 11]])
    dst = np.concatenate([np.arange(1, 10), np.arange(9), [11, 10]])
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    n = 13
    part = np.array([0] * 10 + [1] * 3, dtype=np.int32)
    cores, _ = core_and_halo(src, dst, part, 2)
    cluster = csr_clusters(csr_indptr(src, n), dst, cores, 4, symmetric=True)
    assert set(np.unique(cluster[:10])) <= {0, 1, 2, 3} and len(np.unique(cluster[:10])) == 4
    assert sorted(cluster[10:].tolist()) == [4, 5, 6]


def test_distdgl_format_round_trips(planted):
    canonical, _, parts = planted
    s = json.loads((parts / "summary.json").read_text())
    part, cores, halos = load_parts(parts)
    orig = np.load(parts / "distdgl" / "orig_nids.npy")
    _, src, dst = read_edges(canonical)
    labels = pq.read_table(canonical / "nodes.parquet").column("label").to_numpy()
    feat = np.load(canonical / "features.npy")
    config = str(parts / s["distdgl_config"])
    assert json.loads(open(config).read())["num_parts"] == 4
    for p in range(4):
        g, node_feats, _, gpb, name, _, _ = dgl.distributed.load_partition(config, p)
        assert name == "planted" and gpb.num_partitions() == 4
        inner = g.ndata["inner_node"].numpy().astype(bool)
        ours = orig[g.ndata[dgl.NID].numpy()]
        assert np.array_equal(np.sort(ours[inner]), cores[p])
        assert np.array_equal(np.sort(ours[~inner]), halos[p])
        # an edge belongs to its destination's part: inner edges = in-edges of the core
        assert int(g.edata["inner_edge"].numpy().sum()) == int(np.count_nonzero(part[dst] == p))
        core_in_order = ours[inner]  # node data rows follow DGL's reshuffled inner-node order
        assert np.array_equal(node_feats["_N/label"].numpy(), labels[core_in_order])
        np.testing.assert_array_equal(node_feats["_N/feat"].numpy(), feat[core_in_order])
        assert {"_N/train_mask", "_N/val_mask", "_N/test_mask"} <= set(node_feats)
    assert sum(len(c) for c in cores) == s["nodes"]


def test_read_csr_and_chunked_halos_match_the_edge_arrays(planted):
    canonical, _, parts = planted
    n, src, dst = read_edges(canonical)
    n2, indptr, indices = read_csr(canonical)
    assert n2 == n and np.array_equal(indptr, csr_indptr(src, n)) and np.array_equal(indices, dst)
    part = np.load(parts / "part_id.npy")
    cores, halos = core_and_halo(src, dst, part, 4)
    # tiny budget: one part per pass over the edges; same answer as the whole-array version
    cores2, halos2 = csr_halos(indptr, indices, part, 4, budget_bytes=1)
    assert all(np.array_equal(a, b) for a, b in zip(cores, cores2, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(halos, halos2, strict=True))
    w = np.linspace(0.1, 1.0, len(dst))
    assert csr_metrics(indptr, indices, part, 4, halos2, w) == partition_metrics(src, dst, part, 4, halos, w)


def test_metis_csr_is_deterministic_and_cuts_like_dgl(planted):
    canonical, block, parts = planted
    n, indptr, indices = read_csr(canonical)
    ours = metis_assign_csr(indptr, indices, 4, symmetric=True, seed=3)
    assert np.array_equal(ours, metis_assign_csr(indptr, indices, 4, symmetric=True, seed=3))
    src = np.repeat(np.arange(n), np.diff(indptr))
    dgl_part = metis_assign((indptr, indices), 4)
    cut_ours = np.count_nonzero(ours[src] != ours[indices])
    cut_dgl = np.count_nonzero(dgl_part[src] != dgl_part[indices])
    assert cut_ours <= 1.05 * cut_dgl + 4
    # a directed CSR is partitioned as A + A^T: the same parts as the symmetrized graph's
    upper = src < indices
    d_ptr = csr_indptr(src[upper], n)
    assert np.array_equal(metis_assign_csr(d_ptr, indices[upper], 4, seed=3), ours)


def test_two_runs_of_the_stage_give_identical_files(tmp_path):
    import hashlib

    planted_landing(tmp_path / "landing", seed=5)
    build_canonical_graph(tmp_path / "landing", tmp_path / "canonical")
    digests = []
    for run in ("a", "b"):
        cfg = PartitionConfig(num_parts=4, clusters_per_part=4, write_distdgl=False, seed=1)
        build_partitions(tmp_path / "canonical", tmp_path / run, cfg, "same")
        files = sorted(p for p in (tmp_path / run).rglob("*") if p.is_file() and p.name != "run_stats.json")
        digests.append({str(p.relative_to(tmp_path / run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files})
    assert "part_id.npy" in digests[0] and "cluster_id.npy" in digests[0] and "summary.json" in digests[0]
    assert digests[0] == digests[1]


def test_metis_assign_edge_cases():
    src, dst = np.array([0, 1]), np.array([1, 0])
    graph = (csr_indptr(src, 3), dst)
    assert metis_assign(graph, 1).tolist() == [0, 0, 0]
    assert metis_assign(graph, 5).tolist() == [0, 1, 2]


def test_config_validation():
    with pytest.raises(ValueError, match="num_parts"):
        PartitionConfig(num_parts=0)
    with pytest.raises(ValueError, match="clusters_per_part"):
        PartitionConfig(clusters_per_part=0)


def test_preprocess_assets_materialize_with_passing_checks(tmp_path):
    planted_landing(tmp_path / "landing" / "tiny", seed=1, intra=600, inter=20)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["tiny"])
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    result = dg.materialize(
        [canonical_graph, normalized_adjacency, metis_partitions],
        partition_key="tiny",
        instance=instance,
        resources={"storage": storage},
    )
    assert result.success
    checks = {(c.asset_key.to_user_string(), c.check_name): c.passed for c in result.get_asset_check_evaluations()}
    assert checks == {
        ("canonical_graph", "edges_valid"): True,
        ("edge_split", "no_held_out_edge_in_message_passing"): True,  # reported, not evaluated: no split here
        ("normalized_adjacency", "symmetric"): True,
        ("normalized_adjacency", "finite_weights"): True,
        ("normalized_adjacency", "weights_in_0_1"): True,
        ("normalized_adjacency", "largest_eigenvalue_at_most_1"): True,
        ("metis_partitions", "every_node_in_one_part"): True,
        ("metis_partitions", "metis_cut_below_random"): True,
    }
    adj = result.asset_materializations_for_node("normalized_adjacency")[0].metadata
    assert adj["nodes"].value == 800 and adj["nnz"].value == adj["edges"].value + 800
    parts = result.asset_materializations_for_node("metis_partitions")[0].metadata
    assert parts["metis_edge_cut_ratio"].value < parts["random_edge_cut_ratio"].value
    # planted_landing splits the nodes at random: about a third train, spread over the parts
    split = pq.read_table(tmp_path / "landing" / "tiny" / "nodes.parquet").column("split").to_pylist()
    assert sum(parts["train_nodes_per_part"].value) == split.count("train")
    assert parts["balance_train_nodes"].value is False and 1.0 <= parts["metis_train_imbalance"].value < 1.5
    assert parts["partition_sizes"].value.startswith("![core and halo nodes per part](data:image/png;base64,")
    out = tmp_path / "home" / "tiny"
    assert (out / "normalized_adjacency" / "indptr.npy").is_file()
    assert (out / "metis_partitions" / "distdgl" / "tiny.json").is_file()


def test_checks_fail_on_corrupted_files(tmp_path):
    from assets.metis_partitions import check_partitions
    from assets.normalized_adjacency import check_adjacency
    from graphs.stages.normalize import AdjacencyConfig, build_normalized_adjacency

    planted_landing(tmp_path / "landing", seed=2, intra=600, inter=20)
    build_canonical_graph(tmp_path / "landing", tmp_path / "canonical")
    build_normalized_adjacency(tmp_path / "canonical", tmp_path / "adj")
    assert all(c.passed for c in check_adjacency(tmp_path / "adj", AdjacencyConfig(), True))
    w = np.load(tmp_path / "adj" / "weights.npy", mmap_mode="r+")
    w[5] = 2.0
    w.flush()
    del w
    write_file_hashes(tmp_path / "adj")  # as a faulty writer would have published it
    failed = {c.check_name for c in check_adjacency(tmp_path / "adj", AdjacencyConfig(), True) if not c.passed}
    assert failed == {"symmetric", "weights_in_0_1", "largest_eigenvalue_at_most_1"}

    build_partitions(tmp_path / "canonical", tmp_path / "parts", PartitionConfig(write_distdgl=False))
    assert all(c.passed for c in check_partitions(tmp_path / "parts", tmp_path / "canonical", 0))
    # the checks recount from the files (not the writer's summary): a part id out of range,
    # and an assignment that cuts as many edges as the random baseline (its ids shifted by one)
    k = json.loads((tmp_path / "parts" / "summary.json").read_text())["num_parts"]
    part = np.load(tmp_path / "parts" / "part_id.npy")
    part = ((random_assign(len(part), k, 0) + 1) % k).astype(np.int32)
    part[0] = 7
    np.save(tmp_path / "parts" / "part_id.npy", part)
    write_file_hashes(tmp_path / "parts")
    assert not any(c.passed for c in check_partitions(tmp_path / "parts", tmp_path / "canonical", 0))


# ----------------------------------------------------------------------------- weighted graphs


def test_metis_edge_weights_scale_and_floor():
    from graphs.stages.partition import metis_edge_weights

    w = metis_edge_weights(np.array([0.001, 0.5, 1.0, 2.0]))
    np.testing.assert_array_equal(w, [1, 250, 500, 1000])  # heaviest -> 1000, at least 1
    assert metis_edge_weights(np.ones(1 << 21)).max() == (1 << 30) // (1 << 21)  # the total stays < 2^30


def test_weighted_metis_cuts_heavy_edges_less(tmp_path):
    """4 blocks visible only through heavy intra-block edges; as many light edges, random."""
    from graphs.stages.partition import metis_assign_weighted, read_edge_weights

    rng = np.random.default_rng(0)
    n = BLOCKS * BLOCK_SIZE
    block = np.arange(n) // BLOCK_SIZE
    b = rng.integers(0, BLOCKS, 1500)
    heavy = (b * BLOCK_SIZE + rng.integers(0, BLOCK_SIZE, 1500), b * BLOCK_SIZE + rng.integers(0, BLOCK_SIZE, 1500))
    light = (rng.integers(0, n, 3000), rng.integers(0, n, 3000))
    src, dst = np.concatenate([heavy[0], light[0]]), np.concatenate([heavy[1], light[1]])
    weight = np.concatenate([np.full(1500, 20.0), np.full(3000, 1.0)])
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"src": src, "dst": dst, "weight": weight}), tmp_path / "in" / "edges.parquet")
    build_canonical_graph(tmp_path / "in", tmp_path / "c")
    s = build_partitions(tmp_path / "c", tmp_path / "p", PartitionConfig(num_parts=BLOCKS, write_distdgl=False))
    assert s["weighted"]
    n_, e_src, e_dst = read_edges(tmp_path / "c")
    w = read_edge_weights(tmp_path / "c")
    indptr = csr_indptr(e_src, n_)
    unweighted = metis_assign((indptr, e_dst), BLOCKS)
    plain = partition_metrics(e_src, e_dst, unweighted, BLOCKS, [], w)["weight_cut_ratio"]
    ours = s["metis"]["weight_cut_ratio"]
    assert ours < 0.6 * plain, (ours, plain)
    assert s["metis"]["weight_cut_ratio"] < s["random"]["weight_cut_ratio"]
    part = np.load(tmp_path / "p" / "part_id.npy")
    # each part is mostly one planted block (ids are kept: 0..n-1 dense)
    purity = sum(np.bincount(block[part == p]).max() for p in range(BLOCKS) if (part == p).any()) / n
    assert purity > 0.9
    np.testing.assert_array_equal(metis_assign_weighted(indptr, e_dst, w, BLOCKS), part)  # deterministic


def test_weighted_metis_symmetrizes_a_directed_graph():
    """Two triangles joined by one light edge, given in one direction only: A + Aᵀ is cut there."""
    from graphs.stages.partition import metis_assign_weighted

    src = np.array([0, 1, 2, 3, 4, 5, 2])
    dst = np.array([1, 2, 0, 4, 5, 3, 3])
    weight = np.array([5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 1.0])
    order = np.lexsort((dst, src))
    indptr = csr_indptr(src[order], 6)
    part = metis_assign_weighted(indptr, dst[order], weight[order], 2)
    assert len(set(part[:3])) == 1 and len(set(part[3:])) == 1 and part[0] != part[3]


def test_induced_csr_equals_the_submatrix_and_leaves_the_scratch_as_found():
    import scipy.sparse as sp

    from graphs.kernels.induced import induced_csr

    rng = np.random.default_rng(4)
    n = 300
    a = sp.random(n, n, density=0.05, random_state=5, format="csr", dtype=np.float32)
    a.setdiag(0)
    a.eliminate_zeros()
    a.sort_indices()
    nodes = np.sort(rng.choice(n, 120, replace=False))
    local = np.full(n, -1, dtype=np.int64)
    want = a[nodes][:, nodes].tocsr()
    want.sort_indices()
    for weight in (None, a.data):
        ptr, idx, w = induced_csr(a.indptr, a.indices, nodes, local, weight)
        assert ptr.tolist() == want.indptr.tolist()
        assert idx.tolist() == want.indices.tolist()  # CSR order kept within each row
        if weight is None:
            assert w is None
        else:
            np.testing.assert_array_equal(w, want.data)
        assert (local == -1).all()


def test_balance_train_nodes_spreads_clustered_training_nodes_over_the_parts(tmp_path):
    """Training nodes concentrated in one planted block: METIS alone keeps the blocks whole, so
    one part holds most seeds; with the training-node constraint every part holds about a
    quarter, at a cut still far below random's. Both summaries report the seeds per part."""
    block = planted_landing(tmp_path / "landing")
    rng = np.random.default_rng(3)
    in_block0 = block == 0
    train = np.where(in_block0, rng.random(len(block)) < 0.9, rng.random(len(block)) < 0.05)
    split = np.where(train, "train", "test")
    pq.write_table(
        pa.table({"node_id": np.arange(len(block)), "label": pa.array(block, pa.int32()), "split": split}),
        tmp_path / "landing" / "nodes.parquet",
    )
    build_canonical_graph(tmp_path / "landing", tmp_path / "canonical")
    plain = build_partitions(tmp_path / "canonical", tmp_path / "plain", PartitionConfig(num_parts=4))
    even = build_partitions(
        tmp_path / "canonical", tmp_path / "even", PartitionConfig(num_parts=4, balance_train_nodes=True)
    )
    total = int(train.sum())
    for s in (plain, even):
        assert sum(s["metis"]["train_nodes"]) == sum(s["random"]["train_nodes"]) == total
        per = np.array(s["metis"]["train_nodes"])
        assert s["metis"]["train_imbalance"] == round(per.max() / per.mean(), 4)
    assert plain["metis"]["train_imbalance"] > 2.5 and not plain["balance_train_nodes"]
    assert even["metis"]["train_imbalance"] <= 1.1 and even["balance_train_nodes"]
    part = np.load(tmp_path / "even" / "part_id.npy")
    assert np.bincount(part, minlength=4).max() <= 1.1 * len(block) / 4  # nodes stay balanced too
    # the price: block 0 (nine tenths of it training nodes) is cut in four; still below random's cut
    assert plain["metis"]["edge_cut_ratio"] < even["metis"]["edge_cut_ratio"] < even["random"]["edge_cut_ratio"]
    # seeded: the same assignment again
    again = build_partitions(
        tmp_path / "canonical", tmp_path / "again", PartitionConfig(num_parts=4, balance_train_nodes=True)
    )
    assert np.array_equal(np.load(tmp_path / "again" / "part_id.npy"), part) and again["metis"] == {
        **even["metis"],
        "seconds": again["metis"]["seconds"],
        "peak_rss_bytes": again["metis"]["peak_rss_bytes"],
    }
    # the multilevel path (coarsened to 2000 directed edges) carries the constraint through its
    # levels: summed by the contraction, given to METIS, kept by the refinement
    coarse = build_partitions(
        tmp_path / "canonical",
        tmp_path / "coarse",
        PartitionConfig(num_parts=4, balance_train_nodes=True, metis_max_edges=2000),
    )
    plain_coarse = build_partitions(
        tmp_path / "canonical", tmp_path / "plain_coarse", PartitionConfig(num_parts=4, metis_max_edges=2000)
    )
    assert coarse["metis_coarsened"] and plain_coarse["metis_coarsened"]
    assert plain_coarse["metis"]["train_imbalance"] > 2.5
    assert coarse["metis"]["train_imbalance"] <= 1.1
    assert coarse["metis"]["edge_cut_ratio"] < coarse["random"]["edge_cut_ratio"]
    assert np.bincount(np.load(tmp_path / "coarse" / "part_id.npy"), minlength=4).max() <= 1.1 * len(block) / 4
