"""Structural features of node pairs on the message-passing graph (plain torch, no DGL).

`PairHeuristics` holds one graph (a symmetric CSR without self loops: the link-prediction
message-passing graph, i.e. the training edges in both directions, never a held-out edge)
and turns int64 pairs [2, P] into float32 features [P, len(FEATURE_NAMES)]:

=====================  ==========================================================
``common_neighbours``  log1p(|N(u) ∩ N(v)|)
``adamic_adar``        log1p(sum over w in N(u) ∩ N(v) of 1 / ln(deg w))
``resource_alloc``     log1p(sum over w in N(u) ∩ N(v) of 1 / deg w) x 10
``log_degree_min``     log1p(min(deg u, deg v))
``log_degree_max``     log1p(max(deg u, deg v))
=====================  ==========================================================

With ``ordered`` (the pairs of a typed relation, source type first), the last two are
log1p(deg u) and log1p(deg v): a destination's degree is its popularity, which min/max would mix
with the source's.

A pair that is itself an edge of the graph (a training positive) is described as the graph
without that edge: ``exclude_own_edge=True`` takes it out of both degrees, so training
positives look like the held-out edges the model is evaluated on. The common neighbours of
u and v never include u or v (no self loops), so the edge itself is never a path u-w-v.

How it works, vectorised: the neighbour lists of the pairs' endpoints are gathered as one
int64 key per (pair, neighbour) (``pair * n + neighbour``), the v side's keys are sorted (the
CSR's columns ascend within rows), and every u-side key is looked up with one
``searchsorted``; the matches are the common neighbours, summed per pair with
``index_add_``. Work and memory are the summed degrees of the pairs' endpoints, computed in
chunks of at most ``chunk_entries`` gathered neighbours.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["FEATURE_NAMES", "PairHeuristics", "symmetric_csr", "two_hop_negatives"]

FEATURE_NAMES = ("common_neighbours", "adamic_adar", "resource_alloc", "log_degree_min", "log_degree_max")
_RA_SCALE = 10.0  # resource allocation sums 1/deg: brought to the others' range


def symmetric_csr(indptr, indices) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr, indices) int64 of a CSR without its self loops, columns ascending within rows."""
    indptr = torch.as_tensor(np.asarray(indptr), dtype=torch.int64)
    indices = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
    n = len(indptr) - 1
    row = torch.repeat_interleave(torch.arange(n, dtype=torch.int64), indptr.diff())
    keep = row != indices
    row, col = row[keep], indices[keep]
    keys = row * n + col
    if len(keys) > 1 and bool((keys.diff() < 0).any()):
        keys, order = torch.sort(keys)
        row, col = row[order], col[order]
    counts = torch.bincount(row, minlength=n)
    return torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]), col


class PairHeuristics:
    """Pair features (module docstring) of one graph, given as a CSR (`symmetric_csr` cleans it)."""

    def __init__(self, indptr, indices, *, chunk_entries: int = 1 << 24, ordered: bool = False):
        self.ordered = ordered  # degree columns of (u, v) as given, not (min, max): a typed relation's pairs
        self.indptr, self.indices = symmetric_csr(indptr, indices)
        self.n = len(self.indptr) - 1
        self.degree = self.indptr.diff()
        deg = self.degree.to(torch.float64)
        # deg >= 2 for any common neighbour (it touches u and v); ln 2 > 0
        self.aa_weight = torch.where(deg > 1, 1.0 / torch.log(deg.clamp(min=2.0)), torch.zeros_like(deg))
        self.ra_weight = torch.where(deg > 0, 1.0 / deg.clamp(min=1.0), torch.zeros_like(deg))
        self.chunk_entries = chunk_entries
        self._edge_keys: torch.Tensor | None = None

    @property
    def num_features(self) -> int:
        return len(FEATURE_NAMES)

    def __call__(self, pairs: torch.Tensor, *, exclude_own_edge: bool = False) -> torch.Tensor:
        """float32 [P, num_features] of the int64 pairs [2, P]."""
        pairs = torch.as_tensor(pairs, dtype=torch.int64)
        if pairs.numel() == 0:
            return torch.zeros(0, self.num_features)
        if int(pairs.min()) < 0 or int(pairs.max()) >= self.n:
            raise ValueError(f"pair node ids must lie in [0, {self.n}); got {int(pairs.min())}..{int(pairs.max())}")
        out = []
        for lo, hi in self._chunks(pairs):
            out.append(self._features(pairs[:, lo:hi], exclude_own_edge))
        return torch.cat(out)

    def is_edge(self, pairs: torch.Tensor) -> torch.Tensor:
        """bool [P]: whether each pair (int64 [2, P]) is an edge of the graph."""
        u, v = pairs[0], pairs[1]
        keys = self._keys()
        q = u * self.n + v
        at = torch.searchsorted(keys, q).clamp(max=max(len(keys) - 1, 0))
        return keys[at] == q if len(keys) else torch.zeros(len(q), dtype=torch.bool)

    def _keys(self) -> torch.Tensor:
        """Sorted int64 ``row * n + column`` of every edge (built on first use)."""
        if self._edge_keys is None:
            row = torch.repeat_interleave(torch.arange(self.n, dtype=torch.int64), self.degree)
            self._edge_keys = row * self.n + self.indices
        return self._edge_keys

    def counts(self, pairs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(common neighbours int64, Adamic-Adar float64, resource allocation float64) per pair, raw."""
        pairs = torch.as_tensor(pairs, dtype=torch.int64)
        u, v = pairs[0], pairs[1]
        pu, nu = self._neighbours(u)
        pv, nv = self._neighbours(v)
        p = len(u)
        cn = torch.zeros(p, dtype=torch.int64)
        aa = torch.zeros(p, dtype=torch.float64)
        ra = torch.zeros(p, dtype=torch.float64)
        if len(nu) and len(nv):
            keys_v = pv * self.n + nv  # sorted: pairs ascend, columns ascend within rows
            keys_u = pu * self.n + nu
            at = torch.searchsorted(keys_v, keys_u).clamp(max=len(keys_v) - 1)
            hit = keys_v[at] == keys_u
            pair, w = pu[hit], nu[hit]
            cn.index_add_(0, pair, torch.ones_like(pair))
            aa.index_add_(0, pair, self.aa_weight[w])
            ra.index_add_(0, pair, self.ra_weight[w])
        return cn, aa, ra

    def _features(self, pairs: torch.Tensor, exclude_own_edge: bool) -> torch.Tensor:
        cn, aa, ra = self.counts(pairs)
        du, dv = self.degree[pairs[0]], self.degree[pairs[1]]
        if exclude_own_edge:
            du, dv = (du - 1).clamp(min=0), (dv - 1).clamp(min=0)
        if not self.ordered:
            du, dv = torch.minimum(du, dv), torch.maximum(du, dv)
        lo, hi = du.to(torch.float64), dv.to(torch.float64)
        cols = [cn.to(torch.float64), aa, ra * _RA_SCALE, lo, hi]
        return torch.log1p(torch.stack(cols, 1)).to(torch.float32)

    def _neighbours(self, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(position in `nodes`, neighbour) of every neighbour of every node, grouped by position."""
        start = self.indptr[nodes]
        count = self.indptr[nodes + 1] - start
        pos = torch.repeat_interleave(torch.arange(len(nodes), dtype=torch.int64), count)
        first = torch.cumsum(count, 0) - count
        offset = torch.arange(len(pos), dtype=torch.int64) - first[pos]
        return pos, self.indices[start[pos] + offset]

    def _chunks(self, pairs: torch.Tensor):
        """[lo, hi) column ranges of `pairs` whose gathered neighbour lists stay under chunk_entries."""
        work = (self.degree[pairs[0]] + self.degree[pairs[1]]).cumsum(0)
        total = int(work[-1])
        if total <= self.chunk_entries:
            yield 0, pairs.shape[1]
            return
        bounds = torch.searchsorted(
            work, torch.arange(1, math.ceil(total / self.chunk_entries) + 1) * self.chunk_entries
        )
        lo = 0
        for hi in bounds.tolist() + [pairs.shape[1]]:
            hi = max(min(hi, pairs.shape[1]), lo + 1) if lo < pairs.shape[1] else lo
            if hi > lo:
                yield lo, hi
            lo = hi


def two_hop_negatives(
    heuristics: PairHeuristics,
    nodes: torch.Tensor,
    sources: torch.Tensor,
    generator: torch.Generator,
    *,
    hops: int = 2,
    node_types: torch.Tensor | None = None,
    end_type: int | None = None,
) -> torch.Tensor:
    """Hard negatives: for each position in `sources` (positions in `nodes`, the global ids of
    a minibatch's nodes), the end w of a random walk of `hops` steps from that node (2: a
    neighbour's neighbour) that is itself among `nodes`, not the node and not its neighbour, and
    of type `end_type` when `node_types` (each node's type) is given; int64 [2, Q] positions in
    `nodes` (Q <= len(sources): draws that miss are dropped). Such pairs are joined by short
    paths, unlike uniform ones."""
    g = heuristics
    u = nodes[sources]
    deg = g.degree[u]
    has = deg > 0
    u, sources = u[has], sources[has]
    w = u
    for _ in range(hops):  # every node on the walk has a neighbour: the graph is symmetric
        d = g.degree[w]
        w = g.indices[g.indptr[w] + (torch.rand(len(w), generator=generator) * d).long().clamp(max=d - 1)]
    where = torch.full((g.n,), -1, dtype=torch.int64)
    where[nodes] = torch.arange(len(nodes), dtype=torch.int64)
    keep = (where[w] >= 0) & (w != u)
    if node_types is not None:
        keep &= node_types[w] == end_type
    keep[keep.clone()] = ~g.is_edge(torch.stack([u[keep], w[keep]]))
    return torch.stack([sources[keep], where[w[keep]]])
