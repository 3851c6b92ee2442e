"""DGL's METIS beside ours: `metis_assign` (``dgl.metis_partition_assignment``) and the DGL graph
over a CSR it is given (`dgl_graph`), what the tests and benchmarks compare metis_partitions'
seeded METIS (`graphs.stages.partition.metis_assign_csr`) with."""

from __future__ import annotations

import warnings

import numpy as np

from graphs.kernels.metis import quiet_stdout

__all__ = ["dgl_graph", "metis_assign"]


def dgl_graph(indptr: np.ndarray, indices: np.ndarray):
    """A DGL graph over the CSR arrays (no copy of the edges; int64 ids)."""
    import dgl
    import torch

    with warnings.catch_warnings():  # read-only Arrow/memmap buffers: DGL only reads them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        indptr_t = torch.from_numpy(np.asarray(indptr, dtype=np.int64))
        indices_t = torch.from_numpy(np.asarray(indices, dtype=np.int64))
    empty = torch.empty(0, dtype=torch.int64)  # no explicit edge ids: edge k is entry k
    return dgl.graph(("csr", (indptr_t, indices_t, empty)), num_nodes=len(indptr) - 1)


def metis_assign(graph, k: int, balance_edges: bool = False) -> np.ndarray:
    """int32 part id per node from DGL's METIS; `graph` is a DGLGraph or (indptr, indices).

    Not reproducible run to run: the METIS in DGL 2.1 (called with its on-disk option) gives
    different, equally valid assignments for the same graph across calls and processes, so
    this stage is the one whose files are not byte-identical for the same inputs; every
    stage downstream is, given the same metis_partitions folder.
    """
    import dgl

    if isinstance(graph, tuple):
        graph = dgl_graph(*graph)
    n = graph.num_nodes()
    if k == 1 or n == 0:
        return np.zeros(n, dtype=np.int32)
    if k >= n:
        return np.arange(n, dtype=np.int32)
    with quiet_stdout():
        parts = dgl.metis_partition_assignment(graph, k, balance_edges=balance_edges)
    if parts is None:
        raise RuntimeError(f"DGL's METIS returned no assignment for {n} nodes and k={k}")
    return parts.numpy().astype(np.int32)
