"""Compact encodings of node features, with exact or bounded error (edge weights' INT8 is
`graphs.kernels.quantize_csr`).

Four feature encodings (``encode_features(x, encoding)``) and one edge-weight encoding.
``n`` rows (nodes), ``d`` columns (feature dims), ``nnz`` stored edges, ``R`` CSR rows.

================  ===========================================  =================================
encoding          arrays (dtype, shape)                        reconstruction, max abs error
================  ===========================================  =================================
``"fp32"``        x float32 [n, d]                             x, exact
``"int8"``        q int8 [n, d]; scale float32 [d];            q * scale + zero_point,
                  zero_point float32 [d]                       <= scale / 2 per column
``"int4"``        packed uint8 [n, ceil(d/2)]; scale float32   q * scale + zero_point with
                  [d]; zero_point float32 [d]                  q in 0..15, <= scale / 2
``"binary"``      packed uint8 [n, ceil(d/8)]                  the 0/1 bits, exact
CSR rows, int8    q int8 [nnz]; scale float32 [R]              q * scale[row], <= scale[row] / 2
================  ===========================================  =================================

Details
-------
* Per-column affine INT8: with the column's min and max, ``scale = (max - min) / 255`` and
  ``zero_point = min + 128 * scale``, so ``q = -128`` decodes to min and ``q = 127`` to max
  (where fl((max - min) / 255) would decode an endpoint an ulp off, the scale is nudged by
  up to 3 float32 ulps if that makes both decode exactly). 0/1 columns such as Cora's decode
  exactly under INT8 and 4-bit alike. A constant column gets ``scale = 0`` and decodes
  exactly to its value.
* 4-bit: ``scale = (max - min) / 15``, ``zero_point = min``, ``q = 0..15``. Two values per
  byte along the row: byte ``j`` of row ``i`` holds column ``2j`` in its low nibble and
  column ``2j + 1`` in its high nibble (an odd ``d`` pads the last high nibble with 0).
* Binary: only for features whose every value is exactly 0.0 or 1.0 (``is_binary``).
  ``np.packbits(..., axis=1, bitorder="little")``: bit ``b`` (LSB = 0) of byte ``j`` of row
  ``i`` is column ``8j + b``; trailing bits of the last byte are 0.
* Per node type (a typed graph's features, `EncodedFeatures.type_offsets`): int8 and 4-bit
  with scale and zero_point [T, d], each type's rows (one id range) quantized over their own
  column ranges; decoding takes each row's node id to pick its type's parameters.
* CSR rows (`graphs.kernels.quantize_csr`): symmetric per-row INT8, ``scale[r] = max_i |w_i| /
  127`` over the row's entries, ``q = round(w / scale[r])`` in -127..127; empty and all-zero
  rows get ``scale = 0``.

Dequantization is one vectorised expression in both NumPy and torch (``q.float() * scale +
zero_point`` after gathering the batch's rows); the torch decoders (`graphs.kernels.quantize_torch`)
run on the device that holds the compact arrays, and decode bit-identically to NumPy.

Every pass reads the input in blocks of rows, so ``x`` may be a ``np.memmap`` of a
10M x 64 feature file: the column min/max pass and the quantize pass hold one block in
float64 at a time, never a float64 copy of the whole array. ``out=`` lets the quantized
array itself be a memmap (e.g. ``np.lib.format.open_memmap``). NaN or infinite input raises
ValueError naming the row and column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

import numpy as np

from graphs.formats.npyrows import take_rows
from graphs.kernels.quantize_torch import (
    dequantize_int4_rows_torch,
    dequantize_rows_torch,
    torch_param,
    unpack_binary_torch,
)

if TYPE_CHECKING:  # torch is imported lazily: the NumPy half must not pay for it
    import torch

__all__ = [
    "ENCODINGS",
    "ErrorAccumulator",
    "FEATURE_TRANSFORMS",
    "EncodedFeatures",
    "forward_transform",
    "inverse_transform",
    "column_min_max",
    "quantize_int8_columns",
    "dequantize_int8_columns",
    "quantize_int4_columns",
    "unpack_int4",
    "dequantize_int4_columns",
    "binary_columns",
    "is_binary",
    "pack_binary",
    "unpack_binary",
    "encode_features",
    "choose_encoding",
    "reconstruction_error",
]

ENCODINGS = ("fp32", "int8", "int4", "binary")

# Elements per block in the chunked passes (~32 MiB as float64).
_BLOCK_ELEMENTS = 1 << 22


def _block_rows(num_cols: int, chunk_rows: int | None) -> int:
    if chunk_rows is not None:
        if chunk_rows <= 0:
            raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
        return int(chunk_rows)
    return max(1, _BLOCK_ELEMENTS // max(1, num_cols))


def _row_blocks(n: int, rows: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, rows):
        yield start, min(n, start + rows)


def _check_2d(x: np.ndarray, what: str) -> None:
    if x.ndim != 2:
        raise ValueError(f"{what}: expected a 2-d [n, d] array, got shape {x.shape}")
    if x.dtype.kind != "f":
        raise TypeError(f"{what}: expected floating-point features, got dtype {x.dtype}")


def _raise_non_finite(block: np.ndarray, row_offset: int, what: str) -> None:
    r, c = np.argwhere(~np.isfinite(block))[0]
    raise ValueError(
        f"{what}: value {block[r, c]!r} at row {row_offset + r}, column {c}; "
        "features must be finite (impute or drop NaN/inf before compressing)"
    )


def column_min_max(x: np.ndarray, *, chunk_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-column (min, max) of a float [n, d] array as float32 [d], read in row blocks.
    Raises ValueError at the first NaN/inf (with its row and column) or when n == 0."""
    _check_2d(x, "column_min_max")
    n, d = x.shape
    if n == 0:
        raise ValueError("column_min_max: the feature array has no rows")
    lo = np.full(d, np.inf, dtype=np.float64)
    hi = np.full(d, -np.inf, dtype=np.float64)
    for a, b in _row_blocks(n, _block_rows(d, chunk_rows)):
        block = np.asarray(x[a:b])
        if not np.isfinite(block).all():
            _raise_non_finite(block, a, "column_min_max")
        np.minimum(lo, block.min(axis=0), out=lo)
        np.maximum(hi, block.max(axis=0), out=hi)
    return lo.astype(np.float32), hi.astype(np.float32)


def _affine_params(lo: np.ndarray, hi: np.ndarray, qmin: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 (scale, zero_point) with qmin -> lo and qmax -> hi, nudging the scale by up
    to 3 ulps where that makes both endpoints decode exactly in float32."""
    lo = lo.astype(np.float32)
    hi = hi.astype(np.float32)
    base = ((hi.astype(np.float64) - lo.astype(np.float64)) / (qmax - qmin)).astype(np.float32)
    fqmin, fqmax = np.float32(qmin), np.float32(qmax)
    scale = base.copy()
    zero = (lo - fqmin * scale).astype(np.float32)
    exact = (fqmin * scale + zero == lo) & (fqmax * scale + zero == hi)
    for step in (1, -1, 2, -2, 3, -3):
        if exact.all():
            break
        cand = base.copy()
        towards = np.float32(np.inf) if step > 0 else np.float32(0)
        for _ in range(abs(step)):
            cand = np.nextafter(cand, towards).astype(np.float32)
        cand_zero = (lo - fqmin * cand).astype(np.float32)
        ok = (fqmin * cand + cand_zero == lo) & (fqmax * cand + cand_zero == hi) & (base > 0)
        take = ok & ~exact
        scale[take] = cand[take]
        zero[take] = cand_zero[take]
        exact |= take
    const = hi == lo
    scale[const] = 0.0
    zero[const] = lo[const]
    return scale, zero


def _quantize_block(block: np.ndarray, scale: np.ndarray, zero: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    """round((x - zero) / scale) clipped to [qmin, qmax], in float64 for one row block."""
    inv = np.divide(1.0, scale.astype(np.float64), out=np.zeros(scale.shape), where=scale > 0)
    q = (block.astype(np.float64) - zero.astype(np.float64)) * inv
    np.rint(q, out=q)
    np.clip(q, qmin, qmax, out=q)
    return q


# ---------------------------------------------------------------------------------------
# Per-column INT8
# ---------------------------------------------------------------------------------------


def quantize_int8_columns(
    x: np.ndarray, *, chunk_rows: int | None = None, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-column affine INT8 of float features [n, d] -> (q int8 [n, d], scale float32 [d],
    zero_point float32 [d]); ``q * scale + zero_point`` is within scale / 2 of x.
    `out` (int8 [n, d], e.g. a memmap) receives q if given."""
    _check_2d(x, "quantize_int8_columns")
    n, d = x.shape
    lo, hi = column_min_max(x, chunk_rows=chunk_rows)
    scale, zero = _affine_params(lo, hi, -128, 127)
    q = _out_array(out, (n, d), np.int8, "quantize_int8_columns")
    for a, b in _row_blocks(n, _block_rows(d, chunk_rows)):
        q[a:b] = _quantize_block(np.asarray(x[a:b]), scale, zero, -128, 127)
    return q, scale, zero


def dequantize_int8_columns(
    q: np.ndarray,
    scale: np.ndarray,
    zero_point: np.ndarray,
    *,
    chunk_rows: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """float32 [n, d] = q * scale + zero_point (q int8 [n, d], scale / zero_point [d], or [n, d]:
    each row's own)."""
    if q.ndim != 2 or q.dtype != np.int8:
        raise ValueError(f"dequantize_int8_columns: q must be int8 [n, d], got {q.dtype} {q.shape}")
    n, d = q.shape
    scale, zero = _check_params(scale, zero_point, d, "dequantize_int8_columns", n)
    x = _out_array(out, (n, d), np.float32, "dequantize_int8_columns")
    for a, b in _row_blocks(n, _block_rows(d, chunk_rows)):
        s, z = (scale, zero) if scale.ndim == 1 else (scale[a:b], zero[a:b])
        x[a:b] = np.asarray(q[a:b]).astype(np.float32) * s + z
    return x


def _check_params(scale, zero_point, d: int, what: str, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """float32 scale and zero point: one per column ([d]), or with `n` given also one per row and
    column ([n, d], the parameters of each row's node type)."""
    scale = np.asarray(scale, dtype=np.float32)
    zero = np.asarray(zero_point, dtype=np.float32)
    shapes = ((d,),) if n is None else ((d,), (n, d))
    if scale.shape not in shapes or zero.shape != scale.shape:
        raise ValueError(f"{what}: scale {scale.shape} and zero_point {zero.shape} must both be one of {shapes}")
    return scale, zero


def _out_array(out, shape, dtype, what: str) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=dtype)
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"{what}: out must be {np.dtype(dtype)} {tuple(shape)}, got {out.dtype} {out.shape}")
    return out


# ---------------------------------------------------------------------------------------
# Per-column 4-bit, two values per byte
# ---------------------------------------------------------------------------------------


def quantize_int4_columns(
    x: np.ndarray, *, chunk_rows: int | None = None, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-column 4-bit affine quantization of float [n, d] -> (packed uint8 [n, ceil(d/2)],
    scale float32 [d], zero_point float32 [d]); decodes within scale / 2."""
    _check_2d(x, "quantize_int4_columns")
    n, d = x.shape
    lo, hi = column_min_max(x, chunk_rows=chunk_rows)
    scale, zero = _affine_params(lo, hi, 0, 15)
    packed = _out_array(out, (n, (d + 1) // 2), np.uint8, "quantize_int4_columns")
    for a, b in _row_blocks(n, _block_rows(d, chunk_rows)):
        q = _quantize_block(np.asarray(x[a:b]), scale, zero, 0, 15).astype(np.uint8)
        if d % 2:
            q = np.concatenate([q, np.zeros((b - a, 1), dtype=np.uint8)], axis=1)
        packed[a:b] = q[:, 0::2] | (q[:, 1::2] << 4)
    return packed, scale, zero


def unpack_int4(packed: np.ndarray, num_cols: int) -> np.ndarray:
    """uint8 [n, num_cols] of 4-bit codes (0..15) from packed uint8 [n, ceil(num_cols/2)]."""
    _check_packed(packed, (num_cols + 1) // 2, "unpack_int4")
    nib = np.stack((packed & 0x0F, packed >> 4), axis=-1)
    return nib.reshape(packed.shape[0], -1)[:, :num_cols]


def dequantize_int4_columns(packed: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, num_cols: int) -> np.ndarray:
    """float32 [n, num_cols] = code * scale + zero_point (per column, or [n, num_cols] per row)."""
    scale, zero = _check_params(scale, zero_point, num_cols, "dequantize_int4_columns", len(packed))
    return unpack_int4(packed, num_cols).astype(np.float32) * scale + zero


def _check_packed(packed: np.ndarray, width: int, what: str) -> None:
    if packed.ndim != 2 or packed.dtype != np.uint8 or packed.shape[1] != width:
        raise ValueError(f"{what}: expected uint8 [n, {width}], got {packed.dtype} {packed.shape}")


# ---------------------------------------------------------------------------------------
# Bit-packed 0/1 features
# ---------------------------------------------------------------------------------------


def binary_columns(x: np.ndarray, *, chunk_rows: int | None = None) -> np.ndarray:
    """bool [d]: column j holds only the exact values 0.0 and 1.0."""
    _check_2d(x, "binary_columns")
    n, d = x.shape
    ok = np.ones(d, dtype=bool)
    for a, b in _row_blocks(n, _block_rows(d, chunk_rows)):
        block = np.asarray(x[a:b])
        ok &= ((block == 0) | (block == 1)).all(axis=0)
        if not ok.any():
            break
    return ok


def is_binary(x: np.ndarray, *, chunk_rows: int | None = None) -> bool:
    """True when every value of x is exactly 0.0 or 1.0."""
    return bool(binary_columns(x, chunk_rows=chunk_rows).all())


def pack_binary(x: np.ndarray, *, chunk_rows: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """packed uint8 [n, ceil(d/8)] of 0/1 features (bitorder little, see module docstring).
    Raises ValueError naming the first value that is not exactly 0 or 1."""
    _check_2d(x, "pack_binary")
    n, d = x.shape
    packed = _out_array(out, (n, (d + 7) // 8), np.uint8, "pack_binary")
    for a, b in _row_blocks(n, _block_rows(d, chunk_rows)):
        block = np.asarray(x[a:b])
        bad = (block != 0) & (block != 1)
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise ValueError(
                f"pack_binary: value {block[r, c]!r} at row {a + r}, column {c} is not 0 or 1; "
                "use the int8 or int4 encoding for these features"
            )
        packed[a:b] = np.packbits(block.astype(np.uint8), axis=1, bitorder="little")
    return packed


def unpack_binary(packed: np.ndarray, num_cols: int, dtype=np.float32) -> np.ndarray:
    """[n, num_cols] array of 0/1 (float32 by default) from packed uint8 [n, ceil(num_cols/8)]."""
    _check_packed(packed, (num_cols + 7) // 8, "unpack_binary")
    bits = np.unpackbits(packed, axis=1, count=num_cols, bitorder="little")
    return bits.astype(dtype, copy=False)


# ---------------------------------------------------------------------------------------
# Convenience: one call per encoding, sizes and errors
# ---------------------------------------------------------------------------------------


FEATURE_TRANSFORMS = ("none", "asinh")
"""What the codes encode: the features themselves, or asinh of them (heavy-tailed columns)."""


def forward_transform(x: np.ndarray, transform: str) -> np.ndarray:
    """float32 values the quantizer sees: x itself, or asinh(x) (computed in float32)."""
    x = np.asarray(x, dtype=np.float32)
    return np.arcsinh(x) if transform == "asinh" else x


def inverse_transform(y: np.ndarray, transform: str) -> np.ndarray:
    """float32 features from decoded values: y itself, or sinh(y)."""
    return np.sinh(y).astype(np.float32, copy=False) if transform == "asinh" else y


_MAIN_ARRAY = {"fp32": "x", "int8": "q", "int4": "packed", "binary": "packed"}


@dataclass(frozen=True)
class EncodedFeatures:
    """Node features in one of the ENCODINGS, with everything needed to decode them.

    Reading a batch: ``rows = feats.gather(nodes)`` takes the compact rows (NumPy, e.g.
    from a memory map), then ``decode_gathered(rows)`` (NumPy) or
    ``decode_gathered_torch(torch_rows)`` (on the rows' device, so only compact bytes
    move) gives float32 features with the transform undone.

    It holds arrays, not files: the files behind them are checked where they are opened,
    against compressed_graph's hashes.json (`graphs.stages.compress.load_features`) or, in training,
    against the SHA-256 the shards' manifest recorded (`graphs.formats.shard_format.read_manifest` with
    ``training.verify_shards``, the default).
    """

    encoding: str
    """One of "fp32", "int8", "int4", "binary"."""
    num_rows: int
    """n, the number of feature rows (nodes)."""
    num_cols: int
    """d, the feature dimension."""
    arrays: dict[str, np.ndarray] = field(repr=False)
    """fp32: {"x"}; int8: {"q", "scale", "zero_point"}; int4: {"packed", "scale",
    "zero_point"}; binary: {"packed"} (dtypes and shapes in the module docstring)."""
    transform: str = "none"
    """One of FEATURE_TRANSFORMS: with "asinh" the codes hold asinh(x) and every decode
    returns sinh of the decoded values."""
    type_offsets: np.ndarray | None = field(default=None, repr=False)
    """A typed graph's int8 / int4 codes: int64 [T + 1], node type t's rows are
    ``type_offsets[t] .. type_offsets[t + 1] - 1``, and scale and zero_point are [T, d], each
    type's own parameters; every decode then takes the rows' node ids. None: one per column."""

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays together."""
        return int(sum(a.nbytes for a in self.arrays.values()))

    @property
    def fp32_nbytes(self) -> int:
        """Bytes of the same features as float32 [n, d]."""
        return 4 * self.num_rows * self.num_cols

    @property
    def saving(self) -> float:
        """1 - nbytes / fp32_nbytes (0.75 means 75% smaller)."""
        return 1.0 - self.nbytes / self.fp32_nbytes if self.fp32_nbytes else 0.0

    @property
    def codes(self) -> np.ndarray:
        """The per-row array (x, q or packed): what `gather` takes rows of."""
        return self.arrays[_MAIN_ARRAY[self.encoding]]

    def gather(self, nodes: np.ndarray, release: bool = False) -> np.ndarray:
        """The compact rows of `nodes` (np.take on the plain array: ~3x faster than fancy
        indexing an np.memmap). ``release``: gathered window by window with the file's pages
        dropped from this process's RSS after each (`graphs.formats.npyrows.take_rows`), for a reader
        that sweeps the whole file (the streamed full-graph evaluation)."""
        codes = self.codes
        if release:
            return take_rows(codes, nodes)
        if isinstance(codes, np.memmap):
            codes = codes.view(np.ndarray)  # still backed by the file mapping
        return np.take(codes, nodes, axis=0)

    def _params(self, nodes) -> tuple:
        """(scale, zero_point): per column, or with per-type parameters each row's ([len(nodes), d],
        NumPy for NumPy `nodes`, else torch on their device)."""
        a = self.arrays
        if self.type_offsets is None:
            return a["scale"], a["zero_point"]
        if nodes is None:
            raise ValueError(
                "these features hold one set of parameters per node type: decoding needs the rows' node ids"
            )
        if isinstance(nodes, np.ndarray):
            t = np.searchsorted(self.type_offsets, nodes, side="right") - 1
            return a["scale"][t], a["zero_point"][t]
        import torch  # only the torch decoders reach here

        offsets = torch.as_tensor(self.type_offsets, device=nodes.device)
        t = torch.searchsorted(offsets, nodes.to(offsets.dtype), right=True) - 1
        return (torch_param(a["scale"], nodes)[t], torch_param(a["zero_point"], nodes)[t])

    def decode_gathered(self, rows: np.ndarray, nodes: np.ndarray | None = None) -> np.ndarray:
        """float32 [len(rows), d] from compact rows (`gather`) of `nodes`, transform undone
        (`nodes` is needed only with per-type parameters, `type_offsets`)."""
        if self.encoding == "fp32":
            y = np.asarray(rows, dtype=np.float32)
        elif self.encoding in ("int8", "int4"):
            scale, zero = self._params(None if nodes is None else np.asarray(nodes))
            if self.encoding == "int8":
                y = dequantize_int8_columns(rows, scale, zero)
            else:
                y = dequantize_int4_columns(rows, scale, zero, self.num_cols)
        else:
            y = unpack_binary(rows, self.num_cols)
        return inverse_transform(y, self.transform)

    def decode_gathered_torch(self, rows: "torch.Tensor", nodes: "torch.Tensor | None" = None) -> "torch.Tensor":
        """float32 [len(rows), d] torch tensor from compact rows of `nodes` (a tensor on their
        device; needed only with `type_offsets`), decoded on their device."""
        if self.encoding == "fp32":
            y = rows
        elif self.encoding in ("int8", "int4"):
            scale, zero = self._params(nodes)
            if self.encoding == "int8":
                y = dequantize_rows_torch(rows, scale, zero)
            else:
                y = dequantize_int4_rows_torch(rows, scale, zero, self.num_cols)
        else:
            y = unpack_binary_torch(rows, self.num_cols)
        return y.sinh() if self.transform == "asinh" else y

    def decode(self) -> np.ndarray:
        """float32 [n, d] reconstruction."""
        return self.decode_gathered(self.codes, np.arange(self.num_rows))

    def decode_rows_torch(self, rows=None, device=None) -> "torch.Tensor":
        """float32 [len(rows), d] torch tensor of the given rows (all rows if None), decoded
        on `device`: the compact rows are gathered on the CPU, moved, then decoded there."""
        import torch

        src = torch.from_numpy(np.ascontiguousarray(self.codes))
        nodes = torch.arange(self.num_rows) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        if rows is not None:
            src = src[nodes]
        src = src.to(device) if device is not None else src
        return self.decode_gathered_torch(src, nodes.to(src.device))


def encode_features(x: np.ndarray, encoding: str, *, chunk_rows: int | None = None) -> EncodedFeatures:
    """Encode float features [n, d] as `encoding` (one of ENCODINGS)."""
    _check_2d(x, "encode_features")
    n, d = x.shape
    if encoding == "fp32":
        arrays = {"x": np.ascontiguousarray(x, dtype=np.float32)}
    elif encoding == "int8":
        q, s, z = quantize_int8_columns(x, chunk_rows=chunk_rows)
        arrays = {"q": q, "scale": s, "zero_point": z}
    elif encoding == "int4":
        p, s, z = quantize_int4_columns(x, chunk_rows=chunk_rows)
        arrays = {"packed": p, "scale": s, "zero_point": z}
    elif encoding == "binary":
        arrays = {"packed": pack_binary(x, chunk_rows=chunk_rows)}
    else:
        raise ValueError(f"unknown feature encoding {encoding!r}; choose one of {ENCODINGS}")
    return EncodedFeatures(encoding=encoding, num_rows=n, num_cols=d, arrays=arrays)


def choose_encoding(x: np.ndarray, *, max_rel_rms: float = 0.02, chunk_rows: int | None = None) -> str:
    """The smallest encoding whose relative RMS reconstruction error is at most
    `max_rel_rms`: "binary" for exactly-0/1 features, else "int4", "int8", then "fp32".
    A proxy only; whether the model still trains as well is measured in
    benchmarks/compression.py."""
    if is_binary(x, chunk_rows=chunk_rows):
        return "binary"
    for enc in ("int4", "int8"):
        err = reconstruction_error(x, encode_features(x, enc, chunk_rows=chunk_rows).decode())
        if err["rel_rms_error"] <= max_rel_rms:
            return enc
    return "fp32"


class ErrorAccumulator:
    """Reconstruction error accumulated over row blocks in float64: the max ``|x - x̂|``
    (overall and per column) and ``||x - x̂||_2 / ||x||_2`` (0 when both are zero, inf when
    x is zero and x̂ is not). Feed blocks with `add`; `result` gives the two numbers."""

    def __init__(self, d: int):
        self.col_max = np.zeros(d, dtype=np.float64)
        self.err2 = 0.0
        self.ref2 = 0.0

    def add(self, x: np.ndarray, x_hat: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        diff = np.abs(x - np.asarray(x_hat, dtype=np.float64))
        if diff.size:
            np.maximum(self.col_max, diff.reshape(len(diff), -1).max(axis=0), out=self.col_max)
        self.err2 += float(np.square(diff).sum())
        self.ref2 += float(np.square(x).sum())

    def result(self) -> dict[str, float]:
        """{"max_abs_error": max |x - x̂|, "rel_rms_error": ||x - x̂|| / ||x||}."""
        if self.ref2 == 0.0:
            rel = 0.0 if self.err2 == 0.0 else float("inf")
        else:
            rel = float(np.sqrt(self.err2 / self.ref2))
        return {"max_abs_error": float(self.col_max.max(initial=0.0)), "rel_rms_error": rel}


def reconstruction_error(x: np.ndarray, x_hat: np.ndarray, *, chunk_rows: int | None = None) -> dict[str, float]:
    """`ErrorAccumulator.result` of x against x_hat, accumulated by row blocks."""
    if x.shape != x_hat.shape:
        raise ValueError(f"reconstruction_error: shapes differ, {x.shape} vs {x_hat.shape}")
    n = x.shape[0]
    d = 1 if x.ndim == 1 else int(np.prod(x.shape[1:]))
    acc = ErrorAccumulator(d)
    for a, b in _row_blocks(n, _block_rows(d, chunk_rows)):
        acc.add(x[a:b], x_hat[a:b])
    return acc.result()
