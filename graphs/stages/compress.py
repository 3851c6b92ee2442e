"""Compressed graph: quantized node features and edge weights, Bloom-filter edge sets per part.

The compressed_graph stage turns three earlier outputs into a graph that takes a fraction
of the memory and still trains almost as well (the loss is measured, not assumed: see
``benchmarks/compression.py``):

* node features (canonical ``features.npy``) in one compact encoding of
  :mod:`graphs.kernels.quantize` — per-column affine INT8, per-column 4-bit (two values per byte)
  or bit-packed 0/1;
* the normalized adjacency's weights (``normalized_adjacency/weights.npy``) as INT8 with
  one scale per CSR row;
* one split-block Bloom filter (:mod:`graphs.kernels.bloom`) per METIS part over the edges
  incident to the part, for link-prediction negative sampling.

Files written (format version 1) into ``<out_dir>/``; ``n`` nodes, ``D`` feature dims,
``nnz`` entries of the normalized adjacency CSR, ``k`` METIS parts:

==============================  ================================  =============================
file                            dtype, shape                      meaning
==============================  ================================  =============================
``features_int8.npy``           int8 [n, D]                       encoding "int8": x ≈ q *
                                                                  scale[j] + zero_point[j]
``features_int4.npy``           uint8 [n, ceil(D/2)]              encoding "int4": column 2j in
                                                                  the low nibble of byte j,
                                                                  2j+1 in the high nibble;
                                                                  x ≈ code * scale + zero_point
``features_binary.npy``         uint8 [n, ceil(D/8)]              encoding "binary": bit b of
                                                                  byte j is column 8j + b
                                                                  (``np.packbits`` little)
``feature_scales.npy``          float32 [2, D]                    int8 / int4 only: row 0 the
                                                                  per-column scale, row 1 the
                                                                  zero point
``weights_int8.npy``            int8 [nnz]                        Â's weights ≈ q * scale[row],
                                                                  aligned with normalized_
                                                                  adjacency's indptr / indices
``weight_scales.npy``           float32 [n]                       per-row scale = max |w| / 127
``bloom/part-{p}.bloom``        Bloom filter file (graphs.kernels.bloom)  edges (u, v) with u or v in
                                                                  part p, both directions
``manifest.json``               JSON                              format version, encoding and
                                                                  transform, every file's
                                                                  dtype / shape / bytes, the
                                                                  settings
``summary.json``                JSON                              the measurements below
==============================  ================================  =============================

Exactly one of the three feature files is present (none when the dataset has no features).
They are the project's one layout of quantized features: minibatch_shards references them
(``feature_encoding="compressed"``) instead of writing codes or scales of its own, and every
reader decodes them through :class:`graphs.kernels.quantize.EncodedFeatures`.

``weights_int8.npy`` + ``weight_scales.npy`` are a storage and transfer artefact: Â's
weights in a quarter of the bytes (decode with :func:`load_weights` and
:func:`graphs.kernels.quantize.dequantize_int8_rows_csr`), e.g. to ship a graph or run full-graph
inference from it. The shards do not read them: a sampled block's weights are Â times a
sampler correction (neighbour rescaling, importance and SAINT normalization) that changes
each destination row's maximum, so INT8 shard weights are quantized per block row from
Â's FP32 weights (`graphs.formats.shard_format`).
With ``feature_transform="asinh"`` the int8 / int4 codes are those of asinh(x) (per-column
range of asinh(x), same layout) and the features are sinh of the decoded values; the
manifest's ``feature_transform`` says which. Heavy-tailed columns need it for 4 bits: on
log-normal features whose column maximum is ~1000x the median, 16 equal steps over
[min, max] put almost every value in the lowest bucket (measured in
benchmarks/compression.py, GCN on a log-normal-feature graph: 4-bit codes of x cost 16.6
accuracy points, 4-bit codes of asinh(x) 0.3; INT8 is within 0.3 points either way).
The CSR structure (``indptr``, ``indices``) is not copied: it stays in normalized_adjacency
and is counted on neither side of the compression ratio. Decoding is one vectorised step
(:func:`load_features` gives a :class:`graphs.kernels.quantize.EncodedFeatures` carrying the
transform, whose ``decode_rows_torch(rows, device)`` decodes a batch on the training
device with the transform undone; minibatch_shards references these files rather than
copying them, see `graphs.formats.shard_format`;
:func:`graphs.kernels.quantize.dequantize_int8_rows_csr_torch` decodes the weights).

Edge sets: for part p the filter holds every canonical edge (u, v) with ``part[u] == p``
or ``part[v] == p``; for a directed canonical graph the reversed pair (v, u) is inserted as
well, so "(u, v) may be an edge" can be asked in either direction. Any pair whose source
(or target) lives in part p is answered by filter p alone: :func:`might_be_edge` routes
each query to ``part[u]``'s filter. A cut edge is stored in two filters, so the edge sets
hold ``E + cut`` keys for ``E`` canonical edges.

Measurements (``summary.json``, also the asset metadata): per tensor the bytes before and
after and the max absolute and relative RMS reconstruction error; the bytes and error every
applicable feature encoding would give (so the trade-off is visible without rebuilding);
per filter the bits per key and the false-positive rate measured on ``fpr_queries`` random
non-edges against the target, plus the routed rate a negative sampler sees; the edge sets'
bytes against raw int64 (src, dst) pairs; and the whole asset (features + weights + edge
sets) against the FP32 / int64 originals.

How it scales: features and weights are memory-mapped and processed in row blocks (the
quantized arrays are written through `graphs.formats.npyrows.create_npy_memmap`, their disk space
reserved first, so a full disk is an error naming the file), the edges are streamed
from ``edges.parquet`` in record batches twice (count keys per part, then insert), and the
non-edge test for the FPR measurement is a vectorised binary search in the CSR rows, so
memory is O(n) plus one block plus the filters (~1.3 bytes per key at 1%).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np

if TYPE_CHECKING:
    from graphs.kernels.bloom import BloomFilter

from graphs.formats.canonical_files import CanonicalGraph, edge_batches
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.npyrows import create_npy_memmap
from graphs.formats.partition_files import Partitions
from graphs.infra.config_checks import MAX_ROWS, MAX_SEED, bounded_repr, check_fields
from graphs.infra.host_memory import reuse_freed_memory
from graphs.infra.storage import atomic_output_dir, peak_rss_bytes, verify_inputs, write_summary
from graphs.kernels.quantize import (
    FEATURE_TRANSFORMS,
    EncodedFeatures,
    ErrorAccumulator,
    column_min_max,
    csr_row_blocks,
    dequantize_int4_columns,
    dequantize_int8_columns,
    dequantize_int8_rows_csr,
    forward_transform,
    inverse_transform,
    is_binary,
    pack_binary,
    quantize_int4_columns,
    quantize_int8_columns,
    quantize_int8_rows_csr,
    unpack_binary,
)
from graphs.stages.normalize import Adjacency, load_csr

__all__ = [
    "FORMAT_VERSION",
    "FEATURE_ENCODINGS",
    "FEATURE_TRANSFORMS",
    "FEATURE_FILES",
    "CompressConfig",
    "CompressedGraph",
    "build_compressed_graph",
    "verify_compressed_graph",
    "load_features",
    "load_weights",
    "load_bloom_filters",
    "might_be_edge",
    "csr_contains",
    "encoding_nbytes",
]

FORMAT_VERSION = CompressedGraph.FORMAT_VERSION
FEATURE_ENCODINGS = ("auto", "int8", "int4", "binary")
FEATURE_FILES = CompressedGraph.FEATURE_FILES
SCALES_FILE = CompressedGraph.FEATURE_SCALES

_BLOCK_ELEMENTS = 1 << 22  # elements per feature block (~32 MiB as float64)
_WEIGHT_BLOCK = 1 << 24  # CSR entries per weight block
_EDGE_BATCH = 1 << 22  # edge rows per streamed batch of edges.parquet


@dataclass(kw_only=True)
class CompressConfig:
    """Settings of the compressed_graph stage."""

    feature_encoding: str = field(
        default="auto",
        metadata={
            "help": "'int8' (per-column affine, 4x smaller), 'int4' (two values per byte, 8x), "
            "'binary' (bit-packed 0/1, 32x, exact; only for 0/1 features) or 'auto' "
            "(binary when every value is 0 or 1, else int8)."
        },
    )
    feature_transform: str = field(
        default="none",
        metadata={
            "help": "'none', or 'asinh': quantize asinh(x) per column and decode sinh(x̂) — for "
            "heavy-tailed features, where 4-bit codes of x itself leave most values in one bucket. "
            "Applies to int8/int4; 'auto' on 0/1 features stores bits and ignores it."
        },
    )
    bloom_fpr: float = field(
        default=0.01, metadata={"help": "Target false-positive rate of each part's edge-set Bloom filter."}
    )
    seed: int = field(
        default=0,
        metadata={"max": MAX_SEED, "help": "Seed of the Bloom filters' hashes and of the measurement samples."},
    )
    fpr_queries: int = field(
        default=1_000_000,
        metadata={"max": 1 << 28, "help": "Random non-edges on which each filter's false-positive rate is measured."},
    )
    check_edges: int = field(
        default=100_000,
        metadata={
            "max": 1 << 40,
            "help": "True edges sampled by the no-false-negative asset check (all edges when fewer).",
        },
    )
    compare_encodings: bool = field(
        default=True,
        metadata={
            "help": "Also measure the reconstruction error of every other applicable feature "
            "encoding (one extra pass over the features each)."
        },
    )
    chunk_rows: int = field(
        default=0,
        metadata={"max": MAX_ROWS, "help": "Feature rows per processing block; 0 = about 4M values per block."},
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.feature_encoding not in FEATURE_ENCODINGS:
            raise ValueError(
                f"feature_encoding must be one of {FEATURE_ENCODINGS}, got {bounded_repr(self.feature_encoding)}"
            )
        if self.feature_transform not in FEATURE_TRANSFORMS:
            raise ValueError(
                f"feature_transform must be one of {FEATURE_TRANSFORMS}, got {bounded_repr(self.feature_transform)}"
            )
        if self.feature_encoding == "binary" and self.feature_transform != "none":
            raise ValueError("feature_transform applies to int8/int4 codes; bit-packed 0/1 features take none")
        if not 0.0 < self.bloom_fpr < 1.0:
            raise ValueError(f"bloom_fpr must be in (0, 1), got {self.bloom_fpr}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.fpr_queries < 1:
            raise ValueError(f"fpr_queries must be >= 1, got {self.fpr_queries}")
        if self.check_edges < 1:
            raise ValueError(f"check_edges must be >= 1, got {self.check_edges}")
        if self.chunk_rows < 0:
            raise ValueError(f"chunk_rows must be >= 0 (0 = automatic), got {self.chunk_rows}")


# ----------------------------------------------------------------------------- sizes


def encoding_nbytes(encoding: str, n: int, d: int) -> int:
    """Bytes of n x d features stored as `encoding` ("fp32", "int8", "int4", "binary"),
    the per-column scale and zero point included."""
    if encoding == "fp32":
        return 4 * n * d
    if encoding == "int8":
        return n * d + 8 * d
    if encoding == "int4":
        return n * ((d + 1) // 2) + 8 * d
    if encoding == "binary":
        return n * ((d + 7) // 8)
    raise ValueError(f"unknown encoding {encoding!r}")


def _rows_per_block(d: int, chunk_rows: int) -> int:
    return chunk_rows if chunk_rows > 0 else max(1, _BLOCK_ELEMENTS // max(1, d))


def _blocks(n: int, rows: int) -> Iterator[tuple[int, int]]:
    for a in range(0, n, rows):
        yield a, min(n, a + rows)


# ----------------------------------------------------------------------------- features


def _rows_of(feats: EncodedFeatures, a: int, b: int) -> EncodedFeatures:
    """Rows a:b of `feats` as plain EncodedFeatures (decode() gives the quantizer's values,
    before any inverse transform)."""
    arrays = {k: (v[a:b] if k in ("x", "q", "packed") else v) for k, v in feats.arrays.items()}
    return EncodedFeatures(feats.encoding, b - a, feats.num_cols, arrays)


class _BlockEncoder:
    """Encodes row blocks of the (transformed) features with global per-column parameters.

    The quantizers of graphs.kernels.quantize derive scale and zero point from the min and max of what
    they are given; prepending the two rows (global min, global max) to each block makes
    every block see exactly the global range, so each block is quantized with the same
    parameters as a whole-array call would use, holding one block at a time.
    """

    def __init__(self, encoding: str, lo: np.ndarray | None, hi: np.ndarray | None, d: int):
        self.encoding, self.lo, self.hi, self.d = encoding, lo, hi, d
        self.scales: np.ndarray | None = None

    def encode(self, block: np.ndarray) -> np.ndarray:
        if self.encoding == "binary":
            return pack_binary(block, chunk_rows=max(1, len(block)))
        padded = np.concatenate([self.lo[None], self.hi[None], block])
        quantize = quantize_int8_columns if self.encoding == "int8" else quantize_int4_columns
        codes, scale, zero = quantize(padded, chunk_rows=len(padded))
        self.scales = np.stack([scale, zero]).astype(np.float32)
        return codes[2:]

    def decode(self, codes: np.ndarray) -> np.ndarray:
        if self.encoding == "int8":
            return dequantize_int8_columns(codes, self.scales[0], self.scales[1])
        if self.encoding == "int4":
            return dequantize_int4_columns(codes, self.scales[0], self.scales[1], self.d)
        return unpack_binary(codes, self.d)


def _transformed_range(x: np.ndarray, transform: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-column (min, max) of the transformed features, float32 [d] each."""
    if transform == "none":
        return column_min_max(x, chunk_rows=rows)
    n, d = x.shape
    if n == 0:
        raise ValueError("the feature array has no rows")
    lo, hi = np.full(d, np.inf, np.float32), np.full(d, -np.inf, np.float32)
    for a, b in _blocks(n, rows):
        blo, bhi = column_min_max(forward_transform(x[a:b], transform))
        np.minimum(lo, blo, out=lo)
        np.maximum(hi, bhi, out=hi)
    return lo, hi


def _encode_features(
    x: np.ndarray, encoding: str, transform: str, tmp: Path, rows: int
) -> tuple[dict, np.ndarray | None]:
    """Write the encoded features (and scales) into `tmp`; return (error summary, scales or None)."""
    n, d = x.shape
    shape = {"int8": (n, d), "int4": (n, (d + 1) // 2), "binary": (n, (d + 7) // 8)}[encoding]
    dtype = np.int8 if encoding == "int8" else np.uint8
    out = create_npy_memmap(tmp / FEATURE_FILES[encoding], dtype=dtype, shape=shape)
    lo, hi = _transformed_range(x, transform, rows) if encoding != "binary" else (None, None)
    enc = _BlockEncoder(encoding, lo, hi, d)
    acc = ErrorAccumulator(d)
    for a, b in _blocks(n, rows):
        block = np.asarray(x[a:b])
        codes = enc.encode(forward_transform(block, transform))
        out[a:b] = codes
        acc.add(block, inverse_transform(enc.decode(codes), transform))
    out.flush()
    del out
    if enc.scales is not None:
        np.save(tmp / SCALES_FILE, enc.scales)
    return acc.result(), enc.scales


def _alternative_errors(x: np.ndarray, encodings: list[str], transform: str, rows: int) -> dict[str, dict]:
    """Reconstruction error of each encoding in `encodings`, block by block, nothing written
    (binary is exact: it is only applicable to 0/1 features, and then not transformed)."""
    n, d = x.shape
    quantized = [e for e in encodings if e != "binary"]
    result = {e: {"max_abs_error": 0.0, "rel_rms_error": 0.0} for e in encodings if e == "binary"}
    if not quantized:
        return result
    lo, hi = _transformed_range(x, transform, rows)
    coders = {e: _BlockEncoder(e, lo, hi, d) for e in quantized}
    acc = {e: ErrorAccumulator(d) for e in quantized}
    for a, b in _blocks(n, rows):
        block = np.asarray(x[a:b])
        t = forward_transform(block, transform)
        for e, coder in coders.items():
            acc[e].add(block, inverse_transform(coder.decode(coder.encode(t)), transform))
    return {**result, **{e: a.result() for e, a in acc.items()}}


def _compress_features(canonical: Path, tmp: Path, cfg: CompressConfig) -> dict | None:
    graph = CanonicalGraph(canonical, {})
    path = graph.features_path
    if not graph.has_features:
        return None
    x = np.load(graph.verified(graph.FEATURES), mmap_mode="r", allow_pickle=False)
    if x.ndim != 2 or x.dtype != np.float32:
        raise ValueError(f"{path}: expected float32 [n, D] features, got {x.dtype} {x.shape}")
    n, d = x.shape
    rows = _rows_per_block(d, cfg.chunk_rows)
    t0 = time.perf_counter()
    binary = n > 0 and d > 0 and is_binary(x, chunk_rows=rows)
    encoding = cfg.feature_encoding
    if encoding == "auto":
        encoding = "binary" if binary else "int8"
    if encoding == "binary" and not binary:
        raise ValueError(
            f"{path}: feature_encoding='binary' needs features that are exactly 0 or 1; "
            "these are not — use 'int8', 'int4' or 'auto'"
        )
    transform = "none" if encoding == "binary" else cfg.feature_transform  # 0/1 bits need none
    errors, _ = _encode_features(x, encoding, transform, tmp, rows)
    seconds = time.perf_counter() - t0

    applicable = ["int8", "int4"] + (["binary"] if binary else [])
    others = {}
    if cfg.compare_encodings:
        others = _alternative_errors(x, [e for e in applicable if e != encoding], transform, rows)
    others[encoding] = errors
    fp32 = encoding_nbytes("fp32", n, d)
    table = {}
    for enc in applicable:
        nbytes = encoding_nbytes(enc, n, d)
        table[enc] = {"bytes": nbytes, "saving": 1 - nbytes / fp32 if fp32 else 0.0, **others.get(enc, {})}
    return {
        "encoding": encoding,
        "transform": transform,
        "rows": n,
        "dims": d,
        "binary_valued": bool(binary),
        "bytes_before": fp32,
        "bytes_after": encoding_nbytes(encoding, n, d),
        **errors,
        "encodings": table,
        "seconds": round(seconds, 3),
    }


# ----------------------------------------------------------------------------- weights


def _compress_weights(adjacency: Path, tmp: Path) -> dict:
    csr = load_csr(adjacency)
    indptr, weights = csr.indptr, csr.weights
    n, nnz = csr.n, csr.nnz
    t0 = time.perf_counter()
    q = create_npy_memmap(tmp / CompressedGraph.WEIGHTS_INT8, dtype=np.int8, shape=(nnz,))
    scale = create_npy_memmap(tmp / CompressedGraph.WEIGHT_SCALES, dtype=np.float32, shape=(n,))
    acc = ErrorAccumulator(1)
    for r0, r1, a, b in _csr_blocks(indptr, _WEIGHT_BLOCK):
        ptr = np.asarray(indptr[r0 : r1 + 1], dtype=np.int64) - a
        w = np.asarray(weights[a:b])
        q[a:b], scale[r0:r1] = quantize_int8_rows_csr(ptr, w)
        acc.add(w[:, None], dequantize_int8_rows_csr(ptr, q[a:b], scale[r0:r1])[:, None])
    q.flush()
    scale.flush()
    del q, scale
    return {
        "entries": nnz,
        "bytes_before": 4 * nnz,
        "bytes_after": nnz + 4 * n,
        **acc.result(),
        "seconds": round(time.perf_counter() - t0, 3),
    }


def _csr_blocks(indptr: np.ndarray, target: int) -> Iterator[tuple[int, int, int, int]]:
    """(r0, r1, first entry, end entry) of `graphs.kernels.quantize.csr_row_blocks`."""
    for r0, r1 in csr_row_blocks(indptr, target):
        yield r0, r1, int(indptr[r0]), int(indptr[r1])


# ----------------------------------------------------------------------------- Bloom filters


def _edge_batches(canonical: Path) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    return edge_batches(canonical, _EDGE_BATCH)


def _part_keys(src, dst, part, symmetrized: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(part, u, v) of every key one batch of edges contributes to the per-part filters."""
    ps, pd = part[src], part[dst]
    cut = ps != pd
    keys = [(ps, src, dst), (pd[cut], src[cut], dst[cut])]  # every edge in part[src], cut ones in part[dst] too
    if not symmetrized:  # the reversed pair goes to the same parts
        keys += [(ps, dst, src), (pd[cut], dst[cut], src[cut])]
    return tuple(np.concatenate(parts) for parts in zip(*keys))


def csr_contains(indptr: np.ndarray, indices: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """bool array: is (u[i], v[i]) an entry of the CSR? Columns must ascend within each row.

    All queries binary-search their row in lockstep (one vectorised step per halving), so
    the cost is O(q log max_degree) gathers and no O(nnz) memory; memmaps are fine.
    """
    u = np.asarray(u, dtype=np.int64)
    v = np.asarray(v, dtype=np.int64)
    lo = np.asarray(indptr[u], dtype=np.int64)
    hi = np.asarray(indptr[u + 1], dtype=np.int64)
    while True:
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) >> 1
        col = np.asarray(indices[np.where(active, mid, 0)], dtype=np.int64) if len(indices) else mid
        go_right = active & (col < v)
        lo = np.where(go_right, mid + 1, lo)
        hi = np.where(active & ~go_right, mid, hi)
    found = lo < np.asarray(indptr[u + 1], dtype=np.int64)
    found[found] = np.asarray(indices[lo[found]], dtype=np.int64) == v[found]
    return found


def _random_non_edges(n: int, count: int, indptr, indices, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` uniform pairs (u, v) in [0, n)^2 such that neither (u, v) nor (v, u) is in the CSR."""
    rng = np.random.default_rng(seed)
    us, vs, have = [], [], 0
    for _ in range(1000):
        need = count - have
        if need <= 0:
            break
        u, v = rng.integers(0, n, size=(2, need + need // 8 + 64))
        keep = ~(csr_contains(indptr, indices, u, v) | csr_contains(indptr, indices, v, u))
        us.append(u[keep][:need])
        vs.append(v[keep][:need])
        have += len(us[-1])
    if have < count:
        raise ValueError(f"could draw only {have} of {count} non-edges among {n} nodes; is the graph complete?")
    return np.concatenate(us), np.concatenate(vs)


def _build_filters(
    canonical: Path,
    adjacency: Path,
    part: np.ndarray,
    k: int,
    tmp: Path,
    cfg: CompressConfig,
    symmetrized: bool,
    num_edges: int,
) -> dict:
    t0 = time.perf_counter()
    counts = np.zeros(k, dtype=np.int64)
    for src, dst in _edge_batches(canonical):
        kp, _, _ = _part_keys(src, dst, part, symmetrized)
        counts += np.bincount(kp, minlength=k)
    from graphs.kernels.bloom import BloomFilter  # numba: imported by the stages that need it, not by readers

    filters = [BloomFilter.empty(int(c), fpr=cfg.bloom_fpr, seed=cfg.seed) for c in counts]
    for src, dst in _edge_batches(canonical):
        kp, u, v = _part_keys(src, dst, part, symmetrized)
        order = np.argsort(kp, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(np.bincount(kp, minlength=k))])
        u, v = u[order], v[order]
        for p in range(k):
            if bounds[p + 1] > bounds[p]:
                filters[p].add(u[bounds[p] : bounds[p + 1]], v[bounds[p] : bounds[p + 1]])
    build_seconds = time.perf_counter() - t0
    (tmp / "bloom").mkdir()
    for p, bf in enumerate(filters):
        bf.save(tmp / "bloom" / f"part-{p}.bloom")

    # False-positive rate on random non-edges: per filter, and routed (pair -> part[u]'s filter).
    n = len(part)
    indptr, indices, _ = load_csr(adjacency)
    per_part, routed = [0.0] * k, 0.0
    if n > 0:
        qu, qv = _random_non_edges(n, cfg.fpr_queries, indptr, indices, cfg.seed + 1)
        per_part = [float(np.count_nonzero(bf.might_contain(qu, qv))) / len(qu) for bf in filters]
        routed = float(np.count_nonzero(might_be_edge(filters, part, qu, qv))) / len(qu)
    keys = int(counts.sum())
    nbytes = sum(bf.nbytes for bf in filters)
    file_bytes = sum((tmp / "bloom" / f"part-{p}.bloom").stat().st_size for p in range(k))
    raw = 16 * num_edges
    return {
        "parts": k,
        "target_fpr": cfg.bloom_fpr,
        "num_hashes": filters[0].num_hashes if filters else 0,
        "keys": keys,
        "keys_per_part": counts.tolist(),
        "edges": num_edges,
        "bits_per_key": 8 * nbytes / keys if keys else 0.0,
        "bits_per_edge": 8 * file_bytes / num_edges if num_edges else 0.0,
        "fpr_queries": cfg.fpr_queries,
        "measured_fpr": routed,
        "measured_fpr_per_part": per_part,
        "measured_fpr_max": max(per_part, default=0.0),
        "expected_fpr_per_part": [bf.expected_fpr for bf in filters],
        "bytes_before": raw,
        "bytes_after": file_bytes,
        "saving": 1 - file_bytes / raw if raw else 0.0,
        "seconds": round(build_seconds, 3),
        "keys_per_second": round(keys / build_seconds) if build_seconds > 0 else 0,
    }


# ----------------------------------------------------------------------------- the stage


def build_compressed_graph(
    canonical_dir: str | os.PathLike,
    adjacency_dir: str | os.PathLike,
    partitions_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: CompressConfig | None = None,
) -> dict:
    """Write the compressed graph (files in the module docstring) into `out_dir`, atomically.

    Returns the summary dict that is also written as summary.json.
    """
    cfg = cfg or CompressConfig()
    t0 = time.perf_counter()
    canonical, adjacency, partitions = Path(canonical_dir), Path(adjacency_dir), Path(partitions_dir)
    _verify_inputs(canonical, adjacency, partitions)
    graph, parts = CanonicalGraph.open(canonical), Partitions.open(partitions)
    n, num_edges, symmetrized = graph.num_nodes, graph.num_edges, graph.symmetrized
    part = np.load(parts.path(parts.PART_ID), allow_pickle=False)
    if part.shape != (n,):
        raise ValueError(f"{parts.path(parts.PART_ID)}: {part.shape[0]} entries but the canonical graph has {n} nodes")
    k = max(int(part.max()) + 1 if n else 1, parts.num_parts)

    with atomic_output_dir(out_dir) as tmp:
        # the per-chunk and per-part arrays reuse the pages their predecessors freed (graphs.infra.host_memory)
        with reuse_freed_memory():
            features = _compress_features(canonical, tmp, cfg)
            weights = _compress_weights(adjacency, tmp)
            bloom = _build_filters(canonical, adjacency, part, k, tmp, cfg, symmetrized, num_edges)

        def totals(feature_bytes_after: int) -> dict:
            before = (features["bytes_before"] if features else 0) + weights["bytes_before"] + bloom["bytes_before"]
            after = feature_bytes_after + weights["bytes_after"] + bloom["bytes_after"]
            return {
                "bytes_before": before,
                "bytes_after": after,
                "ratio": before / after if after else 1.0,
                "saving": 1 - after / before if before else 0.0,
            }

        overall = totals(features["bytes_after"] if features else 0)
        if features:
            for row in features["encodings"].values():
                row["asset_ratio"] = totals(row["bytes"])["ratio"]
                row["asset_saving"] = totals(row["bytes"])["saving"]
        summary = {
            "format_version": FORMAT_VERSION,
            "nodes": n,
            "edges": num_edges,
            "symmetrized": symmetrized,
            "feature_encoding": features["encoding"] if features else None,
            "features": features,
            "weights": weights,
            "bloom": bloom,
            "total": overall,
            "config": asdict(cfg),
            "seconds": round(time.perf_counter() - t0, 3),
            "peak_rss_bytes": peak_rss_bytes(),
        }
        (tmp / CompressedGraph.MANIFEST).write_text(json.dumps(_manifest(tmp, summary, cfg), indent=2))
        write_summary(tmp, summary)
    return summary


def _verify_inputs(canonical: Path, adjacency: Path, partitions: Path) -> None:
    """Check every upstream file the stage reads against its folder's hashes.json before any
    work (`graphs.infra.storage.verify_inputs`; the readers check again, from the digest cache)."""
    verify_inputs(canonical, (CanonicalGraph.SUMMARY, CanonicalGraph.EDGES, CanonicalGraph.FEATURES))
    verify_inputs(adjacency, Adjacency.CSR_FILES)
    verify_inputs(partitions, (Partitions.PART_ID, Partitions.SUMMARY))


def _manifest(tmp: Path, summary: dict, cfg: CompressConfig) -> dict:
    files = {}
    for path in sorted(tmp.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(tmp).as_posix()
        entry = {"bytes": path.stat().st_size}
        if path.suffix == ".npy":
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
            entry.update(dtype=arr.dtype.name, shape=list(arr.shape))
        files[rel] = entry
    return {
        "format_version": FORMAT_VERSION,
        "nodes": summary["nodes"],
        "feature_encoding": summary["feature_encoding"],
        "feature_transform": summary["features"]["transform"] if summary["features"] else None,
        "feature_dims": summary["features"]["dims"] if summary["features"] else 0,
        "bloom_parts": summary["bloom"]["parts"],
        "bloom_directions": "both",
        "weights_align_with": f"{Adjacency.STAGE}/{Adjacency.INDPTR}, {Adjacency.INDICES}",
        "files": files,
        "config": asdict(cfg),
    }


# ----------------------------------------------------------------------------- readers


def load_features(out_dir: str | os.PathLike, mmap: bool = True, *, verify: bool = True) -> EncodedFeatures | None:
    """The compressed features (memory-mapped), or None without features. ``decode()`` and
    ``decode_rows_torch(rows, device)`` return float32 features, the transform undone.

    With `verify`, the manifest, codes and scales are first checked against the folder's
    hashes.json (`graphs.infra.storage.verified`, once per process and file). Training passes False:
    it checks the same files against the hashes the shards' manifest recorded
    (`graphs.formats.shard_format.read_manifest`), so each rank need not hash them twice.
    """
    art = CompressedGraph.open(out_dir, verify=verify)
    manifest = art.manifest
    encoding = manifest["feature_encoding"]
    if encoding is None:
        return None
    path = art.verified(FEATURE_FILES[encoding]) if verify else art.path(FEATURE_FILES[encoding])
    mode = "c" if mmap else None  # copy-on-write: writable for torch.from_numpy, the file never changes
    main = np.load(path, mmap_mode=mode, allow_pickle=False)
    d = int(manifest["feature_dims"])
    if encoding == "binary":
        arrays = {"packed": main}
    else:
        scales = np.load(art.verified(SCALES_FILE) if verify else art.path(SCALES_FILE), allow_pickle=False)
        arrays = {"q" if encoding == "int8" else "packed": main, "scale": scales[0], "zero_point": scales[1]}
    return EncodedFeatures(
        encoding=encoding,
        num_rows=main.shape[0],
        num_cols=d,
        arrays=arrays,
        transform=manifest.get("feature_transform") or "none",
    )


def load_weights(out_dir: str | os.PathLike, mmap: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(q int8 [nnz], scale float32 [n]); decode with ``dequantize_int8_rows_csr(indptr, q, scale)``.
    The files are checked against the folder's hashes.json first."""
    art = CompressedGraph.open(out_dir, verify=True)
    mode = "c" if mmap else None
    return (
        np.load(art.verified(art.WEIGHTS_INT8), mmap_mode=mode, allow_pickle=False),
        np.load(art.verified(art.WEIGHT_SCALES), mmap_mode=mode, allow_pickle=False),
    )


def load_bloom_filters(out_dir: str | os.PathLike) -> list[BloomFilter]:
    """The per-part filters, part 0 first (bit arrays memory-mapped), each file checked against
    the folder's hashes.json first (`BloomFilter.load` itself checks only the header)."""
    art = CompressedGraph.open(out_dir, verify=True)
    from graphs.kernels.bloom import BloomFilter

    return [BloomFilter.load(art.verified(art.bloom_file(p))) for p in range(int(art.manifest["bloom_parts"]))]


def might_be_edge(filters: list[BloomFilter], part: np.ndarray, u, v) -> np.ndarray:
    """bool array: False means (u[i], v[i]) is certainly not an edge; each pair asks the filter
    of u's part (which holds every edge incident to that part)."""
    u = np.asarray(u, dtype=np.int64)
    v = np.asarray(v, dtype=np.int64)
    u, v = np.broadcast_arrays(u, v)
    pu = np.asarray(part)[u.ravel()]
    out = np.zeros(u.size, dtype=bool)
    order = np.argsort(pu, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(pu, minlength=len(filters)))])
    uf, vf = u.ravel()[order], v.ravel()[order]
    for p, bf in enumerate(filters):
        a, b = bounds[p], bounds[p + 1]
        if b > a:
            out[order[a:b]] = bf.might_contain(uf[a:b], vf[a:b])
    return out.reshape(u.shape)


# ----------------------------------------------------------------------------- verification


def _sample_edges(canonical: Path, num_edges: int, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` edges of edges.parquet drawn without replacement (all when fewer), one streamed pass."""
    if num_edges <= count:
        picks = np.arange(num_edges, dtype=np.int64)
    else:
        picks = np.sort(np.random.default_rng(seed).choice(num_edges, size=count, replace=False))
    us, vs, start = [], [], 0
    for src, dst in _edge_batches(canonical):
        lo, hi = np.searchsorted(picks, [start, start + len(src)])
        local = picks[lo:hi] - start
        us.append(src[local])
        vs.append(dst[local])
        start += len(src)
    if not us:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(us), np.concatenate(vs)


def verify_compressed_graph(
    out_dir: str | os.PathLike,
    canonical_dir: str | os.PathLike,
    adjacency_dir: str | os.PathLike,
    partitions_dir: str | os.PathLike,
    *,
    sample_edges: int = 100_000,
    seed: int = 0,
) -> dict:
    """Re-read the written files and measure what the asset checks assert.

    Returns ``bloom_edges_checked`` and ``bloom_false_negatives`` (sampled true edges (u, v),
    each asked in both directions of both endpoints' part filters), and for the features and
    the weights the largest excess of |x - x̂| over its bound — half a quantization step plus
    float32 rounding, ``scale / 2 + 1e-4 scale + 4 ulp(max |x|)`` per column (features) or
    per row (weights); 0 for exact encodings — as ``feature_bound_excess`` /
    ``feature_columns_over_bound`` and ``weight_bound_excess`` / ``weight_rows_over_bound``.
    Features stored with ``feature_transform="asinh"`` are compared as asinh(x), where the
    quantizer's bound holds.
    """
    out, canonical, adjacency = Path(out_dir), Path(canonical_dir), Path(adjacency_dir)
    graph = CanonicalGraph.open(canonical, verify=True)
    parts = Partitions.open(partitions_dir)
    part = np.load(parts.verified(parts.PART_ID), allow_pickle=False)
    result = _bloom_misses(out, canonical, part, graph.num_edges, sample_edges, seed)
    feats = load_features(out)
    result.update(
        feature_encoding=feats.encoding if feats else None, feature_bound_excess=0.0, feature_columns_over_bound=0
    )
    if feats is not None:
        result.update(_feature_bound_excess(out, canonical, feats))
    result.update(_weight_bound_excess(out, adjacency))
    return result


def _bloom_misses(out: Path, canonical: Path, part: np.ndarray, edges: int, sample_edges: int, seed: int) -> dict:
    """Sampled true edges asked of the Bloom filters of both endpoints' parts, both directions; the misses."""
    filters = load_bloom_filters(out)
    u, v = _sample_edges(canonical, edges, sample_edges, seed)
    misses = np.zeros(len(u), dtype=bool)
    for a, b in ((u, v), (v, u)):
        for owner in (a, b):
            po = part[owner]
            for p, bf in enumerate(filters):
                sel = po == p
                if sel.any():
                    misses[sel] |= ~bf.might_contain(a[sel], b[sel])
    return {"bloom_edges_checked": int(len(u)), "bloom_false_negatives": int(np.count_nonzero(misses))}


def _feature_bound_excess(out: Path, canonical: Path, feats: EncodedFeatures) -> dict:
    """The largest excess of the decoded features' error over its bound per column, and the columns over it."""
    x = np.load(CanonicalGraph(canonical, {}).verified(CanonicalGraph.FEATURES), mmap_mode="r", allow_pickle=False)
    n, d = x.shape
    if (feats.num_rows, feats.num_cols) != (n, d):
        raise ValueError(f"{out}: features are {feats.num_rows} x {feats.num_cols}, canonical has {n} x {d}")
    # Compared where the quantizer worked: on asinh(x) when the features were transformed.
    step = np.zeros(d) if feats.encoding == "binary" else feats.arrays["scale"].astype(np.float64)
    acc = ErrorAccumulator(d)
    magnitude = np.zeros(d, dtype=np.float32)
    rows = _rows_per_block(d, 0)
    for a, b in _blocks(n, rows):
        t = forward_transform(x[a:b], feats.transform)
        if len(t):
            np.maximum(magnitude, np.abs(t).max(axis=0), out=magnitude)
        acc.add(t, _rows_of(feats, a, b).decode())
    bound = step * (0.5 + 1e-4) + 4 * np.spacing(magnitude).astype(np.float64)
    if feats.encoding == "binary":
        bound[:] = 0.0
    excess = acc.col_max - bound
    return {
        "feature_bound_excess": float(max(excess.max(initial=0.0), 0.0)),
        "feature_columns_over_bound": int(np.count_nonzero(excess > 0)),
    }


def _weight_bound_excess(out: Path, adjacency: Path) -> dict:
    """The largest excess of the int8 weights' error over its bound per row, and the rows over it."""
    indptr, _, weights = load_csr(adjacency)
    q, scale = load_weights(out)
    worst, rows_over = 0.0, 0
    for r0, r1, a, b in _csr_blocks(indptr, _WEIGHT_BLOCK):
        ptr = np.asarray(indptr[r0 : r1 + 1], dtype=np.int64) - a
        w = np.asarray(weights[a:b], dtype=np.float64)
        s = np.asarray(scale[r0:r1], dtype=np.float64)
        err = np.abs(w - dequantize_int8_rows_csr(ptr, np.asarray(q[a:b]), s.astype(np.float32)))
        counts = np.diff(ptr)
        row_err = np.zeros(r1 - r0)
        nonempty = counts > 0
        if err.size:
            row_err[nonempty] = np.maximum.reduceat(err, ptr[:-1][nonempty])
        row_max = s * 127
        bound = s * (0.5 + 1e-4) + 4 * np.spacing(row_max.astype(np.float32)).astype(np.float64)
        over = row_err - bound
        worst = max(worst, float(over.max(initial=0.0)))
        rows_over += int(np.count_nonzero(over > 0))
    return {"weight_bound_excess": worst, "weight_rows_over_bound": rows_over}
