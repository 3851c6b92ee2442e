"""Neighbour aggregation: the one place that picks a sparse kernel.

``aggregate(block, x, reduce=..., edge_weight=...)`` computes, for every destination node
``v`` of a :class:`~training.blocks.Block`, ``reduce_{u -> v} w_uv * x_u`` with ``reduce``
one of sum / mean / max (``w_uv = 1`` without edge weights). Every GNN layer in
``training.layers`` goes through it, so the kernel choice lives here only:

- ``torch``: torch sparse CSR matmul (``torch.sparse.mm``) for sum and mean, wrapped in an
  autograd function whose backward multiplies by the cached transposed CSR instead of
  letting torch transpose the matrix on every step; ``scatter_reduce(amax)`` for max.
  Runs on every device and torch version.
- ``dgl``: DGL's fused CPU kernels (``dgl.ops.gspmm``), faster than torch sparse on CPU
  (``benchmarks/aggregate.py`` measures both), whose transposed matmul is the slow half of
  a step. DGL is imported lazily the first time it is wanted; it is never required.
- ``auto`` (default): ``dgl`` for CPU tensors when DGL imports, else ``torch``. The PyPI DGL
  wheel is CPU-only, so CUDA tensors always take the torch path.

The backend is the ``backend`` argument (``auto`` when None). The layers of
``training.layers`` pass their ``aggregation`` attribute, set for a whole model with
``training.layers.use_aggregation`` (the ``training.aggregation`` setting).

Precision: aggregation always runs in float32 (or float64 for float64 input). Half and
bfloat16 inputs (e.g. under autocast) are upcast and the result is cast back to the input
dtype: torch 2.2.1 has no bf16 CPU kernel for CSR matmul, and summing hundreds of
neighbours in 16-bit loses precision anyway. Autocast is disabled inside.

Zero-in-degree destination nodes get 0 for every reduce (DGL's convention).
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

import graphs  # noqa: F401  (sets DGLBACKEND before DGL is imported)
from training.blocks import Block, CSRStructure

__all__ = [
    "Aggregating",
    "BACKENDS",
    "aggregate",
    "edge_scores",
    "edge_softmax",
    "per_row",
    "resolve_backend",
    "use_aggregation",
    "weighted_mean_weights",
    "with_dst_rows",
]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "dgl")
REDUCES = ("sum", "mean", "max")

_UNSET = object()
_dgl_module = _UNSET


def _dgl():
    """The dgl module, or None when it cannot be imported (result cached)."""
    global _dgl_module
    if _dgl_module is _UNSET:
        try:
            import dgl
            import dgl.ops  # noqa: F401
        # A broken DGL install raises more than ImportError (e.g. a missing GraphBolt
        # library for an unsupported torch version); either way: fall back to torch.
        except Exception as exc:  # noqa: BLE001
            log.info("DGL not importable (%s); aggregation uses torch sparse kernels", exc)
            _dgl_module = None
        else:
            _dgl_module = dgl
    return _dgl_module


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """``"torch"`` or ``"dgl"``: the kernel ``aggregate`` will use for tensors on ``device``."""
    name = backend or "auto"
    if name not in BACKENDS:
        raise ValueError(f"unknown aggregation backend {name!r}; use one of {BACKENDS}")
    if name == "torch":
        return "torch"
    if name == "dgl":
        if _dgl() is None:
            raise ImportError(
                "aggregation backend 'dgl' was requested but dgl cannot be imported; "
                "install dgl or use the aggregation backend 'auto'"
            )
        return "dgl"
    return "dgl" if device.type == "cpu" and _dgl() is not None else "torch"


def aggregate(
    block: Block,
    x: torch.Tensor,
    *,
    reduce: str = "sum",
    edge_weight: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Reduce source features over each destination node's in-edges.

    Args:
        block: the graph structure (``block.edge_weight`` is *not* applied implicitly).
        x: source-node features ``[num_src, *F]`` (e.g. ``[N, F]`` or ``[N, heads, F]``).
        reduce: ``"sum"``, ``"mean"`` (sum divided by in-degree) or ``"max"``.
        edge_weight: optional per-edge multiplier ``[num_edges, *W]`` broadcastable against
            ``x``'s feature dims once trailing 1s are appended: ``[E]`` scales every feature
            of an edge, ``[E, heads]`` scales each head of ``[N, heads, F]`` features.
            Gradients flow into it.
        backend: ``"auto"`` (also for None), ``"torch"`` or ``"dgl"``.

    Returns:
        ``[num_dst, *F]`` in ``x.dtype``.
    """
    if reduce not in REDUCES:
        raise ValueError(f"unknown reduce {reduce!r}; use one of {REDUCES}")
    if x.shape[0] != block.num_src:
        raise ValueError(f"x has {x.shape[0]} rows but the block has num_src={block.num_src} source nodes")
    kernel = resolve_backend(backend, x.device)
    out_dtype = x.dtype
    compute_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    with _autocast_off(x.device):
        x = x.to(compute_dtype)
        if edge_weight is not None:
            edge_weight = _as_edge_multiplier(edge_weight.to(compute_dtype), x, block)
        if kernel == "dgl":
            out = _aggregate_dgl(block, x, reduce, edge_weight)
        else:
            out = _aggregate_torch(block, x, reduce, edge_weight)
    return out.to(out_dtype)


def edge_scores(block: Block, src: torch.Tensor, dst: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """``src[u] + dst[v]`` for every edge u -> v: ``[num_edges, *F]`` from ``src [num_src, *F]``
    and ``dst [num_dst, *F]`` (an attention layer's two halves of its scores); DGL's fused
    ``u_add_v`` on its backend, two gathers otherwise."""
    if resolve_backend(backend, src.device) == "dgl":
        dtype = torch.promote_types(src.dtype, dst.dtype)
        compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
        with _autocast_off(src.device):
            g = _dgl_graph(block, "w")
            return _dgl().ops.u_add_v(g, src.to(compute).contiguous(), dst.to(compute).contiguous()).to(dtype)
    # index_select, not indexing: its backward is an index_add, not a sorting index_put
    return src.index_select(0, block.indices) + dst.index_select(0, block.dst_ids())


def edge_softmax(block: Block, scores: torch.Tensor, backend: str | None = None) -> torch.Tensor:
    """Softmax of per-edge ``scores [num_edges, *]`` over each destination's in-edges.

    On the DGL backend DGL's kernel (``dgl.ops.edge_softmax``). Otherwise vectorised: a segment
    max (``scatter_reduce``) for stability, then exp and a segment sum (``index_add``).
    Computed in float32; returns ``scores.dtype``.
    """
    out_dtype = scores.dtype
    if resolve_backend(backend, scores.device) == "dgl" and block.num_edges > 0:
        with _autocast_off(scores.device):
            s = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
            return _dgl().ops.edge_softmax(_dgl_graph(block, "w"), s.contiguous()).to(out_dtype)
    s = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    dst = block.dst_ids()
    seg_shape = (block.num_dst, *s.shape[1:])
    index = dst.view(-1, *([1] * (s.dim() - 1))).expand_as(s)
    # The max is only a stabiliser: softmax is invariant to it, so no gradient through it.
    seg_max = s.new_zeros(seg_shape).scatter_reduce(0, index, s.detach(), reduce="amax", include_self=False)
    ex = torch.exp(s - seg_max[dst])
    seg_sum = s.new_zeros(seg_shape).index_add(0, dst, ex)
    return (ex / seg_sum.index_select(0, dst)).to(out_dtype)


def _autocast_off(device: torch.device):
    if device.type in ("cpu", "cuda"):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


def _as_edge_multiplier(w: torch.Tensor, x: torch.Tensor, block: Block) -> torch.Tensor:
    """``w`` reshaped to ``[E, *W, 1, ...]`` with as many dims as ``x``."""
    if w.shape[0] != block.num_edges:
        raise ValueError(f"edge_weight has {w.shape[0]} entries but the block has {block.num_edges} edges")
    if w.dim() > x.dim():
        raise ValueError(f"edge_weight shape {list(w.shape)} has more dims than features {list(x.shape)}")
    w = w.reshape(*w.shape, *([1] * (x.dim() - w.dim())))
    for dw, dx in zip(w.shape[1:], x.shape[1:]):
        if dw not in (1, dx):
            raise ValueError(f"edge_weight shape {list(w.shape)} does not broadcast against features {list(x.shape)}")
    return w.contiguous()


# ---------------------------------------------------------------------------- torch path


class _CSRMatMul(torch.autograd.Function):
    """``A @ x`` for ``A`` = CSR(structure, values); backward uses the cached transpose."""

    @staticmethod
    def forward(ctx, structure: CSRStructure, values: torch.Tensor, x: torch.Tensor):
        ctx.structure = structure
        ctx.save_for_backward(values, x)
        return torch.sparse.mm(structure.matrix(values), x)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        structure: CSRStructure = ctx.structure
        values, x = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_values = grad_x = None
        if ctx.needs_input_grad[1]:
            # d out[v] / d values[e] = x[src(e)], for e = (src -> v)
            grad_values = (grad_out[structure.dst_ids] * x[structure.indices]).sum(-1)
        if ctx.needs_input_grad[2]:
            grad_x = torch.sparse.mm(structure.matrix_t(values), grad_out)
        return None, grad_values, grad_x


def _edge_values(block: Block, reduce: str, dtype: torch.dtype) -> torch.Tensor:
    """Per-edge matrix values without edge weights: 1 (sum) or 1/in_degree (mean); cached."""

    def build():
        if reduce == "sum":
            return torch.ones(block.num_edges, dtype=dtype, device=block.device)
        return _inv_in_degree(block, dtype)[block.dst_ids()]

    return block._cached(("values", reduce, dtype), build)


def _inv_in_degree(block: Block, dtype: torch.dtype) -> torch.Tensor:
    return block._cached(("inv_in_degree", dtype), lambda: 1.0 / block.in_degrees().clamp(min=1).to(dtype))


def _aggregate_torch(block, x, reduce, w):
    if reduce == "max":
        return _max_torch(block, x, w)
    structure = block.structure()
    num_src, feat_shape = x.shape[0], x.shape[1:]
    if w is None:
        values = _edge_values(block, reduce, x.dtype)
        out = _CSRMatMul.apply(structure, values, x.reshape(num_src, -1).contiguous())
        return out.reshape(block.num_dst, *feat_shape)
    if reduce == "mean":
        w = w * _inv_in_degree(block, x.dtype)[block.dst_ids()].view(-1, *([1] * (w.dim() - 1)))
    if all(d == 1 for d in w.shape[1:]):  # one scalar per edge: a single matmul
        out = _CSRMatMul.apply(structure, w.reshape(-1), x.reshape(num_src, -1).contiguous())
        return out.reshape(block.num_dst, *feat_shape)
    if x.dim() == 3 and w.shape[2] == 1:  # one scalar per edge and head: a matmul per head
        heads = [_CSRMatMul.apply(structure, w[:, h, 0].contiguous(), x[:, h].contiguous()) for h in range(x.shape[1])]
        return torch.stack(heads, dim=1)
    raise NotImplementedError(
        f"torch aggregation supports edge weights [E] or [E, heads]; got {list(w.shape)} for features {list(x.shape)}"
    )


def _max_torch(block, x, w):
    msg = x[block.indices]
    if w is not None:
        msg = msg * w
    index = block.dst_ids().view(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
    # include_self=False: rows without in-edges keep the initial 0, as in DGL
    return msg.new_zeros((block.num_dst, *msg.shape[1:])).scatter_reduce(
        0, index, msg, reduce="amax", include_self=False
    )


# ------------------------------------------------------------------------------ DGL path


def _dgl_graph(block: Block, grads: str):
    """The block as a DGL block restricted to the sparse formats its kernels will read.

    ``grads`` names the gradients the caller will want: ``""`` (none: inference, or inputs
    that need none), ``"x"`` (the source features), ``"w"`` (the edge weights too).
    Forward reads CSC, the backward for node features CSR (the transpose's in-edges), and
    the backward for edge weights an SDDMM, which DGL 2.1 runs on COO only once CSC exists.
    The formats a backward will read are built here, once per block: DGL would otherwise
    convert on every backward call (a reversed graph does not keep what it converts). COO is
    built only for edge-weight gradients, and after CSR: DGL builds it from CSC then, where
    asked for all three formats at once it takes a slower path.
    """

    def build():
        dgl = _dgl()
        # Explicit edge ids (= position in the block): DGL's libxsmm CPU kernel for
        # edge-weighted messages needs the id array and fails on the implicit form.
        eids = torch.arange(block.num_edges, device=block.device)
        g = _dgl_block(dgl, block, eids)
        if grads == "":
            return g.formats("csc")
        g = g.formats(["csc", "csr"])
        g.create_formats_()
        if grads == "w":  # COO after CSR, not all three at once (DGL's slower path)
            g = g.formats(["csc", "csr", "coo"])
            g.create_formats_()
        return g

    return block._cached(("dgl_graph", grads), build)


def _dgl_block(dgl, block: Block, eids: torch.Tensor):
    """The DGL block over the CSC (indptr, indices, eids). ``dgl.create_block`` scans the indices for
    their maximum to check them against the sizes given (a tenth of a kernel call on a large block);
    a block's sizes are its own, so one of int64 ids is made from its unit graph directly."""
    if not (block.indptr.dtype == block.indices.dtype == eids.dtype == torch.int64):
        return dgl.create_block(
            ("csc", (block.indptr, block.indices, eids)), num_src_nodes=block.num_src, num_dst_nodes=block.num_dst
        )
    # DGL is optional for training (`_dgl`): imported only once it has loaded
    from dgl.heterograph import DGLBlock
    from dgl.heterograph_index import create_unitgraph_from_csr

    index = create_unitgraph_from_csr(
        2, block.num_src, block.num_dst, block.indptr, block.indices, eids, ["coo", "csr", "csc"], True
    )
    return DGLBlock(index, (["_N"], ["_N"]), ["_E"])


def _aggregate_dgl(block, x, reduce, w):
    dgl = _dgl()
    grads = ""
    if torch.is_grad_enabled():
        grads = "w" if w is not None and w.requires_grad else "x" if x.requires_grad else ""
    g = _dgl_graph(block, grads)
    x = x.contiguous()
    if w is None:
        out = dgl.ops.gspmm(g, "copy_lhs", reduce, x, None)
    else:
        out = dgl.ops.gspmm(g, "mul", reduce, x, w)
    if reduce == "max" and block.num_edges > 0:
        # DGL's kernel leaves -inf on rows without in-edges (update_all zeroes them later).
        no_in = (block.in_degrees() == 0).view(-1, *([1] * (out.dim() - 1)))
        out = torch.where(no_in, torch.zeros((), dtype=out.dtype), out)
    return out


# ----------------------------------------------------------------------------- layers


class _DstRows(torch.autograd.Function):
    """(x, x[:n]); the backward adds the prefix's gradient into the rows' gradient in place."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int):
        ctx.n, ctx.shape = n, x.shape
        ctx.set_materialize_grads(False)
        return x.view_as(x), x[:n]

    @staticmethod
    def backward(ctx, grad_all: torch.Tensor | None, grad_dst: torch.Tensor | None):
        if grad_dst is None:
            return grad_all, None
        if grad_all is None:
            grad_all = grad_dst.new_zeros(ctx.shape)
        grad_all[: ctx.n] += grad_dst  # the consumers' own tensor (with_dst_rows)
        return grad_all, None


def with_dst_rows(x: torch.Tensor, num_dst: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, x[:num_dst])`` for a layer that reads every source row and, apart, its destinations'
    (a block's first ``num_dst`` sources). Autograd would give the slice a zero-filled source-sized
    gradient and add it to the other; here the destinations' gradient is added into the other's
    first rows, in place: the rows' consumers must be kernels whose gradient is a tensor of their
    own (an aggregation, a linear map), not one passing a gradient through (an add)."""
    if not (x.requires_grad and torch.is_grad_enabled()):
        return x, x[:num_dst]
    return _DstRows.apply(x, num_dst)


def per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values [N]`` shaped to broadcast over the rows of ``like [N, ...]``."""
    return values.to(like.dtype).view(-1, *([1] * (like.dim() - 1)))


def weighted_mean_weights(block: Block, edge_weight: torch.Tensor) -> torch.Tensor:
    """Per-edge multipliers that turn a mean (sum / in-degree) into the weighted mean
    ``Σ w x / Σ w`` of each destination: ``w_vu · deg(v) / Σ_u w_vu`` (0 where a row's weights sum to 0)."""
    dst = block.dst_ids()
    w = edge_weight.to(torch.float32 if edge_weight.dtype in (torch.float16, torch.bfloat16) else edge_weight.dtype)
    row_sum = torch.zeros(block.num_dst, dtype=w.dtype, device=w.device).index_add_(0, dst, w)
    scale = torch.where(row_sum > 0, block.in_degrees().to(w.dtype) / row_sum, torch.zeros_like(row_sum))
    return w * scale[dst]


class Aggregating(nn.Module):
    """A layer that aggregates over a block: ``aggregation`` is the `training.aggregate`
    backend its aggregations use ("auto", "torch" or "dgl"; see `use_aggregation`)."""

    aggregation: str = "auto"
    # set for one training forward pass by `training.compensation.VRGCN.attach`: a callable
    # that replaces `aggregate` (VR-GCN's control variate); None = plain aggregation
    control_variate = None

    def aggregate(
        self, block: Block, x: torch.Tensor, reduce: str, edge_weight: torch.Tensor | None, transform=None
    ) -> torch.Tensor:
        """`training.aggregate.aggregate` with this layer's backend (or its control variate, when
        set). ``transform``: the linear map the layer applied to its input to get ``x`` (None: x is
        the input), which the control variate applies to the input without dropout."""
        if self.control_variate is not None:
            return self.control_variate(block, x, reduce, edge_weight, self.aggregation, transform)
        return aggregate(block, x, reduce=reduce, edge_weight=edge_weight, backend=self.aggregation)


@contextlib.contextmanager
def use_aggregation(model: nn.Module, backend: str):
    """Within the block, every layer of `model` aggregates with `backend`; restored after."""
    layers = [m for m in model.modules() if isinstance(m, Aggregating)]
    old = [m.aggregation for m in layers]
    for m in layers:
        m.aggregation = backend
    try:
        yield
    finally:
        for m, name in zip(layers, old):
            m.aggregation = name
