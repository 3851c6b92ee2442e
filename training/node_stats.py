"""Per-node gradient statistics for adaptive sampling (``training.node_grad_stats``).

For every minibatch, the loss gradient with respect to the input features of its input
nodes (``x``, after the feature transform; the rows of ``blocks[0]``'s sources) is taken
in the same backward pass as the parameters' gradient; its L2 norm per row, divided by the
fp16 loss scale and multiplied back by the minibatch count of the step (so it is the norm of
the minibatch loss's own gradient), is added to that node's sum, and its count is raised by
one. At the end every rank's sums are added (all-reduce) and rank 0 writes them with
`graphs.formats.node_scores.write_node_scores` into the trained_model folder, where the next
minibatch_shards materialization with ``samplers.neighbor.prob: adaptive`` reads them. Costs one
extra gradient through the first layer's aggregation per step (only when on).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from graphs.formats.node_scores import NODE_SCORES_NAME, write_node_scores

__all__ = ["NodeGradStats"]


class NodeGradStats:
    """Running sums of ‖∂L/∂x_v‖ and counts per node (float64 / int64 [n], on the CPU)."""

    def __init__(self, n: int):
        self.total = torch.zeros(n, dtype=torch.float64)
        self.count = torch.zeros(n, dtype=torch.int64)

    def watch(self, x: torch.Tensor) -> torch.Tensor:
        """`x` as a leaf that keeps its gradient (call before the forward pass)."""
        return x.detach().requires_grad_(True)

    def record(self, x: torch.Tensor, input_nodes: torch.Tensor, scale: float) -> None:
        """Add ‖x.grad_v‖ / scale for the rows of `x` (after backward), v = `input_nodes`
        (unique global ids of the rows; `x` may hold only the first len(rows) of them)."""
        if x.grad is None:
            return
        norms = x.grad.detach().float().norm(dim=1).double().cpu() / scale
        ids = input_nodes[: norms.numel()].cpu().to(torch.int64)
        self.total.index_add_(0, ids, norms)
        self.count.index_add_(0, ids, torch.ones_like(ids))

    def all_reduce(self, initialized: bool, backend: str | None, device: torch.device) -> None:
        """Sum every rank's statistics into every rank's copy."""
        if not initialized:
            return
        on = device if backend == "nccl" else torch.device("cpu")
        for t in (self.total, self.count):
            buf = t.to(on)
            dist.all_reduce(buf)
            t.copy_(buf.cpu())

    def write(self, folder) -> str:
        """Write the statistics into `folder` (graphs.formats.node_scores format); returns the file name."""
        write_node_scores(folder / NODE_SCORES_NAME, self.total.numpy(), self.count.numpy())
        return NODE_SCORES_NAME
