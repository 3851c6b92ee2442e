"""Minibatch sampling written once as shard files: one stream of sampled blocks per DDP rank.

Four built-in samplers (``ShardConfig.sampler``; registered with their traits in
`graphs.sampling.registry`, one module each in `graphs.sampling.kinds`, where a new sampler is
one new module: docs/extending.md), each producing, per minibatch, one block per GNN
layer in the CSC layout of `training.blocks.Block` (destination nodes are the first
``num_dst`` source nodes; block ``l``'s destination nodes are block ``l + 1``'s source
nodes, so one array ``input_nodes`` of global ids names the nodes of every block):

``neighbor``
    DGL's neighbour sampling with ``fanouts`` (``fanouts[0]`` is the input layer, DGL's
    order; -1 takes every neighbour): the fused C++ path that
    ``dgl.dataloading.NeighborSampler.sample_blocks`` takes on a multi-threaded CPU
    (``DGLGraph.sample_neighbors_fused``, see `dgl_neighbor_blocks`), run with one thread,
    on a graph with int32 ids where they fit (`dgl_csc_graph`). With one thread it draws
    exactly the blocks ``NeighborSampler`` draws for the same ``dgl.seed`` on DGL's int64
    graph (tests/test_sampling.py checks this). Seeds are the training nodes.
``importance``
    Layer-wise importance sampling (LADIES, Zou et al. 2019; FastGCN's estimator on the
    neighbourhood of the layer's nodes): for the destination set S of a layer, every
    neighbour u of S has probability ``q_u ∝ Σ_{v∈S, v≠u} Â_vu²``; ``samplers.importance.nodes``
    nodes are drawn *with replacement*, and the sampled edge v <- u gets the weight
    ``Â_vu · c_u / (s · q_u)`` (``c_u`` = times u was drawn, ``s`` = draws); with the self
    loop added exactly (below), the block's aggregation ``Σ_u w_vu x_u`` is an unbiased
    estimate of the exact row ``(Â X)_v``. The next layer's destinations are S plus the
    drawn nodes.
``cluster_gcn``
    Cluster-GCN: each minibatch is the subgraph of Â induced by ``samplers.cluster_gcn.clusters`` METIS
    clusters (``cluster_id.npy`` of metis_partitions); every layer uses that one block
    (stored once: ``shared_block`` in the manifest). The loss nodes are its training nodes.
``saint``
    DGL's ``SAINTSampler`` (node, edge or random-walk mode). DGL 2.1 computes no
    normalization, so it is estimated as in GraphSAINT (Zeng et al. 2020, §3.2) from
    ``N`` pre-sampled subgraphs: ``C_v``, ``C_uv`` = how many contain node v / edge u->v.
    Aggregation normalization ``α_uv = C_uv / C_v``: the edge weight is ``Â_vu / α_uv``.
    Loss normalization: ``loss_weight_v = N / (C_v · T)`` (T = training nodes), so
    ``Σ_v loss_weight_v · loss_v`` over a subgraph is an unbiased estimate of the mean
    training loss. Counts are clamped at 1.

Edges and weights. Sampling runs on the graph of Â *without* its diagonal (a DGL graph
built from the normalized CSR minus the self loops: edge ``u -> v`` for each entry
``Â[v, u]``, so DGL's in-neighbours of v are row v of Â and a sampled edge id is a
position in those off-diagonal arrays). Each block then gets every destination's self
loop ``v -> v`` with weight ``Â_vv`` (first edge of each destination's segment) when
``self_loops`` is on and Â has a diagonal: the fanout counts real neighbours only, and
a GCN layer over the block computes what full-graph inference over Â computes.
Edge weights and corrections are stored apart: ``weight`` is Â's entry of each edge,
``correction`` the sampler's inverse inclusion probability (1 for self loops):
``neighbor`` ``deg(v) / sampled(v)`` when ``samplers.neighbor.rescale`` (uniform sampling without
replacement, so Σ Â·c x is an unbiased estimate of the row of Â·X; 1 without it). With
``samplers.neighbor.prob="weight"`` the fanout neighbours of v are drawn *with replacement* in
proportion to ``Â_vu`` (DGL's ``prob``: heavy edges of a weighted graph are drawn more
often), and each drawn edge gets the correction ``S_v / (Â_vu · draws(v))`` (``S_v`` = the
off-diagonal row sum of Â; Hansen-Hurwitz: ``E[Â_vu c_vu x_u] = Σ_u Â_vu x_u / draws`` per
draw) when ``rescale``; a layer with fanout -1 takes every neighbour (correction 1).
``prob="adaptive"`` draws the same way in proportion to a per-node mass p(u) mixing
degree and the previous training run's gradient norms, with the correction ``P_v / (p(u) ·
draws(v))`` (`graphs.sampling.weighting`, which also holds ``seed_weighting="class_balanced"``:
seeds drawn with replacement in inverse proportion to their class's training-node count).
``importance`` and ``saint`` store their corrections above (``c_u/(s·q_u)``, ``C_v/C_uv``),
``cluster_gcn`` 1 (Â restricted to the subgraph). Each layer type applies the correction
its own way (`training.layers.sampled_edge_weight`: GCN Â·c, GIN c (Â·c with
``edge_weights``), SAGE-mean the c-weighted (Â·c-weighted) mean; layers whose aggregation
is not linear, GAT and SAGE-pool, refuse shards whose manifest records ``non_uniform_draws``:
importance, saint, and neighbor with ``prob`` weight/adaptive). With
``weight_encoding="int8"`` the weights are stored as per-destination symmetric INT8
(`graphs.kernels.quantize_csr.quantize_int8_rows_csr`: ``q`` int8 per edge, ``scale`` float32 per
destination; weight = q * scale[dst]); the correction stays FP32.

Seeds per epoch (``neighbor`` and ``importance``): the training nodes (split "train",
label >= 0) are permuted with a seed per epoch and cut into W contiguous, disjoint parts
of ceil(T/W) or floor(T/W) nodes, so every training node is a seed exactly once per
epoch. Each rank's part is cut into the same number ``B = ceil(ceil(T/W) / batch_size)``
of minibatches whose sizes differ by at most one (none larger than ``batch_size``): equal
step counts across ranks (unequal counts hang DDP) with nothing dropped or repeated.
With ``placement="partition"`` the shares keep those sizes, but rank r fills its share first
with its own training nodes: the nodes of the METIS parts (metis_partitions' ``part_id.npy``)
assigned to r (`ranks_of_parts`: parts in decreasing order of training nodes, each to the
least-loaded rank, since METIS balances nodes and not training nodes); the surplus of ranks
owning more than their share fills the others' gaps (`schedule._place_on_owners`). So step
counts and batch sizes are exactly those of ``random``, DDP's gradient weighting is
unchanged, and most sampled neighbours (hence feature rows) are in the rank's own parts.
Whenever the parts are given (and number at least W), the writer measures per step the
share of gathered feature rows (``input_nodes``) owned by another rank (manifest
``placement``), under either placement.
``cluster_gcn``: the clusters are permuted per epoch and cut into W·B groups of near-equal
size (B = ceil(K / (clusters · W)) per rank), so every cluster is used once per
epoch. ``saint``: W·B independent subgraphs per epoch, B = ``samplers.saint.subgraphs`` or, when 0,
ceil(n / (W · mean nodes of a pre-sampled subgraph)). A ``cluster_gcn``/``saint``
minibatch may hold no training node (its loss is 0, but the rank still steps).

Determinism: every random draw comes from a seed derived from (``seed``, epoch, rank,
minibatch) through NumPy's SeedSequence; DGL's samplers run with one OpenMP thread (DGL
2.1's multi-threaded sampling is not reproducible) and are re-seeded (``dgl.seed`` and
``torch.manual_seed``) before each minibatch. The same inputs and config give identical
shard files. Parallelism is across minibatches instead: ``workers`` processes, forked from
the stage's process once it has built what sampling builds on first use (its DGL graph, draw
probabilities: `MinibatchSampler.prepare`), each sample and write whole shard files. A forked child inherits the graph (copy-on-write) and the forking thread's
DGL generator, whose stream depends on the thread (DGL's per-thread engines); since every
minibatch is re-seeded, the files are byte-identical for any number of workers.

Files written into ``<out_dir>/`` (replaced atomically as a whole): the shard files and
``manifest.json`` of `graphs.formats.shard_format`, where the format (file names, keys, dtypes,
version, manifest schema) is defined once for this writer and the reader (`training.data`).
No feature file is written here: the manifest names the canonical ``features.npy``
(``feature_encoding="fp32"``) or compressed_graph's codes and scales (``"compressed"``).

Edge weights with ``weight_encoding="int8"`` are quantized per block row here, from the
block's FP32 weights (Â's entries of the sampled edges, self loops included).
With ``weight_encoding="auto"`` (the default) and an unweighted graph no weight is stored:
the samplers skip gathering them (weight encoding ``factors``, `graphs.formats.shard_format`).

Usage::

    inputs = load_shard_inputs(home / "cora/canonical_graph", home / "cora/normalized_adjacency",
                               home / "cora/metis_partitions")
    manifest = write_minibatch_shards(inputs, home / "cora/minibatch_shards", ShardConfig())
"""

from graphs.sampling.base import (
    MinibatchSampler,
    SampledBlock,
    SampledMinibatch,
    dgl_csc_graph,
    dgl_neighbor_blocks,
    insert_self_loops,
    make_sampler,
    segment_positions,
)
from graphs.sampling.config import (
    AUTO_BATCH_MAX,
    AUTO_MINIBATCHES,
    ShardConfig,
    auto_batch_size,
    resolve_batch_size,
)
from graphs.sampling.inputs import ShardInputs, load_shard_inputs, train_nodes_of
from graphs.sampling.placement import (
    Placement,
    PlacementTraits,
    placement_class,
    placement_names,
    ranks_of_parts,
    register_placement,
)
from graphs.sampling.registry import SamplerTraits, register_sampler, sampler_class, sampler_names
from graphs.sampling.schedule import (
    derive_seed,
    epoch_cluster_groups,
    epoch_seed_batches,
    minibatch_seed,
    remote_rows,
)
from graphs.sampling.writer import sampling_workers, write_minibatch_shards

__all__ = [
    "AUTO_BATCH_MAX",
    "AUTO_MINIBATCHES",
    "MinibatchSampler",
    "SamplerTraits",
    "Placement",
    "PlacementTraits",
    "SampledBlock",
    "SampledMinibatch",
    "ShardConfig",
    "ShardInputs",
    "auto_batch_size",
    "derive_seed",
    "dgl_csc_graph",
    "dgl_neighbor_blocks",
    "epoch_cluster_groups",
    "epoch_seed_batches",
    "insert_self_loops",
    "load_shard_inputs",
    "make_sampler",
    "minibatch_seed",
    "placement_class",
    "placement_names",
    "ranks_of_parts",
    "register_placement",
    "register_sampler",
    "remote_rows",
    "resolve_batch_size",
    "sampler_class",
    "sampler_names",
    "sampling_workers",
    "segment_positions",
    "train_nodes_of",
    "write_minibatch_shards",
]
