"""The compressed_graph stage's node features: quantized block by block, every encoding's error measured.

`graphs.stages.compress` documents the files (``features_int8.npy``, ``features_int4.npy`` or
``features_binary.npy``, and ``feature_scales.npy``) and runs the stage; this module writes them
(`compress_features`) and checks them against the canonical features (`feature_bound_excess`).
The features are memory-mapped and encoded in row blocks of about 4M values (`_BlockEncoder`: every
block is quantized with the global per-column parameters a whole-array call would use), so memory
is one block; the codes are those of :mod:`graphs.kernels.quantize`, decoded by its
`EncodedFeatures`. `encoding_nbytes` gives the bytes of each encoding without encoding anything.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.compress_files import CompressedGraph
from graphs.formats.graph_schema import TypedSchema
from graphs.formats.npyrows import create_npy_memmap
from graphs.kernels.quantize import (
    EncodedFeatures,
    ErrorAccumulator,
    column_min_max,
    dequantize_int4_columns,
    dequantize_int8_columns,
    forward_transform,
    inverse_transform,
    is_binary,
    pack_binary,
    quantize_int4_columns,
    quantize_int8_columns,
    unpack_binary,
)

__all__ = ["compress_features", "encoding_nbytes", "feature_bound_excess"]

_BLOCK_ELEMENTS = 1 << 22  # elements per feature block (~32 MiB as float64)


# ----------------------------------------------------------------------------- sizes


def encoding_nbytes(encoding: str, n: int, d: int, types: int = 1) -> int:
    """Bytes of n x d features stored as `encoding` ("fp32", "int8", "int4", "binary"),
    the per-column scale and zero point included (one pair per column and node type)."""
    if encoding == "fp32":
        return 4 * n * d
    if encoding == "int8":
        return n * d + 8 * d * types
    if encoding == "int4":
        return n * ((d + 1) // 2) + 8 * d * types
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
    offsets = None if feats.type_offsets is None else feats.type_offsets - a
    return EncodedFeatures(feats.encoding, b - a, feats.num_cols, arrays, type_offsets=offsets)


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


class _TypeErrors:
    """A typed graph's reconstruction error per node type, on each type's own columns (its rows are
    one id range, `graphs.formats.graph_schema.TypedSchema`): ``rel_rms`` (RMS error over RMS
    value) and ``max_abs``, on each type's own quantization parameters."""

    def __init__(self, typed):
        self.types = [
            (name, int(typed.offsets[t]), int(typed.offsets[t + 1]), w)
            for t, (name, w) in enumerate(zip(typed.schema.node_types, typed.feat_widths))
            if w
        ]
        self.sums = {name: [0.0, 0.0, 0.0] for name, *_ in self.types}  # squared error, squared value, max

    def add(self, a: int, block: np.ndarray, decoded: np.ndarray) -> None:
        for name, first, last, width in self.types:
            lo, hi = max(first, a), min(last, a + len(block))
            if lo >= hi:
                continue
            diff = decoded[lo - a : hi - a, :width].astype(np.float64) - block[lo - a : hi - a, :width]
            s = self.sums[name]
            s[0] += float(np.sum(diff**2))
            s[1] += float(np.sum(block[lo - a : hi - a, :width].astype(np.float64) ** 2))
            s[2] = max(s[2], float(np.abs(diff).max(initial=0.0)))

    def result(self) -> dict:
        return {
            name: {"rel_rms": float(np.sqrt(e / v)) if v else float(np.sqrt(e)), "max_abs": m}
            for name, (e, v, m) in self.sums.items()
        }


def _segments(n: int, typed, encoding: str) -> list[tuple[int, int]]:
    """The row ranges quantized with parameters of their own: every node type's of a typed graph
    (its rows are one id range) for int8 / int4, else all rows."""
    if typed is None or encoding == "binary":
        return [(0, n)]
    return [(int(typed.offsets[t]), int(typed.offsets[t + 1])) for t in range(len(typed.counts))]


def _segment_coders(x: np.ndarray, encodings: list[str], transform: str, rows: int, s0: int, s1: int) -> dict:
    """A `_BlockEncoder` per encoding for rows s0:s1, from those rows' transformed range."""
    lo, hi = (None, None)
    if s1 > s0 and any(e != "binary" for e in encodings):
        lo, hi = _transformed_range(x[s0:s1], transform, rows)
    return {e: _BlockEncoder(e, lo, hi, x.shape[1]) for e in encodings}


def _unused_params(d: int) -> np.ndarray:
    """Scale 1 and zero point 0: the parameters of a node type without rows."""
    return np.stack([np.ones(d), np.zeros(d)]).astype(np.float32)


def _encode_features(
    x: np.ndarray, encoding: str, transform: str, tmp: Path, rows: int, typed=None
) -> tuple[dict, np.ndarray | None]:
    """Write the encoded features (and scales) into `tmp`; return (error summary, scales or None).
    For a typed graph (`typed`: its `TypedSchema`) each node type's rows are quantized with their own
    per-column parameters (scales [2, T, d]) and the summary holds each type's error (``node_types``)."""
    n, d = x.shape
    shape = {"int8": (n, d), "int4": (n, (d + 1) // 2), "binary": (n, (d + 7) // 8)}[encoding]
    dtype = np.int8 if encoding == "int8" else np.uint8
    out = create_npy_memmap(tmp / CompressedGraph.FEATURE_FILES[encoding], dtype=dtype, shape=shape)
    acc = ErrorAccumulator(d)
    per_type = _TypeErrors(typed) if typed is not None else None
    scales = []
    for s0, s1 in _segments(n, typed, encoding):
        enc = _segment_coders(x, [encoding], transform, rows, s0, s1)[encoding]
        for a, b in _blocks(s1 - s0, rows):
            a, b = a + s0, b + s0
            block = np.asarray(x[a:b])
            codes = enc.encode(forward_transform(block, transform))
            out[a:b] = codes
            decoded = inverse_transform(enc.decode(codes), transform)
            acc.add(block, decoded)
            if per_type is not None:
                per_type.add(a, block, decoded)
        scales.append(enc.scales if enc.scales is not None or encoding == "binary" else _unused_params(d))
    out.flush()
    del out
    stacked = None
    if encoding != "binary":
        stacked = scales[0] if len(scales) == 1 and typed is None else np.stack(scales, axis=1)
        np.save(tmp / CompressedGraph.FEATURE_SCALES, stacked)
    return acc.result() | ({"node_types": per_type.result()} if per_type else {}), stacked


def _alternative_errors(x: np.ndarray, encodings: list[str], transform: str, rows: int, typed=None) -> dict[str, dict]:
    """Reconstruction error of each encoding in `encodings`, block by block, nothing written
    (binary is exact: it is only applicable to 0/1 features, and then not transformed); int8 and
    int4 with the parameters the stage would use (per node type for a typed graph)."""
    n, d = x.shape
    quantized = [e for e in encodings if e != "binary"]
    result = {e: {"max_abs_error": 0.0, "rel_rms_error": 0.0} for e in encodings if e == "binary"}
    if not quantized:
        return result
    acc = {e: ErrorAccumulator(d) for e in quantized}
    for s0, s1 in _segments(n, typed, quantized[0]):
        coders = _segment_coders(x, quantized, transform, rows, s0, s1)
        for a, b in _blocks(s1 - s0, rows):
            block = np.asarray(x[a + s0 : b + s0])
            t = forward_transform(block, transform)
            for e, coder in coders.items():
                acc[e].add(block, inverse_transform(coder.decode(coder.encode(t)), transform))
    return {**result, **{e: a.result() for e, a in acc.items()}}


def compress_features(canonical: Path, tmp: Path, cfg) -> dict | None:
    """Write the encoded features (and scales) of the canonical graph in `canonical` into `tmp`;
    return their summary (encoding, bytes, errors, every applicable encoding's), None without
    features. `cfg` is the stage's `graphs.stages.compress.CompressConfig` (its feature_encoding,
    feature_transform, chunk_rows and compare_encodings)."""
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
    typed = TypedSchema.read(canonical)
    errors, scales = _encode_features(x, encoding, transform, tmp, rows, typed)
    seconds = time.perf_counter() - t0

    applicable = ["int8", "int4"] + (["binary"] if binary else [])
    others = {}
    if cfg.compare_encodings:
        others = _alternative_errors(x, [e for e in applicable if e != encoding], transform, rows, typed)
    others[encoding] = errors
    fp32 = encoding_nbytes("fp32", n, d)
    types = 1 if typed is None else len(typed.counts)
    table = {}
    for enc in applicable:
        nbytes = encoding_nbytes(enc, n, d, types)
        table[enc] = {"bytes": nbytes, "saving": 1 - nbytes / fp32 if fp32 else 0.0, **others.get(enc, {})}
    return {
        "encoding": encoding,
        "transform": transform,
        "rows": n,
        "dims": d,
        "binary_valued": bool(binary),
        "bytes_before": fp32,
        "bytes_after": encoding_nbytes(encoding, n, d, types),
        "type_offsets": None if scales is None or scales.ndim == 2 else [int(o) for o in typed.offsets],
        **errors,
        "encodings": table,
        "seconds": round(seconds, 3),
    }


def feature_bound_excess(out: Path, canonical: Path, feats: EncodedFeatures) -> dict:
    """The largest excess of the decoded features' error over its bound per column (per node type
    with per-type parameters), and the columns over it."""
    x = np.load(CanonicalGraph(canonical, {}).verified(CanonicalGraph.FEATURES), mmap_mode="r", allow_pickle=False)
    n, d = x.shape
    if (feats.num_rows, feats.num_cols) != (n, d):
        raise ValueError(f"{out}: features are {feats.num_rows} x {feats.num_cols}, canonical has {n} x {d}")
    if feats.encoding == "binary":
        segments = [(0, n, np.zeros(d))]
    elif feats.type_offsets is None:
        segments = [(0, n, feats.arrays["scale"])]
    else:
        o = feats.type_offsets
        segments = [(int(o[t]), int(o[t + 1]), feats.arrays["scale"][t]) for t in range(len(o) - 1)]
    worst, over = 0.0, np.zeros(d, dtype=bool)
    rows = _rows_per_block(d, 0)
    for s0, s1, step in segments:
        # Compared where the quantizer worked: on asinh(x) when the features were transformed.
        acc = ErrorAccumulator(d)
        magnitude = np.zeros(d, dtype=np.float32)
        for a, b in _blocks(s1 - s0, rows):
            t = forward_transform(x[s0 + a : s0 + b], feats.transform)
            if len(t):
                np.maximum(magnitude, np.abs(t).max(axis=0), out=magnitude)
            acc.add(t, _rows_of(feats, s0 + a, s0 + b).decode())
        bound = np.asarray(step, dtype=np.float64) * (0.5 + 1e-4) + 4 * np.spacing(magnitude).astype(np.float64)
        if feats.encoding == "binary":
            bound[:] = 0.0
        excess = acc.col_max - bound
        worst = max(worst, float(excess.max(initial=0.0)))
        over |= excess > 0
    return {"feature_bound_excess": worst, "feature_columns_over_bound": int(np.count_nonzero(over))}
