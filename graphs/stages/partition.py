"""METIS partitions of a canonical graph: part per node, 1-hop halos, Cluster-GCN clusters,
and DGL's distributed partition format — with a seeded random partition as the baseline.

The assignment is METIS 5 k-way (edge-cut objective) called through ``pymetis`` on an
idx_t CSR streamed straight from the canonical edges (`read_csr`: the sorted dst column
is the adjacency, the row pointers come from per-batch counts, so no src array and no
DGL graph exist), seeded with the config's seed: the same inputs and settings give
byte-identical files in every process. (DGL 2.1's `dgl.metis_partition_assignment`,
kept as `metis_assign` for comparison, is not reproducible across calls, and builds
several whole-graph copies.) Every node belongs to exactly one part (its *core* nodes);
the *halo* of part p is the set of nodes outside p with an edge into p's core (the
sources of p's in-edges, DGL's convention; for a symmetrized graph, simply the 1-hop
neighbours of p that live elsewhere), computed from the CSR in chunks
(`graphs.stages.partition_metrics`, with the edge-cut and balance metrics).
Each part is then split into up to C clusters by seeded METIS on its induced subgraph,
cut out of the CSR one part at a time (`csr_clusters`), for Cluster-GCN batching. A
directed graph is partitioned on A + Aᵀ (as DGL's METIS symmetrizes).

Weighted graphs (canonical edges.parquet with a ``weight`` column): the same call with
integer edge weights (`metis_edge_weights`): ``max(1, round(w * S / w_max))`` with
``S = min(1000, 2^30 // edges)`` — the heaviest edge gets S, every edge at least 1
(weights below w_max / (2S) all become 1), and the total stays below 2^30 so METIS's
32-bit sums cannot overflow. Heavy edges are then cut less; the summary adds the cut
*weight* ratio (``weight_cut_ratio``) beside the edge-cut ratio for METIS and the random
baseline.

Files written (format version 1) into `<out_dir>/`:
    part_id.npy                  int32 [n]   part of every node, 0..k-1
    cluster_id.npy               int32 [n]   global cluster id p * C + c, c in 0..C-1
                                             (a part with fewer than C nodes, or whose
                                             METIS leaves some clusters empty, has gaps)
    part-{p}/core_nodes.npy      int64 [n_p] ascending node ids with part_id == p
    part-{p}/halo_nodes.npy      int64 [h_p] ascending node ids outside p with an edge into p
    distdgl/<graph_name>.json    DGL distributed partition config (with write_distdgl; DGL's
                                             heterogeneous format for a typed graph,
                                             `graphs.formats.distdgl_typed`)
    distdgl/part{p}/             graph.dgl, node_feat.dgl, edge_feat.dgl per part
    distdgl/orig_nids.npy        int64 [n]   reshuffled node id -> canonical node id
    vertex_cut/edge_part.npy     int32 [m]   with ``vertex_cut`` set: the part of every canonical edge
                                             (edges.parquet order, which is Â's off-diagonal order)
    vertex_cut/master.npy        int32 [n]   every node's master part (`graphs.stages.vertex_cut`)
    partition_sizes.png          core and halo sizes per part, METIS vs random
    summary.json                 metrics for "metis" and "random" (and "vertex_cut"), timings, settings

The DistDGL folder is what `dgl.distributed.load_partition(json, p)` and DistDGL's
`DistGraph` read; node data `feat` (canonical features.npy), `label` (int64) and
`train_mask`/`val_mask`/`test_mask` are included when the canonical graph has them.

Memory: the CSR is 8 bytes per directed edge (idx_t is int64 in pymetis's wheels, so an
int32 copy would only be widened again); METIS adds ~90-130 bytes per edge of its own
(its weighted copy and one per coarsening level), so a graph of more than
`metis_max_edges` directed edges (default 40M) is first coarsened by size-constrained label
propagation and METIS partitions the coarse graph (`graphs.kernels.coarsen`: the partition is
projected back and refined; its cut beside METIS on the whole graph is in BENCHMARKS.md).
The DistDGL export is written part by part from the CSR and our assignment
(`graphs.formats.distdgl_format.write_distdgl_parts`: one int32 edge id per edge plus one
part's graph at a time, features read from the file in blocks), in DGL's format.

The tests check this writer against DGL's own `partition_graph` given the same assignment
(tests/dgl_reference.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from graphs.formats.canonical_files import CanonicalGraph, edge_batches
from graphs.formats.graph_schema import TypedSchema
from graphs.formats.partition_files import Partitions, load_parts
from graphs.infra.config_checks import MAX_SEED, check_fields
from graphs.infra.plotting import headless_pyplot
from graphs.infra.storage import atomic_output_dir, peak_rss_bytes, verify_inputs, write_summary
from graphs.kernels.coarsen import Level, metis_levels
from graphs.kernels.induced import induced_csr
from graphs.kernels.metis import metis_idx_dtype, metis_kway_multi, quiet_stdout
from graphs.stages.partition_dgl import dgl_graph, metis_assign
from graphs.stages.partition_metrics import csr_halos, csr_metrics, train_balance, type_balance
from graphs.stages.partition_nodes import train_mask, write_distdgl
from graphs.stages.vertex_cut import MAX_VERTEX_CUT_PARTS, edge_partitioner_class, vertex_cut

FORMAT_VERSION = Partitions.FORMAT_VERSION
METIS_WEIGHT_SCALE = 1000  # integer METIS weight of the heaviest edge (see the module docstring)
METIS_WEIGHT_TOTAL = 1 << 30  # bound on the sum of the integer weights


@dataclass(kw_only=True)
class PartitionConfig:
    """Settings of the metis_partitions stage."""

    num_parts: int = field(
        default=4, metadata={"max": 1 << 20, "help": "Number of parts k (one per machine/trainer group)."}
    )
    balance_edges: bool = field(
        default=False, metadata={"help": "Ask METIS to balance edges (in-degree) per part as well as nodes."}
    )
    balance_train_nodes: bool = field(
        default=False,
        metadata={
            "help": "Ask METIS to balance the training nodes (split 'train' with a label) per part as well: a "
            "second balance constraint, as DGL's balance_ntypes does with the training mask, so the ranks owning "
            "the parts get equal seed shares. Needs training nodes."
        },
    )
    balance_node_types: bool = field(
        default=True,
        metadata={
            "help": "Typed graphs: ask METIS to balance each node type per part as well (one balance constraint "
            "per type, as DGL's balance_ntypes), so every part holds its share of users, items, ...; no effect "
            "on an untyped graph."
        },
    )
    clusters_per_part: int = field(
        default=8,
        metadata={"max": 1 << 20, "help": "Cluster-GCN clusters C per part (METIS on the part's induced subgraph)."},
    )
    seed: int = field(
        default=0,
        metadata={
            "max": MAX_SEED,
            "help": "Seed of METIS (parts and clusters) and of the random (hash) baseline partition.",
        },
    )
    write_distdgl: bool = field(
        default=True,
        metadata={
            "help": "Also write DGL's distributed partition format under distdgl/ (heterogeneous for a typed graph)."
        },
    )
    vertex_cut: str = field(
        default="none",
        metadata={
            "help": "Also partition the edges (vertex cut), by a registered edge partitioner "
            "(graphs/stages/vertex_cuts/): 'hdrf' (streamed, the higher-degree endpoint replicated) or 'dbh' "
            "(degree-based hashing); every edge goes to one of num_parts parts (at most 64) and a vertex is "
            "held by every part with one of its edges; writes vertex_cut/edge_part.npy and master.npy (each "
            "vertex's master part), read by minibatch_shards' placement 'vertex_cut'. 'none' = off.",
        },
    )
    metis_max_edges: int = field(
        default=40_000_000,
        metadata={
            "max": 1 << 40,
            "help": "Most directed edges METIS is given (it holds ~100 bytes per edge): a larger graph, "
            "or part for the clusters, is first coarsened by size-constrained label propagation and "
            "the result refined (graphs/kernels/coarsen.py); 0 = no limit.",
        },
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.num_parts < 1:
            raise ValueError(f"num_parts must be >= 1, got {self.num_parts}")
        if self.clusters_per_part < 1:
            raise ValueError(f"clusters_per_part must be >= 1, got {self.clusters_per_part}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.vertex_cut != "none":
            edge_partitioner_class(self.vertex_cut)  # ValueError naming the registered ones
            if self.num_parts > MAX_VERTEX_CUT_PARTS:
                raise ValueError(
                    f"vertex_cut={self.vertex_cut!r} places edges on at most {MAX_VERTEX_CUT_PARTS} parts; "
                    f"num_parts={self.num_parts}"
                )
        if self.metis_max_edges < 0:
            raise ValueError(f"metis_max_edges must be >= 0 (0 = no limit), got {self.metis_max_edges}")


# ----------------------------------------------------------------------------- graph


def read_edges(canonical_dir: str | os.PathLike) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, src, dst) of a canonical graph; src/dst int64, sorted by (src, dst)."""
    graph = CanonicalGraph.open(canonical_dir)
    n, m, path = graph.num_nodes, graph.num_edges, graph.edges_path
    # streamed into preallocated arrays: a whole Arrow table would double the peak memory
    src, dst = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    k = 0
    for s, d in edge_batches(graph.root):
        if k + len(s) > m:
            raise ValueError(f"{path}: holds more than the {m} edges summary.json gives")
        src[k : k + len(s)] = s
        dst[k : k + len(s)] = d
        k += len(s)
    if k != m:
        raise ValueError(f"{path}: holds {k} edges but summary.json says {m}")
    return n, src, dst


def read_edge_weights(canonical_dir: str | os.PathLike) -> np.ndarray | None:
    """float64 weight per edge of a weighted canonical graph (edges.parquet order), else None."""
    graph = CanonicalGraph.open(canonical_dir)
    if not graph.weighted:
        return None
    return pq.read_table(graph.verified(graph.EDGES), columns=["weight"]).column(0).to_numpy()


def metis_edge_weights(weight: np.ndarray) -> np.ndarray:
    """int32 METIS edge weights ``max(1, round(w * S / w_max))``, S = min(1000, 2^30 // edges)."""
    if len(weight) == 0:
        return np.empty(0, dtype=np.int32)
    scale = max(1, min(METIS_WEIGHT_SCALE, METIS_WEIGHT_TOTAL // len(weight)))
    return np.maximum(1, np.rint(weight * (scale / float(weight.max())))).astype(np.int32)


def metis_assign_weighted(
    indptr: np.ndarray,
    indices: np.ndarray,
    weight: np.ndarray,
    k: int,
    balance_edges: bool = False,
    symmetric: bool = False,
) -> np.ndarray:
    """int32 part id per node from METIS (pymetis) with integer edge weights from `weight`.

    The CSR must have no self loops (canonical graphs have none). Unless `symmetric` says
    it already is (a symmetrized canonical graph and its induced subgraphs), the graph is
    made symmetric as A + Aᵀ when it is not. `balance_edges` weighs each node by its
    degree + 1 (DGL's balance_edges uses the in-degree; + 1 keeps isolated nodes weighed).
    """
    return metis_assign_csr(indptr, indices, k, balance_edges, symmetric, weight=weight)


def csr_indptr(src: np.ndarray, n: int) -> np.ndarray:
    """int64 [n + 1] row pointers of edges sorted by src."""
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr


def read_csr(canonical_dir: str | os.PathLike) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, indptr, indices) of a canonical graph in METIS's idx_t, streamed from edges.parquet.

    The edges are sorted by (src, dst), so `indices` is the dst column and `indptr` comes from
    per-batch counts of src: no src array and no Arrow table is ever whole in memory; the
    peak is the CSR itself plus one batch.
    """
    graph = CanonicalGraph.open(canonical_dir)
    n, m, path = graph.num_nodes, graph.num_edges, graph.edges_path
    dtype = metis_idx_dtype()
    counts = np.zeros(n + 1, dtype=dtype)
    indices = np.empty(m, dtype=dtype)
    k, last = 0, -1
    for s, d in edge_batches(graph.root):
        if not len(s):
            continue
        if k + len(s) > m:
            raise ValueError(f"{path}: holds more than the {m} edges summary.json gives")
        if s[0] < last or (len(s) > 1 and np.any(s[1:] < s[:-1])):
            raise ValueError(f"{path}: src is not sorted ascending (re-materialize canonical_graph)")
        if s[-1] >= n or d.min() < 0 or d.max() >= n:
            raise ValueError(f"{path}: node ids outside 0..{n - 1} (summary.json gives {n} nodes)")
        counts[s[0] + 1 : s[-1] + 2] += np.bincount(s - s[0])
        indices[k : k + len(s)] = d
        k, last = k + len(s), s[-1]
    if k != m:
        raise ValueError(f"{path}: holds {k} edges but summary.json says {m}")
    np.cumsum(counts, out=counts)
    return n, counts, indices


def metis_assign_csr(
    indptr: np.ndarray,
    indices: np.ndarray,
    k: int,
    balance_edges: bool = False,
    symmetric: bool = False,
    weight: np.ndarray | None = None,
    seed: int = 0,
    max_edges: int = 0,
    balance: np.ndarray | None = None,
) -> np.ndarray:
    """int32 part id per node from METIS 5 k-way (pymetis, edge-cut objective, seeded).

    `balance` (bool or 0/1 per node, [n] or [n, c]) adds c balance constraints: METIS also spreads
    the nodes of each column evenly over the parts (the training nodes, one column per node type).

    Deterministic: the same CSR, k and seed give the same assignment in every process. The
    CSR must have no self loops (canonical graphs have none). Unless `symmetric` says it
    already is, it is made symmetric as A + Aᵀ when it is not (as DGL's METIS does).
    `weight` (float per edge) becomes integer METIS edge weights (`metis_edge_weights`).
    `balance_edges` weighs each node by its degree + 1 (DGL's balance_edges uses the
    in-degree; + 1 keeps isolated nodes weighed). `balance` (a bool per node, e.g. the training
    nodes) adds a second balance constraint: METIS also spreads those nodes evenly over the
    parts (multi-constraint k-way, `graphs.kernels.metis.metis_kway_multi`). A symmetric CSR already in METIS's idx_t
    (`read_csr`) is handed over without a copy. With `max_edges` > 0, a graph of more directed
    edges is coarsened first and METIS partitions the coarse graph (`graphs.kernels.coarsen`).
    """
    import pymetis

    n = len(indptr) - 1
    if k == 1 or n == 0:
        return np.zeros(n, dtype=np.int32)
    if k >= n:
        return np.arange(n, dtype=np.int32)
    dtype = metis_idx_dtype()
    if not symmetric:
        import scipy.sparse as sp

        data = weight if weight is not None else np.ones(len(indices), dtype=np.float32)
        a = sp.csr_matrix((data, indices, indptr), shape=(n, n))
        if (a != a.T).nnz:
            a = (a + a.T).tocsr()
            a.sort_indices()
            indptr, indices = a.indptr, a.indices
            weight = a.data if weight is not None else None
        del a
    if max_edges and len(indices) > max_edges:
        vweight = np.diff(np.asarray(indptr, dtype=np.int64)) + 1 if balance_edges else np.ones(n, dtype=np.int64)
        eweight = metis_edge_weights(weight).astype(np.int64) if weight is not None else None
        extra = None if balance is None else np.asarray(balance, dtype=np.int64).reshape(n, -1)
        level = Level(np.asarray(indptr, dtype=np.int64), indices, eweight, vweight, extra)
        return metis_levels(level, k, max_edges, seed)
    xadj, adjncy = np.asarray(indptr, dtype=dtype), np.asarray(indices, dtype=dtype)
    vweights = (np.diff(xadj) + 1).astype(dtype) if balance_edges else None
    eweights = metis_edge_weights(weight).astype(dtype) if weight is not None else None
    if balance is not None:  # constraints per node: [its weight, 1 in each column where it is to be balanced]
        base = vweights if vweights is not None else np.ones(n, dtype=dtype)
        extra = np.asarray(balance, dtype=dtype).reshape(n, -1)
        both = np.concatenate([base[:, None], extra], axis=1)
        return metis_kway_multi(xadj, adjncy, k, both, eweights, seed).astype(np.int32)
    with quiet_stdout():
        _, parts = pymetis.part_graph(
            k,
            pymetis.CSRAdjacency(xadj, adjncy),
            eweights=eweights,
            vweights=vweights,
            options=pymetis.Options(seed=int(seed)),
        )
    return np.asarray(parts, dtype=np.int32)


def csr_clusters(
    indptr: np.ndarray,
    indices: np.ndarray,
    cores: list[np.ndarray],
    clusters_per_part: int,
    weight: np.ndarray | None = None,
    symmetric: bool = False,
    seed: int = 0,
    max_edges: int = 0,
) -> np.ndarray:
    """int32 global cluster id p * C + c: seeded METIS into C clusters on each part's induced
    subgraph, cut out of the CSR one part at a time (a part without inner edges: contiguous chunks);
    `max_edges` as in `metis_assign_csr`."""
    C = clusters_per_part
    n = len(indptr) - 1
    cluster = np.empty(n, dtype=np.int32)
    local = np.full(n, -1, dtype=np.int64)
    for p, core in enumerate(cores):
        c = min(C, len(core))
        if c <= 1:
            local_part = np.zeros(len(core), dtype=np.int32)
        else:
            sub_ptr, sub_idx, sub_w = induced_csr(indptr, indices, core, local, weight)
            if len(sub_idx) == 0:
                local_part = (np.arange(len(core)) * c // len(core)).astype(np.int32)
            else:
                local_part = metis_assign_csr(
                    sub_ptr, sub_idx, c, symmetric=symmetric, weight=sub_w, seed=seed, max_edges=max_edges
                )
        cluster[core] = p * C + local_part
    return cluster


def random_assign(n: int, k: int, seed: int = 0) -> np.ndarray:
    """int32 part id per node: splitmix64 hash of (node id, seed) mod k — the baseline."""
    z = np.arange(n, dtype=np.uint64) + np.uint64((seed + 1) * 0x9E3779B97F4A7C15 % 2**64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z % np.uint64(k)).astype(np.int32)


# ----------------------------------------------------------------------------- stage


def build_partitions(
    canonical_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    cfg: PartitionConfig | None = None,
    graph_name: str = "graph",
) -> dict:
    """Partition the canonical graph in `canonical_dir`; write the files listed above atomically.

    Returns the summary dict (also summary.json) with "metis" and "random" metrics side by side.
    """
    cfg = cfg or PartitionConfig()
    k = cfg.num_parts
    canonical = Path(canonical_dir)
    t0 = time.perf_counter()
    _verify_inputs(canonical, cfg)
    n, indptr, indices = read_csr(canonical)
    weight = read_edge_weights(canonical)
    symmetrized = CanonicalGraph.open(canonical).symmetrized
    seconds = {"load": time.perf_counter() - t0}

    train = train_mask(canonical, n)
    typed = TypedSchema.read(canonical)
    node_types = None if typed is None else typed.node_types_of(np.arange(n))
    random = _random_baseline(indptr, indices, k, cfg.seed, weight, seconds, train)
    part, cores, halos, metis = _metis_parts(
        canonical, indptr, indices, cfg, symmetrized, weight, train, seconds, node_types
    )
    if typed is not None:
        random_part = random_assign(n, k, cfg.seed)
        random.update(type_balance(random_part, k, node_types, typed.schema.node_types))
        metis.update(type_balance(part, k, node_types, typed.schema.node_types))

    t = time.perf_counter()
    cluster = csr_clusters(
        indptr, indices, cores, cfg.clusters_per_part, weight, symmetrized, cfg.seed, cfg.metis_max_edges
    )
    seconds["clusters"] = time.perf_counter() - t
    edges = _vertex_cut(indptr, indices, cfg, symmetrized, train, seconds)

    with atomic_output_dir(out_dir) as tmp:
        num_clusters = _save_assignments(tmp, part, cluster, cores, halos)
        if edges is not None:
            (tmp / Partitions.EDGE_PART).parent.mkdir()
            np.save(tmp / Partitions.EDGE_PART, edges.edge_part)
            np.save(tmp / Partitions.MASTER, edges.master)
        del cluster, cores, halos  # written: the DistDGL export below needs only the CSR and part
        if cfg.write_distdgl:
            t = time.perf_counter()
            orig_nids = write_distdgl(canonical, tmp / Partitions.DISTDGL, indptr, indices, part, k, graph_name)
            np.save(tmp / Partitions.ORIG_NIDS, orig_nids)
            del orig_nids
            seconds["distdgl_write"] = time.perf_counter() - t
        _plot_sizes(metis, random, tmp / Partitions.SIZES_PLOT)
        summary = {
            "format_version": FORMAT_VERSION,
            "nodes": n,
            "edges": int(len(indices)),
            "num_parts": k,
            "balance_edges": cfg.balance_edges,
            "balance_train_nodes": cfg.balance_train_nodes,
            "balance_node_types": bool(node_types is not None and cfg.balance_node_types),
            "weighted": weight is not None,
            "metis_coarsened": bool(cfg.metis_max_edges and len(indices) > cfg.metis_max_edges),
            "clusters_per_part": cfg.clusters_per_part,
            "clusters": num_clusters,
            "graph_name": graph_name,
            "distdgl_config": f"{Partitions.DISTDGL}/{graph_name}.json" if cfg.write_distdgl else None,
            "metis": metis,
            "random": random,
            **({"vertex_cut": edges.metrics} if edges is not None else {}),
            "seconds": {name: round(v, 3) for name, v in seconds.items()},
            "total_seconds": round(time.perf_counter() - t0, 3),
            "peak_rss_bytes": peak_rss_bytes(),
        }
        write_summary(tmp, summary)
    return summary


def _metis_parts(
    canonical: Path, indptr, indices, cfg: PartitionConfig, symmetrized: bool, weight, train, seconds, node_types=None
):
    """(part id per node, cores, halos, metrics) of METIS's assignment; its times into `seconds`.
    `node_types` (a typed graph's type index per node) adds a balance constraint per type."""
    k = cfg.num_parts
    if cfg.balance_train_nodes and not train.any():
        raise ValueError(
            f"{canonical}: balance_train_nodes needs training nodes (split 'train' with a label); it has none"
        )
    columns = [train] if cfg.balance_train_nodes else []
    if node_types is not None and cfg.balance_node_types and node_types.max(initial=0) > 0:
        columns += [node_types == t for t in range(int(node_types.max()) + 1)]
    t = time.perf_counter()
    part = metis_assign_csr(
        indptr,
        indices,
        k,
        cfg.balance_edges,
        symmetrized,
        weight=weight,
        seed=cfg.seed,
        max_edges=cfg.metis_max_edges,
        balance=np.stack(columns, axis=1) if columns else None,
    )
    seconds["metis_assign"] = time.perf_counter() - t
    metis_rss = peak_rss_bytes()
    t = time.perf_counter()
    cores, halos = csr_halos(indptr, indices, part, k)
    seconds["halo"] = time.perf_counter() - t
    metis = csr_metrics(indptr, indices, part, k, halos, weight)
    metis.update(seconds=round(seconds["metis_assign"], 3), peak_rss_bytes=metis_rss)
    metis.update(train_balance(part, k, train))
    return part, cores, halos, metis


def _vertex_cut(indptr, indices, cfg: PartitionConfig, symmetrized: bool, train, seconds: dict):
    """The edge partition of ``cfg.vertex_cut`` (`graphs.stages.vertex_cut`), or None when off;
    its time and peak memory into its metrics, its time into `seconds`."""
    if cfg.vertex_cut == "none":
        return None
    t = time.perf_counter()
    fallback = random_assign(len(indptr) - 1, cfg.num_parts, cfg.seed)  # the part of an isolated vertex
    edges = vertex_cut(cfg.vertex_cut, indptr, indices, cfg.num_parts, cfg.seed, symmetrized, train, fallback)
    seconds["vertex_cut"] = time.perf_counter() - t
    edges.metrics.update(seconds=round(seconds["vertex_cut"], 3), peak_rss_bytes=peak_rss_bytes())
    return edges


def _random_baseline(indptr, indices, k: int, seed: int, weight, seconds: dict, train: np.ndarray) -> dict:
    """The metrics of a seeded random assignment, the baseline METIS is compared with; its time into `seconds`."""
    t = time.perf_counter()
    random_part = random_assign(len(indptr) - 1, k, seed)
    seconds["random_assign"] = time.perf_counter() - t
    random_halos = csr_halos(indptr, indices, random_part, k)[1]
    random = csr_metrics(indptr, indices, random_part, k, random_halos, weight)
    random.update(seconds=round(seconds["random_assign"], 3), peak_rss_bytes=peak_rss_bytes())
    random.update(train_balance(random_part, k, train))
    return random


def _save_assignments(tmp: Path, part: np.ndarray, cluster: np.ndarray, cores: list, halos: list) -> int:
    """Save part_id.npy, cluster_id.npy and each part's core and halo nodes; the number of clusters."""
    np.save(tmp / Partitions.PART_ID, part)
    np.save(tmp / Partitions.CLUSTER_ID, cluster)
    for p in range(len(cores)):
        (tmp / Partitions.part_file(p, Partitions.CORE_NODES)).parent.mkdir()
        np.save(tmp / Partitions.part_file(p, Partitions.CORE_NODES), cores[p])
        np.save(tmp / Partitions.part_file(p, Partitions.HALO_NODES), halos[p])
    return int(len(np.unique(cluster)))


def _verify_inputs(canonical: Path, cfg: PartitionConfig) -> None:
    """Check every canonical file the stage will read against its hashes.json before any work
    (`graphs.infra.storage.verify_inputs`; the readers check again, from the per-process digest cache)."""
    distdgl = (CanonicalGraph.NODES, CanonicalGraph.FEATURES) if cfg.write_distdgl else ()
    if cfg.write_distdgl and CanonicalGraph.open(canonical).typed:
        distdgl += (CanonicalGraph.TYPES, CanonicalGraph.TYPED_EDGES)
    verify_inputs(canonical, (CanonicalGraph.SUMMARY, CanonicalGraph.EDGES, *distdgl))


def _plot_sizes(metis: dict, random: dict, path: Path) -> None:
    plt = headless_pyplot()

    k = len(metis["nodes_per_part"])
    x = np.arange(k)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(8, 3.2), dpi=100, gridspec_kw={"width_ratios": [3, 1]})
    for offset, name, m in ((-0.2, "METIS", metis), (0.2, "random", random)):
        ax.bar(x + offset, m["nodes_per_part"], 0.38, label=f"{name} core")
        ax.bar(x + offset, m["halo_per_part"], 0.38, bottom=m["nodes_per_part"], alpha=0.5, label=f"{name} halo")
    ax.set_xticks(x)
    ax.set_xlabel("part")
    ax.set_ylabel("nodes")
    ax.legend(fontsize=7)
    ax2.bar(["METIS", "random"], [metis["edge_cut_ratio"], random["edge_cut_ratio"]], color=["C0", "C2"])
    ax2.set_ylabel("edge-cut ratio")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


__all__ = [
    "Partitions",
    "FORMAT_VERSION",
    "PartitionConfig",
    "build_partitions",
    "csr_clusters",
    "induced_csr",
    "metis_assign_csr",
    "read_csr",
    "csr_indptr",
    "dgl_graph",
    "load_parts",
    "metis_assign",
    "random_assign",
    "read_edges",
]
