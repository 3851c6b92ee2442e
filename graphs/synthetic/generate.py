"""Synthetic graphs for demos, tests and benchmarks: a degree-corrected stochastic block model.

The generator writes a dataset in gnnflow's input layout (the landing layout of docs/landing.md),
streaming, so 10M nodes / 100M edges fit in well under 4 GB of memory.

Model (DC-SBM, Karrer & Newman 2011, sampled edge by edge like Chung-Lu)
-----------------------------------------------------------------------
- `num_nodes` nodes get classes 0..k-1, balanced (class sizes differ by at most one),
  assigned by a random permutation, so node ids carry no information about labels. With
  `minority_fraction` f > 0 the last class gets round(n f) nodes (an imbalanced task such as
  fraud) and the other k-1 classes share the rest evenly; edges follow the same rules, so a
  minority node's inter-class edges (1 - homophily of them) mostly lead to the majority.
- Each node gets a propensity `theta_i` drawn from a Pareto law with minimum 1 and
  density ~ theta^-degree_exponent, so the degree distribution has the tail
  P(deg = d) ~ d^-degree_exponent. `theta` is capped at the structural cutoff (expected
  degree about sqrt(2 * num_edges)), which keeps multi-edges between hubs rare.
- Each of the `num_edges` edge rows is drawn independently: `src` with probability
  proportional to theta over all nodes; with probability `homophily` the edge stays in
  src's class, otherwise it goes to one of the other k-1 classes chosen uniformly; `dst`
  is drawn proportional to theta inside that class. Hence the expected degree of node i
  is about 2 * num_edges * theta_i / sum(theta) and the fraction of intra-class edge rows
  is `homophily` in expectation. Self loops and duplicate rows are possible but rare; the
  ingest stage drops self loops, symmetrizes and dedupes.
- Features: each class has a random unit-norm centroid in R^feature_dim; a node's feature
  is its class centroid plus i.i.d. N(0, feature_noise^2) noise per coordinate. With the
  defaults a classifier on a node's own features is mediocre, while averaging over the
  1-hop neighbourhood (what a GNN layer does) removes most of the noise — see
  `demo_config` for measured figures.
- Weights (only with `heavy_weight` > 0): edge files get a float64 `weight` column,
  `heavy_weight` on intra-class rows and 1.0 on the others, so the class signal of the
  graph lies in its heavy edges; with a low `homophily` the light edges are mostly
  heterophilous noise that only a weighted pipeline can tell apart. `heavy_weight=1`
  writes the column with every weight 1.0.
- Splits: a random permutation puts exactly round(n * train_fraction) nodes in `train`,
  round(n * val_fraction) in `val`, the rest in `test`. Defaults 0.6 / 0.2 / 0.2.

Sampling is vectorised per block of edges. Drawing "proportional to theta inside class c"
is one lookup in a single cumulative-weight array over the nodes sorted by class (class c
is one contiguous segment), accelerated by a guide table (Chen & Asau's indexed search)
so that each draw costs O(1) expected memory accesses instead of a binary search.

Determinism
-----------
All randomness comes from `numpy.random.Generator(PCG64)` streams derived from
`SeedSequence(seed)`: one child per node-level quantity and one per block of
`_EDGE_BLOCK` edges (`spawn_key=(stream, block)`, the keys `SeedSequence.spawn` would
give). The same seed and config always give identical files, and the node tables and the
concatenated edge rows (files in order) do not even depend on `num_edge_files` or
`chunk_edges`, which only decide how the rows are cut into files and row groups.

Files written (format version 1; each file's Parquet schema metadata holds
`gnnflow.generate` = JSON {"format_version": 1, "config": {...}})
---------------------------------------------------------------------------------------
- `<out_dir>/edges/part-00000.parquet` ... `part-{num_edge_files-1:05d}.parquet`:
  columns `src` int64, `dst` int64 (node ids); file f holds the edge rows
  [f * E // F, (f + 1) * E // F) of the global sequence, row groups of `chunk_edges` rows.
- `<out_dir>/nodes.parquet`: `node_id` int64 (id_offset + 0..n-1, ascending),
  `label` int32 (0..k-1), `split` string (`train` / `val` / `test`).
- `<out_dir>/features.parquet`: `node_id` int64 (same order), `feat`
  fixed_size_list<float32>[feature_dim]; written in row groups of `_NODE_BLOCK` rows so the
  n x feature_dim matrix never sits in memory.

`out_dir` is replaced atomically: everything is written into a temporary sibling folder
that is renamed into place only when complete. A non-empty `out_dir` that the generator
did not write (e.g. the whole landing folder) is refused, never replaced.

Usage::

    from graphs.synthetic.generate import demo_config, generate_dataset
    summary = generate_dataset(demo_config(), "landing/demo")
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from graphs.infra.config_checks import MAX_CLASSES, MAX_ROWS, MAX_SEED, MAX_WIDTH, bounded_repr, check_fields
from graphs.infra.storage import atomic_output_dir, dir_bytes
from graphs.stages.landing import FEATURES_FILE, NODES_FILE

FORMAT_VERSION = 1
"""Version of the generated layout, stored in every file's schema metadata."""

SPLIT_NAMES = ("train", "val", "test")

_EDGE_BLOCK = 1 << 16
"""Edge rows per random block (one child seed each); fixed so output ignores chunk_edges."""

_NODE_BLOCK = 1 << 16
"""Nodes per random feature block and per row group of nodes/features.parquet."""

# spawn_key[0] of each random stream; never reorder (it would change every dataset).
_STREAM_THETA, _STREAM_LABELS, _STREAM_SPLITS, _STREAM_CENTROIDS = 0, 1, 2, 3
_STREAM_FEATURES, _STREAM_EDGES = 4, 5


@dataclass(kw_only=True)
class GenerateConfig:
    """Parameters of the degree-corrected stochastic block model and of the files written."""

    num_nodes: int = field(
        default=100_000, metadata={"max": 1 << 40, "help": "Number of nodes n (ids id_offset .. id_offset+n-1)."}
    )

    num_edges: int = field(
        default=1_000_000,
        metadata={"max": 1 << 40, "help": "Number of directed edge rows written (before ingest symmetrizes/dedupes)."},
    )

    num_classes: int = field(
        default=8, metadata={"max": MAX_CLASSES, "help": "Number of classes k (labels 0..k-1, balanced)."}
    )

    homophily: float = field(
        default=0.85,
        metadata={"help": "Expected fraction of edge rows whose endpoints share a class, in [0, 1]."},
    )

    degree_exponent: float = field(
        default=2.5,
        metadata={"help": "Power-law exponent gamma of the degree distribution, P(deg=d) ~ d^-gamma; > 1."},
    )

    feature_dim: int = field(default=32, metadata={"max": MAX_WIDTH, "help": "Length D of each node's feature vector."})

    feature_noise: float = field(
        default=0.7,
        metadata={"help": "Std of the Gaussian noise per feature coordinate; class centroids have unit norm."},
    )

    train_fraction: float = field(default=0.6, metadata={"help": "Fraction of nodes in the 'train' split."})

    val_fraction: float = field(
        default=0.2,
        metadata={"help": "Fraction of nodes in the 'val' split; the rest is 'test'."},
    )

    num_edge_files: int = field(default=4, metadata={"max": 1 << 16, "help": "Number of Parquet files under edges/."})

    chunk_edges: int = field(
        default=1 << 20,
        metadata={"max": MAX_ROWS, "help": "Edge rows generated per step and per Parquet row group (memory vs speed)."},
    )

    seed: int = field(default=0, metadata={"max": MAX_SEED, "help": "Seed of all random streams (>= 0)."})

    id_offset: int = field(
        default=0, metadata={"max": 2**63 - 1, "help": "Added to 0..n-1 to form the node ids written."}
    )

    minority_fraction: float = field(
        default=0.0,
        metadata={
            "help": "> 0: an imbalanced task: the last class (k-1) gets round(n x this) nodes (at least 1) and the "
            "other classes share the rest evenly; 0: balanced classes."
        },
    )

    heavy_weight: float = field(
        default=0.0,
        metadata={"help": "> 0: write a weight column, this on intra-class rows and 1.0 on others; 0: none."},
    )
    """> 0: write a weight column, this on intra-class rows and 1.0 on others; 0: none."""

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> None:
            raise ValueError(f"GenerateConfig.{name}={bounded_repr(getattr(self, name))}: {why}")

        check_fields(self, "GenerateConfig")
        if self.num_nodes < 1:
            fail("num_nodes", "must be >= 1")
        if self.num_edges < 0:
            fail("num_edges", "must be >= 0")
        if self.num_classes < 1:
            fail("num_classes", "must be >= 1")
        if self.num_classes > self.num_nodes:
            fail("num_classes", f"must be <= num_nodes={self.num_nodes} (every class needs a node)")
        if not 0.0 <= self.homophily <= 1.0:
            fail("homophily", "must be in [0, 1]")
        if self.num_classes == 1 and self.homophily != 1.0:
            fail("homophily", "must be 1.0 when num_classes == 1 (no other class to link to)")
        if self.degree_exponent <= 1.0:
            fail("degree_exponent", "must be > 1 (a power law d^-gamma needs gamma > 1)")
        if self.feature_dim < 1:
            fail("feature_dim", "must be >= 1")
        if self.feature_noise < 0:
            fail("feature_noise", "must be >= 0")
        if not 0.0 <= self.train_fraction <= 1.0:
            fail("train_fraction", "must be in [0, 1]")
        if not 0.0 <= self.val_fraction <= 1.0:
            fail("val_fraction", "must be in [0, 1]")
        if self.train_fraction + self.val_fraction > 1.0 + 1e-12:
            fail(
                "val_fraction",
                f"train_fraction + val_fraction must be <= 1 (got {self.train_fraction} + {self.val_fraction})",
            )
        if self.minority_fraction:
            if not 0.0 < self.minority_fraction < 1.0:
                fail("minority_fraction", "must be in (0, 1), or 0 for balanced classes")
            if self.num_classes < 2:
                fail("minority_fraction", "needs num_classes >= 2 (a minority and at least one other class)")
            if self.num_nodes - self.minority_nodes < self.num_classes - 1:
                fail("minority_fraction", "leaves fewer nodes than the other classes need (one each)")
        if self.heavy_weight < 0:
            fail("heavy_weight", "must be >= 0 (0 = no weight column)")
        if self.num_edge_files < 1:
            fail("num_edge_files", "must be >= 1")
        if self.chunk_edges < 1:
            fail("chunk_edges", "must be >= 1")
        if self.seed < 0:
            fail("seed", "must be >= 0 (SeedSequence entropy)")
        int64 = np.iinfo(np.int64)
        if not (int64.min <= self.id_offset and self.id_offset + self.num_nodes - 1 <= int64.max):
            fail("id_offset", "node ids id_offset .. id_offset+num_nodes-1 must fit in int64")

    @property
    def minority_nodes(self) -> int:
        """Nodes of the last class with `minority_fraction` (0 when balanced)."""
        return max(1, round(self.num_nodes * self.minority_fraction)) if self.minority_fraction else 0


def demo_config() -> GenerateConfig:
    """The `make demo` dataset: 100k nodes, 1M edge rows, 8 classes, 32-dim features.

    Measured on this config (seed 0; multinomial logistic regression fitted on the train
    split, scored on the test split): 0.52 accuracy on a node's own features, 0.96 on
    features averaged over its 1-hop neighbourhood (mean over A + I of the symmetrized,
    deduplicated graph), so graph structure is worth about 44 points.
    """
    return GenerateConfig(num_nodes=100_000, num_edges=1_000_000)


def scale_config(num_nodes: int, num_edges: int, seed: int = 0) -> GenerateConfig:
    """Benchmark recipe (e.g. 1M/10M or 10M/100M): defaults, ~10M edge rows per file."""
    return GenerateConfig(
        num_nodes=num_nodes,
        num_edges=num_edges,
        seed=seed,
        num_edge_files=max(4, -(-num_edges // 10_000_000)),
    )


def _rng(seed: int, *key: int) -> np.random.Generator:
    """Generator for one random stream; equal to SeedSequence(seed).spawn(...) nesting."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def _schema_metadata(config: GenerateConfig) -> dict[bytes, bytes]:
    payload = {"format_version": FORMAT_VERSION, "config": dataclasses.asdict(config)}
    return {b"gnnflow.generate": json.dumps(payload, sort_keys=True).encode()}


@dataclass
class _Model:
    """Node-level arrays of a sampled DC-SBM (all n-sized or k-sized)."""

    labels: np.ndarray  # int32[n], class of node i
    split: np.ndarray  # int8[n], index into SPLIT_NAMES
    order: np.ndarray  # int64[n], node ids sorted by class (class c is one segment)
    class_end: np.ndarray  # int64[k], end of class c's segment in `order`
    seg_lo: np.ndarray  # float64[k], cumulative weight before class c's segment
    seg_hi: np.ndarray  # float64[k], cumulative weight at the end of class c's segment
    cum: np.ndarray  # float64[n + 1], inclusive cumsum of theta in `order` order, then +inf
    guide: np.ndarray  # int32/int64[G], first position with cum > g * total / G
    centroids: np.ndarray  # float32[k, D], unit-norm class centroids


def _propensities(config: GenerateConfig) -> np.ndarray:
    """theta_i ~ Pareto(min 1, density ~ x^-gamma), capped at the structural cutoff."""
    n, m = config.num_nodes, config.num_edges
    theta = _rng(config.seed, _STREAM_THETA).pareto(config.degree_exponent - 1.0, n) + 1.0
    np.minimum(theta, float(n), out=theta)  # finite even for gamma near 1
    if m > 0:
        # Expected degree 2m * theta / sum(theta) <= sqrt(2m); a few fixed-point steps on the
        # cap because capping lowers sum(theta). Beyond it hubs would need repeated edges.
        cap = float(n)
        for _ in range(4):
            cap = math.sqrt(2.0 * m) * float(np.minimum(theta, cap).sum()) / (2.0 * m)
        np.minimum(theta, max(cap, 1.0), out=theta)
    return theta


def _build_model(config: GenerateConfig) -> _Model:
    n, k, seed = config.num_nodes, config.num_classes, config.seed
    theta = _propensities(config)

    # Balanced classes through a random permutation: node perm[j] gets class j % k, so the
    # nodes of class c, in segment order, are perm[c::k]. With a minority class, its m nodes
    # are perm[:m] (class k-1) and the others share perm[m:] the same way over k-1 classes.
    perm = _rng(seed, _STREAM_LABELS).permutation(n)
    labels = np.empty(n, dtype=np.int32)
    m = config.minority_nodes
    if m:
        rest = perm[m:]
        labels[perm[:m]] = k - 1
        labels[rest] = np.arange(n - m, dtype=np.int64) % (k - 1)
        order = np.concatenate([rest[c :: k - 1] for c in range(k - 1)] + [perm[:m]]).astype(np.int64)
    else:
        labels[perm] = np.arange(n, dtype=np.int64) % k
        order = np.concatenate([perm[c::k] for c in range(k)]).astype(np.int64)
    class_end = np.cumsum(np.bincount(labels, minlength=k)).astype(np.int64)
    del perm

    cum = np.empty(n + 1, dtype=np.float64)
    np.cumsum(theta[order], out=cum[:n])
    cum[n] = np.inf  # sentinel: a forward scan never runs past the end
    del theta
    total = cum[n - 1]
    seg_hi = cum[class_end - 1].copy()
    seg_lo = np.concatenate([[0.0], seg_hi[:-1]])

    # Guide table with G = n buckets of equal weight: bucket g starts at the first position
    # whose cumulative weight exceeds its left edge (searched in sorted order: cheap).
    edges = np.arange(n, dtype=np.float64) * (total / n)
    guide = np.searchsorted(cum[:n], edges, side="right")
    guide = guide.astype(np.int32 if n < 2**31 - 1 else np.int64)

    split_perm = _rng(seed, _STREAM_SPLITS).permutation(n)
    n_train = round(n * config.train_fraction)
    n_val = min(round(n * config.val_fraction), n - n_train)
    split = np.full(n, 2, dtype=np.int8)
    split[split_perm[:n_train]] = 0
    split[split_perm[n_train : n_train + n_val]] = 1
    del split_perm

    centroids = _rng(seed, _STREAM_CENTROIDS).standard_normal((k, config.feature_dim))
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
    return _Model(labels, split, order, class_end, seg_lo, seg_hi, cum, guide, centroids.astype(np.float32))


def _draw_positions(model: _Model, u: np.ndarray, seg_last: np.ndarray | None) -> np.ndarray:
    """Positions p in class-sorted order with cum[p-1] <= u < cum[p] (inverse-CDF lookup).

    Starts at the guide-table entry for u's bucket, then scans forward (and backward, to be
    safe against rounding at bucket edges) over the few positions inside the bucket.
    `seg_last` clips each result to the last position of its intended class segment, in
    case u rounded up onto the segment's upper boundary.
    """
    cum, guide = model.cum, model.guide
    g = (u * (len(guide) / cum[-2])).astype(np.int64)
    np.clip(g, 0, len(guide) - 1, out=g)
    pos = guide[g].astype(np.int64)
    active = np.flatnonzero(cum[pos] <= u)
    while active.size:  # forward: the bucket holds about total/(n*min theta) positions
        pos[active] += 1
        active = active[cum[pos[active]] <= u[active]]
    active = np.flatnonzero(pos > 0)
    active = active[cum[pos[active] - 1] > u[active]]
    while active.size:  # backward: only after floating-point rounding at a bucket edge
        pos[active] -= 1
        active = active[(pos[active] > 0)]
        active = active[cum[pos[active] - 1] > u[active]]
    if seg_last is not None:
        np.minimum(pos, seg_last, out=pos)
    return pos


def _edge_block(model: _Model, config: GenerateConfig, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Edge rows [block * _EDGE_BLOCK, ...) of the global sequence as node ids (src, dst)."""
    start = block * _EDGE_BLOCK
    size = min(_EDGE_BLOCK, config.num_edges - start)
    rng = _rng(config.seed, _STREAM_EDGES, block)
    k = config.num_classes

    src_pos = _draw_positions(model, rng.random(size) * model.cum[-2], None)
    np.minimum(src_pos, len(model.order) - 1, out=src_pos)
    src_class = np.searchsorted(model.class_end, src_pos, side="right")

    # Intra-class with probability h; otherwise a uniformly chosen *other* class.
    inter = rng.random(size) >= config.homophily
    dst_class = src_class.copy()
    if k > 1:
        shift = rng.integers(1, k, size=size)
        dst_class[inter] = (src_class[inter] + shift[inter]) % k
    lo, hi = model.seg_lo[dst_class], model.seg_hi[dst_class]
    u = lo + rng.random(size) * (hi - lo)
    dst_pos = _draw_positions(model, u, model.class_end[dst_class] - 1)

    offset = np.int64(config.id_offset)
    return model.order[src_pos] + offset, model.order[dst_pos] + offset


def _write_nodes_and_features(model: _Model, config: GenerateConfig, out: Path, bar: tqdm) -> None:
    n, d = config.num_nodes, config.feature_dim
    meta = _schema_metadata(config)
    node_schema = pa.schema([("node_id", pa.int64()), ("label", pa.int32()), ("split", pa.string())], metadata=meta)
    feat_schema = pa.schema([("node_id", pa.int64()), ("feat", pa.list_(pa.float32(), d))], metadata=meta)
    split_names = pa.array(SPLIT_NAMES, type=pa.string())
    noise = np.float32(config.feature_noise)
    with (
        pq.ParquetWriter(out / NODES_FILE, node_schema) as node_writer,
        pq.ParquetWriter(out / FEATURES_FILE, feat_schema) as feat_writer,
    ):
        for block, start in enumerate(range(0, n, _NODE_BLOCK)):
            stop = min(start + _NODE_BLOCK, n)
            ids = pa.array(np.arange(start, stop, dtype=np.int64) + np.int64(config.id_offset))
            labels = model.labels[start:stop]
            node_writer.write_batch(
                pa.record_batch(
                    [ids, pa.array(labels), pc.take(split_names, pa.array(model.split[start:stop]))],
                    schema=node_schema,
                )
            )
            rng = _rng(config.seed, _STREAM_FEATURES, block)
            feat = rng.standard_normal((stop - start, d), dtype=np.float32)
            feat *= noise
            feat += model.centroids[labels]
            feat_writer.write_batch(
                pa.record_batch(
                    [ids, pa.FixedSizeListArray.from_arrays(pa.array(feat.reshape(-1)), d)],
                    schema=feat_schema,
                )
            )
            bar.update(stop - start)


def _write_edges(model: _Model, config: GenerateConfig, edge_dir: Path, bar: tqdm) -> dict:
    m, files, chunk = config.num_edges, config.num_edge_files, config.chunk_edges
    weighted = config.heavy_weight > 0
    fields = [("src", pa.int64()), ("dst", pa.int64())] + ([("weight", pa.float64())] if weighted else [])
    schema = pa.schema(fields, metadata=_schema_metadata(config))
    intra = self_loops = 0
    cached: tuple[int, np.ndarray, np.ndarray] | None = None  # block cut by a file boundary
    for f in range(files):
        f_start, f_stop = f * m // files, (f + 1) * m // files
        with pq.ParquetWriter(edge_dir / f"part-{f:05d}.parquet", schema) as writer:
            for c_start in range(f_start, f_stop, chunk):
                c_stop = min(c_start + chunk, f_stop)
                src = np.empty(c_stop - c_start, dtype=np.int64)
                dst = np.empty_like(src)
                for block in range(c_start // _EDGE_BLOCK, (c_stop - 1) // _EDGE_BLOCK + 1):
                    if cached is None or cached[0] != block:
                        cached = (block, *_edge_block(model, config, block))
                    b_start = block * _EDGE_BLOCK
                    lo, hi = max(c_start, b_start), min(c_stop, b_start + len(cached[1]))
                    src[lo - c_start : hi - c_start] = cached[1][lo - b_start : hi - b_start]
                    dst[lo - c_start : hi - c_start] = cached[2][lo - b_start : hi - b_start]
                offset = config.id_offset
                same = model.labels[src - offset] == model.labels[dst - offset]
                intra += int(np.count_nonzero(same))
                self_loops += int(np.count_nonzero(src == dst))
                columns = [pa.array(src), pa.array(dst)]
                if weighted:
                    columns.append(pa.array(np.where(same, float(config.heavy_weight), 1.0)))
                writer.write_batch(pa.record_batch(columns, schema=schema))
                bar.update(c_stop - c_start)
    return {"intra_class_fraction": intra / m if m else float("nan"), "self_loops": self_loops}


_GENERATED_ENTRIES = {"edges", NODES_FILE, FEATURES_FILE}


def check_replaceable(out_dir: str | os.PathLike) -> None:
    """FileExistsError unless `out_dir` is absent, empty, or a dataset this generator wrote.

    A generated dataset holds only edges/part-*.parquet, nodes.parquet and features.parquet,
    and its nodes.parquet carries the `gnnflow.generate` schema metadata; anything else (a
    landing folder of several datasets, a user's own data) is never replaced.
    """
    out = Path(out_dir)
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"{out}: exists and is not a folder; choose a new --out")
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return
    ours = entries <= _GENERATED_ENTRIES and (out / NODES_FILE).is_file()
    if ours:
        try:
            ours = b"gnnflow.generate" in (pq.read_schema(out / NODES_FILE).metadata or {})
        except Exception:  # not Parquet: not ours
            ours = False
    if ours and (out / "edges").is_dir():
        ours = all(p.name.startswith("part-") and p.suffix == ".parquet" for p in (out / "edges").iterdir())
    if not ours:
        raise FileExistsError(
            f"{out}: is not empty and was not written by the generator ({', '.join(sorted(entries)[:5])}"
            f"{', ...' if len(entries) > 5 else ''}); refusing to replace it; choose a new or empty --out"
        )


def generate_dataset(config: GenerateConfig, out_dir: str | os.PathLike, *, progress: bool = True) -> dict:
    """Sample a DC-SBM graph and write it to `out_dir` (replaced atomically).

    `out_dir` must be absent, empty, or an earlier output of this function
    (`check_replaceable`); anything else raises FileExistsError before a file is written.

    Returns a summary: `path`, `nodes`, `edge_rows`, `edge_files`, `bytes` (on disk),
    `seconds` (whole run: nodes, features and edges), `edges_per_second` (edge_rows /
    seconds), `intra_class_fraction` (measured on the rows written),
    `self_loops`.
    """
    check_replaceable(out_dir)
    t0 = time.perf_counter()
    model = _build_model(config)
    with atomic_output_dir(out_dir, record_hashes=False) as tmp:
        with tqdm(
            total=config.num_nodes, unit="node", unit_scale=True, desc="nodes+features", disable=not progress
        ) as bar:
            _write_nodes_and_features(model, config, tmp, bar)
        (tmp / "edges").mkdir()
        with tqdm(total=config.num_edges, unit="edge", unit_scale=True, desc="edges", disable=not progress) as bar:
            stats = _write_edges(model, config, tmp / "edges", bar)
    seconds = time.perf_counter() - t0
    return {
        "path": str(Path(out_dir)),
        "nodes": config.num_nodes,
        "edge_rows": config.num_edges,
        "edge_files": config.num_edge_files,
        "bytes": dir_bytes(out_dir),
        "seconds": seconds,
        "edges_per_second": config.num_edges / seconds if seconds > 0 else float("inf"),
        **stats,
    }
