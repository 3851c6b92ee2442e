"""A typed graph's neighbours drawn relation by relation: `fanout` in-edges of each relation per
destination (DGL's fanout per edge type on a heterograph), instead of `fanout` over all of a
node's in-edges (`samplers.neighbor.per_relation`).

DGL draws per edge type over a graph whose edge ids are grouped by type
(``dgl.sampling.sample_etype_neighbors`` with the types' id offsets): `RelationDraws` builds that
graph over the relational Â once (edge id = rank of the entry in a stable sort by relation, so
``position[edge id]`` is the entry's place in Â), draws layer by layer from the seeds outwards and
turns each frontier into a block (``dgl.to_block``), whose ``dgl.EID`` it sets to the Â positions
of its edges, as the fused sampler's blocks carry them. The sampling correction of an edge of
relation r into v is deg_r(v) / sampled_r(v) (`correction`), the inverse of its inclusion
probability, counted from v's row of Â.
"""

from __future__ import annotations

import numpy as np

from graphs.sampling.base import Adjacency, segment_positions

__all__ = ["RelationDraws"]


class RelationDraws:
    """Per-relation neighbour draws over `adj` (the relational Â) whose entries have relations `etypes`."""

    def __init__(self, adj: Adjacency, etypes: np.ndarray, relations: int):
        import dgl
        import torch

        self.adj, self.etypes, self.relations = adj, np.asarray(etypes), relations
        self.position = np.argsort(self.etypes, kind="stable").astype(np.int64)  # edge id -> Â position
        edge_id = np.empty_like(self.position)
        edge_id[self.position] = np.arange(len(self.position), dtype=np.int64)
        counts = np.bincount(self.etypes, minlength=relations)
        self.offsets = [0, *np.cumsum(counts).tolist()]
        self.graph = dgl.graph(
            (
                "csc",
                (
                    torch.from_numpy(adj.indptr),
                    torch.from_numpy(np.asarray(adj.indices, dtype=np.int64)),
                    torch.from_numpy(edge_id),
                ),
            ),
            num_nodes=adj.n,
        )

    def blocks(self, seeds: np.ndarray, fanouts: list[int]):
        """(input nodes, DGL blocks, input layer first) of `fanouts` draws from `seeds` outwards;
        each block's ``dgl.EID`` holds its edges' positions in Â. Seed DGL first (``dgl.seed``)."""
        import dgl
        import torch

        nodes, blocks = torch.from_numpy(np.asarray(seeds, dtype=np.int64)), []
        for fanout in reversed(fanouts):
            frontier = dgl.sampling.sample_etype_neighbors(
                self.graph,
                nodes,
                self.offsets,
                torch.full((self.relations,), fanout, dtype=torch.int64),
                edge_dir="in",
                copy_ndata=False,
            )
            block = dgl.to_block(frontier, nodes)
            ids = frontier.edata[dgl.EID][block.edata[dgl.EID]].numpy()
            block.edata[dgl.EID] = torch.from_numpy(self.position[ids])
            nodes = block.srcdata[dgl.NID]
            blocks.insert(0, block)
        return nodes, blocks

    def correction(self, indptr: np.ndarray, etype: np.ndarray, dst_global: np.ndarray) -> np.ndarray:
        """float32 per block edge (CSC over the destinations, `etype` each edge's relation):
        deg_r(v) / sampled_r(v) for its destination v and relation r."""
        r = self.relations
        num_dst = len(indptr) - 1
        key = np.repeat(np.arange(num_dst, dtype=np.int64), np.diff(indptr)) * r + etype
        sampled = np.bincount(key, minlength=num_dst * r)
        deg = self.adj.degree[dst_global]
        rows = np.repeat(np.arange(num_dst, dtype=np.int64), deg)
        full_key = rows * r + self.etypes[segment_positions(self.adj.indptr[dst_global], deg)]
        full = np.bincount(full_key, minlength=num_dst * r)
        return (full[key] / np.maximum(sampled[key], 1)).astype(np.float32)
