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
``feature_scales.npy``          float32 [2, D], or [2, T, D]      int8 / int4 only: [0] the
                                  for a typed graph               per-column scale, [1] the
                                                                  zero point; a typed graph's
                                                                  per node type (T types, rows
                                                                  at the manifest's
                                                                  ``feature_type_offsets``)
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
:func:`graphs.kernels.quantize_csr.dequantize_int8_rows_csr`), e.g. to ship a graph or run full-graph
inference from it. The shards do not read them: a sampled block's weights are Â times a
sampler correction (neighbour rescaling, importance and SAINT normalization) that changes
each destination row's maximum, so INT8 shard weights are quantized per block row from
Â's FP32 weights (`graphs.formats.shard_format`).
With ``feature_transform="asinh"`` the int8 / int4 codes are those of asinh(x) (per-column
range of asinh(x), same layout) and the features are sinh of the decoded values; the
manifest's ``feature_transform`` says which. Heavy-tailed columns need it for 4 bits: on
log-normal features whose column maximum is far above the median, 16 equal steps over
[min, max] put almost every value in the lowest bucket (benchmarks/compression.py measures
the accuracy of each encoding with and without the transform).
The CSR structure (``indptr``, ``indices``) is not copied: it stays in normalized_adjacency
and is counted on neither side of the compression ratio. Decoding is one vectorised step
(:func:`load_features` gives a :class:`graphs.kernels.quantize.EncodedFeatures` carrying the
transform, whose ``decode_rows_torch(rows, device)`` decodes a batch on the training
device with the transform undone; minibatch_shards references these files rather than
copying them, see `graphs.formats.shard_format`;
:func:`graphs.kernels.quantize_torch.dequantize_int8_rows_csr_torch` decodes the weights).

Edge sets: for part p the filter holds every canonical edge (u, v) with ``part[u] == p``
or ``part[v] == p``; for a directed canonical graph the reversed pair (v, u) is inserted as
well, so "(u, v) may be an edge" can be asked in either direction. Any pair whose source
(or target) lives in part p is answered by filter p alone:
:func:`graphs.stages.compress_bloom.might_be_edge` routes each query to ``part[u]``'s filter.
A cut edge is stored in two filters, so the edge sets hold ``E + cut`` keys for ``E``
canonical edges.

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

This module holds the settings (`CompressConfig`), runs the stage, writes the manifest and reads
the files back; each part is written and checked by its own module beside it:
`graphs.stages.compress_features`, `graphs.stages.compress_weights` and
`graphs.stages.compress_bloom`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from graphs.kernels.bloom import BloomFilter

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.partition_files import Partitions
from graphs.infra.config_checks import MAX_ROWS, MAX_SEED, bounded_repr, check_fields
from graphs.infra.host_memory import reuse_freed_memory
from graphs.infra.storage import atomic_output_dir, peak_rss_bytes, verify_inputs, write_summary
from graphs.kernels.quantize import FEATURE_TRANSFORMS, EncodedFeatures
from graphs.stages.compress_bloom import bloom_misses, build_filters
from graphs.stages.compress_features import compress_features, feature_bound_excess
from graphs.stages.compress_weights import compress_weights, weight_bound_excess
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
]

FORMAT_VERSION = CompressedGraph.FORMAT_VERSION
FEATURE_ENCODINGS = ("auto", "int8", "int4", "binary")
FEATURE_FILES = CompressedGraph.FEATURE_FILES
SCALES_FILE = CompressedGraph.FEATURE_SCALES


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
            features = compress_features(canonical, tmp, cfg)
            weights = compress_weights(adjacency, tmp)
            bloom = build_filters(canonical, adjacency, part, k, tmp, cfg, symmetrized, num_edges)

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
        "feature_type_offsets": summary["features"]["type_offsets"] if summary["features"] else None,
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
    offsets = manifest.get("feature_type_offsets")
    return EncodedFeatures(
        encoding=encoding,
        num_rows=main.shape[0],
        num_cols=d,
        arrays=arrays,
        transform=manifest.get("feature_transform") or "none",
        type_offsets=None if offsets is None else np.asarray(offsets, dtype=np.int64),
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
    from graphs.kernels.bloom import BloomFilter  # lazy: numba kernels, ~0.14 s, wanted only here

    return [BloomFilter.load(art.verified(art.bloom_file(p))) for p in range(int(art.manifest["bloom_parts"]))]


# ----------------------------------------------------------------------------- verification


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
    result = bloom_misses(load_bloom_filters(out), canonical, part, graph.num_edges, sample_edges, seed)
    feats = load_features(out)
    result.update(
        feature_encoding=feats.encoding if feats else None, feature_bound_excess=0.0, feature_columns_over_bound=0
    )
    if feats is not None:
        result.update(feature_bound_excess(out, canonical, feats))
    csr = load_csr(adjacency)
    result.update(weight_bound_excess(csr, *load_weights(out)))
    return result
