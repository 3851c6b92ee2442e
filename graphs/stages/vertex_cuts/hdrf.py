"""vertex_cut: hdrf, High-Degree Replicated First (Petroni et al., CIKM 2015): the edges are
streamed once, in the canonical order, and edge (u, v) goes to the part p maximising

    C_rep(p) + C_bal(p),  C_rep = g(u, p) + g(v, p),  g(x, p) = 1 + (1 - θ_x) when p holds x (else 0),
    θ_u = δ(u) / (δ(u) + δ(v)) over the partial degrees δ seen so far,
    C_bal = λ (max_size - |p|) / (ε + max_size - min_size),  λ = 1.1, ε = 1,

so the endpoint of higher partial degree is the one replicated, and λ > 1 keeps the parts' edge
counts within a few edges of each other. Ties go to the lowest part; the result depends on the edge
order only (the seed is not used). One compiled pass, O(k) per edge; on a symmetrized graph each
undirected edge is placed once (as v -> u, v < u) and its reverse follows it."""

import numba
import numpy as np

from graphs.stages.vertex_cut import EdgePartitioner, EdgePartitionerTraits, pair_directions, register_edge_partitioner

BALANCE = 1.1  # λ
EPSILON = 1.0  # ε


@numba.njit(cache=True, nogil=True)
def _hdrf_kernel(indptr, indices, k, symmetric, lam, eps, part):  # pragma: no cover
    n = len(indptr) - 1
    partial = np.zeros(n, dtype=np.int64)
    held = np.zeros(n, dtype=np.uint64)
    sizes = np.zeros(k, dtype=np.int64)
    for u in range(n):
        for e in range(indptr[u], indptr[u + 1]):
            v = indices[e]
            if symmetric and v < u:
                continue  # placed with its reverse v -> u
            partial[u] += 1
            partial[v] += 1
            theta_u = partial[u] / (partial[u] + partial[v])
            theta_v = 1.0 - theta_u
            big, small = sizes.max(), sizes.min()
            best, best_score = 0, -1.0
            for p in range(k):
                bit = np.uint64(1) << np.uint64(p)
                score = lam * (big - sizes[p]) / (eps + big - small)
                if held[u] & bit:
                    score += 2.0 - theta_u
                if held[v] & bit:
                    score += 2.0 - theta_v
                if score > best_score:
                    best, best_score = p, score
            part[e] = best
            sizes[best] += 1
            bit = np.uint64(1) << np.uint64(best)
            held[u] |= bit
            held[v] |= bit


@register_edge_partitioner
class HighDegreeReplicatedFirst(EdgePartitioner):
    name = "hdrf"
    traits = EdgePartitionerTraits(full_degrees=False)

    @classmethod
    def assign(cls, indptr, indices, k, degree, seed, symmetric):
        part = np.zeros(len(indices), dtype=np.int32)
        _hdrf_kernel(np.asarray(indptr, dtype=np.int64), indices, k, symmetric, BALANCE, EPSILON, part)
        return pair_directions(indptr, indices, part) if symmetric else part
