"""Multilevel METIS within a memory budget: coarsen by size-constrained label propagation,
partition the coarse graph with METIS, project back and refine — each pass a numba kernel over
the CSR, so no step holds more than the CSR and a few arrays of its size.

Why: METIS (through pymetis, idx_t = int64) costs about 90-130 bytes per directed edge —
its own copy of the graph with edge weights, then one coarser copy per level, which shrink
slowly on power-law graphs — so at 200M directed edges (100M undirected) it needs 18-26 GB.
`multilevel_assign` hands METIS a graph of at most `max_edges` directed edges instead:

1. **Coarsen** (`label_propagation` + `contract`, repeated until the graph has at most
   `max_edges` edges): each node takes the cluster label with the largest total edge weight
   among its neighbours, provided the cluster's node weight stays <= ``U = total / (k * 16)``
   (so METIS can still balance k parts out of clusters), preferring its own label on ties;
   a level that removes under 5 % of the edges is redone with U doubled (up to total / 2k).
   Nodes are visited in id order and each move takes effect at once (Gauss-Seidel), so a
   cluster never passes U. This is the size-constrained label propagation used to
   partition complex networks (Meyerhenke, Sanders, Schulz 2014/2016): it finds the dense
   regions first, where a matching shrinks a power-law graph only slowly. Contracting a
   clustering merges parallel edges into integer edge weights and sums node weights.
2. **Partition** the coarsest graph with seeded METIS (node weights = member counts, or the
   members' degree + 1 with `balance_edges`; edge weights = merged multiplicities). Its
   edge cut equals the cut of the projected assignment on the fine graph.
3. **Uncoarsen**: project the parts one level down and refine (`refine_kway`): nodes in id
   order, each moving at once to the other part with the most edge weight into it when that
   beats its own part and the part's weight stays under ``(1 + imbalance) * total / k``;
   every move lowers the cut, and rounds go on until nothing moves.

Further balance constraints (`Level.balance`, one column each: the training nodes, each node
type of a typed graph) are summed by the contraction like the node weights, handed to METIS as
more constraints (multi-constraint k-way, `graphs.kernels.metis.metis_kway_multi`), and kept by
the refinement: a move must leave every column of its new part under that column's cap too.

The result is deterministic for the same CSR, k and seed. Edge weights and node weights
are integers (METIS's); a graph already within `max_edges` goes straight to METIS.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from graphs.kernels.metis import metis_idx_dtype, metis_kway_multi, quiet_stdout

CLUSTERS_PER_PART = 16  # cluster weight bound U = total node weight / (k * this)
LP_ROUNDS = 5  # label-propagation rounds per level
REFINE_ROUNDS = 8  # most refinement rounds per level
MAX_LEVELS = 12
CHUNK_EDGES = 1 << 22  # edges per row chunk of the vectorised passes (edge_cut_weight, DistDGL)
_NO_WEIGHTS = np.empty(0, dtype=np.int64)
SHORT_ROW = 32  # rows of at most this many edges sum their labels' weights by a scan (see _sum_by_key)


@dataclass
class Level:
    """A graph of the hierarchy: CSR with integer edge weights (None = all 1) and node weights."""

    indptr: np.ndarray  # int64 [n + 1]
    indices: np.ndarray  # int32 or int64 [m]
    eweight: np.ndarray | None  # int64 [m] or None
    vweight: np.ndarray  # int64 [n]
    balance: np.ndarray | None = None  # int64 [n, c]: further balance constraints (summed like vweight)

    @property
    def n(self) -> int:
        return len(self.indptr) - 1

    @property
    def m(self) -> int:
        return int(self.indptr[-1])


def row_chunks(indptr: np.ndarray, edges_per_chunk: int = CHUNK_EDGES) -> list[tuple[int, int]]:
    """(row0, row1) ranges of the CSR holding about `edges_per_chunk` edges each."""
    n = len(indptr) - 1
    m = int(indptr[-1])
    cuts = np.searchsorted(indptr, np.arange(0, m, edges_per_chunk, dtype=np.int64), side="right") - 1
    bounds = np.unique(np.concatenate([[0], np.clip(cuts, 0, n), [n]]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))


def _chunk_rows(indptr: np.ndarray, r0: int, r1: int) -> np.ndarray:
    """Local row (0..r1-r0-1) of every edge of rows r0..r1-1."""
    return np.repeat(np.arange(r1 - r0, dtype=np.int64), np.diff(indptr[r0 : r1 + 1]))


def _weights(g: Level) -> tuple[np.ndarray, bool]:
    """(edge weights, has weights): an empty array stands for all-ones (numba takes no None)."""
    if g.eweight is None:
        return _NO_WEIGHTS, False
    return g.eweight, True


@numba.njit(cache=True, nogil=True, inline="always")
def _sum_by_key(keys, weights, e0, e1, key_of, eweight, has_w, dense):  # pragma: no cover
    """Total edge weight per distinct key_of[e] of edges e0..e1 (weights eweight[e], or 1):
    the keys into keys[:t], their totals into weights[:t]; returns t. A short row is summed by a scan of the
    keys met so far (they stay in the L1 cache); a long one through `dense` (zeros, one slot
    per key, left zeroed), whose slots would each be a cache miss on a large graph."""
    t = 0
    if e1 - e0 <= SHORT_ROW:
        for e in range(e0, e1):
            key = key_of[e]
            w = eweight[e] if has_w else 1
            i = 0
            while i < t and keys[i] != key:
                i += 1
            if i == t:
                keys[t] = key
                weights[t] = w
                t += 1
            else:
                weights[i] += w
        return t
    for e in range(e0, e1):
        key = key_of[e]
        if dense[key] == 0:
            keys[t] = key
            t += 1
        dense[key] += eweight[e] if has_w else 1
    for i in range(t):
        weights[i] = dense[keys[i]]
        dense[keys[i]] = 0
    return t


@numba.njit(cache=True, nogil=True, inline="always")
def _move(u, old, new, weight, load, group, active, neighbours):  # pragma: no cover
    """Node u (of `weight`) from group `old` to `new`: the groups' loads follow, and its
    neighbours are visited again (the next round, or this one if they come later)."""
    load[old] -= weight
    load[new] += weight
    group[u] = new
    for v in neighbours:
        active[v] = True


@numba.njit(cache=True, nogil=True)
def _lp_kernel(indptr, indices, eweight, has_w, vweight, label, size, max_weight, rounds):  # pragma: no cover
    n = len(indptr) - 1
    dense = np.zeros(n, np.int64)  # scratch of `_sum_by_key` for long rows
    width = max(1, int(np.max(indptr[1:] - indptr[:-1])) if n else 1)
    keys, weights = np.empty(width, label.dtype), np.empty(width, np.int64)
    nbr_label = np.empty(width, label.dtype)
    active = np.ones(n, np.bool_)  # visited this round: every node in the first, then those a move touched
    for _ in range(rounds):
        moved = 0
        for u in range(n):
            if not active[u]:
                continue
            active[u] = False
            e0, e1 = indptr[u], indptr[u + 1]
            if e0 == e1:
                continue
            for e in range(e0, e1):
                nbr_label[e - e0] = label[indices[e]]
            t = _sum_by_key(keys, weights, 0, e1 - e0, nbr_label, eweight[e0:e1] if has_w else eweight, has_w, dense)
            own, vw = label[u], vweight[u]
            best, best_score, refused = -1, -1, -1
            for i in range(t):
                lab = keys[i]
                score = 2 * weights[i]
                if lab == own:
                    score += 1  # ties go to the own label
                elif size[lab] + vw > max_weight:
                    refused = max(refused, score)
                    continue
                if score > best_score or (score == best_score and lab < best):
                    best, best_score = lab, score
            if refused > best_score:
                active[u] = True  # a better label was full: try again next round, when it may have room
            if best >= 0 and best != own:
                _move(u, own, best, vw, size, label, active, indices[e0:e1])
                moved += 1
        if moved == 0:
            break


@numba.njit(cache=True, nogil=True)
def _contract_kernel(
    indptr, indices, eweight, has_w, members, member_ptr, cmap, out_ptr, out_adj, out_w
):  # pragma: no cover
    """Coarse rows in coarse-id order, parallel edges merged: row c at out_ptr[c]..out_ptr[c + 1]
    of (out_adj, out_w); returns the number of coarse edges."""
    nc = len(member_ptr) - 1
    slot = np.full(nc, -1, np.int64)  # output position of each coarse neighbour of the current row
    out = 0
    for c in range(nc):
        start = out
        for j in range(member_ptr[c], member_ptr[c + 1]):
            u = members[j]
            for e in range(indptr[u], indptr[u + 1]):
                d = cmap[indices[e]]
                if d == c:
                    continue  # inside the cluster
                w = eweight[e] if has_w else 1
                s = slot[d]
                if s < 0:
                    slot[d] = out
                    out_adj[out] = d
                    out_w[out] = w
                    out += 1
                else:
                    out_w[s] += w
        for s in range(start, out):
            slot[out_adj[s]] = -1
        out_ptr[c + 1] = out
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _fits(extra, extra_load, extra_cap, u, p):  # pragma: no cover
    """Whether part p stays within every further constraint's cap with node u in it."""
    for j in range(extra.shape[1]):
        if extra_load[p, j] + extra[u, j] > extra_cap[j]:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def _refine_kernel(
    indptr, indices, eweight, has_w, vweight, part, load, cap, k, rounds, extra, extra_load, extra_cap
):  # pragma: no cover
    n = len(indptr) - 1
    conn = np.zeros(k, np.int64)  # edge weight from the node into each part
    touched = np.empty(k, np.int64)
    active = np.ones(n, np.bool_)  # visited this round: every node in the first, then those a move touched
    for _ in range(rounds):
        moved = 0
        for u in range(n):
            if not active[u]:
                continue
            active[u] = False
            e0, e1 = indptr[u], indptr[u + 1]
            if e0 == e1:
                continue
            t = 0
            for e in range(e0, e1):
                p = part[indices[e]]
                if conn[p] == 0:
                    touched[t] = p
                    t += 1
                conn[p] += eweight[e] if has_w else 1
            own, vw = part[u], vweight[u]
            best, best_conn = -1, conn[own]
            refused = False
            for i in range(t):
                p = touched[i]
                if p != own and (conn[p] > best_conn or (conn[p] == best_conn and best >= 0 and p < best)):
                    if load[p] + vw <= cap and _fits(extra, extra_load, extra_cap, u, p):
                        best, best_conn = p, conn[p]
                    else:
                        refused = True
            if refused and best < 0:
                active[u] = True  # a better part was full: try again next round
            for i in range(t):
                conn[touched[i]] = 0
            if best >= 0:
                for j in range(extra.shape[1]):
                    extra_load[own, j] -= extra[u, j]
                    extra_load[best, j] += extra[u, j]
                _move(u, own, best, vw, load, part, active, indices[e0:e1])
                moved += 1
        if moved == 0:
            break


def label_propagation(g: Level, max_weight: int, rounds: int = LP_ROUNDS) -> np.ndarray:
    """int64 cluster label per node (labels are node ids), cluster weights <= max(max_weight,
    heaviest node). See the module docstring."""
    label = np.arange(g.n, dtype=np.int32 if g.n < 2**31 else np.int64)  # int32: half the cache misses' footprint
    size = g.vweight.astype(np.int64, copy=True)
    if g.m:
        _lp_kernel(g.indptr, g.indices, *_weights(g), g.vweight, label, size, int(max_weight), int(rounds))
    return label.astype(np.int64, copy=False)


@numba.njit(cache=True, nogil=True)
def _group(cmap, nc):  # pragma: no cover
    """(members, member_ptr): the nodes of each coarse id, ascending (a counting sort)."""
    member_ptr = np.zeros(nc + 1, np.int64)
    for u in range(len(cmap)):
        member_ptr[cmap[u] + 1] += 1
    for c in range(nc):
        member_ptr[c + 1] += member_ptr[c]
    cursor = member_ptr[:-1].copy()
    members = np.empty(len(cmap), np.int64)
    for u in range(len(cmap)):
        members[cursor[cmap[u]]] = u
        cursor[cmap[u]] += 1
    return members, member_ptr


def contract(g: Level, label: np.ndarray) -> tuple[Level, np.ndarray]:
    """(coarse graph, coarse id per node): one coarse node per label, parallel edges merged
    into summed integer weights, edges inside a cluster dropped."""
    present = np.zeros(g.n, dtype=bool)
    present[label] = True
    coarse_id = np.cumsum(present, dtype=np.int64) - 1
    cmap = coarse_id[label]
    del coarse_id, present
    nc = int(cmap.max()) + 1 if g.n else 0
    vweight = np.bincount(cmap, weights=g.vweight, minlength=nc).astype(np.int64)
    balance = None
    if g.balance is not None:
        balance = np.stack(
            [np.bincount(cmap, weights=g.balance[:, j], minlength=nc) for j in range(g.balance.shape[1])], axis=1
        ).astype(np.int64)
    members, member_ptr = _group(cmap, nc)
    out_ptr = np.zeros(nc + 1, dtype=np.int64)
    adj = np.empty(g.m, dtype=np.int32 if nc < 2**31 else np.int64)  # at most the fine edges
    wt = np.empty(g.m, dtype=np.int64)
    m = _contract_kernel(g.indptr, g.indices, *_weights(g), members, member_ptr, cmap, out_ptr, adj, wt)
    del members, member_ptr
    adj, wt = adj[:m].copy(), wt[:m].copy()
    return Level(out_ptr, adj, wt, vweight, balance), cmap


def edge_cut_weight(g: Level, part: np.ndarray) -> int:
    """Total weight of the directed edges whose ends lie in different parts."""
    cut = 0
    for r0, r1 in row_chunks(g.indptr):
        e0, e1 = int(g.indptr[r0]), int(g.indptr[r1])
        is_cut = part[r0 + _chunk_rows(g.indptr, r0, r1)] != part[g.indices[e0:e1]]
        cut += int(is_cut.sum()) if g.eweight is None else int(g.eweight[e0:e1][is_cut].sum())
    return cut


def refine_kway(g: Level, part: np.ndarray, k: int, imbalance: float, rounds: int = REFINE_ROUNDS) -> np.ndarray:
    """Greedy k-way refinement (see the module docstring); returns the refined int32 parts. A
    move must keep every further balance constraint (`Level.balance`) under its own cap too."""
    cap = (1.0 + imbalance) * float(g.vweight.sum()) / k
    part = part.astype(np.int32, copy=True)
    load = np.bincount(part, weights=g.vweight, minlength=k).astype(np.int64)
    extra = g.balance if g.balance is not None else np.zeros((g.n, 0), dtype=np.int64)
    extra_load = (
        np.stack([np.bincount(part, weights=extra[:, j], minlength=k) for j in range(extra.shape[1])], axis=1).astype(
            np.int64
        )
        if extra.shape[1]
        else np.zeros((k, 0), dtype=np.int64)
    )
    extra_cap = (1.0 + imbalance) * extra.sum(axis=0).astype(np.float64) / k
    if g.m:
        _refine_kernel(
            g.indptr, g.indices, *_weights(g), g.vweight, part, load, cap, int(k), int(rounds),
            np.ascontiguousarray(extra), extra_load, extra_cap,
        )  # fmt: skip
    return part


def metis_levels(
    g: Level,
    k: int,
    max_edges: int,
    seed: int,
    imbalance: float = 0.03,
) -> np.ndarray:
    """int32 part per node of `g`: coarsen until at most `max_edges` edges, METIS, uncoarsen + refine."""
    import pymetis

    levels, maps = [g], []
    total = int(g.vweight.sum())
    max_weight = max(1, total // (k * CLUSTERS_PER_PART))
    while levels[-1].m > max_edges:
        if len(maps) == MAX_LEVELS:
            raise RuntimeError(f"coarsening stopped at {levels[-1].m} edges after {MAX_LEVELS} levels")
        cur = levels[-1]
        coarse, cmap = contract(cur, label_propagation(cur, max_weight))
        while coarse.m > 0.95 * cur.m and max_weight < total // (2 * k):
            # no structure at this cluster size (e.g. a small dense random graph): allow bigger clusters
            max_weight = min(2 * max_weight, total // (2 * k))
            coarse, cmap = contract(cur, label_propagation(cur, max_weight))
        if coarse.m > 0.95 * cur.m:
            raise RuntimeError(
                f"label propagation cannot coarsen the graph below {cur.m} directed edges "
                f"({coarse.m} after one more level); raise metis_max_edges or use more memory"
            )
        levels.append(coarse)
        maps.append(cmap)
    top = levels[-1]
    dtype = metis_idx_dtype()
    if top.n <= k:
        part = np.arange(top.n, dtype=np.int32)
    elif top.balance is not None:  # several constraints: METIS through ctypes (pymetis passes one)
        weights = np.concatenate([top.vweight[:, None], top.balance], axis=1).astype(dtype)
        eweights = top.eweight.astype(dtype) if top.eweight is not None else None
        part = metis_kway_multi(top.indptr.astype(dtype), top.indices.astype(dtype), k, weights, eweights, seed).astype(
            np.int32
        )
    else:
        eweights = top.eweight.astype(dtype) if top.eweight is not None else None
        with quiet_stdout():
            _, parts = pymetis.part_graph(
                k,
                pymetis.CSRAdjacency(top.indptr.astype(dtype), top.indices.astype(dtype)),
                eweights=eweights,
                vweights=top.vweight.astype(dtype),
                options=pymetis.Options(seed=int(seed)),
            )
        part = np.asarray(parts, dtype=np.int32)
    for level in range(len(maps) - 1, -1, -1):
        levels.pop()
        part = part[maps[level]]
        maps.pop()
        part = refine_kway(levels[-1], part, k, imbalance)
    return part


__all__ = ["Level", "contract", "edge_cut_weight", "label_propagation", "metis_levels", "refine_kway", "row_chunks"]
