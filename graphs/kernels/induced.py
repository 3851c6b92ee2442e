"""The subgraph a set of nodes induces in a CSR, as a CSR of its own (a numba kernel, one pass over
the rows of those nodes): Cluster-GCN's clusters are METIS on each part's induced subgraph."""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["induced_csr"]


@numba.njit(cache=True, nogil=True)
def _induced_kernel(indptr, indices, nodes, local, weight, has_w, sub_indptr, out_idx, out_w):  # pragma: no cover
    """The rows of `nodes` keeping the edges whose ends have a local id; returns the edge count."""
    o = 0
    for i in range(len(nodes)):
        u = nodes[i]
        for e in range(indptr[u], indptr[u + 1]):
            v = local[indices[e]]
            if v >= 0:
                out_idx[o] = v
                if has_w:
                    out_w[o] = weight[e]
                o += 1
        sub_indptr[i + 1] = o
    return o


def induced_csr(
    indptr: np.ndarray, indices: np.ndarray, nodes: np.ndarray, local: np.ndarray, weight: np.ndarray | None = None
):
    """(indptr, indices, weight or None) of the subgraph induced by ascending `nodes`, ids
    local 0..len-1. `local` is an int64 [n] scratch array of -1 (left as it was found)."""
    nodes = np.asarray(nodes, dtype=np.int64)
    local[nodes] = np.arange(len(nodes), dtype=np.int64)
    total = int((np.asarray(indptr[nodes + 1], dtype=np.int64) - np.asarray(indptr[nodes], dtype=np.int64)).sum())
    sub_indptr = np.zeros(len(nodes) + 1, dtype=np.int64)
    out_idx = np.empty(total, dtype=np.int64)  # at most every edge of the rows
    has_w = weight is not None
    out_w = np.empty(total if has_w else 0, dtype=weight.dtype if has_w else np.float32)
    w = weight if has_w else out_w
    m = _induced_kernel(indptr, indices, nodes, local, w, has_w, sub_indptr, out_idx, out_w)
    local[nodes] = -1
    return sub_indptr, out_idx[:m].copy(), (out_w[:m].copy() if has_w else None)
