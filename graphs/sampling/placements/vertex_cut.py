"""placement: vertex_cut: the ranks share metis_partitions' vertex cut (``vertex_cut`` set there):
the edge parts go to ranks balancing the training nodes of their masters, rank r takes its seeds
first from the nodes mastered by its parts (the surplus over an equal share moving to other
ranks, as 'partition' does), samples only from the edges of its parts, and holds the feature rows
of every node those edges touch (the replicas), so a row is remote only for a seed moved to a rank
holding none of its edges."""

import numpy as np

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.partition_files import load_edge_parts, load_masters
from graphs.sampling.placement import OwnEdges, Placement, PlacementTraits, ranks_of_parts, register_placement


def _partitions_dir(inputs):
    if inputs.partitions_dir is None:
        raise ValueError("placement='vertex_cut' needs metis_partitions materialized with vertex_cut set")
    return inputs.partitions_dir


@register_placement
class VertexCutPlacement(Placement):
    name = "vertex_cut"
    traits = PlacementTraits(needs_parts=True, places_seeds=True, own_edges=True)

    @classmethod
    def owners(cls, inputs, cfg):
        master = np.asarray(load_masters(_partitions_dir(inputs), inputs.n), dtype=np.int64)
        rank_of_part = ranks_of_parts(master, inputs.train_nodes, cfg.world_size)  # refuses fewer parts than ranks
        return rank_of_part, rank_of_part[master]

    @classmethod
    def own_edges(cls, inputs, cfg, rank_of_part, adj):
        # every placement module is imported at the first lookup of any (`graphs.sampling.placement`):
        # imported here, numba's kernels (~0.2 s to load) stay out of stages that place seeds another way
        from graphs.stages.vertex_cut import holders_of, popcounts  # lazy: numba, only for this placement

        m = CanonicalGraph.open(inputs.canonical_dir).num_edges
        if adj.num_edges != m:
            raise ValueError(f"Â has {adj.num_edges} off-diagonal entries and the canonical graph {m} edges")
        rank_of_edge = rank_of_part.astype(np.int16)[load_edge_parts(_partitions_dir(inputs), m)]
        master = np.asarray(load_masters(inputs.partitions_dir, inputs.n), dtype=np.int64)
        holders = holders_of(adj.indptr, adj.indices, rank_of_edge)
        holders |= np.uint64(1) << rank_of_part[master].astype(np.uint64)
        held = [int(np.count_nonzero(holders & (np.uint64(1) << np.uint64(r)))) for r in range(cfg.world_size)]
        facts = {
            "rows_held_per_rank": held,
            "replication_factor": round(float(popcounts(holders).sum() / max(inputs.n, 1)), 4),
            "edges_per_rank": np.bincount(rank_of_edge, minlength=cfg.world_size).tolist(),
        }
        return OwnEdges(rank_of_edge, holders, facts)
