"""Message-flow blocks: the graph structure one GNN layer runs over, in plain torch.

A :class:`Block` is one layer of a sampled computation graph (DGL calls it a message
flow graph) stored in CSC form over its destination nodes:

- ``indptr``  int64 ``[num_dst + 1]``: the in-edges of destination ``v`` are
  ``indptr[v]:indptr[v + 1]``;
- ``indices`` int64 ``[num_edges]``: the local source index (``0..num_src-1``) of each edge;
- ``edge_weight`` float32 ``[num_edges]`` or None (e.g. the normalized adjacency weights
  of ``D^-1/2 (A + I) D^-1/2``); a block read from shards of weight encoding ``factors``
  carries ``weight_factors`` (:class:`NodeScales`) instead and computes them, bit for bit, on
  first access (a layer that never reads them never pays for them);
- ``correction`` float32 ``[num_edges]`` or None: a sampled block's per-edge sampling
  correction (inverse inclusion probability, `graphs.formats.shard_format`), which each layer type
  applies in its own way (`training.layers.sampled_edge_weight`); None on a full graph. A
  block read from shards that store it per destination carries ``correction_compact`` (first
  in-edge's, the others') instead and expands it on first access;
- ``correction_per_dst`` bool: True when every in-edge of a destination has the same
  correction (uniform neighbour sampling without self loops: deg(v)/sampled(v)), so that it
  cancels in a weighted mean; False when unknown (the correction is then applied as it is).

As in DGL, the destination nodes are also the first ``num_dst`` source nodes, so a layer
reads the destination nodes' own features as ``x[:num_dst]``. A full graph is a Block
with ``num_src == num_dst == n`` (:func:`block_from_csr`).

Everything derived from the structure (torch sparse CSR matrices, the transposed
structure for the backward pass, per-edge destination ids, a DGL graph when DGL is used)
is computed once and cached on the block, so the layers and attention heads that run over
the same block share it. The cache is keyed by what it depends on; it is never shared
between blocks. Nothing here imports DGL.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = [
    "Block",
    "NodeScales",
    "CSRStructure",
    "correction_is_per_dst",
    "block_from_csr",
    "csr_matrix",
    "drop_edge_scale",
    "drop_edges",
    "mask_edges",
    "remove_self_loops",
    "slice_dst",
]


class NodeScales:
    """Â's row and column scales (`graphs.formats.shard_format`, weight encoding ``factors``) of one
    minibatch's nodes: Â's entry of block edge u -> v is float32(row[v] · col[u]) (float32(row[v])
    without ``col``), u and v positions in ``nodes``. Gathered from the [n] vectors on first use,
    once per device, and shared by the minibatch's blocks (each block's nodes are a prefix)."""

    def __init__(self, row: np.ndarray, col: np.ndarray | None, nodes: np.ndarray):
        self.row, self.col, self.nodes = row, col, nodes
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor | None]] = {}

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(row, col) float64 over ``nodes`` on ``device`` (col is row for a symmetric Â)."""
        got = self._on.get(device)
        if got is None:
            row = self._moved(self.row, device)
            col = None
            if self.col is not None:
                col = row if self.col is self.row else self._moved(self.col, device)
            got = self._on[device] = (row, col)
        return got

    def _moved(self, scale: np.ndarray, device: torch.device) -> torch.Tensor:
        host = torch.from_numpy(np.take(scale, self.nodes))
        if device.type == "cuda":  # pinned, so the copy does not wait for the device
            return host.pin_memory().to(device, non_blocking=True)
        return host.to(device)

    def edge_weights(self, block: "Block") -> torch.Tensor:
        """float32 ``[num_edges]``: Â's entries of ``block``'s edges, as weights.npy holds them."""
        row, col = self.on(block.device)
        w = row[: block.num_dst][block.dst_ids()]
        if col is not None:
            w = w * col[: block.num_src][block.indices]  # one float64 product, rounded once
        return w.to(torch.float32)


class _Derived:
    """A Block field that, when not given, is built on first access from what the block holds
    in compact form (then kept): ``build(block)``, None when there is nothing to build from.
    As a dataclass field's default, it makes the default None."""

    def __init__(self, build):
        self.build = build

    def __set_name__(self, owner, name) -> None:
        self.key = "_" + name

    def __get__(self, block, owner=None):
        if block is None:
            return None
        value = block.__dict__.get(self.key)
        if value is None:
            value = self.build(block)
            if value is not None:
                block.__dict__[self.key] = value
        return value

    def __set__(self, block, value) -> None:
        block.__dict__[self.key] = value

    @staticmethod
    def given(block, name: str):
        """Field `name` of `block` as it was given or already built, without building it."""
        return block.__dict__.get("_" + name)


def _weights_from_factors(block: "Block") -> torch.Tensor | None:
    return None if block.weight_factors is None else block.weight_factors.edge_weights(block)


def _expanded_correction(block: "Block") -> torch.Tensor | None:
    """The per-edge correction of ``correction_compact`` (first in-edge, then the rest of each
    destination's), as `graphs.formats.shard_codec.expand_correction` expands it."""
    if block.correction_compact is None:
        return None
    first, rest = block.correction_compact
    dst = block.dst_ids()
    # an edge is its destination's first when it sits at indptr[dst] (no boolean mask: no device sync)
    is_first = torch.arange(block.num_edges, device=dst.device) == block.indptr[:-1][dst]
    return torch.where(is_first, first[dst], rest[dst])


@dataclass(eq=False)  # identity equality and hashing: a block is a graph, not a value
class Block:
    """One message-flow layer in CSC form over its destination nodes (see module docstring)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    num_src: int
    num_dst: int
    edge_weight: torch.Tensor | None = _Derived(_weights_from_factors)
    correction: torch.Tensor | None = _Derived(_expanded_correction)
    correction_per_dst: bool = False
    weight_factors: NodeScales | None = None
    correction_compact: tuple[torch.Tensor, torch.Tensor] | None = None
    # False for a block whose rows are not nodes among the sources (a typed block's rows per
    # (destination, relation), `training.typed_blocks.TypedBlock.relation_rows`): aggregation only
    dst_in_src: bool = True
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.num_src = int(self.num_src)
        self.num_dst = int(self.num_dst)
        if self.indptr.dtype != torch.int64 or self.indices.dtype != torch.int64:
            raise TypeError(
                f"Block indptr and indices must be int64, got {self.indptr.dtype} and "
                f"{self.indices.dtype}; convert with .long()"
            )
        if self.indptr.dim() != 1 or self.indptr.numel() != self.num_dst + 1:
            raise ValueError(
                f"Block indptr must have shape [num_dst + 1] = [{self.num_dst + 1}], got {list(self.indptr.shape)}"
            )
        if self.dst_in_src and self.num_dst > self.num_src:
            raise ValueError(
                f"Block has num_dst={self.num_dst} > num_src={self.num_src}; destination "
                "nodes must be the first num_dst source nodes"
            )
        # as given: what the compact forms would give is not computed here
        correction, weight = _Derived.given(self, "correction"), _Derived.given(self, "edge_weight")
        if correction is not None and correction.shape[0] != self.indices.shape[0]:
            raise ValueError(
                f"Block correction has {correction.shape[0]} entries but the block has {self.indices.shape[0]} edges"
            )
        if weight is not None and weight.shape[0] != self.indices.shape[0]:
            raise ValueError(
                f"Block edge_weight has {weight.shape[0]} entries but the block has {self.indices.shape[0]} edges"
            )
        # Checking indptr[-1] == len(indices) needs a device sync; do it on CPU only.
        if self.indptr.device.type == "cpu" and int(self.indptr[-1]) != self.indices.numel():
            raise ValueError(
                f"Block indptr[-1]={int(self.indptr[-1])} does not match len(indices)={self.indices.numel()}"
            )

    @property
    def num_edges(self) -> int:
        return self.indices.numel()

    @property
    def device(self) -> torch.device:
        return self.indices.device

    def to(self, device, non_blocking: bool = False) -> "Block":
        """The same block on ``device``: ``self`` (cache kept) when already there, else a
        new Block with an empty cache."""
        compact = self.correction_compact or (None, None)
        tensors = (self.indptr, self.indices, _Derived.given(self, "edge_weight"), _Derived.given(self, "correction"))
        indptr, indices, weight, correction, first, rest = moved = [
            None if t is None else t.to(device, non_blocking=non_blocking) for t in tensors + compact
        ]
        if all(m is t for m, t in zip(moved, tensors + compact)):
            return self
        return Block(
            indptr,
            indices,
            self.num_src,
            self.num_dst,
            weight,
            correction,
            self.correction_per_dst,
            self.weight_factors,
            None if first is None else (first, rest),
            self.dst_in_src,
        )

    def in_degrees(self) -> torch.Tensor:
        """int64 ``[num_dst]``: number of in-edges of each destination node."""
        return self._cached("in_degrees", lambda: self.indptr.diff())

    def out_degrees(self) -> torch.Tensor:
        """int64 ``[num_src]``: number of edges of this block leaving each source node."""
        return self._cached("out_degrees", lambda: torch.bincount(self.indices, minlength=self.num_src))

    def dst_ids(self) -> torch.Tensor:
        """int64 ``[num_edges]``: the destination node of each edge (COO row ids)."""
        return self._cached(
            "dst_ids",
            lambda: torch.repeat_interleave(
                torch.arange(self.num_dst, device=self.device),
                self.in_degrees(),
                output_size=self.num_edges,
            ),
        )

    def structure(self) -> "CSRStructure":
        """The CSR structure (its transpose built on first use by a backward pass), cached."""
        return self._cached("structure", lambda: CSRStructure(self))

    def _cached(self, key, build):
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = build()
        return value


class CSRStructure:
    """A block's sparsity pattern as CSR ``[num_dst, num_src]`` and, built on first use, its
    transpose (for backward passes that need the gradient of the source features: the input
    layer's features need none, so its block, the largest, never pays for the sort).

    The transpose's ``perm`` maps edge values from CSC-over-destinations order (the block's edge
    order) into the transposed (CSR-over-sources) order: ``values_t = values[perm]``.
    """

    def __init__(self, block: Block):
        self.indptr, self.indices = block.indptr, block.indices
        self.dst_ids = block.dst_ids()
        self.num_dst, self.num_src = block.num_dst, block.num_src
        self._block = block
        self._transpose: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def transpose(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(indptr_t, indices_t, perm)`` of the CSR over sources, computed once."""
        if self._transpose is None:
            perm = torch.argsort(self.indices, stable=True)
            indptr_t = torch.zeros(self.num_src + 1, dtype=torch.int64, device=self.indices.device)
            torch.cumsum(self._block.out_degrees(), 0, out=indptr_t[1:])
            self._transpose = (indptr_t, self.dst_ids[perm], perm)
        return self._transpose

    def matrix(self, values: torch.Tensor) -> torch.Tensor:
        """Sparse CSR ``[num_dst, num_src]`` with the given per-edge values."""
        return _csr(self.indptr, self.indices, values, (self.num_dst, self.num_src))

    def matrix_t(self, values: torch.Tensor) -> torch.Tensor:
        """Sparse CSR ``[num_src, num_dst]`` of the transpose (values in block edge order)."""
        indptr_t, indices_t, perm = self.transpose()
        return _csr(indptr_t, indices_t, values[perm], (self.num_src, self.num_dst))


def _csr(indptr, indices, values, size) -> torch.Tensor:
    with warnings.catch_warnings():
        # torch 2.2 warns "Sparse CSR tensor support is in beta state" on first use
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(indptr, indices, values, size)


def correction_is_per_dst(indptr: np.ndarray, correction: np.ndarray | None) -> bool:
    """Whether every in-edge of each destination of a CSC block carries the same correction."""
    if correction is None or len(correction) == 0:
        return True
    deg = np.diff(indptr)
    has = deg > 0
    return bool(np.array_equal(np.repeat(correction[indptr[:-1][has]], deg[has]), correction))


def block_from_csr(indptr: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor | None = None) -> Block:
    """A full-graph Block (``num_src == num_dst == n``) from CSR/CSC arrays.

    For a symmetric graph (such as the normalized adjacency) CSR and CSC coincide; for a
    directed graph pass the CSC (in-edges per node). NumPy arrays are accepted.
    """
    indptr = torch.as_tensor(indptr).long()
    indices = torch.as_tensor(indices).long()
    if weights is not None:
        weights = torch.as_tensor(weights).float()
    n = indptr.numel() - 1
    return Block(indptr, indices, n, n, weights)


def csr_matrix(block: Block, values: torch.Tensor | None = None) -> torch.Tensor:
    """Torch sparse CSR ``[num_dst, num_src]`` of ``block``.

    With ``values=None`` the block's edge weights are used (ones when it has none) and
    the matrix is cached on the block; explicit values build a fresh matrix over the
    cached structure.
    """
    if values is not None:
        return block.structure().matrix(values)

    def build():
        w = block.edge_weight
        if w is None:
            w = torch.ones(block.num_edges, device=block.device)
        return block.structure().matrix(w)

    return block._cached("csr_matrix", build)


def mask_edges(block: Block, keep: torch.Tensor) -> Block:
    """A new Block with only the edges where the bool mask ``keep [num_edges]`` is True."""
    kept_per_dst = torch.zeros(block.num_dst, dtype=torch.int64, device=block.device)
    kept_per_dst.index_add_(0, block.dst_ids(), keep.long())
    indptr = torch.zeros_like(block.indptr)
    torch.cumsum(kept_per_dst, 0, out=indptr[1:])
    weight = None if block.edge_weight is None else block.edge_weight[keep]
    correction = None if block.correction is None else block.correction[keep]
    # a subset of a destination's edges keeps one correction per destination
    return Block(
        indptr, block.indices[keep], block.num_src, block.num_dst, weight, correction, block.correction_per_dst
    )


def drop_edges(block: Block, p: float, generator: torch.Generator | None = None) -> Block:
    """DropEdge: a new Block keeping each edge other than a self loop with probability ``1 - p``.

    Self loops ``v -> v`` are always kept (a node never loses its own features). For a sum
    or weighted aggregation multiply the kept edges by :func:`drop_edge_scale` to keep its
    expectation; a mean (or softmax, or max) over the kept edges needs nothing more.
    """
    if p <= 0.0:
        return block
    keep = (torch.rand(block.num_edges, device=block.device, generator=generator) >= p) | (
        block.indices == block.dst_ids()
    )
    return mask_edges(block, keep)


def drop_edge_scale(block: Block, p: float) -> torch.Tensor:
    """float32 ``[num_edges]`` of a block after :func:`drop_edges` with rate ``p``: ``1 / (1 - p)``
    per kept edge, 1 per self loop (always kept), so ``E[Σ_kept scale_uv w_uv x_u] = Σ_u w_uv x_u``."""
    loop = block.indices == block.dst_ids()
    return torch.where(loop, 1.0, 1.0 / (1.0 - p)).to(torch.float32)


def remove_self_loops(block: Block) -> Block:
    """A new Block without edges ``v -> v`` (destination ``v`` is source ``v``)."""
    return mask_edges(block, block.indices != block.dst_ids())


def slice_dst(block: Block, start: int, stop: int) -> tuple[Block, torch.Tensor]:
    """The sub-block of destination nodes ``start:stop`` and the source ids it reads.

    Returns ``(sub, src_ids)``: ``sub`` has ``num_dst = stop - start`` and its sources
    are ``src_ids`` (int64, ids into the parent's sources), with the destination nodes
    first as the Block convention requires, so ``layer(sub, h[src_ids])`` equals rows
    ``start:stop`` of ``layer(block, h)``. Used for layer-wise inference in batches.
    Requires ``stop <= num_dst``; vectorised (no loop over nodes).
    """
    if not 0 <= start <= stop <= block.num_dst:
        raise ValueError(f"slice_dst({start}, {stop}) out of range for num_dst={block.num_dst}")
    device = block.device
    lo, hi = int(block.indptr[start]), int(block.indptr[stop])
    nbr = block.indices[lo:hi]
    own = torch.arange(start, stop, device=device)
    # local id of every parent source node: dst slice first, then the other neighbours
    local = torch.full((block.num_src,), -1, dtype=torch.int64, device=device)
    local[own] = torch.arange(stop - start, device=device)
    uniq = torch.unique(nbr)
    extra = uniq[local[uniq] < 0]
    local[extra] = torch.arange(stop - start, stop - start + extra.numel(), device=device)
    src_ids = torch.cat([own, extra])
    weight = None if block.edge_weight is None else block.edge_weight[lo:hi]
    indptr = block.indptr[start : stop + 1] - lo
    sub = Block(indptr, local[nbr], src_ids.numel(), stop - start, weight)
    return sub, src_ids
