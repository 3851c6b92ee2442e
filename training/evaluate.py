"""Full-graph evaluation: layer-wise inference over the normalized adjacency, no sampling.

Validation and test accuracy (`training.metrics.accuracy`; the final predictions) come from running the model
over the whole graph layer by layer (`training.layers.GNN.inference` and
``inference_with_embeddings``, as DGL's GraphSAGE examples' ``inference``): layer
``l`` is computed for every node from layer ``l - 1``'s output of every node, over the
full normalized adjacency Â (self loops included, weights used by GCN layers). That is
exact (no sampling noise) and costs one pass over the edges per layer. With
``batch_size`` each layer runs over chunks of destination nodes
(`training.blocks.slice_dst`), bounding the memory of one chunk on the device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from training import metrics
from training.blocks import Block, block_from_csr

__all__ = ["EvalGraph", "accuracies", "load_full_block"]


def load_full_block(adjacency_dir: str | os.PathLike) -> Block:
    """The normalized adjacency CSR (indptr/indices/weights .npy) as a full-graph Block.

    Â is symmetric for the default ``degree_norm="both"`` on a symmetrized graph, so its CSR is
    also the CSC over destinations that Block expects.
    """
    from graphs.normalize import load_csr

    return block_from_csr(*load_csr(adjacency_dir, mmap=False))


@dataclass
class EvalGraph:
    """What rank 0 keeps for evaluation: the full block, preprocessed features, labels."""

    block: Block
    x: torch.Tensor
    labels: torch.Tensor
    masks: dict[str, torch.Tensor]
    _on: dict = field(default_factory=dict, repr=False)

    def on(self, device: torch.device) -> tuple[Block, torch.Tensor]:
        """(block, x) on ``device``, moved once and kept (the block's cached structure too)."""
        key = str(device)
        if key not in self._on:
            self._on[key] = (self.block.to(device), self.x.to(device))
        return self._on[key]


@torch.no_grad()
def accuracies(logits: torch.Tensor, labels: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, float]:
    """``{split}_acc`` for every split mask (NaN for an empty split)."""
    pred = logits.argmax(1).cpu()
    labels = labels.cpu()
    out = {}
    for name, mask in masks.items():
        m = mask.cpu()
        out[f"{name}_acc"] = metrics.accuracy(labels[m].numpy(), pred[m].numpy())
    return out
