"""Full-graph evaluation: layer-wise inference over the normalized adjacency, no sampling.

Validation and test accuracy (`training.metrics.accuracy`; the final predictions) come from running the model
over the whole graph layer by layer (`training.layers.GNN.inference` and
``inference_with_embeddings``, as DGL's GraphSAGE examples' ``inference``): layer
``l`` is computed for every node from layer ``l - 1``'s output of every node, over the
full normalized adjacency Â (self loops included, weights used by GCN layers). That is
exact (no sampling noise) and costs one pass over the edges per layer. With
``batch_size`` each layer runs over chunks of destination nodes
(`training.blocks.slice_dst`), bounding the memory of one chunk on the device.

:class:`StreamingEval` (used when ``training.eval_batch_size`` is set) never holds Â or
the feature matrix in memory: for each layer and each chunk of ``chunk_rows`` destination
rows it reads that row block of Â (indptr/indices/weights, memory-mapped), the feature
rows of the chunk's sources (memory-mapped FP32, or INT8 rows decoded per chunk, then the
run's feature transform) or the previous layer's rows, runs the layer on the device and
writes the chunk's output into that layer's memory-mapped ``.npy`` file. Device memory is
bounded by one chunk (its rows, their neighbours' rows, its edges), host memory by the
page cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from training import metrics
from training.blocks import Block, block_from_csr

__all__ = ["EvalGraph", "StreamingEval", "accuracies", "load_full_block", "row_block"]


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


def row_block(
    indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray | None, start: int, stop: int
) -> tuple[Block, np.ndarray]:
    """Rows ``start:stop`` of a CSR (memory-mapped arrays are read only there) as a Block.

    Returns ``(block, src_ids)`` like `training.blocks.slice_dst`: the destinations are
    ``start..stop-1`` (the first sources), then the other neighbours in ascending order;
    vectorised, and nothing of size n is allocated.
    """
    lo, hi = int(indptr[start]), int(indptr[stop])
    nbr = np.asarray(indices[lo:hi], dtype=np.int64)
    uniq = np.unique(nbr)
    extra = uniq[(uniq < start) | (uniq >= stop)]
    inside = (nbr >= start) & (nbr < stop)
    local = np.where(inside, nbr - start, (stop - start) + np.searchsorted(extra, nbr))
    src_ids = np.concatenate([np.arange(start, stop, dtype=np.int64), extra])
    ptr = torch.from_numpy(np.asarray(indptr[start : stop + 1], dtype=np.int64) - lo)
    w = None if weights is None else torch.from_numpy(np.array(weights[lo:hi], dtype=np.float32))
    return Block(ptr, torch.from_numpy(local), len(src_ids), stop - start, w), src_ids


class StreamingEval:
    """Layer-wise full-graph inference in row chunks from memory-mapped files (module docstring).

    ``rows(ids) -> float32 tensor`` gives the (transformed) input features of nodes ``ids``;
    each layer's output goes to ``work_dir/layer{l}.npy``.
    """

    def __init__(self, adjacency_dir, rows, chunk_rows: int, work_dir, device):
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows={chunk_rows} must be >= 1")
        d = Path(adjacency_dir)
        self.arrays = []
        for name in ("indptr", "indices", "weights"):
            path = d / f"{name}.npy"
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing; materialize normalized_adjacency first")
            self.arrays.append(np.load(path, mmap_mode="r", allow_pickle=False))
        self.n = len(self.arrays[0]) - 1
        self.rows, self.chunk_rows = rows, chunk_rows
        self.work_dir, self.device = Path(work_dir), torch.device(device)

    @torch.no_grad()
    def forward(self, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings, logits) of every node, as tensors over memory-mapped files."""
        was_training = model.training
        model.eval()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        indptr, indices, weights = self.arrays
        try:
            prev = None  # the previous layer's output file (None: the input features)
            outputs = []
            for layer in range(model.num_layers):
                out = None
                for start in range(0, self.n, self.chunk_rows):
                    stop = min(start + self.chunk_rows, self.n)
                    block, src_ids = row_block(indptr, indices, weights, start, stop)
                    h = self.rows(src_ids) if prev is None else torch.from_numpy(np.take(prev, src_ids, axis=0))
                    y = model.layer(layer, block.to(self.device), h.to(self.device)).float().cpu().numpy()
                    if out is None:
                        out = np.lib.format.open_memmap(
                            self.work_dir / f"layer{layer}.npy", mode="w+", dtype=np.float32, shape=(self.n, y.shape[1])
                        )
                    out[start:stop] = y
                out.flush()
                outputs.append(out)
                prev = out
            if model.num_layers > 1:
                emb = outputs[-2]
            else:  # the embeddings of a one-layer model are its (transformed) input features
                emb = None
                for start in range(0, self.n, self.chunk_rows):
                    x = self.rows(np.arange(start, min(start + self.chunk_rows, self.n))).float().numpy()
                    if emb is None:
                        emb = np.lib.format.open_memmap(
                            self.work_dir / "input.npy", mode="w+", dtype=np.float32, shape=(self.n, x.shape[1])
                        )
                    emb[start : start + len(x)] = x
            return torch.from_numpy(np.asarray(emb)), torch.from_numpy(np.asarray(outputs[-1]))
        finally:
            model.train(was_training)


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
