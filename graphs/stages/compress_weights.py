"""The compressed_graph stage's edge weights: Â's FP32 weights as INT8 with one scale per CSR row.

`graphs.stages.compress` documents the files (``weights_int8.npy``, ``weight_scales.npy``) and
reads them (`graphs.stages.compress.load_weights`); this module writes them from
normalized_adjacency's CSR in blocks of about 16M entries (`compress_weights`) and checks them
against it (`weight_bound_excess`). The codes are those of
`graphs.kernels.quantize_csr.quantize_int8_rows_csr`: symmetric per row, weight = q * scale[row].
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import numpy as np

from graphs.formats.compress_files import CompressedGraph
from graphs.formats.npyrows import create_npy_memmap
from graphs.kernels.quantize import ErrorAccumulator
from graphs.kernels.quantize_csr import csr_row_blocks, dequantize_int8_rows_csr, quantize_int8_rows_csr
from graphs.stages.normalize import CSR, load_csr

__all__ = ["compress_weights", "weight_bound_excess"]

_WEIGHT_BLOCK = 1 << 24  # CSR entries per weight block


def compress_weights(adjacency: Path, tmp: Path) -> dict:
    """Write the INT8 weights and per-row scales of normalized_adjacency's CSR in `adjacency`
    into `tmp`; return their summary (entries, bytes, reconstruction error, seconds)."""
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
    """(r0, r1, first entry, end entry) of `graphs.kernels.quantize_csr.csr_row_blocks`."""
    for r0, r1 in csr_row_blocks(indptr, target):
        yield r0, r1, int(indptr[r0]), int(indptr[r1])


def weight_bound_excess(csr: CSR, q: np.ndarray, scale: np.ndarray) -> dict:
    """The largest excess of the int8 weights' error over its bound per row, and the rows over it:
    `q` and `scale` as `graphs.stages.compress.load_weights` reads them, `csr` normalized_adjacency's."""
    indptr, _, weights = csr
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
