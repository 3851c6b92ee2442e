"""Non-uniform sampling weights: adaptive neighbour probabilities and class-balanced seeds.

Adaptive neighbour sampling (``samplers.neighbor.prob: adaptive``)
    Every node u gets the probability mass

        p(u) = α · deg(u) / Σ deg + (1 − α) · g(u) / Σ g

    (``deg`` = off-diagonal degree in Â, ``g`` = `graphs.formats.node_scores.mean_grad_norm` of the
    previous training run's gradient statistics; ``α = samplers.neighbor.adaptive_alpha``; without statistics,
    α = 1). A destination v draws its ``fanout`` neighbours *with replacement*, neighbour u
    with probability ``π_vu = p(u) / P_v``, ``P_v = Σ_{u ∈ N(v)} p(u)``. Each drawn edge gets
    the correction ``c_vu = P_v / (p(u) · k_v)`` (``k_v`` = draws of v): Hansen-Hurwitz, so

        E[Σ_draws Â_vu c_vu x_u] = k_v Σ_u π_vu Â_vu x_u P_v / (p(u) k_v) = Σ_u Â_vu x_u,

    the exact row of Â·X, whatever p (as long as p(u) > 0 on every edge: the degree term
    keeps it so for α > 0; with α = 0 nodes never read in training get the mean of g).
    Each layer type applies ``c`` its own way (`training.layers.sampled_edge_weight`), as for
    every other sampler.

Class-balanced seeds (``ShardConfig.seed_weighting = "class_balanced"``)
    Instead of a permutation of the T training nodes, each epoch draws T seeds *with
    replacement*, node v with probability ``1 / (C · T_{y(v)})`` (``T_c`` = training nodes of
    class c, C = classes present): every class is expected to fill 1/C of the seeds, so a 1 %
    minority class (and the neighbourhoods sampled around it) is seen C/100 times more
    often. This changes the objective on purpose (the balanced loss, not the mean one); a
    minority node is repeated within an epoch instead of once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["adaptive_edge_probs", "adaptive_node_probs", "class_balanced_probs", "segment_sums"]


def adaptive_node_probs(degree: np.ndarray, scores: np.ndarray | None, alpha: float) -> np.ndarray:
    """p(u) float64 [n] of the module docstring, scaled to mean 1 (only ratios matter);
    `scores` None (no gradient statistics yet) = degree only."""
    degree = np.asarray(degree, dtype=np.float64)
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"adaptive_alpha={alpha} must lie in [0, 1]")
    total_deg = degree.sum()
    p = degree / total_deg if total_deg > 0 else np.full(len(degree), 1.0 / max(len(degree), 1))
    if scores is not None and alpha < 1.0:
        scores = np.asarray(scores, dtype=np.float64)
        if scores.shape != degree.shape:
            raise ValueError(f"node scores have {scores.shape[0]} entries, the graph has {degree.shape[0]} nodes")
        total = scores.sum()
        if total > 0:
            p = alpha * p + (1.0 - alpha) * scores / total
    return p * (len(p) / p.sum()) if p.sum() > 0 else p


def segment_sums(indptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """float64 [len(indptr) - 1]: the sum of `values` over each CSR row (vectorised)."""
    cum = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    indptr = np.asarray(indptr, dtype=np.int64)
    return cum[indptr[1:]] - cum[indptr[:-1]]


def adaptive_edge_probs(
    indptr: np.ndarray, indices: np.ndarray, node_probs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(edge probability float32 [nnz] = p(u) of each off-diagonal entry Â[v, u], P_v float64 [n]
    = its row sums): what DGL draws by and what the correction divides by."""
    edge_p = np.asarray(node_probs, dtype=np.float64)[np.asarray(indices, dtype=np.int64)]
    return edge_p.astype(np.float32), segment_sums(indptr, edge_p)


def class_balanced_probs(labels: np.ndarray) -> np.ndarray:
    """float64 [T]: the draw probability of each training node (labels of the training nodes,
    >= 0), 1 / (C · T_class) with C the classes present; sums to 1."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0:
        return np.empty(0, dtype=np.float64)
    counts = np.bincount(labels)
    present = int(np.count_nonzero(counts))
    return 1.0 / (present * counts[labels].astype(np.float64))
