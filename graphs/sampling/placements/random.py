"""placement: random (the default): a permutation of the training nodes cut into W equal parts,
one per rank; the METIS parts, when given, only measure the remote feature rows."""

from graphs.sampling.placement import Placement, PlacementTraits, register_placement


@register_placement
class RandomPlacement(Placement):
    name = "random"
    traits = PlacementTraits(needs_parts=False, places_seeds=False)
