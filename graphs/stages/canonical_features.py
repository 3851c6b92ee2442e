"""The canonical_graph stage's features: features.parquet rows written as features.npy in node order.

`graphs.stages.canonical` documents features.npy (float32 [n, D], row = node_id) and runs the
stage. `write_features` reads the input file in batches of about `FEATURE_BATCH_BYTES` through a
`FEATURE_READ_BUFFER` buffer, checks each row (one fixed width, finite values, one row per node,
an id some edge or nodes.parquet row names) and writes it at its node's row: rows in node order
through pwrite, others scattered in RAM or into a mapping of the file (`_FeatureWriter`).
`warm_feature_kernels` loads the numba kernels' cached machine code ahead of use.
"""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph
from graphs.formats.npyrows import NpyRowWriter
from graphs.stages.canonical_ids import Relabeler
from graphs.stages.canonical_inputs import feature_only_id
from graphs.stages.landing import DatasetFiles, InputError

FEATURE_BATCH_BYTES = 8 << 20  # of float32 values per feature batch read
FEATURE_READ_BUFFER = 4 << 20  # bytes of the feature file read at a time


def write_features(
    tmp: Path,
    files: DatasetFiles,
    relabel: Relabeler,
    new_ids: np.ndarray | None = None,
    *,
    batch_rows: int,
    budget_bytes: int,
) -> dict:
    """features.npy and its facts; `new_ids` of the feature file's rows when already known. At
    most `batch_rows` rows are read at a time; rows out of node order are scattered in RAM when
    the whole matrix fits `budget_bytes`."""
    path = files.features
    n = relabel.n
    # Read in ~8 MB batches through a 4 MB buffer, not a whole column chunk at once: the
    # batches' memory is then reused, where 64 MB batches took ~600 MB of fresh memory whose
    # first touch (the kernel zeroing huge pages) cost more than decoding the file.
    pf = pq.ParquetFile(path, buffer_size=FEATURE_READ_BUFFER, pre_buffer=False)
    seen = np.zeros(n, dtype=bool)
    width_guess = max(
        1,
        pf.schema_arrow.field("feat").type.list_size
        if pa.types.is_fixed_size_list(pf.schema_arrow.field("feat").type)
        else 64,
    )
    # FEATURE_BATCH_BYTES of floats at most, and no more than a row group: batches that
    # straddle row groups cost a concatenation each
    largest_group = max((pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)), default=1)
    rows_per_batch = max(1024, min(batch_rows, FEATURE_BATCH_BYTES // (4 * width_guess), largest_group))
    if new_ids is None:  # one call: a string relabeller builds its hash set once, not per batch
        new_ids = relabel(pf.read(columns=["node_id"]).column(0))
    with _FeatureWriter(tmp / CanonicalGraph.FEATURES, n, new_ids, budget_bytes) as out:
        _copy_features(pf, path, rows_per_batch, new_ids, seen, out)
    if out.dim is None:
        raise InputError(f"{path}: holds no rows")
    return {"feature_dim": int(out.dim), "nodes_without_features": int(n - seen.sum())}


class _FeatureWriter:
    """features.npy [n, dim] float32, written row block by row block.

    Rows in node order go through pwrite (`NpyRowWriter`), not a mapping: the page cache
    holds them either way, but dirty mapped pages would count in this process's RSS (5 GB at
    10M x 128). Rows in another order (ids that do not follow the file's rows) are scattered
    into a buffer in RAM when the whole matrix fits `budget_bytes`, then written at once: each
    first touch of a page of a file mapping is a page fault, which scattered rows pay page after
    page. Larger ones are scattered into a mapping of the file.
    """

    def __init__(self, path: Path, n: int, new_ids: np.ndarray, budget_bytes: int):
        self.path, self.n, self.budget = path, n, budget_bytes
        self.in_order = bool((np.diff(new_ids) == 1).all()) if len(new_ids) else True
        self.dim = None
        self._rows = self._map = self._buffer = None

    def __enter__(self) -> "_FeatureWriter":
        return self

    def start(self, dim: int) -> None:
        self.dim = dim
        self._rows = NpyRowWriter(self.path, np.float32, (self.n, dim))
        if self.in_order:
            return
        if self.n * dim * 4 <= self.budget:
            self._buffer = np.zeros((self.n, dim), dtype=np.float32)
        else:
            self._map = np.load(self.path, mmap_mode="r+")

    def write(self, idx: np.ndarray, rows: np.ndarray, contiguous: bool) -> None:
        """Rows of nodes `idx` (`contiguous`: idx is idx[0], idx[0] + 1, ...)."""
        if contiguous and self._buffer is None:
            self._rows.write(int(idx[0]), rows)
        else:
            _scatter_rows(self._buffer if self._buffer is not None else np.asarray(self._map), idx, rows)

    def __exit__(self, kind, *_) -> None:
        if self._buffer is not None and kind is None:
            self._rows.write(0, self._buffer)
        if self._rows is not None:
            self._rows.close()
        self._map = self._buffer = None  # no msync: the rename publishes the file; the page cache serves readers


@numba.njit(cache=True, nogil=True)
def _scatter_rows(out, idx, rows):  # pragma: no cover - compiled
    """out[idx[i]] = rows[i]: numpy's fancy assignment of 2-d rows costs ~3x this."""
    for i in range(len(idx)):
        r = idx[i]
        for j in range(rows.shape[1]):
            out[r, j] = rows[i, j]


def warm_feature_kernels() -> None:
    """Load the kernels' cached machine code for the argument types `_copy_features` passes
    (rows read-only, as zero-copy from Arrow)."""
    rows = np.frombuffer(np.zeros(1, np.float32).tobytes(), np.float32).reshape(1, 1)
    _scatter_rows(np.zeros((1, 1), np.float32), np.zeros(1, np.int64), rows)
    _mark_new(np.zeros(1, bool), np.zeros(1, np.int64))


@numba.njit(cache=True, nogil=True)
def _mark_new(seen, idx):  # pragma: no cover - compiled
    """Mark ids `idx` seen; False when one was seen before (or repeats within idx)."""
    new = True
    for i in range(len(idx)):
        if seen[idx[i]]:
            new = False
        seen[idx[i]] = True
    return new


def _copy_features(pf, path: Path, rows_per_batch: int, new_ids, seen, out: _FeatureWriter) -> None:
    """Every feature row into `out` at row `new_ids` (of the file's rows, -1 = unknown)."""
    at = 0
    for batch in pf.iter_batches(batch_size=rows_per_batch, columns=["node_id", "feat"]):
        ids, feat = batch.column(0), batch.column(1)
        if ids.null_count or feat.null_count:
            raise InputError(f"{path}: columns 'node_id'/'feat' must not hold nulls")
        if pa.types.is_fixed_size_list(feat.type):
            width = feat.type.list_size
            values = feat.flatten()
        else:
            lengths = np.diff(feat.offsets.to_numpy())
            width = int(lengths[0]) if len(lengths) else (out.dim or 0)
            if len(lengths) and (lengths != width).any():
                row = int(np.flatnonzero(lengths != width)[0])
                raise InputError(
                    f"{path}: column 'feat' varies in width: node_id {ids[row].as_py()!r} has "
                    f"{lengths[row]} values, node_id {ids[0].as_py()!r} has {width}"
                )
            values = feat.flatten()
        if out.dim is None:
            out.start(width)
        elif width != out.dim and len(batch):
            raise InputError(
                f"{path}: column 'feat' varies in width: {width} values in a later row group, {out.dim} before"
            )
        idx = new_ids[at : at + len(ids)]
        at += len(ids)
        if (idx < 0).any():
            raise feature_only_id(path, ids[int(np.flatnonzero(idx < 0)[0])].as_py())
        if not _mark_new(seen, idx):
            raise InputError(f"{path}: column 'node_id' repeats an id; one feature row per node")
        rows = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(idx), out.dim)
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            row = int(np.flatnonzero(~finite)[0])
            raise InputError(
                f"{path}: column 'feat' of node_id {ids[row].as_py()!r} holds a NaN or infinite value "
                "(or one beyond float32's range); features must be finite"
            )
        if len(idx):
            out.write(idx, rows, contiguous=idx[-1] - idx[0] + 1 == len(idx) and bool((np.diff(idx) == 1).all()))


__all__ = ["FEATURE_BATCH_BYTES", "FEATURE_READ_BUFFER", "warm_feature_kernels", "write_features"]
