"""vertex_cut: dbh, degree-based hashing (Xie et al., NeurIPS 2014): edge (u, v) goes to the part
of a seeded hash of its endpoint of lower degree (ties: the lower id), so a low-degree vertex keeps
all its edges in one part and only the hubs, whose edges hash by their many neighbours, are cut.
One vectorised pass over the edges in chunks; both directions of an edge pick the same endpoint."""

import numpy as np

from graphs.kernels.coarsen import row_chunks
from graphs.stages.partition import random_assign
from graphs.stages.vertex_cut import EdgePartitioner, EdgePartitionerTraits, register_edge_partitioner


@register_edge_partitioner
class DegreeBasedHashing(EdgePartitioner):
    name = "dbh"
    traits = EdgePartitionerTraits(full_degrees=True)

    @classmethod
    def assign(cls, indptr, indices, k, degree, seed, symmetric):
        n = len(indptr) - 1
        node_part = random_assign(n, k, seed)
        part = np.empty(len(indices), dtype=np.int32)
        for r0, r1 in row_chunks(indptr, 1 << 22):
            e0, e1 = int(indptr[r0]), int(indptr[r1])
            src = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(indptr[r0 : r1 + 1]))
            dst = np.asarray(indices[e0:e1], dtype=np.int64)
            ds, dd = degree[src], degree[dst]
            src_side = (ds < dd) | ((ds == dd) & (src < dst))
            part[e0:e1] = node_part[np.where(src_side, src, dst)]
        return part
