"""Vertex-cut (edge) partitioning: every edge goes to one of k parts, a vertex is replicated in
every part that holds one of its edges (metis_partitions' ``vertex_cut``).

An edge partitioner is an `EdgePartitioner` subclass in its own module of
`graphs.stages.vertex_cuts`, registered with `register_edge_partitioner` under its ``name``
(every module of that package is imported on the first lookup, so a new one is one new file).
It declares `EdgePartitionerTraits`:

- ``full_degrees``: it reads every vertex's degree before the first edge is placed (DBH); without
  it, the partitioner streams the edges once and keeps its own partial state (HDRF).

`assign` places the edges of a CSR (rows = canonical src, columns = dst, the canonical order,
which is also Â's off-diagonal order) and returns int32 [m], the part of every edge. On a
symmetrized graph both directions of an edge go to the same part (`pair_directions`), so a
part holds whole undirected edges.

`vertex_cut` adds what the rest of gnnflow reads (`graphs.formats.partition_files` names the
files): the *master* part of every vertex (the part holding most of its out-edges, ties to the
lowest part; a vertex without out-edges: its lowest replica; an isolated vertex: the random
baseline's part), the parts that hold each vertex (a uint64 bit set, so k <= 64), and the
metrics: replication factor (vertex copies over vertices, masters counted), edges and vertices
per part, edge imbalance (largest part over the mean) and the training nodes per master part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numba
import numpy as np

from graphs.infra.variants import Registry
from graphs.kernels.coarsen import row_chunks
from graphs.stages.partition_metrics import train_balance

__all__ = [
    "MAX_VERTEX_CUT_PARTS",
    "EdgePartitioner",
    "EdgePartitionerTraits",
    "VertexCut",
    "edge_partitioner_class",
    "edge_partitioner_names",
    "holders_of",
    "popcounts",
    "register_edge_partitioner",
    "vertex_cut",
]

MAX_VERTEX_CUT_PARTS = 64  # the parts holding a vertex are the bits of one uint64


@dataclass(frozen=True, kw_only=True)
class EdgePartitionerTraits:
    """What an edge partitioner is (the module docstring says what each means)."""

    full_degrees: bool


class EdgePartitioner:
    """An edge partitioner: its traits and `assign`."""

    name: ClassVar[str]
    traits: ClassVar[EdgePartitionerTraits]

    @classmethod
    def assign(
        cls, indptr: np.ndarray, indices: np.ndarray, k: int, degree: np.ndarray | None, seed: int, symmetric: bool
    ) -> np.ndarray:
        """int32 [m]: the part 0..k-1 of every edge of the CSR. `degree` (int64 [n], the undirected
        degree) is given when ``traits.full_degrees``; with `symmetric` both directions of an edge
        must get the same part."""
        raise NotImplementedError(f"edge partitioner {cls.name!r} implements no assign()")


def _check_traits(cls: type) -> None:
    if not (isinstance(cls, type) and issubclass(cls, EdgePartitioner)):
        raise TypeError(f"{cls!r} is not an EdgePartitioner subclass")
    if not isinstance(getattr(cls, "traits", None), EdgePartitionerTraits):
        raise TypeError(f"edge partitioner {cls.name!r} ({cls.__qualname__}) declares no EdgePartitionerTraits")


EDGE_PARTITIONERS = Registry("edge partitioner", "vertex_cut", "graphs.stages.vertex_cuts", _check_traits)


def register_edge_partitioner(cls: type[EdgePartitioner]) -> type[EdgePartitioner]:
    """Class decorator: register the `EdgePartitioner` subclass `cls` under ``cls.name``."""
    return EDGE_PARTITIONERS.register(cls)


def edge_partitioner_names() -> tuple[str, ...]:
    """The registered edge partitioners' names."""
    return EDGE_PARTITIONERS.names()


def edge_partitioner_class(name: str) -> type[EdgePartitioner]:
    """The edge partitioner registered as `name` (ValueError naming the registered ones otherwise)."""
    return EDGE_PARTITIONERS.get(name)


# ----------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def _reverse_position(indptr, indices, u, v):  # pragma: no cover
    """Position of edge u -> v in the CSR (columns ascending within a row), or -1."""
    lo, hi = indptr[u], indptr[u + 1]
    while lo < hi:
        mid = (lo + hi) // 2
        if indices[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    if lo < indptr[u + 1] and indices[lo] == v:
        return lo
    return -1


@numba.njit(cache=True, nogil=True)
def _pair_kernel(indptr, indices, part):  # pragma: no cover
    """Give every edge u -> v with v < u the part of its reverse v -> u (when there is one)."""
    n = len(indptr) - 1
    for u in range(n):
        for e in range(indptr[u], indptr[u + 1]):
            v = indices[e]
            if v < u:
                r = _reverse_position(indptr, indices, v, u)
                if r >= 0:
                    part[e] = part[r]


def pair_directions(indptr: np.ndarray, indices: np.ndarray, part: np.ndarray) -> np.ndarray:
    """`part` with every edge u -> v (v < u) given its reverse's part: on a symmetrized graph,
    the parts of the edges v -> u (v < u) decide both directions."""
    _pair_kernel(np.asarray(indptr, dtype=np.int64), indices, part)
    return part


@numba.njit(cache=True, nogil=True)
def _holders_kernel(indptr, indices, part, holders):  # pragma: no cover
    n = len(indptr) - 1
    for u in range(n):
        for e in range(indptr[u], indptr[u + 1]):
            bit = np.uint64(1) << np.uint64(part[e])
            holders[u] |= bit
            holders[indices[e]] |= bit


def holders_of(indptr: np.ndarray, indices: np.ndarray, part: np.ndarray) -> np.ndarray:
    """uint64 [n]: bit p set for every part p (at most 64) holding an edge of the node."""
    holders = np.zeros(len(indptr) - 1, dtype=np.uint64)
    _holders_kernel(np.asarray(indptr, dtype=np.int64), indices, part, holders)
    return holders


def popcounts(bits: np.ndarray) -> np.ndarray:
    """int64: the set bits of each uint64 (how many parts hold each node)."""
    return _popcount(bits)


def _masters(indptr: np.ndarray, part: np.ndarray, holders: np.ndarray, k: int, fallback: np.ndarray) -> np.ndarray:
    """int32 [n]: the part holding most of each vertex's out-edges (ties: the lowest), a vertex
    without out-edges its lowest replica, an isolated vertex its `fallback` part."""
    n = len(indptr) - 1
    master = np.empty(n, dtype=np.int32)
    for r0, r1 in row_chunks(indptr, max(1, (1 << 24) // k)):
        e0, e1 = int(indptr[r0]), int(indptr[r1])
        rows = np.repeat(np.arange(r1 - r0, dtype=np.int64), np.diff(indptr[r0 : r1 + 1]))
        counts = np.bincount(rows * k + part[e0:e1], minlength=(r1 - r0) * k).reshape(r1 - r0, k)
        master[r0:r1] = np.argmax(counts, axis=1)
    no_out = np.diff(indptr) == 0
    held = holders[no_out]
    lowest_bit = held & (~held + np.uint64(1))  # the lowest set bit alone (0 for 0)
    lowest = _popcount(lowest_bit - np.uint64(1)).astype(np.int32)  # its index
    master[no_out] = np.where(held != 0, lowest, fallback[no_out])
    return master


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of each uint64."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.int64)


@dataclass
class VertexCut:
    """An edge partition: the part of every edge, every vertex's master part and holders, metrics."""

    edge_part: np.ndarray  # int32 [m], canonical edge order
    master: np.ndarray  # int32 [n]
    holders: np.ndarray  # uint64 [n], bit p set when part p holds the vertex (its master's included)
    metrics: dict


def vertex_cut(
    name: str,
    indptr: np.ndarray,
    indices: np.ndarray,
    k: int,
    seed: int,
    symmetric: bool,
    train: np.ndarray,
    fallback: np.ndarray,
) -> VertexCut:
    """The registered edge partitioner `name`'s k parts of the CSR, with masters, holders and
    metrics (module docstring). `train` (bool [n]) the training nodes, `fallback` (int [n]) the
    part of an isolated vertex."""
    if not 1 <= k <= MAX_VERTEX_CUT_PARTS:
        raise ValueError(f"vertex_cut={name!r} places edges on at most {MAX_VERTEX_CUT_PARTS} parts; num_parts={k}")
    cls = edge_partitioner_class(name)
    indptr = np.asarray(indptr, dtype=np.int64)
    n = len(indptr) - 1
    degree = None
    if cls.traits.full_degrees:
        degree = np.diff(indptr)
        if not symmetric:  # in-edges count too
            degree = degree + np.bincount(np.asarray(indices, dtype=np.int64), minlength=n)
    part = np.ascontiguousarray(cls.assign(indptr, indices, k, degree, seed, symmetric), dtype=np.int32)
    if len(part) != len(indices) or (len(part) and (part.min() < 0 or part.max() >= k)):
        raise AssertionError(f"edge partitioner {name!r} returned parts outside 0..{k - 1} or of the wrong length")
    holders = holders_of(indptr, indices, part)
    master = _masters(indptr, part, holders, k, np.asarray(fallback, dtype=np.int32))
    holders |= np.uint64(1) << master.astype(np.uint64)
    copies = _popcount(holders)
    edges = np.bincount(part, minlength=k)
    vertices = [int(np.count_nonzero(holders & (np.uint64(1) << np.uint64(p)))) for p in range(k)]
    metrics = {
        "partitioner": name,
        "replication_factor": round(float(copies.sum() / max(n, 1)), 4),
        "replicated_vertices": int(np.count_nonzero(copies > 1)),
        "edges_per_part": edges.tolist(),
        "vertices_per_part": vertices,
        "edge_imbalance": round(float(edges.max() / edges.mean()), 4) if len(part) else 1.0,
        **train_balance(master, k, train),
    }
    return VertexCut(part, master, holders, metrics)
