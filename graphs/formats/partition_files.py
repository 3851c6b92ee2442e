"""The metis_partitions folder as a typed artifact: its file names, format version and summary.

The format (dtypes, shapes, what each file holds) is documented where it is written,
`graphs.stages.partition`; this module is the one place its file names live, shared by that writer
and by every reader (compressed_graph, the samplers, the assets and the benchmarks).
"""

from __future__ import annotations

import os

import numpy as np

from graphs.formats.stage_artifact import StageArtifact

__all__ = ["Partitions", "load_edge_parts", "load_masters", "load_parts"]


class Partitions(StageArtifact):
    """A metis_partitions folder (`graphs.stages.partition` documents the files)."""

    STAGE = "metis_partitions"
    FORMAT_VERSION = 1
    PART_ID = "part_id.npy"
    CLUSTER_ID = "cluster_id.npy"
    CORE_NODES = "core_nodes.npy"  # in part-{p}/, see `part_file`
    HALO_NODES = "halo_nodes.npy"  # in part-{p}/
    DISTDGL = "distdgl"
    ORIG_NIDS = "distdgl/orig_nids.npy"
    SIZES_PLOT = "partition_sizes.png"
    EDGE_PART = "vertex_cut/edge_part.npy"  # with a vertex cut: int32 [m], the part of every canonical edge
    MASTER = "vertex_cut/master.npy"  # int32 [n], every vertex's master part

    @staticmethod
    def part_file(p: int, name: str) -> str:
        """The path, relative to the folder, of part `p`'s file `name` (CORE_NODES, HALO_NODES)."""
        return f"part-{p}/{name}"

    @property
    def num_parts(self) -> int:
        return int(self.summary["num_parts"])


def load_parts(partitions_dir: str | os.PathLike) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """(part_id, core node lists, halo node lists) as written by `graphs.stages.partition.build_partitions`,
    each file checked against the folder's hashes.json first (`graphs.infra.storage.verified`)."""
    parts = Partitions.open(partitions_dir, verify=True)
    part = np.load(parts.verified(parts.PART_ID), allow_pickle=False)
    k = parts.num_parts
    cores = [np.load(parts.verified(parts.part_file(p, parts.CORE_NODES)), allow_pickle=False) for p in range(k)]
    halos = [np.load(parts.verified(parts.part_file(p, parts.HALO_NODES)), allow_pickle=False) for p in range(k)]
    return part, cores, halos


def _vertex_cut_file(partitions_dir: str | os.PathLike, name: str, length: int, per: str) -> np.ndarray:
    parts = Partitions.open(partitions_dir, verify=True)
    if not parts.has(name):
        raise ValueError(
            f"{parts.path(name)}: missing; materialize metis_partitions with vertex_cut set (e.g. 'hdrf') "
            "for placement 'vertex_cut'"
        )
    values = np.load(parts.verified(name), allow_pickle=False)
    if len(values) != length:
        raise ValueError(f"{parts.path(name)}: {len(values)} entries, expected one per {per} ({length})")
    return values


def load_masters(partitions_dir: str | os.PathLike, n: int) -> np.ndarray:
    """int32 [n]: every node's master part in the folder's vertex cut (checked against hashes.json
    and the graph's `n` nodes; a ValueError naming the file and the setting that writes it when
    the folder has no vertex cut)."""
    return _vertex_cut_file(partitions_dir, Partitions.MASTER, n, "node")


def load_edge_parts(partitions_dir: str | os.PathLike, m: int) -> np.ndarray:
    """int32 [m]: the part of every canonical edge in the folder's vertex cut (checked as `load_masters`)."""
    return _vertex_cut_file(partitions_dir, Partitions.EDGE_PART, m, "edge")
