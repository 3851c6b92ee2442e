"""Historical compensation for small fanouts: a gradient moving average and VR-GCN.

Two independent options (``training.compensation``, :class:`CompensationConfig`), both
off by default; ``benchmarks/techniques_compensation.py`` measures them at fanouts (2, 2).

**Gradient moving average** (``grad_ema``: the η below, 0 = off). :class:`GradientEMA`
wraps the optimizer and, just before each of its steps, replaces every parameter's
gradient by

    g̃_t = η·g_t + (1 − η)·g̃_{t−1},        g̃_0 = g_0,

the step's gradient g_t averaged with the ones before it. This is not a new idea with a
new name: it is *momentum with dampening*. For SGD without momentum it is exactly
``torch.optim.SGD(momentum=1−η, dampening=1−η)`` (same first step, same recursion;
``tests/test_compensation.py`` checks this). Under Adam/AdamW it is a second moving
average in front of Adam's own: Adam's first moment m_t = β1·m_{t−1} + (1−β1)·g̃_t then
averages over a window of roughly 1/(1−β1) + (1−η)/η steps, and its second moment sees
g̃², which has less variance than g², so its denominator shrinks and the effective step
of a noisy coordinate grows a little. Weight decay is not part of g̃ under AdamW (it is
applied decoupled, to the weights); under Adam/SGD it enters through g as L2. η = 1 is the
identity. It runs once per *optimizer* step, after gradient accumulation and after DDP's
all-reduce, so every rank holds the same g̃ (the averaged gradient is the same on every
rank); with fp16 loss scaling `GradScaler.step` unscales the gradients before calling it
and skips it (and so the average's update) on overflow steps. Its buffers are part of the
optimizer's ``state_dict``, so checkpoints resume it exactly.

**VR-GCN** (``vrgcn``: Chen, Zhu & Song, "Stochastic Training of Graph Convolutional
Networks with Variance Reduction", ICML 2018). Every training rank keeps, per layer, the
last value h̄_u of each node's aggregated input (the message rows that layer sums: its
input, or the input times the layer's neighbour weight where the layer multiplies first;
both are linear, so the estimator below is unchanged), computed *without* dropout. A layer's
aggregation over a sampled block (of its input h after dropout) then becomes

    Σ_{u ∈ sample(v)} α̂_vu (h_u − h̄_u)  +  Σ_{u ∈ N(v)} α_vu h̄_u,

the sampled (corrected, `training.layer_registry.LayerKind.edge_weight`) aggregation of the
*difference* to the history plus the exact aggregation of the histories over the full
neighbourhood read from Â (``normalized_adjacency``, the graph the model is evaluated on).
It is an unbiased estimate of the full aggregation for any h̄, and equal to it when the
histories are exact (h̄ = h), which is what makes small fanouts approach full-neighbourhood
accuracy: the sample only has to estimate the small change since a node was last seen.
After the step each sampled source's history is set to its current value. Histories start
at zero (the plain sampled estimator) and are per rank and not checkpointed (a resumed run
rebuilds them). Memory: n × (width aggregated) floats per layer on the training device.
It applies to the layers whose declared aggregation is ``linear`` (`training.layer_registry`):
``sage`` (mean), ``gcn`` over Â's weights, and ``gin`` (sum); ``gat`` and ``sage_pool``
(softmax, max) are refused.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from graphs.infra.config_checks import bounded_repr, check_fields
from graphs.stages.normalize import load_csr
from training.aggregate import aggregate
from training.blocks import Block
from training.layer_registry import layer_kind

__all__ = ["CompensationConfig", "GradientEMA", "VRGCN", "check_vrgcn_supports", "full_rows_block"]


@dataclass(kw_only=True)
class CompensationConfig:
    """Historical compensation for high-variance (small-fanout) sampling; both off by default."""

    grad_ema: float = field(
        default=0.0,
        metadata={
            "help": "η of the gradient moving average g̃_t = η·g_t + (1−η)·g̃_{t−1} applied before each "
            "optimizer step (momentum with dampening; see training.compensation); 0 = off, the brief's "
            "range is 0.7-0.9, 1 = the identity"
        },
    )
    vrgcn: bool = field(
        default=False,
        metadata={
            "help": "VR-GCN: per-node, per-layer historical activations as a control variate of each sampled "
            "aggregation (sage/gcn/gin), the full-neighbourhood aggregation of the histories read from Â"
        },
    )

    def __post_init__(self) -> None:
        check_fields(self, "training.compensation")
        if not 0.0 <= self.grad_ema <= 1.0:
            raise ValueError(
                f"training.compensation.grad_ema={bounded_repr(self.grad_ema)}: must be in [0, 1] (0 = off)"
            )


# ----------------------------------------------------------------------------- gradient EMA


class GradientEMA:
    """An optimizer whose gradients are first replaced by their moving average (see module docstring).

    Wraps ``optimizer`` and forwards ``param_groups``, ``state``, ``zero_grad`` and
    ``step`` to it, so `GradScaler`, learning-rate setting and clipping treat it as the
    optimizer. ``state_dict`` holds the inner optimizer's state and the averages.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, eta: float):
        if not 0.0 < eta <= 1.0:
            raise ValueError(f"GradientEMA eta={eta!r}: must be in (0, 1]")
        self.optimizer, self.eta = optimizer, float(eta)
        self.averages: dict[int, torch.Tensor] = {}  # index of the parameter in param_groups order

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    @torch.no_grad()
    def average_gradients(self) -> None:
        """Replace each gradient g by g̃ = η·g + (1−η)·g̃_prev (g̃ = g the first time)."""
        for i, p in enumerate(self._params()):
            if p.grad is None:
                continue
            avg = self.averages.get(i)
            if avg is None:
                self.averages[i] = p.grad.detach().clone()
            else:
                avg.mul_(1.0 - self.eta).add_(p.grad, alpha=self.eta)
                p.grad.copy_(avg)

    def step(self, closure=None):
        self.average_gradients()
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "grad_ema": {"eta": self.eta, "averages": {str(i): a for i, a in self.averages.items()}},
        }

    def load_state_dict(self, state: dict) -> None:
        if "grad_ema" not in state:
            raise ValueError(
                "the checkpoint's optimizer state has no gradient averages (it was written with "
                "training.compensation.grad_ema off); start a new run or turn it off"
            )
        self.optimizer.load_state_dict(state["optimizer"])
        params = self._params()
        self.averages = {
            int(i): a.to(params[int(i)].device, params[int(i)].dtype) for i, a in state["grad_ema"]["averages"].items()
        }


# ----------------------------------------------------------------------------- VR-GCN


def check_vrgcn_supports(model_cfg) -> None:
    """Refuse a model VR-GCN cannot serve (``model_cfg``: `training.layers.ModelConfig`)."""
    problem = layer_kind(model_cfg.conv).compensation_problem(model_cfg)
    if problem is not None:
        raise ValueError(f"training.compensation.vrgcn {problem}")
    if model_cfg.activation_checkpointing:
        raise ValueError(
            "training.compensation.vrgcn and model.activation_checkpointing cannot be combined: the recomputed "
            "forward would read histories the first pass already updated"
        )


def full_rows_block(indptr: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor) -> Block:
    """The full in-neighbourhoods of ``rows`` (global ids) in the CSR ``(indptr, indices, weights)``
    as a Block whose sources are *global* ids (``num_src`` = n): destination i's edges are
    row ``rows[i]``'s entries. Vectorised: no loop over rows."""
    n = indptr.numel() - 1
    starts, ends = indptr[rows], indptr[rows + 1]
    counts = ends - starts
    out_indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=rows.device)
    out_indptr[1:] = torch.cumsum(counts, 0)
    total = int(out_indptr[-1])
    # position of every output edge inside its row, plus the row's start in the CSR
    offsets = torch.arange(total, device=rows.device) - torch.repeat_interleave(
        out_indptr[:-1], counts, output_size=total
    )
    pos = torch.repeat_interleave(starts, counts, output_size=total) + offsets
    return Block(out_indptr, indices[pos], n, rows.numel(), edge_weight=weights[pos])


class VRGCN:
    """Per-layer node histories and the control-variate aggregation (see module docstring).

    ``adjacency``: (indptr int64 [n+1], indices int64 [nnz], weights float32 [nnz]) of Â on
    the training device. Use :meth:`attach` around a training forward pass.
    """

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor):
        self.indptr, self.indices, self.weights = indptr, indices, weights
        self.n = indptr.numel() - 1
        self.histories: dict[int, torch.Tensor] = {}

    @classmethod
    def from_adjacency(cls, adjacency: Path, device: torch.device) -> "VRGCN":
        csr = load_csr(adjacency)
        t = [
            torch.from_numpy(np.array(a)) for a in (csr.indptr, csr.indices, csr.weights)
        ]  # a copy: Â moves to the device
        return cls(t[0].long().to(device), t[1].long().to(device), t[2].float().to(device))

    def history(self, layer: int, width: int, like: torch.Tensor) -> torch.Tensor:
        h = self.histories.get(layer)
        if h is None or h.shape[1] != width:
            h = self.histories[layer] = torch.zeros(self.n, width, dtype=torch.float32, device=like.device)
        return h

    @contextlib.contextmanager
    def attach(self, model, blocks: list[Block], input_nodes: torch.Tensor):
        """Within the block, each of ``model``'s layers aggregates with the control variate
        over ``blocks`` (block l's sources are ``input_nodes[:num_src]``, as in DGL's
        message-flow graphs); the histories of the sampled sources are updated as they are used."""
        convs = list(model.convs)
        if len(convs) != len(blocks):
            raise ValueError(f"VR-GCN: {len(blocks)} blocks for a {len(convs)}-layer model")
        for layer, (conv, block) in enumerate(zip(convs, blocks)):
            conv.control_variate = _LayerVariate(self, layer, block, input_nodes, model)
        try:
            yield
        finally:
            for conv in convs:
                conv.control_variate = None


class _LayerVariate:
    """One layer's control variate: called by the layer in place of `training.aggregate.aggregate`."""

    def __init__(self, vr: VRGCN, layer: int, block: Block, input_nodes: torch.Tensor, model):
        self.vr, self.layer, self.model = vr, layer, model
        self.src = input_nodes[: block.num_src].to(vr.indptr.device)
        self.sampled = block
        # the layer's input before dropout (set by `GNN.layer`); None: x is what the history keeps
        self.undropped: torch.Tensor | None = None

    def __call__(
        self, block: Block, x: torch.Tensor, reduce: str, edge_weight, backend: str, transform=None
    ) -> torch.Tensor:
        if block is not self.sampled:  # e.g. DropEdge's copy: same sources, fewer edges
            if block.num_src != self.sampled.num_src or block.num_dst != self.sampled.num_dst:
                raise ValueError("VR-GCN: the layer aggregated over a block that is not its sampled one")
        # The history keeps the rows without dropout (E[dropout(h)] = h, so the estimate stays
        # unbiased, and x - x_bar carries the change since the last visit, not a dropout mask).
        with torch.no_grad():
            if self.undropped is None:
                current = x.detach()
            else:
                current = transform(self.undropped) if transform is not None else self.undropped
        hist = self.vr.history(self.layer, x.shape[1] if x.dim() > 1 else 1, x)
        x_bar = hist[self.src].to(x.dtype)
        sampled = aggregate(block, x - x_bar, reduce=reduce, edge_weight=edge_weight, backend=backend)
        full = full_rows_block(self.vr.indptr, self.vr.indices, self.vr.weights, self.src[: block.num_dst])
        w_full = self.model.kind.edge_weight(full, self.model.options)
        exact = aggregate(full, hist, reduce=reduce, edge_weight=w_full, backend="torch")
        with torch.no_grad():
            hist[self.src] = current.float()
        return sampled + exact.to(sampled.dtype)
