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
the feature matrix in memory: it first writes the transformed input features once, in row
chunks, to ``input.npy`` (FP32 rows, or INT8 rows decoded, then the run's feature transform);
then for each layer and each chunk of ``chunk_rows`` destination rows it reads that row block
of Â (indptr/indices/weights), gathers the previous layer's rows of the chunk's sources into
one reused buffer, runs the layer on the device and writes the chunk's output into
``layer{l}.npy`` with ``os.pwrite``. Every read of a memory-mapped file drops its pages from
the process's RSS after it (`graphs.formats.npyrows`), so rank 0's peak RSS is bounded by one chunk
(its rows, their neighbours' rows, its edges) plus one 64 MB window of file pages, not by the
files' sizes. Device memory is bounded by one chunk.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from graphs.formats.npyrows import NpyRowWriter, read_rows, release, take_rows
from graphs.stages.normalize import Adjacency, load_csr, load_relational_csr
from training import metrics
from training.blocks import Block, block_from_csr, remove_self_loops
from training.typed_blocks import TypedBlock

__all__ = ["EvalGraph", "StreamingEval", "accuracies", "load_full_block", "row_block"]


def load_full_block(adjacency_dir: str | os.PathLike) -> Block | TypedBlock:
    """The graph a dataset's models run over, as one full-graph block: the normalized adjacency
    CSR (indptr/indices/weights .npy) as a Block, or, for a typed graph, its relational Â (rows
    are destinations) as a TypedBlock over every node.

    Â is symmetric for the default ``degree_norm="both"`` on a symmetrized graph, so its CSR is
    also the CSC over destinations that Block expects.
    """
    typed = Adjacency.open(adjacency_dir).typed_schema
    if typed is None:
        return block_from_csr(*load_csr(adjacency_dir, mmap=False))
    rel = load_relational_csr(adjacency_dir, mmap=False)
    block = block_from_csr(rel.indptr, rel.indices, rel.weights)
    nodes = torch.arange(rel.n, dtype=torch.int64)
    types = torch.from_numpy(typed.node_types_of(nodes.numpy()))
    return TypedBlock(block, torch.from_numpy(rel.etypes.astype(np.int64)), types, typed.schema, nodes)


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
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray | None,
    start: int,
    stop: int,
    scratch: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[Block, np.ndarray]:
    """Rows ``start:stop`` of a CSR (memory-mapped arrays are read only there) as a Block.

    Returns ``(block, src_ids)`` like `training.blocks.slice_dst`: the destinations are
    ``start..stop-1`` (the first sources), then the other neighbours in ascending order.
    Vectorised in O(n / chunk + edges of the rows): neighbours are marked in a boolean array
    of n entries and numbered through an int64 array of n entries (no sort, no search).
    ``scratch`` = (bool [n] all False, int64 [n]) reuses them across calls (the mark array is
    left all False again); None allocates them. The memory-mapped rows' pages are dropped
    after they are read (`graphs.formats.npyrows.read_rows`).
    """
    n = len(indptr) - 1
    mark, pos = scratch if scratch is not None else (np.zeros(n, dtype=bool), np.empty(n, dtype=np.int64))
    ptr = read_rows(indptr, start, stop + 1).astype(np.int64, copy=False)
    lo, hi = int(ptr[0]), int(ptr[-1])
    nbr = read_rows(indices, lo, hi).astype(np.int64, copy=False)
    mark[nbr] = True
    mark[start:stop] = False
    extra = np.flatnonzero(mark)
    mark[extra] = False
    m = stop - start
    pos[start:stop] = np.arange(m)
    pos[extra] = np.arange(m, m + len(extra))
    local = pos[nbr]
    src_ids = np.concatenate([np.arange(start, stop, dtype=np.int64), extra])
    w = None if weights is None else torch.from_numpy(read_rows(weights, lo, hi).astype(np.float32, copy=False))
    return Block(torch.from_numpy(ptr - lo), torch.from_numpy(local), len(src_ids), m, w), src_ids


class StreamingEval:
    """Layer-wise full-graph inference in row chunks from memory-mapped files (module docstring).

    ``rows(ids) -> float32 tensor`` gives the (transformed) input features of nodes ``ids``
    (called with ascending row ranges only); they are written once to ``work_dir/input.npy``
    and each layer's output to ``work_dir/layer{l}.npy``. ``threads`` > 0 sets torch's
    intra-op threads for the duration of `forward` (the previous count is restored after):
    rank 0 may use every core while the other ranks wait for it. ``self_loops`` False drops Â's
    diagonal from every chunk (a model trained on shards without self loops).
    """

    def __init__(self, adjacency_dir, rows, chunk_rows: int, work_dir, device, threads: int = 0, self_loops=True):
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
        self.rows, self.chunk_rows, self.threads = rows, chunk_rows, threads
        self.self_loops = bool(self_loops)
        self.work_dir, self.device = Path(work_dir), torch.device(device)
        self.files: dict[str, Path] = {}

    @torch.no_grad()
    def forward(self, model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """(embeddings, logits) of every node, as tensors over memory-mapped files
        (``self.files["embeddings"]`` and ``self.files["logits"]``)."""
        was_training, threads = model.training, torch.get_num_threads()
        model.eval()
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            # the transformed input once (not once per chunk that reads a row: a chunk's neighbours
            # are ~n/3 rows of a power-law graph at 50 chunks), then one file per layer
            files = [self._write_input(self.work_dir / "input.npy")]
            for layer in range(model.num_layers):
                files.append(self._write_layer(model, layer, files[-1], self.work_dir / f"layer{layer}.npy"))
                if layer == 0 and model.num_layers > 1:
                    files[0].unlink()  # no longer needed: free its disk space
            self.files = {"embeddings": files[-2], "logits": files[-1]}
            emb, logits = (np.load(files[i], mmap_mode="r+", allow_pickle=False) for i in (-2, -1))
            return torch.from_numpy(emb), torch.from_numpy(logits)
        finally:
            torch.set_num_threads(threads)
            model.train(was_training)

    def save_embeddings(self, path: str | os.PathLike) -> None:
        """Move the last `forward`'s embeddings file to ``path`` (copied across file systems)."""
        shutil.move(self.files.pop("embeddings"), path)

    def _chunks(self):
        for start in range(0, self.n, self.chunk_rows):
            yield start, min(start + self.chunk_rows, self.n)

    def _write_input(self, path: Path) -> Path:
        writer = None
        try:
            for start, stop in self._chunks():
                x = self.rows(np.arange(start, stop, dtype=np.int64)).float().cpu().numpy()
                writer = writer or NpyRowWriter(path, np.float32, (self.n, *x.shape[1:]))
                writer.write(start, x)
        finally:
            if writer is not None:
                writer.close()
        return path

    def _write_layer(self, model: nn.Module, layer: int, source: Path, path: Path) -> Path:
        """Layer ``layer`` of every node from ``source`` (the previous layer's rows) into ``path``."""
        indptr, indices, weights = self.arrays
        prev = np.load(source, mmap_mode="r", allow_pickle=False)
        scratch = (np.zeros(self.n, dtype=bool), np.empty(self.n, dtype=np.int64))
        buf, writer = None, None
        try:
            for start, stop in self._chunks():
                block, src_ids = row_block(indptr, indices, weights, start, stop, scratch)
                if not self.self_loops:  # the model was trained on blocks without Â's diagonal
                    block = remove_self_loops(block)
                if buf is None or len(buf) < len(src_ids):  # one gather buffer, grown as needed
                    buf = np.empty((len(src_ids) + len(src_ids) // 4, *prev.shape[1:]), dtype=prev.dtype)
                h = take_rows(prev, src_ids, out=buf[: len(src_ids)])
                y = model.layer(layer, block.to(self.device), torch.from_numpy(h).to(self.device))
                y = y.float().cpu().numpy()
                writer = writer or NpyRowWriter(path, np.float32, (self.n, *y.shape[1:]))
                writer.write(start, y)
        finally:
            if writer is not None:
                writer.close()
            release(prev)
        return path


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
