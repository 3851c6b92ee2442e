"""Multilevel METIS within a memory budget: coarsen by size-constrained label propagation,
partition the coarse graph with METIS, project back and refine — all vectorised over CSR
row chunks, so no step holds more than the CSR and a few arrays of its size.

Why: METIS (through pymetis, idx_t = int64) costs about 90-130 bytes per directed edge —
its own copy of the graph with edge weights, then one coarser copy per level, which shrink
slowly on power-law graphs — so at 200M directed edges (100M undirected) it needs 18-26 GB.
`multilevel_assign` hands METIS a graph of at most `max_edges` directed edges instead:

1. **Coarsen** (`label_propagation` + `contract`, repeated until the graph has at most
   `max_edges` edges): each node takes the cluster label with the largest total edge weight
   among its neighbours, provided the cluster's node weight stays <= ``U = total / (k * 16)``
   (so METIS can still balance k parts out of clusters), preferring its own label on ties;
   a level that removes under 5 % of the edges is redone with U doubled (up to total / 2k).
   Rows are visited in chunks; the labels and cluster weights are updated after each chunk
   (Gauss-Seidel across chunks, synchronous within one), and moves that would overfill a
   cluster are refused in order. This is the size-constrained label propagation used to
   partition complex networks (Meyerhenke, Sanders, Schulz 2014/2016): it finds the dense
   regions first, where a matching shrinks a power-law graph only slowly. Contracting a
   clustering merges parallel edges into integer edge weights and sums node weights.
2. **Partition** the coarsest graph with seeded METIS (node weights = member counts, or the
   members' degree + 1 with `balance_edges`; edge weights = merged multiplicities). Its
   edge cut equals the cut of the projected assignment on the fine graph.
3. **Uncoarsen**: project the parts one level down and refine (`refine_kway`): every node
   whose best other part (by edge weight into it) beats its own moves there, provided the
   part's weight stays under ``(1 + imbalance) * total / k``; rounds until nothing moves
   or the cut stops falling (a round that raises the cut is undone).

The result is deterministic for the same CSR, k and seed. Edge weights and node weights
are integers (METIS's); a graph already within `max_edges` goes straight to METIS.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CLUSTERS_PER_PART = 16  # cluster weight bound U = total node weight / (k * this)
LP_ROUNDS = 5  # label-propagation rounds per level
REFINE_ROUNDS = 8  # most refinement rounds per level
MAX_LEVELS = 12
CHUNK_EDGES = 1 << 22  # edges per row chunk of every pass


@dataclass
class Level:
    """A graph of the hierarchy: CSR with integer edge weights (None = all 1) and node weights."""

    indptr: np.ndarray  # int64 [n + 1]
    indices: np.ndarray  # int32 or int64 [m]
    eweight: np.ndarray | None  # int64 [m] or None
    vweight: np.ndarray  # int64 [n]

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


def _admit(target: np.ndarray, amount: np.ndarray, load: np.ndarray, cap: int | float) -> np.ndarray:
    """Mask of the moves (target, amount) admitted in order so that load[target] stays <= cap."""
    order = np.argsort(target, kind="stable")
    t, a = target[order], amount[order]
    cum = np.cumsum(a)
    starts = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    before = np.repeat(cum[starts] - a[starts], np.diff(np.r_[starts, len(t)]))
    ok = np.empty(len(t), dtype=bool)
    ok[order] = load[t] + (cum - before) <= cap
    return ok


def label_propagation(g: Level, max_weight: int, rounds: int = LP_ROUNDS) -> np.ndarray:
    """int64 cluster label per node (labels are node ids), cluster weights <= max(max_weight,
    heaviest node). See the module docstring."""
    n = g.n
    label = np.arange(n, dtype=np.int64)
    size = g.vweight.astype(np.int64, copy=True)
    chunks = row_chunks(g.indptr)
    for _ in range(rounds):
        moved = 0
        for r0, r1 in chunks:
            e0, e1 = int(g.indptr[r0]), int(g.indptr[r1])
            if e0 == e1:
                continue
            key = _chunk_rows(g.indptr, r0, r1) * n + label[g.indices[e0:e1]]
            if g.eweight is None:
                key.sort()
                starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
                total = np.diff(np.r_[starts, len(key)])
            else:
                order = np.argsort(key)
                key = key[order]
                starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
                total = np.add.reduceat(g.eweight[e0:e1][order], starts)
                del order
            key = key[starts]
            row, lab = key // n, key % n
            node = r0 + row
            own = label[node] == lab
            feasible = own | (size[lab] + g.vweight[node] <= max_weight)
            score = np.where(feasible, 2 * total + own, -1)  # ties go to the own label
            seg = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
            best = np.maximum.reduceat(score, seg)
            is_best = score == np.repeat(best, np.diff(np.r_[seg, len(row)]))
            pick = np.flatnonzero(is_best)
            pick = pick[np.r_[True, row[pick][1:] != row[pick][:-1]]]  # first best label per row
            node, new = node[pick], lab[pick]
            change = new != label[node]
            node, new = node[change], new[change]
            if not len(node):
                continue
            ok = _admit(new, g.vweight[node], size, max_weight)
            node, new = node[ok], new[ok]
            np.subtract.at(size, label[node], g.vweight[node])
            np.add.at(size, new, g.vweight[node])
            label[node] = new
            moved += len(node)
        if moved == 0:
            break
    return label


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
    chunks = row_chunks(g.indptr)
    idx_dtype = np.int32 if nc < 2**31 else np.int64

    def edges(r0, r1):
        e0, e1 = int(g.indptr[r0]), int(g.indptr[r1])
        cs = cmap[r0 + _chunk_rows(g.indptr, r0, r1)]
        cd = cmap[g.indices[e0:e1]]
        keep = cs != cd
        w = g.eweight[e0:e1][keep] if g.eweight is not None else np.ones(int(keep.sum()), dtype=np.int64)
        return cs[keep], cd[keep], w

    counts = np.zeros(nc, dtype=np.int64)
    for r0, r1 in chunks:
        cs, _, _ = edges(r0, r1)
        counts += np.bincount(cs, minlength=nc)
    ptr = np.zeros(nc + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    del counts
    adj = np.empty(int(ptr[-1]), dtype=idx_dtype)
    wt = np.empty(int(ptr[-1]), dtype=np.int64)
    cursor = ptr[:-1].copy()
    for r0, r1 in chunks:  # bucket the edges by coarse source (a counting sort)
        cs, cd, w = edges(r0, r1)
        order = np.argsort(cs, kind="stable")
        cs, cd, w = cs[order], cd[order], w[order]
        starts = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
        rank = np.arange(len(cs), dtype=np.int64) - np.repeat(starts, np.diff(np.r_[starts, len(cs)]))
        pos = cursor[cs] + rank
        adj[pos], wt[pos] = cd, w
        cursor[cs[starts]] += np.diff(np.r_[starts, len(cs)])
    del cursor
    # merge parallel edges row chunk by row chunk, compacting in place (output never passes input)
    new_ptr = np.zeros(nc + 1, dtype=np.int64)
    out = 0
    for r0, r1 in row_chunks(ptr):
        e0, e1 = int(ptr[r0]), int(ptr[r1])
        if e0 == e1:
            new_ptr[r0 + 1 : r1 + 1] = out
            continue
        row = _chunk_rows(ptr, r0, r1)
        key = row * nc + adj[e0:e1]
        order = np.argsort(key)
        key = key[order]
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        w = np.add.reduceat(wt[e0:e1][order], starts)
        key = key[starts]
        r = key // nc
        adj[out : out + len(key)] = key % nc
        wt[out : out + len(key)] = w
        new_ptr[r0 + 1 : r1 + 1] = out + np.cumsum(np.bincount(r, minlength=r1 - r0))
        out += len(key)
    coarse = Level(new_ptr, adj[:out].copy(), wt[:out].copy(), vweight)
    return coarse, cmap


def edge_cut_weight(g: Level, part: np.ndarray) -> int:
    """Total weight of the directed edges whose ends lie in different parts."""
    cut = 0
    for r0, r1 in row_chunks(g.indptr):
        e0, e1 = int(g.indptr[r0]), int(g.indptr[r1])
        is_cut = part[r0 + _chunk_rows(g.indptr, r0, r1)] != part[g.indices[e0:e1]]
        cut += int(is_cut.sum()) if g.eweight is None else int(g.eweight[e0:e1][is_cut].sum())
    return cut


def refine_kway(g: Level, part: np.ndarray, k: int, imbalance: float, rounds: int = REFINE_ROUNDS) -> np.ndarray:
    """Greedy k-way refinement (see the module docstring); returns the refined int32 parts."""
    cap = (1.0 + imbalance) * float(g.vweight.sum()) / k
    part = part.astype(np.int32, copy=True)
    load = np.bincount(part, weights=g.vweight, minlength=k)
    cut = edge_cut_weight(g, part)
    chunks = row_chunks(g.indptr)
    for _ in range(rounds):
        before, before_load = part.copy(), load.copy()
        moved = 0
        for r0, r1 in chunks:
            e0, e1 = int(g.indptr[r0]), int(g.indptr[r1])
            if e0 == e1:
                continue
            rows = r1 - r0
            w = g.eweight[e0:e1] if g.eweight is not None else None
            conn = np.bincount(
                _chunk_rows(g.indptr, r0, r1) * k + part[g.indices[e0:e1]], weights=w, minlength=rows * k
            ).reshape(rows, k)
            own_part = part[r0:r1]
            ar = np.arange(rows)
            own = conn[ar, own_part].copy()
            conn[ar, own_part] = -1.0
            best = conn.argmax(axis=1)
            gain = conn[ar, best] - own
            node = np.flatnonzero(gain > 0)
            if not len(node):
                continue
            node = node[np.argsort(-gain[node], kind="stable")]  # biggest gains first
            target = best[node]
            ok = _admit(target, g.vweight[r0 + node].astype(np.float64), load, cap)
            node, target = node[ok], target[ok]
            np.subtract.at(load, own_part[node], g.vweight[r0 + node])
            np.add.at(load, target, g.vweight[r0 + node])
            part[r0 + node] = target
            moved += len(node)
        if moved == 0:
            break
        new_cut = edge_cut_weight(g, part)
        if new_cut >= cut:  # synchronous moves of neighbours can undo each other: keep the better
            if new_cut > cut:
                part, load = before, before_load
            break
        cut = new_cut
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

    from graphs.partition import _quiet, metis_idx_dtype

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
    else:
        eweights = top.eweight.astype(dtype) if top.eweight is not None else None
        with _quiet():
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
