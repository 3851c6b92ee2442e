"""Full-graph evaluation: layer-wise inference over the normalized adjacency, no sampling.

Validation and test accuracy (and the final predictions) come from running the model
over the whole graph layer by layer (DGL's GraphSAGE examples' ``inference``): layer
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
from torch import nn

from training.blocks import Block, block_from_csr, slice_dst

__all__ = ["EvalGraph", "accuracies", "full_graph_forward", "load_full_block"]


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
def full_graph_forward(
    model: nn.Module,
    block: Block,
    x: torch.Tensor,
    batch_size: int = 0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(embeddings, logits) of every node, layer by layer, in eval mode.

    ``model`` is a :class:`training.layers.GNN` (its ``layer(i, block, h)``). The
    embeddings are the input of the last layer (the last hidden representation; the
    input features for a one-layer model). With ``batch_size > 0`` each layer runs in
    destination chunks of that size on ``device`` and is gathered on ``x``'s device.
    """
    was_training = model.training
    model.eval()
    try:
        n = block.num_dst
        device = torch.device(device) if device is not None else x.device
        h = x
        emb = x
        if batch_size <= 0 or batch_size >= n:
            blk = block.to(device)
            h = h.to(device)
            for layer in range(model.num_layers):
                emb = h
                h = model.layer(layer, blk, h)
            return emb.to(x.device).float(), h.to(x.device).float()
        chunks = [slice_dst(block, s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
        for layer in range(model.num_layers):
            emb = h
            h = torch.cat([model.layer(layer, sub.to(device), h[src].to(device)).to(x.device) for sub, src in chunks])
        return emb.float(), h.float()
    finally:
        model.train(was_training)


def accuracies(logits: torch.Tensor, labels: torch.Tensor, masks: dict[str, torch.Tensor]) -> dict[str, float]:
    """``{split}_acc`` for every split mask (NaN for an empty split)."""
    pred = logits.argmax(1).cpu()
    labels = labels.cpu()
    out = {}
    for name, mask in masks.items():
        m = mask.cpu()
        total = int(m.sum())
        out[f"{name}_acc"] = float((pred[m] == labels[m]).sum()) / total if total else float("nan")
    return out
