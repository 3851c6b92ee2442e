"""Multilevel METIS within an edge budget (graphs/kernels/coarsen.py) on small hand-checked graphs."""

import numpy as np
import pytest

from graphs.kernels.coarsen import Level, contract, edge_cut_weight, label_propagation, metis_levels, refine_kway
from graphs.stages.partition import metis_assign_csr
from graphs.stages.partition_metrics import csr_metrics


def _csr(n, pairs):
    """Symmetric CSR (int64) of undirected `pairs`, no duplicates."""
    a = np.asarray(pairs, dtype=np.int64)
    src = np.concatenate([a[:, 0], a[:, 1]])
    dst = np.concatenate([a[:, 1], a[:, 0]])
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst


def _level(n, pairs):
    indptr, indices = _csr(n, pairs)
    return Level(indptr, indices, None, np.ones(n, dtype=np.int64))


def _planted(blocks, size, p_in, inter_edges, seed=0):
    """`blocks` dense random blocks of `size` nodes plus `inter_edges` random edges between blocks."""
    rng = np.random.default_rng(seed)
    pairs = set()
    for b in range(blocks):
        base = b * size
        u, v = np.triu_indices(size, 1)
        keep = rng.random(len(u)) < p_in
        pairs.update(zip((base + u[keep]).tolist(), (base + v[keep]).tolist(), strict=True))
    n = blocks * size
    while inter_edges:
        u, v = rng.integers(0, n, 2)
        if u // size != v // size and (min(u, v), max(u, v)) not in pairs:
            pairs.add((int(min(u, v)), int(max(u, v))))
            inter_edges -= 1
    # shuffle the ids so that blocks are not contiguous id ranges
    perm = rng.permutation(n)
    truth = np.arange(n) // size
    relabeled = [(perm[u], perm[v]) for u, v in pairs]
    block_of = np.empty(n, dtype=np.int64)
    block_of[perm] = truth
    return n, sorted(relabeled), block_of


def test_contract_merges_parallel_edges_and_sums_node_weights():
    # clusters {0,1} and {2,3}: K2,2 between them (4 edges) plus an edge inside each cluster
    g = _level(4, [(0, 1), (2, 3), (0, 2), (0, 3), (1, 2), (1, 3)])
    coarse, cmap = contract(g, np.array([1, 1, 3, 3]))
    assert cmap.tolist() == [0, 0, 1, 1]
    assert coarse.vweight.tolist() == [2, 2]
    assert coarse.indptr.tolist() == [0, 1, 2]
    assert coarse.indices.tolist() == [1, 0]
    assert coarse.eweight.tolist() == [4, 4]  # the 4 parallel edges, each direction; inner edges dropped


def test_contract_of_weighted_graph_sums_weights():
    indptr, indices = _csr(3, [(0, 1), (0, 2), (1, 2)])
    w = np.array([5, 7, 5, 11, 7, 11], dtype=np.int64)  # (0,1)=5, (0,2)=7, (1,2)=11 in CSR order
    g = Level(indptr, indices, w, np.array([1, 2, 3], dtype=np.int64))
    coarse, cmap = contract(g, np.array([0, 2, 2]))
    assert cmap.tolist() == [0, 1, 1]
    assert coarse.vweight.tolist() == [1, 5]
    assert coarse.eweight.tolist() == [12, 12]  # 5 + 7 between {0} and {1, 2}


def test_label_propagation_finds_disconnected_cliques_and_respects_the_bound():
    clique = [(u, v) for u in range(5) for v in range(u + 1, 5)]
    pairs = clique + [(u + 5, v + 5) for u, v in clique]
    g = _level(10, pairs)
    label = label_propagation(g, max_weight=5)
    assert len(set(label[:5].tolist())) == 1 and len(set(label[5:].tolist())) == 1
    assert label[0] != label[5]
    small = label_propagation(g, max_weight=2)
    assert np.bincount(small).max() <= 2


def test_refine_moves_a_misplaced_node_back():
    n, pairs, truth = _planted(2, 20, 0.5, 3)
    g = _level(n, pairs)
    part = truth.astype(np.int32).copy()
    best = edge_cut_weight(g, part)
    wrong = int(np.flatnonzero(truth == 0)[0])
    part[wrong] = 1
    assert edge_cut_weight(g, part) > best
    refined = refine_kway(g, part, 2, imbalance=0.1)
    assert edge_cut_weight(g, refined) == best
    assert refined[wrong] == 0


def test_edge_cut_weight_matches_partition_metrics():
    n, pairs, truth = _planted(3, 30, 0.3, 40)
    indptr, indices = _csr(n, pairs)
    part = (np.arange(n) % 3).astype(np.int32)
    expected = csr_metrics(indptr, indices, part, 3, [[] for _ in range(3)])["edge_cut"]
    assert edge_cut_weight(Level(indptr, indices, None, np.ones(n, dtype=np.int64)), part) == expected


def test_metis_levels_recovers_planted_blocks_within_budget():
    n, pairs, truth = _planted(4, 150, 0.2, 120, seed=1)
    indptr, indices = _csr(n, pairs)
    g = Level(indptr, indices, None, np.ones(n, dtype=np.int64))
    budget = len(indices) // 8  # forces at least one coarsening level
    part = metis_levels(g, 4, budget, seed=0)
    direct = metis_assign_csr(indptr, indices, 4, symmetric=True)
    assert edge_cut_weight(g, part) <= 1.05 * edge_cut_weight(g, direct)
    assert edge_cut_weight(g, part) == 2 * 120  # exactly the planted inter-block edges, both directions
    assert np.bincount(part, minlength=4).max() <= 1.03 * n / 4
    # the same inputs give the same assignment
    assert np.array_equal(part, metis_levels(g, 4, budget, seed=0))


def test_metis_assign_csr_coarsens_only_above_the_budget():
    n, pairs, truth = _planted(4, 100, 0.2, 80, seed=2)
    indptr, indices = _csr(n, pairs)
    direct = metis_assign_csr(indptr, indices, 4, symmetric=True, max_edges=len(indices))
    assert np.array_equal(direct, metis_assign_csr(indptr, indices, 4, symmetric=True))
    coarse = metis_assign_csr(indptr, indices, 4, symmetric=True, max_edges=len(indices) // 4)
    assert coarse.dtype == np.int32 and set(coarse.tolist()) == {0, 1, 2, 3}
    # each planted block lands in one part
    assert all(len(set(coarse[truth == b].tolist())) == 1 for b in range(4))


def test_metis_levels_balances_node_weights():
    n, pairs, _ = _planted(4, 100, 0.2, 80, seed=3)
    indptr, indices = _csr(n, pairs)
    deg = np.diff(indptr)
    part = metis_assign_csr(indptr, indices, 4, balance_edges=True, symmetric=True, max_edges=len(indices) // 4)
    load = np.bincount(part, weights=deg + 1, minlength=4)
    assert load.max() <= 1.1 * load.sum() / 4


def test_coarsening_that_cannot_shrink_fails_clearly():
    # a perfect matching: every cluster bound of 1 node keeps the graph as it is
    g = _level(8, [(0, 1), (2, 3), (4, 5), (6, 7)])
    with pytest.raises(RuntimeError, match="cannot coarsen"):
        metis_levels(g, 8, 1, seed=0)
