"""Per-node gradient statistics: what training writes and adaptive sampling reads (one owner).

The feedback loop of adaptive neighbour sampling (`graphs.sampling.weighting`): a training run
with ``training.node_grad_stats`` on accumulates, for every node ``v`` that entered a minibatch
as an input node, the L2 norm of the loss gradient with respect to its input features
``‖∂L/∂x_v‖`` (unscaled, summed over every minibatch that read ``v``, and how many did), and
writes them into the trained_model folder; the next minibatch_shards materialization with
``samplers.neighbor.prob: adaptive`` reads them as ``g(v)``, the running mean of that norm.

File (format version 1): ``<trained_model>/node_grad_norm.npz``, an uncompressed ``.npz``
written by `graphs.formats.npzio.write_npz` and read by ``read_npz_file`` (no pickle) holding

- ``format_version`` int64 [1] = `FORMAT_VERSION`
- ``grad_norm_sum`` float64 [n]: Σ ‖∂L/∂x_v‖ over the minibatches that read v (every rank)
- ``count`` int64 [n]: how many minibatches read v

NumPy only: `training` writes it without DGL, `graphs.sampling` reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from graphs.formats.npzio import NpzFormatError, read_npz_file, write_npz

__all__ = ["FORMAT_VERSION", "NODE_SCORES_NAME", "mean_grad_norm", "read_node_scores", "write_node_scores"]

NODE_SCORES_NAME = "node_grad_norm.npz"
FORMAT_VERSION = 1


def write_node_scores(path: str | os.PathLike, grad_norm_sum: np.ndarray, count: np.ndarray) -> None:
    """Write the statistics (arrays of equal length n) to `path` (a file inside a folder
    that is published atomically as a whole, e.g. the trained_model folder)."""
    grad_norm_sum = np.asarray(grad_norm_sum, dtype=np.float64)
    count = np.asarray(count, dtype=np.int64)
    if grad_norm_sum.shape != count.shape or grad_norm_sum.ndim != 1:
        raise ValueError(f"grad_norm_sum {grad_norm_sum.shape} and count {count.shape} must be equal 1-d shapes")
    write_npz(
        path,
        {"format_version": np.array([FORMAT_VERSION], dtype=np.int64), "grad_norm_sum": grad_norm_sum, "count": count},
    )


def read_node_scores(path: str | os.PathLike, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(grad_norm_sum float64 [n], count int64 [n]) from `path`; errors name the file."""
    path = Path(path)
    try:
        arrays = read_npz_file(path)
    except (OSError, NpzFormatError) as exc:
        raise ValueError(f"{path}: not a readable node-score file ({exc})") from exc
    if not {"grad_norm_sum", "count"} <= set(arrays):
        raise ValueError(f"{path}: needs the arrays grad_norm_sum and count, has {sorted(arrays)}")
    version = int(arrays.get("format_version", np.array([-1]))[0])
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{path}: node-score format version {version}, this code reads {FORMAT_VERSION}; "
            "re-materialize trained_model with training.node_grad_stats on"
        )
    total, count = arrays["grad_norm_sum"], arrays["count"]
    if total.shape != (n,) or count.shape != (n,):
        raise ValueError(
            f"{path}: {total.shape[0]} nodes, the graph has {n}; re-materialize trained_model on the current graph "
            "(training.node_grad_stats on) before sampling with samplers.neighbor.prob 'adaptive'"
        )
    if not np.isfinite(total).all() or (total < 0).any() or (count < 0).any():
        raise ValueError(f"{path}: grad_norm_sum must be finite and >= 0, count >= 0")
    return total.astype(np.float64), count.astype(np.int64)


def mean_grad_norm(grad_norm_sum: np.ndarray, count: np.ndarray) -> np.ndarray:
    """g(v) float64 [n]: the mean gradient norm of v over the minibatches that read it; nodes
    never read get the mean over the nodes that were (0 everywhere when none was)."""
    seen = count > 0
    g = np.zeros(len(count), dtype=np.float64)
    g[seen] = grad_norm_sum[seen] / count[seen]
    if seen.any():
        g[~seen] = g[seen].mean()
    return g
