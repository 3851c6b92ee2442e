"""Normalized adjacency: the GCN propagation matrix Â of a canonical graph, as CSR arrays.

    degree_norm="both"   Â = D_r^-1/2 (A + I) D_c^-1/2   (Kipf & Welling's renormalization; for a
                                                  symmetrized graph D_r = D_c = D and Â is
                                                  symmetric)
    degree_norm="right"  Â = D_r^-1 (A + I)              (row-normalized: Â·X averages each row's
                                                  neighbourhood, the "mean" aggregator)

Row i of Â holds the edges i -> j of the canonical edges.parquet (row = src, column = dst),
so Â·X gathers, for node i, the features of its out-neighbours; for a symmetrized graph
(the default) that is every neighbour, and Â·X equals DGL's
``GraphConv(norm=..., weight=False, bias=False)`` on ``dgl.add_self_loop(g)``. For a
directed graph it equals GraphConv on the reversed graph. D_r counts the entries of a row
(out-degree, +1 for the self loop), D_c those of a column (in-degree, +1).
With `add_self_loops=False` the "+ I" is left out (and a node without edges gets an
empty row).

Weighted graphs (canonical edges.parquet with a ``weight`` column): A holds the edge
weights (A_w), the self loop has weight ``self_loop_weight`` (s, default 1.0), and the
degrees are weighted: D_r[i] = s + Σ_j w_ij (row sums of A_w + sI), D_c[j] = s + Σ_i w_ij,
so Â = D_r^-1/2 (A_w + sI) D_c^-1/2 (or D_r^-1 (A_w + sI)); each entry is
w_ij · D_r[i]^-1/2 · D_c[j]^-1/2. Since w_ij <= D_r[i] and w_ij <= D_c[j], every entry
still lies in (0, 1] and λmax <= 1. With all weights 1 (and s = 1) Â equals the
unweighted one bit for bit. The self-loop weight also applies to unweighted graphs.

Â factors when the graph is unweighted and the self loop's weight is 1 (or there are no self
loops): every entry is then float32(row_scale[i] · col_scale[j]) ('both') or
float32(row_scale[i]) ('right'), one float64 product rounded once, exactly as weights.npy is
computed. The two vectors are written beside it (`load_scale_factors`), so that a sampled
block can be stored without its per-edge weights and have them recomputed bit for bit
(`graphs.formats.shard_format`, weight encoding ``factors``).

Files written (format version 1) into `<out_dir>/`:
    indptr.npy    int64   [n + 1]   row i is indices[indptr[i]:indptr[i+1]]
    indices.npy   int32   [nnz]     column ids, ascending within a row (int64 when n >= 2^31)
    weights.npy   float32 [nnz]     Â's entries, aligned with indices
    row_scale.npy float64 [n]       when Â factors (below): D_r^-1/2 ('both') or D_r^-1 ('right')
    col_scale.npy float64 [n]       'both' on a directed graph only: D_c^-1/2 (else it equals the row's)
    summary.json  counts, settings ("degree_norm", "add_self_loops", "format_version"), timings,
                  ``scale_factors`` (the factor files, or null)
where nnz = edges + n with self loops (every node gets exactly one, isolated nodes too:
their only entry is Â[i, i] = 1), and nnz = edges without.

How it scales: degrees are one DuckDB GROUP BY over edges.parquet. Then the file is
streamed in record batches; the canonical edges are already sorted by (src, dst), so CSR
order is file order and the output position of edge k (row s, column d) is
``k + s + (d > s)`` — the s self loops of the rows before, plus row s's own self loop if
it sorts before d. Each batch is scattered into the three `.npy` files through memory
maps (`graphs.formats.npyrows.create_npy_memmap`: their disk space reserved first, so a full disk
is an error naming the file); the self loops go in at the end, one vectorised scatter over n positions. Memory
is O(n) plus one batch, whatever the edge count.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from graphs.formats.canonical_files import CanonicalGraph, edge_batches
from graphs.formats.graph_schema import TypedSchema
from graphs.formats.npyrows import create_npy_memmap
from graphs.formats.stage_artifact import StageArtifact
from graphs.infra import duck
from graphs.infra.config_checks import MAX_ROWS, MAX_SCALE, bounded_repr, check_fields
from graphs.infra.storage import atomic_output_dir, peak_rss_bytes, write_summary
from graphs.stages.normalize_relations import RelationalCSR, write_relational_adjacency

NORMS = ("both", "right")


class Adjacency(StageArtifact):
    """A normalized_adjacency folder (files in the module docstring)."""

    STAGE = "normalized_adjacency"
    FORMAT_VERSION = 1
    INDPTR = "indptr.npy"
    INDICES = "indices.npy"
    WEIGHTS = "weights.npy"
    ROW_SCALE = "row_scale.npy"
    COL_SCALE = "col_scale.npy"
    CSR_FILES = (INDPTR, INDICES, WEIGHTS)
    # a typed graph's relational Â (`graphs.stages.normalize_relations`)
    RELATIONAL_FILES = {
        "indptr": "rel_indptr.npy",
        "indices": "rel_indices.npy",
        "weights": "rel_weights.npy",
        "etypes": "rel_etypes.npy",
    }

    @property
    def relational(self) -> bool:
        """Whether the folder holds a typed graph's relational Â."""
        return bool(self.summary.get("relational"))

    @property
    def typed_schema(self) -> TypedSchema | None:
        """The typed graph's schema its relational Â was built over, None for an untyped graph."""
        facts = self.summary.get("relational")
        return None if not facts else TypedSchema.from_json(facts["schema"], str(self.path(self.SUMMARY)))

    @property
    def num_nodes(self) -> int:
        return int(self.summary["nodes"])


FORMAT_VERSION = Adjacency.FORMAT_VERSION


@dataclass(kw_only=True)
class AdjacencyConfig:
    """Settings of the normalized_adjacency stage."""

    add_self_loops: bool = field(
        default=True, metadata={"help": "Add I to A before normalizing (the GCN renormalization trick)."}
    )
    degree_norm: str = field(
        default="both",
        metadata={"help": "'both': D^-1/2 (A+I) D^-1/2 (symmetric); 'right': D^-1 (A+I) (row mean)."},
    )
    batch_rows: int = field(
        default=4_000_000, metadata={"max": MAX_ROWS, "help": "Edge rows per streamed batch of edges.parquet."}
    )
    memory_limit: str = field(
        default="2GB", metadata={"help": "DuckDB memory_limit for the degree aggregation, e.g. '2GB'."}
    )
    power_iterations: int = field(
        default=50, metadata={"max": 100_000, "help": "Power-iteration steps of the largest-eigenvalue asset check."}
    )
    self_loop_weight: float = field(
        default=1.0,
        metadata={
            "max": MAX_SCALE,
            "help": "Weight s of each added self loop (A_w + sI), counted in the weighted degree.",
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.self_loop_weight > 0:
            raise ValueError(f"self_loop_weight must be > 0, got {self.self_loop_weight}")
        if self.degree_norm not in NORMS:
            raise ValueError(f"degree_norm must be one of {NORMS}, got {bounded_repr(self.degree_norm)}")
        if self.batch_rows < 1:
            raise ValueError(f"batch_rows must be >= 1, got {self.batch_rows}")
        if self.power_iterations < 1:
            raise ValueError(f"power_iterations must be >= 1, got {self.power_iterations}")
        self.memory_limit = duck.check_memory_size(self.memory_limit)


class CSR(NamedTuple):
    """Â as three (usually memory-mapped) arrays; n = len(indptr) - 1."""

    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray

    @property
    def n(self) -> int:
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])


def load_csr(adjacency_dir: str | os.PathLike, mmap: bool = True, n: int | None = None) -> CSR:
    """The arrays written by `build_normalized_adjacency`, memory-mapped read-only by default,
    each checked against the folder's hashes.json first (`graphs.infra.storage.verified`).

    Missing files, files changed since they were published, arrays of inconsistent lengths, or
    (with `n`) a row count other than `n` raise naming the file and the stage to re-materialize.
    """
    adj = Adjacency.open(adjacency_dir)
    mode = "r" if mmap else None
    arrays = []
    for name in Adjacency.CSR_FILES:
        if not adj.has(name):
            raise FileNotFoundError(f"{adj.path(name)}: missing; materialize normalized_adjacency first")
        arrays.append(np.load(adj.verified(name), mmap_mode=mode, allow_pickle=False))
    csr = CSR(*arrays)
    if not len(csr.indices) == len(csr.weights) == (int(csr.indptr[-1]) if len(csr.indptr) else -1):
        raise ValueError(
            f"{adj.root}: indptr ends at {int(csr.indptr[-1]) if len(csr.indptr) else None} but {adj.INDICES} has "
            f"{len(csr.indices)} and {adj.WEIGHTS} {len(csr.weights)} entries; re-materialize normalized_adjacency"
        )
    if n is not None and csr.n != n:
        raise ValueError(
            f"{adj.path(adj.INDPTR)}: {csr.n} rows but the canonical graph has {n} nodes; "
            "re-materialize normalized_adjacency"
        )
    return csr


def load_relational_csr(adjacency_dir: str | os.PathLike, mmap: bool = True) -> RelationalCSR:
    """A typed graph's relational Â (`graphs.stages.normalize_relations`), memory-mapped read-only
    by default, each file checked against the folder's hashes.json first; ValueError naming the
    stages to re-run when the folder has none."""
    adj = Adjacency.open(adjacency_dir)
    if not adj.relational:
        raise ValueError(
            f"{adj.root}: no relational Â; the canonical graph is not typed (re-run canonical_graph and "
            "normalized_adjacency if its landing folder has nodes/)"
        )
    mode = "r" if mmap else None
    arrays = [np.load(adj.verified(name), mmap_mode=mode, allow_pickle=False) for name in adj.RELATIONAL_FILES.values()]
    return RelationalCSR(*arrays)


class ScaleFactors(NamedTuple):
    """Â's entry (i, j) = float32(row[i] · col[j]), or float32(row[i]) when ``col`` is None
    ('right'); ``col is row`` for a symmetric Â. The paths are the files they were read from."""

    row: np.ndarray
    col: np.ndarray | None
    row_path: Path
    col_path: Path | None


def load_scale_factors(adjacency_dir: str | os.PathLike, n: int | None = None) -> ScaleFactors | None:
    """Â's row and column scales when it factors (module docstring), memory-mapped; None when
    it does not (a weighted graph, another self-loop weight). The summary and the scale files are
    checked against the folder's hashes.json first."""
    adj = Adjacency.open(adjacency_dir, verify=True)
    d = adj.root
    entry = adj.summary.get("scale_factors")
    if not entry:
        return None
    loaded = {}
    for name in (entry["row"], entry["col"]):
        if name is None or name in loaded:
            continue
        if name not in (adj.ROW_SCALE, adj.COL_SCALE):
            raise ValueError(f"{d / adj.SUMMARY}: scale_factors names {name!r}; re-materialize normalized_adjacency")
        path = d / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; re-materialize normalized_adjacency")
        arr = np.load(adj.verified(name), mmap_mode="r", allow_pickle=False)
        if arr.dtype != np.float64 or arr.ndim != 1 or (n is not None and len(arr) != n):
            raise ValueError(
                f"{path}: {arr.dtype} {list(arr.shape)}, expected float64 [{n}]; re-materialize normalized_adjacency"
            )
        loaded[name] = arr
    col = entry["col"]
    return ScaleFactors(
        loaded[entry["row"]],
        None if col is None else loaded[col],
        d / entry["row"],
        None if col is None else d / col,
    )


def edge_degrees(
    edges_path: str | os.PathLike, n: int, symmetric: bool, memory_limit: str = "2GB"
) -> tuple[np.ndarray, np.ndarray]:
    """(out-degree, in-degree) int64 arrays of length n, aggregated by DuckDB.

    For a symmetrized graph the in-degree is the out-degree (the same array is returned).
    """
    counts, _ = _degrees(edges_path, n, symmetric, memory_limit, weighted=False)
    return counts


def weighted_degrees(
    edges_path: str | os.PathLike, n: int, symmetric: bool, memory_limit: str = "2GB"
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((out-count, in-count) int64, (out-weight sum, in-weight sum) float64), one DuckDB pass.

    The counts size the CSR rows, the weight sums scale them. For a symmetrized graph the
    in-arrays are the out-arrays.
    """
    return _degrees(edges_path, n, symmetric, memory_limit, weighted=True)


def _degrees(edges_path, n: int, symmetric: bool, memory_limit: str, weighted: bool):
    con = duck.connect(memory_limit)  # duckdb imported there, lazily: CSR readers need only NumPy
    duck.read_parquet(con, [edges_path]).create_view("edges")  # a literal path, through the relation API
    counts, sums = [], []
    weight_sum = ", sum(weight) AS wsum" if weighted else ""
    for col in ("src",) if symmetric else ("src", "dst"):
        t = con.sql(f"SELECT {col} AS node, count(*) AS deg{weight_sum} FROM edges GROUP BY {col}").fetchnumpy()
        deg = np.zeros(n, dtype=np.int64)
        deg[t["node"]] = t["deg"]
        counts.append(deg)
        if weighted:
            wsum = np.zeros(n, dtype=np.float64)
            wsum[t["node"]] = t["wsum"]
            sums.append(wsum)
    con.close()
    return (counts[0], counts[-1]), ((sums[0], sums[-1]) if weighted else None)


def build_normalized_adjacency(
    canonical_dir: str | os.PathLike, out_dir: str | os.PathLike, cfg: AdjacencyConfig | None = None
) -> dict:
    """Write Â of the canonical graph in `canonical_dir` as CSR files into `out_dir` (atomically).

    Returns the summary dict that is also written as summary.json.
    """
    cfg = cfg or AdjacencyConfig()
    t0 = time.perf_counter()
    # the canonical files read, checked against its hashes.json
    graph = CanonicalGraph.open(canonical_dir, verify=True)
    canonical = graph.root
    n, num_edges = graph.num_nodes, graph.num_edges
    edges_path = graph.verified(graph.EDGES)

    symmetric = graph.symmetrized
    weighted = graph.weighted
    (out_deg, in_deg), sums = _degrees(edges_path, n, symmetric, cfg.memory_limit, weighted)
    if int(out_deg.sum()) != num_edges:
        raise ValueError(f"{edges_path}: holds {int(out_deg.sum())} edges but {graph.SUMMARY} says {num_edges}")
    loop = 1 if cfg.add_self_loops else 0
    row_len = out_deg + loop
    # weighted degrees: weight sums (edge counts when unweighted) plus the self-loop weight
    row_scale, col_scale = _scale_factors(*(sums if weighted else (out_deg, in_deg)), cfg)
    t_degrees = time.perf_counter() - t0

    nnz = num_edges + loop * n
    index_dtype = np.int32 if n < 2**31 else np.int64
    with atomic_output_dir(out_dir) as tmp:
        indptr = create_npy_memmap(tmp / Adjacency.INDPTR, dtype=np.int64, shape=(n + 1,))
        indptr[0] = 0
        np.cumsum(row_len, out=indptr[1:])
        indices = create_npy_memmap(tmp / Adjacency.INDICES, dtype=index_dtype, shape=(nnz,))
        weights = create_npy_memmap(tmp / Adjacency.WEIGHTS, dtype=np.float32, shape=(nnz,))
        k, below_diag = _fill_edges(canonical, cfg, weighted, indices, weights, row_scale, col_scale)
        if k != num_edges:
            raise ValueError(f"{edges_path}: streamed {k} edges but {graph.SUMMARY} says {num_edges}")
        if loop:
            diag_pos = indptr[:-1] + below_diag
            indices[diag_pos] = np.arange(n, dtype=index_dtype)
            diag = row_scale * col_scale if col_scale is not None else row_scale
            weights[diag_pos] = diag * cfg.self_loop_weight if cfg.self_loop_weight != 1.0 else diag
        for arr in (indptr, indices, weights):
            arr.flush()
        del indptr, indices, weights
        factors = _save_scale_factors(tmp, row_scale, col_scale, weighted, cfg)
        typed = TypedSchema.read(canonical)
        relational = (
            None
            if typed is None
            else write_relational_adjacency(graph, tmp, Adjacency.RELATIONAL_FILES, len(typed.schema.relations))
            | {"schema": typed.to_json()}
        )

        seconds = time.perf_counter() - t0
        nonempty = row_len > 0
        summary = {
            "format_version": FORMAT_VERSION,
            "nodes": n,
            "edges": num_edges,
            "nnz": int(nnz),
            "degree_norm": cfg.degree_norm,
            "add_self_loops": cfg.add_self_loops,
            "self_loop_weight": cfg.self_loop_weight,
            "weighted": weighted,
            "symmetrized": symmetric,
            "index_dtype": np.dtype(index_dtype).name,
            "scale_factors": factors,
            "relational": relational,
            "isolated_nodes": int(np.count_nonzero((out_deg == 0) & (in_deg == 0))),
            "empty_rows": int(np.count_nonzero(~nonempty)),
            "max_row_length": int(row_len.max()) if n else 0,
            "degree_seconds": round(t_degrees, 3),
            "seconds": round(seconds, 3),
            "edges_per_second": round(num_edges / seconds) if seconds > 0 else 0,
            "peak_rss_bytes": peak_rss_bytes(),
        }
        write_summary(tmp, summary)
    return summary


def _scale_factors(out_w: np.ndarray, in_w: np.ndarray, cfg: AdjacencyConfig) -> tuple[np.ndarray, np.ndarray | None]:
    """Row and column scale factors (float64) of the weighted degrees; no column factor for `degree_norm: row`."""
    loop_w = cfg.self_loop_weight if cfg.add_self_loops else 0.0
    row_deg = out_w.astype(np.float64) + loop_w
    col_deg = in_w.astype(np.float64) + loop_w
    # Scale factors in float64; each weight is one product, rounded once to float32.
    with np.errstate(divide="ignore"):
        if cfg.degree_norm == "both":
            return row_deg**-0.5, col_deg**-0.5
        return 1.0 / row_deg, None


def _fill_edges(canonical: Path, cfg: AdjacencyConfig, weighted: bool, indices, weights, row_scale, col_scale):
    """Stream the canonical edges into the CSR arrays; (edges streamed, per row the edges before its self loop).

    With self loops, each row's loop slot (after its edges with a smaller column) is left free.
    """
    loop = 1 if cfg.add_self_loops else 0
    below_diag = np.zeros(len(row_scale), dtype=np.int64)
    k = 0
    for batch in edge_batches(canonical, cfg.batch_rows, with_weight=weighted):
        src, dst = batch[0], batch[1]
        pos = np.arange(k, k + len(src), dtype=np.int64)
        if loop and len(src):
            before = dst < src
            first = int(src[0])  # src is sorted: only rows first..src[-1] occur in this batch
            below_diag[first : int(src[-1]) + 1] += np.bincount(src[before] - first, minlength=int(src[-1]) - first + 1)
            pos += src
            pos += ~before
        indices[pos] = dst
        w = row_scale[src] * col_scale[dst] if col_scale is not None else row_scale[src]
        if weighted:
            w *= batch[2]
        weights[pos] = w
        k += len(src)
    return k, below_diag


def _save_scale_factors(tmp: Path, row_scale, col_scale, weighted: bool, cfg: AdjacencyConfig) -> dict | None:
    """Save the scale factors when Â = diag(row) (A + I) diag(col) entry by entry; their file names."""
    loop_w = cfg.self_loop_weight if cfg.add_self_loops else 0.0
    if weighted or loop_w not in (0.0, 1.0):
        return None
    np.save(tmp / Adjacency.ROW_SCALE, row_scale)
    col_file = None
    if col_scale is not None:
        col_file = Adjacency.ROW_SCALE if np.array_equal(col_scale, row_scale) else Adjacency.COL_SCALE
        if col_file == Adjacency.COL_SCALE:
            np.save(tmp / Adjacency.COL_SCALE, col_scale)
    return {"row": Adjacency.ROW_SCALE, "col": col_file}


# ----------------------------------------------------------------------------- checks
# Used by the asset checks; each reads the CSR in bounded chunks.


def asymmetric_entries(csr: CSR, rtol: float = 1e-6, block_entries: int = 1 << 20) -> int:
    """How many entries (i, j, w) lack a partner (j, i, w') with |w' - w| <= rtol * |w|.

    Entries are bucketed by blocks of at most 65536 columns [c0, c1) and about
    `block_entries` entries. Within a block, a stable radix sort on the 16-bit column
    offset puts the transposed keys (j, i) in order (rows are already ascending), and they
    are looked up in rows c0..c1-1, a contiguous sorted stretch of the CSR. Every sort is
    linear and every search cache-sized; memory is ~16 bytes per entry.
    """
    n, nnz = csr.n, csr.nnz
    if nnz == 0:
        return 0
    width = 1 << 16
    indptr = np.asarray(csr.indptr)
    cols = np.asarray(csr.indices)
    rows = np.repeat(np.arange(n, dtype=np.int32 if n < 2**31 else np.int64), np.diff(indptr))
    col_end = np.cumsum(np.bincount(cols, minlength=n))
    by_entries = np.searchsorted(col_end, np.arange(block_entries, nnz, block_entries), side="right")
    bounds = np.unique(np.concatenate([[0, n], by_entries, np.arange(0, n, width)]))
    bounds = bounds[bounds <= n]
    block = np.empty(nnz, dtype=np.uint32 if len(bounds) > width else np.uint16)
    for lo in range(0, nnz, 1 << 24):  # in chunks: searchsorted's int64 result would be 8 bytes/entry
        block[lo : lo + (1 << 24)] = np.searchsorted(bounds, cols[lo : lo + (1 << 24)], side="right") - 1
    by_block = np.argsort(block, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(block, minlength=len(bounds) - 1))])
    del block
    bad = 0
    for b in range(len(bounds) - 1):
        c0 = int(bounds[b])
        sel = by_block[starts[b] : starts[b + 1]]  # entries with a column in [c0, c1), row-major
        sel = sel[np.argsort((cols[sel] - c0).astype(np.uint16), kind="stable")]  # -> column-major
        t_keys = cols[sel].astype(np.int64) * n + rows[sel]  # (j, i) of entries (i, j), ascending
        t_w = np.asarray(csr.weights[sel], dtype=np.float64)
        lo, hi = int(indptr[c0]), int(indptr[bounds[b + 1]])
        r_keys = rows[lo:hi].astype(np.int64) * n + cols[lo:hi]
        if len(r_keys) == 0:
            bad += len(t_keys)
            continue
        at = np.minimum(np.searchsorted(r_keys, t_keys), len(r_keys) - 1)
        ok = (r_keys[at] == t_keys) & (np.abs(csr.weights[lo + at] - t_w) <= rtol * np.abs(t_w))
        bad += int(np.count_nonzero(~ok))
    return bad


def weight_stats(csr: CSR, chunk: int = 1 << 24) -> dict:
    """Non-finite count, min and max over the finite weights, and how many lie outside (0, 1]."""
    nonfinite, outside = 0, 0
    lo_w, hi_w = np.inf, -np.inf
    for lo in range(0, csr.nnz, chunk):
        w = np.asarray(csr.weights[lo : lo + chunk])
        finite = np.isfinite(w)
        nonfinite += int(np.count_nonzero(~finite))
        wf = w[finite]
        outside += int(np.count_nonzero((wf <= 0) | (wf > 1)))
        if len(wf):
            lo_w, hi_w = min(lo_w, float(wf.min())), max(hi_w, float(wf.max()))
    return {"nonfinite": nonfinite, "outside_0_1": outside, "min": lo_w, "max": hi_w}


def _row_chunks(indptr: np.ndarray, chunk: int):
    """(r0, r1, lo, hi): consecutive row ranges holding about `chunk` entries (one row at least)."""
    n, r0 = len(indptr) - 1, 0
    while r0 < n:
        r1 = int(np.searchsorted(indptr, indptr[r0] + chunk, side="right")) - 1
        r1 = min(max(r1, r0 + 1), n)
        yield r0, r1, int(indptr[r0]), int(indptr[r1])
        r0 = r1


def perron_guess(csr: CSR, cfg: AdjacencyConfig, chunk: int = 1 << 24) -> np.ndarray:
    """A positive vector that is Â's Perron eigenvector when Â was built as `cfg` says.

    'right' (D^-1 Ã, rows summing to 1): all ones. 'both' with self loops of weight s:
    Â_ii = s / d_i, so sqrt(d_i) = sqrt(s / Â_ii), and D^-1/2 Ã D^-1/2 · D^1/2 1 = D^1/2 1 (any edge
    weights). 'both' without self loops: sqrt(entries in the row), exact for an unweighted graph.
    Only a guess: `spectral_radius_bound` is an upper bound for any positive vector."""
    n = csr.n
    indptr = np.asarray(csr.indptr)
    if cfg.degree_norm != "both":
        return np.ones(n)
    if not (cfg.add_self_loops and cfg.self_loop_weight > 0):
        return np.sqrt(np.maximum(np.diff(indptr), 1).astype(np.float64))
    diag = np.zeros(n)
    for r0, r1, lo, hi in _row_chunks(indptr, chunk):
        rows = np.repeat(np.arange(r0, r1), np.diff(indptr[r0 : r1 + 1]))
        on = np.asarray(csr.indices[lo:hi]) == rows
        diag[rows[on]] = csr.weights[lo:hi][on]
    x = np.ones(n)
    has = diag > 0
    x[has] = np.sqrt(cfg.self_loop_weight / diag[has])
    return x


def spectral_radius_bound(csr: CSR, x: np.ndarray, chunk: int = 1 << 24) -> float:
    """max_i (Âx)_i / x_i for a positive x: an upper bound on the spectral radius of a
    nonnegative Â (Collatz-Wielandt), equal to it when x is the Perron eigenvector.

    One matrix-vector product in float64, streamed over row chunks of about `chunk` entries."""
    if csr.nnz == 0:
        return 0.0
    if not (x > 0).all():
        raise ValueError("spectral_radius_bound needs a positive vector")
    indptr = np.asarray(csr.indptr)
    bound = 0.0
    for r0, r1, lo, hi in _row_chunks(indptr, chunk):
        prod = np.asarray(csr.weights[lo:hi], dtype=np.float64) * x[np.asarray(csr.indices[lo:hi])]
        cum = np.concatenate([[0.0], np.cumsum(prod)])
        y = cum[indptr[r0 + 1 : r1 + 1] - lo] - cum[indptr[r0:r1] - lo]
        bound = max(bound, float((y / x[r0:r1]).max()))
    return bound


def largest_eigenvalue(csr: CSR, iterations: int = 50) -> float:
    """Power-iteration estimate of Â's largest eigenvalue: the Rayleigh quotient x·Âx / x·x.

    Starts from the all-ones vector. For a correct 'right' Â (rows sum to 1) that vector is
    an eigenvector with eigenvalue 1; for a correct symmetric 'both' Â the Rayleigh
    quotient never exceeds the largest eigenvalue, which is 1. So a correct Â never
    reports more than 1 (up to float32 rounding), while a mis-scaled one converges to its
    true, larger eigenvalue. Uses torch's sparse CSR matrix-vector product.
    """
    import torch

    if csr.nnz == 0:
        return 0.0
    # int32 index arrays when they fit: the indices are then used without a copy
    index = np.int32 if csr.nnz < 2**31 and csr.n < 2**31 else np.int64
    with warnings.catch_warnings():  # "sparse CSR support is in beta"; read-only memmaps
        warnings.simplefilter("ignore", UserWarning)
        mat = torch.sparse_csr_tensor(
            torch.from_numpy(np.asarray(csr.indptr, dtype=index)),
            torch.from_numpy(np.asarray(csr.indices, dtype=index)),
            torch.from_numpy(np.asarray(csr.weights, dtype=np.float32)),
            size=(csr.n, csr.n),
        )
    x = torch.ones(csr.n, dtype=torch.float32)  # a vector: torch.mv is ~2x the (n, 1) matrix product
    estimate = 0.0
    for _ in range(iterations):
        y = torch.mv(mat, x)
        estimate = float((x * y).sum(dtype=torch.float64) / (x * x).sum(dtype=torch.float64))
        norm = torch.linalg.vector_norm(y)
        if norm == 0:
            return 0.0
        x = y / norm
    return estimate


__all__ = [
    "Adjacency",
    "AdjacencyConfig",
    "CSR",
    "FORMAT_VERSION",
    "asymmetric_entries",
    "build_normalized_adjacency",
    "edge_degrees",
    "weighted_degrees",
    "largest_eigenvalue",
    "load_csr",
    "perron_guess",
    "spectral_radius_bound",
    "weight_stats",
]
