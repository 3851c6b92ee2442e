"""Pair heuristics (training.pair_features) against brute force, hard negatives, the link budget."""

import math

import numpy as np
import pytest
import torch

from training.pair_features import FEATURE_NAMES, PairHeuristics, two_hop_negatives


def _random_graph(n=60, m=300, seed=0):
    """A symmetric CSR (with a few self loops and unsorted columns, which PairHeuristics drops
    and sorts) and its neighbour sets."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    nbrs = [set() for _ in range(n)]
    for u, v in zip(src.tolist(), dst.tolist()):
        if u != v:
            nbrs[u].add(v)
            nbrs[v].add(u)
    rows = [sorted(s, reverse=True) + ([i] if i % 7 == 0 else []) for i, s in enumerate(nbrs)]  # loops, unsorted
    indptr = np.cumsum([0] + [len(r) for r in rows])
    indices = np.array([c for r in rows for c in r], dtype=np.int64)
    return indptr, indices, nbrs


def test_heuristics_equal_a_brute_force_reference():
    indptr, indices, nbrs = _random_graph()
    n = len(nbrs)
    pairs = np.array([(u, v) for u in range(n) for v in range(n) if u != v]).T
    g = PairHeuristics(indptr, indices, chunk_entries=500)  # several chunks
    cn, aa, ra = g.counts(torch.from_numpy(pairs))
    feats = g(torch.from_numpy(pairs))
    deg = [len(s) for s in nbrs]
    for i, (u, v) in enumerate(pairs.T.tolist()):
        common = nbrs[u] & nbrs[v]
        ref_aa = sum(1 / math.log(deg[w]) for w in common)
        ref_ra = sum(1 / deg[w] for w in common)
        assert int(cn[i]) == len(common)
        assert float(aa[i]) == pytest.approx(ref_aa) and float(ra[i]) == pytest.approx(ref_ra)
        expected = [len(common), ref_aa, 10 * ref_ra, min(deg[u], deg[v]), max(deg[u], deg[v])]
        assert feats[i].tolist() == pytest.approx(np.log1p(expected).tolist(), rel=1e-5)
    assert feats.shape == (pairs.shape[1], len(FEATURE_NAMES))
    assert int(cn.sum()) > 0  # the graph has common neighbours to find
    edges = torch.tensor([[u, v] for u in range(n) for v in nbrs[u]]).T
    assert bool(g.is_edge(edges).all()) and not bool(g.is_edge(torch.tensor([[0], [0]])).any())


def test_an_edge_is_described_as_the_graph_without_it():
    # path 0-1-2 plus the edge 0-2: as a training positive, (0, 2) has degrees 1 and 1, one common neighbour
    g = PairHeuristics(np.array([0, 2, 4, 6]), np.array([1, 2, 0, 2, 0, 1]))
    own = g(torch.tensor([[0], [2]]), exclude_own_edge=True)[0]
    plain = g(torch.tensor([[0], [2]]))[0]
    assert own.tolist() == pytest.approx(np.log1p([1, 1 / math.log(2), 5.0, 1, 1]).tolist())
    assert plain.tolist()[3:] == pytest.approx(np.log1p([2, 2]).tolist())


def test_two_hop_negatives_share_a_neighbour_and_are_not_edges():
    indptr, indices, nbrs = _random_graph(seed=3)
    g = PairHeuristics(indptr, indices)
    nodes = torch.arange(0, 60, 2)  # a minibatch's nodes: every other node
    hard = two_hop_negatives(g, nodes, torch.arange(len(nodes)).repeat(20), torch.Generator().manual_seed(0))
    assert hard.shape[1] > 50
    for a, b in hard.T.tolist():
        u, w = int(nodes[a]), int(nodes[b])
        assert u != w and w not in nbrs[u] and nbrs[u] & nbrs[w]


def test_the_budget_has_a_step_floor_and_a_cap():
    import dataclasses

    from training.link import LINK_DEFAULTS
    from training.run_plan import training_epochs
    from training.task_settings import task_blocks

    training = task_blocks(LINK_DEFAULTS)[1]  # link prediction: at least 1000 steps, at most 100 epochs
    assert training_epochs(training, shard_epochs=3, steps_per_epoch=8) == 100  # ceil(1000 / 8) = 125, capped
    assert training_epochs(training, shard_epochs=3, steps_per_epoch=148) == 7
    assert training_epochs(training, shard_epochs=12, steps_per_epoch=148) == 12
    assert training_epochs(dataclasses.replace(training, epochs=2), shard_epochs=3, steps_per_epoch=8) == 2
    with pytest.raises(ValueError, match="max_epochs"):
        dataclasses.replace(training, max_epochs=0)
