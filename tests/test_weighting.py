"""Non-uniform sampling weights (graphs.sampling.weighting, graphs.formats.node_scores): adaptive
neighbour sampling is unbiased, prefers high-score neighbours and reads training's gradient
statistics; class-balanced seeds give each class an equal share; the generator's minority class."""

import json

import numpy as np
import pytest

from graphs.formats.node_scores import mean_grad_norm, read_node_scores, write_node_scores
from graphs.sampling import ShardConfig, epoch_seed_batches, load_shard_inputs, make_sampler, write_minibatch_shards
from graphs.sampling.weighting import adaptive_node_probs, class_balanced_probs
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency, load_csr
from graphs.synthetic.generate import GenerateConfig, generate_dataset


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> dict:
    """A 500-node DC-SBM graph (4 classes, 60 % train) with its dense Â."""
    root = tmp_path_factory.mktemp("weighting")
    cfg = GenerateConfig(num_nodes=500, num_edges=3500, feature_dim=8, num_classes=4, num_edge_files=1)
    generate_dataset(cfg, root / "landing", progress=False)
    can, adj = root / "canonical_graph", root / "normalized_adjacency"
    build_canonical_graph(root / "landing", can)
    build_normalized_adjacency(can, adj)
    n = json.loads((can / "summary.json").read_text())["nodes"]
    csr = load_csr(adj)
    a = np.zeros((n, n))
    a[np.repeat(np.arange(n), np.diff(csr.indptr)), csr.indices] = csr.weights
    return {"root": root, "canonical": can, "adjacency": adj, "n": n, "dense": a}


def _scores_file(path, n: int, seed: int = 3) -> np.ndarray:
    """A node-score file with heavy-tailed g(v) (some nodes never seen); returns g."""
    rng = np.random.default_rng(seed)
    count = rng.integers(0, 4, size=n)
    total = rng.lognormal(0.0, 1.5, size=n) * count
    write_node_scores(path, total, count)
    return mean_grad_norm(total, count)


def test_node_scores_round_trip_and_unseen_nodes_get_the_mean(tmp_path):
    write_node_scores(tmp_path / "s.npz", np.array([2.0, 0.0, 9.0, 0.0]), np.array([2, 0, 3, 0]))
    total, count = read_node_scores(tmp_path / "s.npz", 4)
    assert total.tolist() == [2.0, 0.0, 9.0, 0.0] and count.tolist() == [2, 0, 3, 0]
    assert mean_grad_norm(total, count).tolist() == [1.0, 2.0, 3.0, 2.0]  # unseen: mean of 1 and 3
    with pytest.raises(ValueError, match=r"s.npz: 4 nodes, the graph has 5"):
        read_node_scores(tmp_path / "s.npz", 5)


def test_adaptive_probabilities_mix_degree_and_scores():
    deg, g = np.array([1.0, 3.0, 0.0, 4.0]), np.array([4.0, 0.0, 4.0, 0.0])
    p = adaptive_node_probs(deg, g, alpha=0.25)
    expected = 0.25 * deg / 8 + 0.75 * g / 8
    np.testing.assert_allclose(p / p.sum(), expected / expected.sum())
    np.testing.assert_allclose(p.mean(), 1.0)
    np.testing.assert_allclose(adaptive_node_probs(deg, None, 0.25), deg / deg.mean())  # no scores: degree
    with pytest.raises(ValueError, match="adaptive_alpha=1.5"):
        adaptive_node_probs(deg, g, 1.5)


def test_adaptive_neighbour_sampling_is_unbiased(graph, tmp_path):
    """Monte Carlo over independent draws: the mean of Σ_draws Â_vu c_vu x_u equals the exact
    off-diagonal row (Â X)_v. Each draw's estimate is an i.i.d. sample (a fresh seed per
    draw), so by the central limit theorem the mean of N draws deviates from its expectation
    by at most 4.5 standard errors (SE = sample std / sqrt(N)) per entry with probability
    1 - 7e-6; over the 60 entries checked a false failure has probability < 5e-4. The same
    draws without the correction (the uniform deg/k of plain neighbour sampling) miss by more
    than that bound, so the test can tell a wrong correction apart."""
    n, a = graph["n"], graph["dense"]
    off = a - np.diag(np.diag(a))
    g = _scores_file(tmp_path / "scores.npz", n)
    inputs = load_shard_inputs(graph["canonical"], graph["adjacency"], node_scores=tmp_path / "scores.npz")
    np.testing.assert_allclose(inputs.node_scores, g)
    sampler = make_sampler(
        inputs,
        ShardConfig(
            fanouts="2",
            samplers={"neighbor": {"prob": "adaptive", "adaptive_alpha": 0.3}},
            self_loops=False,
            weight_encoding="fp32",
        ),
    )
    x = np.random.default_rng(1).normal(1.0, 1.0, size=(n, 3))
    deg = np.count_nonzero(off, axis=1)
    targets = inputs.train_nodes[deg[inputs.train_nodes] >= 4][:20]
    exact = off[targets] @ x
    trials = 3000
    est = np.zeros((trials, *exact.shape))
    naive = np.zeros_like(est)
    for i in range(trials):
        mb = sampler.sample(targets, seed=i)
        ids, (b,) = mb.input_nodes, mb.blocks
        dst = np.repeat(np.arange(b.num_dst), np.diff(b.indptr))
        xs = x[ids[b.indices]]
        np.add.at(est[i], dst, (b.weight * b.correction)[:, None] * xs)
        uniform = (deg[targets] / np.diff(b.indptr))[dst]
        np.add.at(naive[i], dst, (b.weight * uniform)[:, None] * xs)
        assert np.all(np.diff(b.indptr) == 2)  # with replacement: exactly the fanout per destination
    se = est.std(axis=0, ddof=1) / np.sqrt(trials)
    assert np.all(np.abs(est.mean(0) - exact) <= 4.5 * se + 1e-9)
    assert np.any(np.abs(naive.mean(0) - exact) > 4.5 * naive.std(axis=0, ddof=1) / np.sqrt(trials))
    assert sampler.adaptive_info["node_scores"] and sampler.adaptive_info["alpha"] == 0.3


def test_adaptive_shards_record_their_scores_and_fall_back_to_degree(graph, tmp_path):
    _scores_file(tmp_path / "scores.npz", graph["n"])
    cfg = ShardConfig(fanouts="3,3", samplers={"neighbor": {"prob": "adaptive"}}, world_size=1, epochs=1)
    with_scores = load_shard_inputs(graph["canonical"], graph["adjacency"], node_scores=tmp_path / "scores.npz")
    m = write_minibatch_shards(with_scores, tmp_path / "a", cfg)
    assert m["adaptive"]["node_scores"] is True and len(m["adaptive"]["node_scores_sha256"]) == 64
    m = write_minibatch_shards(load_shard_inputs(graph["canonical"], graph["adjacency"]), tmp_path / "b", cfg)
    assert m["adaptive"] == {"alpha": 1.0, "node_scores": False, "p_max_over_mean": m["adaptive"]["p_max_over_mean"]}


def test_class_balanced_seed_frequencies():
    labels = np.array([0] * 900 + [1] * 90 + [2] * 10)
    p = class_balanced_probs(labels)
    np.testing.assert_allclose(p.sum(), 1.0)
    np.testing.assert_allclose([p[labels == c].sum() for c in range(3)], [1 / 3] * 3)
    train = np.arange(1000) * 2  # global ids of the training nodes
    cfg = ShardConfig(world_size=2, batch_size=100, seed_weighting="class_balanced")
    drawn = np.concatenate([np.concatenate(r) for e in range(20) for r in epoch_seed_batches(train, e, cfg, None, p)])
    assert len(drawn) == 20 * 1000  # as many seeds as a permutation, same step counts
    share = np.bincount(labels[drawn // 2], minlength=3) / len(drawn)
    # each share is a mean of 20,000 Bernoulli(1/3) draws: SE = sqrt(2/9 / 20000) = 0.0033
    np.testing.assert_allclose(share, [1 / 3] * 3, atol=5 * 0.0034)
    uniform = np.concatenate([np.concatenate(r) for r in epoch_seed_batches(train, 0, cfg)])
    assert np.array_equal(np.sort(uniform), train)  # the default: each training node once


def test_class_balanced_sampler_oversamples_the_minority(tmp_path):
    cfg = GenerateConfig(num_nodes=2000, num_edges=12000, num_classes=3, minority_fraction=0.02, num_edge_files=1)
    generate_dataset(cfg, tmp_path / "landing", progress=False)
    build_canonical_graph(tmp_path / "landing", tmp_path / "can")
    build_normalized_adjacency(tmp_path / "can", tmp_path / "adj")
    inputs = load_shard_inputs(tmp_path / "can", tmp_path / "adj")
    labels = inputs.labels
    assert np.bincount(labels).tolist() == [980, 980, 40]  # round(2000 x 0.02) minority nodes
    sampler = make_sampler(inputs, ShardConfig(fanouts="2", world_size=1, seed_weighting="class_balanced"))
    seeds = np.concatenate([mb.seeds for e in range(5) for _, _, mb in sampler.epoch(e)])
    share = np.bincount(labels[seeds], minlength=3) / len(seeds)
    assert abs(share[2] - 1 / 3) < 0.03 and share[2] > 10 * 0.02
    with pytest.raises(ValueError, match="seed_weighting='class_balanced' weights seed nodes"):
        ShardConfig(sampler="cluster_gcn", seed_weighting="class_balanced")
    with pytest.raises(ValueError, match="minority_fraction"):
        GenerateConfig(num_classes=1, minority_fraction=0.01, homophily=1.0)
