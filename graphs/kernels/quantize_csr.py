"""Per-row INT8 of CSR edge weights (the layout in `graphs.kernels.quantize`'s docstring): the
normalized adjacency's weights in compressed_graph and the shards' INT8 block weights.

``indptr`` is int64 [R + 1], the usual CSR row pointer into ``q`` / the weights; ``scale[r] =
max_i |w_i| / 127`` over row r's entries, so ``q * scale[row]`` is within ``scale[row] / 2``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

__all__ = ["csr_row_blocks", "dequantize_int8_rows_csr", "quantize_int8_rows_csr"]

_BLOCK_ELEMENTS = 1 << 22  # entries quantized at a time


def _check_csr(indptr: np.ndarray, nnz: int, what: str) -> np.ndarray:
    indptr = np.asarray(indptr)
    if indptr.ndim != 1 or indptr.size == 0 or indptr.dtype.kind not in "iu":
        raise ValueError(f"{what}: indptr must be a 1-d integer array [R + 1], got {indptr.dtype} {indptr.shape}")
    if indptr[0] != 0 or indptr[-1] != nnz:
        raise ValueError(f"{what}: indptr must start at 0 and end at nnz={nnz}, got {indptr[0]} .. {indptr[-1]}")
    if indptr.size > 1 and (np.diff(indptr) < 0).any():
        raise ValueError(f"{what}: indptr is not non-decreasing")
    return indptr.astype(np.int64, copy=False)


def csr_row_blocks(indptr: np.ndarray, target_nnz: int) -> Iterator[tuple[int, int]]:
    """(r0, r1) row ranges of a CSR holding about target_nnz entries each (at least one row):
    how every streamed pass over a CSR (quantizing, checking, splitting Â) walks its rows."""
    rows = indptr.size - 1
    r0 = 0
    while r0 < rows:
        r1 = int(np.searchsorted(indptr, indptr[r0] + target_nnz, side="right")) - 1
        r1 = min(rows, max(r0 + 1, r1))
        yield r0, r1
        r0 = r1


def quantize_int8_rows_csr(
    indptr: np.ndarray, weights: np.ndarray, *, block_nnz: int = _BLOCK_ELEMENTS
) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row INT8 of CSR values -> (q int8 [nnz], scale float32 [R]) with
    scale[r] = max |w| of row r / 127 (0 for empty or all-zero rows); q * scale[row] is
    within scale[row] / 2 of w."""
    weights = np.asarray(weights)
    if weights.ndim != 1 or weights.dtype.kind != "f":
        raise ValueError(f"quantize_int8_rows_csr: weights must be 1-d float, got {weights.dtype} {weights.shape}")
    indptr = _check_csr(indptr, weights.size, "quantize_int8_rows_csr")
    rows = indptr.size - 1
    q = np.empty(weights.size, dtype=np.int8)
    scale = np.zeros(rows, dtype=np.float32)
    for r0, r1 in csr_row_blocks(indptr, block_nnz):
        a, b = int(indptr[r0]), int(indptr[r1])
        seg = np.abs(np.asarray(weights[a:b], dtype=np.float64))
        if not np.isfinite(seg).all():
            i = int(np.flatnonzero(~np.isfinite(seg))[0]) + a
            row = int(np.searchsorted(indptr, i, side="right")) - 1
            raise ValueError(f"quantize_int8_rows_csr: weight {weights[i]!r} at entry {i} (row {row}) is not finite")
        counts = np.diff(indptr[r0 : r1 + 1])
        nonempty = counts > 0
        rowmax = np.zeros(r1 - r0, dtype=np.float64)
        if seg.size:
            # reduceat over the starts of non-empty rows only: an empty row's start equals the
            # next row's start and would otherwise read one element of the next row.
            rowmax[nonempty] = np.maximum.reduceat(seg, indptr[r0:r1][nonempty] - a)
        s = (rowmax / 127.0).astype(np.float32)
        scale[r0:r1] = s
        inv = np.divide(1.0, s.astype(np.float64), out=np.zeros(s.shape), where=s > 0)
        vals = np.asarray(weights[a:b], dtype=np.float64) * np.repeat(inv, counts)
        np.rint(vals, out=vals)
        np.clip(vals, -127, 127, out=vals)
        q[a:b] = vals
    return q, scale


def dequantize_int8_rows_csr(indptr: np.ndarray, q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """float32 [nnz] = q * scale[row of each entry]."""
    indptr = _check_csr(indptr, q.size, "dequantize_int8_rows_csr")
    scale = np.asarray(scale, dtype=np.float32)
    if scale.shape != (indptr.size - 1,):
        raise ValueError(f"dequantize_int8_rows_csr: scale must be ({indptr.size - 1},), got {scale.shape}")
    return q.astype(np.float32) * np.repeat(scale, np.diff(indptr))
