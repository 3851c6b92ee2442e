"""placement: partition: rank r takes its seeds first from the METIS parts assigned to it (parts go
to ranks balancing training nodes, `graphs.sampling.placement.ranks_of_parts`), only the surplus over
an equal share moving to other ranks, so step counts and batch sizes are those of random."""

import numpy as np

from graphs.sampling.placement import Placement, PlacementTraits, ranks_of_parts, register_placement


@register_placement
class PartitionPlacement(Placement):
    name = "partition"
    traits = PlacementTraits(needs_parts=True, places_seeds=True)

    @classmethod
    def owners(cls, inputs, cfg):
        if inputs.part_id is None:
            raise ValueError("placement='partition' needs part_id.npy from metis_partitions")
        part_id = np.asarray(inputs.part_id, dtype=np.int64)
        rank_of_part = ranks_of_parts(part_id, inputs.train_nodes, cfg.world_size)  # refuses fewer parts than ranks
        return rank_of_part, rank_of_part[part_id]
