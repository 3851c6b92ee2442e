"""Encoding and decoding the minibatches of a shard file: their npz entries, and the compact correction.

`graphs.formats.shard_format` owns the format (file layout, keys, entries, version); this module turns
sampled minibatches into one file's entries (`encode_shard`, for the writer `graphs.sampling.writer`)
and a file's arrays back into `StoredMinibatch` records (`decode_minibatch`, for the reader
`training.data`). A block's sampling correction is stored as two values per destination when that
holds it exactly (`compact_correction`), else per edge; the reader expands it (`expand_correction`).
NumPy only, like the format: training runs where DGL is not installed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from graphs.formats.shard_format import (
    BLOCK_ENTRIES,
    FORMAT_VERSION,
    MINIBATCH_ENTRIES,
    WEIGHT_ENCODINGS,
    block_key,
    index_dtype,
    minibatch_key,
)
from graphs.kernels.quantize_csr import dequantize_int8_rows_csr, quantize_int8_rows_csr

__all__ = [
    "StoredBlock",
    "StoredMinibatch",
    "canonical_correction",
    "compact_correction",
    "decode_minibatch",
    "encode_minibatch",
    "encode_shard",
    "expand_correction",
]

# Minibatch entries read and written by name; any other optional entry of MINIBATCH_ENTRIES is
# written from the sampled minibatch's attribute of that name when it is not None, and read
# back into ``StoredMinibatch.extra``.
_MINIBATCH_CORE = ("input_nodes", "seeds", "seed_pos", "labels", "loss_weight")


# Block entries read and written by name below; any other optional entry of BLOCK_ENTRIES
# (a per-edge array added later) is written from the sampled block's attribute of that
# name when it is not None, and read back into ``StoredBlock.extra``.
_BLOCK_CORE = (
    "num_src",
    "num_dst",
    "indptr",
    "indices",
    "weight",
    "weight_q",
    "weight_scale",
    "correction",
    "correction_first",
    "correction_rest",
)


# ----------------------------------------------------------------------------- writing


def compact_correction(indptr: np.ndarray, correction: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(first, rest) float32 [num_dst]: the correction of each destination's first in-edge and
    the one value of all its others, when that holds `correction` exactly; else None.

    Uniform neighbour sampling's correction deg(v)/sampled(v) is one value per destination,
    its self loop's 1 apart: a fourth of a shard's bytes stored as two numbers per destination.
    """
    deg = np.diff(indptr)
    has = deg > 0
    first = np.ones(len(deg), np.float32)
    rest = np.ones(len(deg), np.float32)
    first[has] = correction[indptr[:-1][has]]
    rest[has] = correction[indptr[1:][has] - 1]
    return (first, rest) if np.array_equal(expand_correction(indptr, first, rest), correction) else None


def canonical_correction(indptr: np.ndarray, first: np.ndarray, rest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, rest) as `compact_correction` gives them for the same per-edge correction: 1 for
    a destination without in-edges, rest = first for one with a single in-edge. A sampler that
    knows its correction per destination builds the stored form with it, without the edges."""
    deg = np.diff(indptr)
    first = np.where(deg > 0, first, np.float32(1)).astype(np.float32, copy=False)
    return first, np.where(deg > 1, rest, first).astype(np.float32, copy=False)


def expand_correction(indptr: np.ndarray, first: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """float32 [nnz]: the per-edge correction of `compact_correction`'s (first, rest)."""
    deg = np.diff(indptr)
    out = np.repeat(rest.astype(np.float32, copy=False), deg)
    has = deg > 0
    out[indptr[:-1][has]] = first[has]
    return out


def encode_minibatch(mb: Any, i: int, weight_encoding: str) -> dict[str, np.ndarray]:
    """The npz entries of minibatch `i` of a shard file.

    `mb` has ``input_nodes``, ``seeds``, ``seed_pos``, ``labels``, ``loss_weight`` (or
    None) and ``blocks``, each block with ``indptr``, ``indices``, ``num_src``,
    ``num_dst``, ``weight`` (float32 per edge; not read, and may be None, with weight
    encoding ``factors``) and ``correction`` (float32 per edge) — `graphs.sampling.SampledMinibatch`.
    """
    if weight_encoding not in WEIGHT_ENCODINGS:
        raise ValueError(f"weight encoding {weight_encoding!r} is not one of {WEIGHT_ENCODINGS}")
    nodes = np.asarray(mb.input_nodes)
    out = {
        minibatch_key(i, "input_nodes"): nodes.astype(
            index_dtype(int(nodes.max()) + 1 if len(nodes) else 0), copy=False
        ),
        minibatch_key(i, "seeds"): np.asarray(mb.seeds, dtype=np.int64),
        minibatch_key(i, "seed_pos"): np.asarray(mb.seed_pos, dtype=np.int64),
        minibatch_key(i, "labels"): np.asarray(mb.labels, dtype=np.int64),
    }
    if mb.loss_weight is not None:
        out[minibatch_key(i, "loss_weight")] = np.asarray(mb.loss_weight, dtype=np.float32)
    for name in MINIBATCH_ENTRIES:
        value = None if name in _MINIBATCH_CORE else getattr(mb, name, None)
        if value is not None:
            out[minibatch_key(i, name)] = np.asarray(value, dtype=np.int64)
    for layer, b in enumerate(mb.blocks):
        out[block_key(i, layer, "num_src")] = np.int64(b.num_src)
        out[block_key(i, layer, "num_dst")] = np.int64(b.num_dst)
        out[block_key(i, layer, "indptr")] = b.indptr.astype(index_dtype(int(b.indptr[-1]) + 1), copy=False)
        out[block_key(i, layer, "indices")] = b.indices
        compact = getattr(b, "correction_compact", None)  # a sampled block that holds it so
        if compact is None:
            correction = np.asarray(b.correction, dtype=np.float32)
            compact = compact_correction(b.indptr, correction)
        if compact is None:
            out[block_key(i, layer, "correction")] = correction
        else:
            out[block_key(i, layer, "correction_first")], out[block_key(i, layer, "correction_rest")] = compact
        if weight_encoding == "int8":
            qw, scale = quantize_int8_rows_csr(b.indptr, b.weight)
            out[block_key(i, layer, "weight_q")] = qw
            out[block_key(i, layer, "weight_scale")] = scale
        elif weight_encoding == "fp32":
            out[block_key(i, layer, "weight")] = b.weight
        for name in BLOCK_ENTRIES:
            value = None if name in _BLOCK_CORE else getattr(b, name, None)
            if value is not None:
                out[block_key(i, layer, name)] = np.asarray(value)
    return out


def encode_shard(minibatches: Sequence[Any], weight_encoding: str) -> dict[str, np.ndarray]:
    """Every npz entry of one shard file: the header, then each minibatch (`encode_minibatch`)."""
    arrays: dict[str, np.ndarray] = {
        "format_version": np.int64(FORMAT_VERSION),
        "minibatches": np.int64(len(minibatches)),
    }
    for i, mb in enumerate(minibatches):
        arrays.update(encode_minibatch(mb, i, weight_encoding))
    return arrays


# ----------------------------------------------------------------------------- reading


@dataclass
class StoredBlock:
    """One block as stored (NumPy views into the shard): CSC over the destination nodes.

    Exactly one of ``weight`` (fp32) or ``weight_q`` + ``weight_scale`` (int8) is set, or
    neither (weight encoding ``factors``: `graphs.formats.shard_references.open_weight_factors`).
    """

    indptr: np.ndarray
    indices: np.ndarray
    num_src: int
    num_dst: int
    weight: np.ndarray | None = None
    weight_q: np.ndarray | None = None
    weight_scale: np.ndarray | None = None
    correction: np.ndarray | None = None
    """The correction per edge, when stored so (else None and ``correction_compact`` is set)."""
    correction_compact: tuple[np.ndarray, np.ndarray] | None = None
    """(``correction_first``, ``correction_rest``) when stored per destination (`expand_correction`)."""
    correction_per_dst: bool | None = None
    """Whether every in-edge of each destination has one correction, when the compact form
    told it without a pass over the edges (None: not known here)."""
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    """Optional entries of BLOCK_ENTRIES beyond the core ones, by name (see `_BLOCK_CORE`)."""

    def correction_per_edge(self) -> np.ndarray:
        """float32 [nnz]: the correction of every edge, expanded from the compact form if need be."""
        if self.correction is not None:
            return self.correction
        return expand_correction(self.indptr, *self.correction_compact)

    def decoded_weight(self) -> np.ndarray | None:
        """float32 [nnz] edge weights (int8 decoded through `graphs.kernels.quantize`); None with weight
        encoding ``factors``."""
        if self.weight is not None or self.weight_q is None:
            return self.weight
        return dequantize_int8_rows_csr(self.indptr, self.weight_q, self.weight_scale)


@dataclass
class StoredMinibatch:
    """One minibatch as stored; ``blocks`` holds one block when the manifest's shared_block."""

    input_nodes: np.ndarray
    seeds: np.ndarray
    seed_pos: np.ndarray
    labels: np.ndarray
    loss_weight: np.ndarray | None
    blocks: list[StoredBlock]
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    """Optional entries of MINIBATCH_ENTRIES beyond the core ones (link prediction's pairs)."""


def decode_minibatch(
    arrays: dict[str, np.ndarray], i: int, num_blocks: int, weight_encoding: str = "fp32"
) -> StoredMinibatch:
    """Minibatch `i` of a shard file's arrays (`graphs.formats.shard_format.read_shard`), `num_blocks` blocks of it, stored
    in the manifest's `weight_encoding` (fp32 and int8 files are told apart by their entries;
    ``factors`` files hold no weights).

    A missing required entry raises KeyError naming the key.
    """

    def optional(key: str) -> np.ndarray | None:
        return arrays[key] if key in arrays else None

    blocks = []
    for layer in range(num_blocks):
        weight = optional(block_key(i, layer, "weight"))
        weight_q = weight_scale = None
        if weight is None and weight_encoding != "factors":
            weight_q, weight_scale = (
                arrays[block_key(i, layer, "weight_q")],
                arrays[block_key(i, layer, "weight_scale")],
            )
        indptr = arrays[block_key(i, layer, "indptr")]
        correction, compact, per_dst = optional(block_key(i, layer, "correction")), None, None
        if correction is None:  # kept compact: a reader expands it when it needs it (correction_per_edge)
            compact = first, rest = (
                arrays[block_key(i, layer, "correction_first")],
                arrays[block_key(i, layer, "correction_rest")],
            )
            many = np.diff(indptr) > 1  # destinations whose first in-edge has others beside it
            per_dst = bool(np.array_equal(first[many], rest[many]))
        blocks.append(
            StoredBlock(
                indptr=indptr,
                indices=arrays[block_key(i, layer, "indices")],
                num_src=int(arrays[block_key(i, layer, "num_src")]),
                num_dst=int(arrays[block_key(i, layer, "num_dst")]),
                weight=weight,
                weight_q=weight_q,
                weight_scale=weight_scale,
                correction=correction,
                correction_compact=compact,
                correction_per_dst=per_dst,
                extra={
                    name: arrays[block_key(i, layer, name)]
                    for name in BLOCK_ENTRIES
                    if name not in _BLOCK_CORE and block_key(i, layer, name) in arrays
                },
            )
        )
    return StoredMinibatch(
        input_nodes=arrays[minibatch_key(i, "input_nodes")],
        seeds=arrays[minibatch_key(i, "seeds")],
        seed_pos=arrays[minibatch_key(i, "seed_pos")],
        labels=arrays[minibatch_key(i, "labels")],
        loss_weight=optional(minibatch_key(i, "loss_weight")),
        blocks=blocks,
        extra={
            name: arrays[minibatch_key(i, name)]
            for name in MINIBATCH_ENTRIES
            if name not in _MINIBATCH_CORE and minibatch_key(i, name) in arrays
        },
    )
