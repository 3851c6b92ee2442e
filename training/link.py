"""Link prediction's settings, model and evaluation from edge-seed shards (plain torch, no DGL);
its training is `training.link_train` (the link head on the shared loop).

The same encoders as node classification (`training.layers.GNN`, output width = the
embedding width), a scorer over pairs of embeddings, binary cross-entropy on each
minibatch's positive and negative pairs (`graphs.sampling.link`), and evaluation of
full-graph embeddings over the message-passing graph against the fixed evaluation
negatives of `graphs.stages.edge_split` (`training.metrics.link_prediction_report`: ROC-AUC, MRR,
Hits@10/50/100).

Scorers (``LinkConfig.scorer``): ``dot`` = ``<h_u, h_v>``; ``mlp`` = DGL's
link_pred.py predictor ``Linear-ReLU-Linear-ReLU-Linear`` on ``h_u * h_v``; ``hybrid`` (the
default) = that predictor on ``h_u * h_v`` concatenated with the pair's structural features
on the message-passing graph (`training.pair_features`: common neighbours, Adamic-Adar,
resource allocation, log degrees), plus a linear term of those features. The features of a
training positive describe the graph without that edge, as a held-out edge is seen. Besides the
shards' uniform negatives, each step adds one hard negative per positive
(``hard_negatives``): a neighbour's neighbour of its source that is not its neighbour, drawn
among the minibatch's nodes (`training.pair_features.two_hop_negatives`), so the scorer
also learns to rank pairs that share neighbours but are no edge.

The run is configured as every task's is, by the ``training`` block (`training.config.TrainingConfig`:
the optimizer, the epoch budget ``training.run_plan.training_epochs``, the shards' sampled epochs
replayed in order, early stopping on validation MRR after ``early_stopping_patience``
evaluations, seed, prefetch); the model of the best validation MRR is the one kept, tested and
written. Epochs are numbered from 1.
A progress line (steps, seeds/s, ETA; `graphs.infra.progress`) is logged every few seconds
within epochs and one line per evaluated epoch.

On a typed graph (`graphs.stages.edge_split_typed`: one target relation) the encoder is the
relational model of the ``model`` block (R-GCN by default, `training.layers.build_model` with the
shards' schema), the blocks are typed, the pair features' degree columns are ordered (source,
destination), hard negatives walk to a node of the destination type, the model is kept by (and
early stopping watches) the validation users' rankings against every destination (``user_mrr``,
`training.ranking`; `selection_metric`), and the final model is ranked so on both splits, beside
the training-free rankings (`ranked_splits`).

One process reads every rank's stream of an epoch in turn (each minibatch one optimizer
step); link prediction is not launched under torchrun/DDP (node classification is).

Files a training run writes (`training.link_train.train_link`): ``model.safetensors``
(`training.outputs.LINK_MODEL`: a `training.state_file` of kind ``link_model``, format
``LINK_MODEL_FORMAT``, holding {"state_dict", "config" (the link block), "model_config",
"degree_buckets", "eval_batch_size", "in_feats", "graph": {"nodes", "edges"}}: everything scoring
needs besides the message-passing graph and the features it was trained on; loading it never
runs code, `load_saved`), ``metrics.parquet`` (one row per evaluated epoch and split: epoch,
split, auc, mrr, hits@10, hits@50, hits@100, loss; the test row carries the best epoch),
``summary.json`` (config, best epoch, its val/test metrics, epoch times).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from graphs.formats.graph_schema import TypedSchema
from graphs.formats.shard_manifest import ShardManifest
from graphs.infra.config_checks import MAX_STEPS, bounded_repr, check_fields
from graphs.infra.storage import CorruptFileError, read_file_hashes
from graphs.stages.edge_split import load_edge_split
from graphs.stages.edge_split_typed import TargetRelation
from graphs.stages.normalize import Adjacency, load_csr
from training.blocks import block_from_csr, remove_self_loops
from training.evaluate import load_full_block
from training.features import degree_features, full_features
from training.layers import GNN, ModelConfig, build_model
from training.metrics import link_prediction_report
from training.outputs import LINK_MODEL
from training.pair_features import FEATURE_NAMES, PairHeuristics
from training.ranking import cross_pairs, ranking_report
from training.state_file import read_state_file

__all__ = [
    "LINK_DEFAULTS",
    "LINK_FIELDS",
    "LINK_MODEL_FORMAT",
    "LINK_MODEL_KIND",
    "SCORERS",
    "LinkGraph",
    "LinkModel",
    "LinkConfig",
    "SavedLinkModel",
    "evaluate_link",
    "evaluate_saved",
    "load_saved",
    "new_link_model",
    "pair_scores",
    "candidate_logits",
    "ranked_splits",
    "ranking",
    "scores_in_chunks",
    "selection_metric",
]

SCORERS = ("dot", "mlp", "hybrid")
LINK_DEFAULTS = {
    "training.optimizer.type": "Adam",
    "training.optimizer.lr": 1e-3,
    "training.min_steps": 1000,
    "training.max_epochs": 100,
    "training.early_stopping_patience": 5,
}
"""Link prediction's own defaults of shared settings (`training.task_settings`): Adam at 1e-3,
at least 1000 steps and at most 100 epochs, early stopping after 5 evaluations of validation MRR."""
LINK_MODEL_FORMAT = 2  # the model file's format version (training.state_file, kind LINK_MODEL_KIND)
LINK_MODEL_KIND = "link_model"
_SCORE_CHUNK = 1 << 18  # pairs scored at once by SavedLinkModel.probabilities (bounds the MLP's memory)
_REMEDY = "re-materialize trained_model (retrain) to write it in this format"


@dataclass(kw_only=True)
class LinkConfig:
    """Link prediction's own settings (the run config's ``link`` block). The encoder is the
    ``model`` block; how it is trained (optimizer, epochs, early stopping, evaluation chunks,
    seed, prefetch) is the ``training`` block, with link prediction's defaults where they differ
    (`LINK_DEFAULTS`)."""

    scorer: str = field(
        default="hybrid",
        metadata={
            "help": f"pair scorer, one of {SCORERS}: hybrid = an MLP on h_u*h_v and the pair's common-neighbour, "
            "Adamic-Adar, resource-allocation and degree features on the message-passing graph"
        },
    )
    hard_negatives: bool = field(
        default=True,
        metadata={
            "help": "add one hard negative per positive seed edge: a neighbour's neighbour of its source among the "
            "minibatch's nodes that is not its neighbour (pairs with common neighbours, which uniform negatives "
            "almost never are)"
        },
    )
    recommend_k: int = field(
        default=20,
        metadata={
            "max": 1 << 16,
            "help": "typed graphs: destinations the predictions asset recommends to every source-type node (the "
            "highest-scored ones it has no edge to yet)",
        },
    )
    ranking_users: int = field(
        default=1000,
        metadata={
            "max": 1 << 31,
            "help": "typed graphs: users (sources of held-out edges of the target relation) whose every candidate "
            "destination is ranked for user_mrr, user_hits@k and recall@k, drawn with the training seed; 0 = all",
        },
    )
    max_steps_per_epoch: int = field(
        default=0,
        metadata={
            "max": MAX_STEPS,
            "help": "stop an epoch after this many minibatches (DGL's link_pred.py stops at 1000); 0 = all",
        },
    )

    MOVED_SETTINGS: ClassVar[dict[str, str]] = {
        "lr": "training.optimizer.lr",
        **{
            k: f"training.{k}"
            for k in ("epochs", "min_steps", "max_epochs", "early_stopping_patience", "eval_every")
            + ("eval_batch_size", "degree_buckets", "seed", "prefetch")
        },
    }

    def __post_init__(self) -> None:
        check_fields(self, "link")
        if self.scorer not in SCORERS:
            raise ValueError(f"link.scorer={bounded_repr(self.scorer)} is not one of {SCORERS}")
        if self.recommend_k < 1:
            raise ValueError(f"link.recommend_k={self.recommend_k} must be >= 1")
        if self.ranking_users < 0:
            raise ValueError(f"link.ranking_users={self.ranking_users} must be >= 0")
        if self.max_steps_per_epoch < 0:
            raise ValueError(f"link.max_steps_per_epoch={self.max_steps_per_epoch} must be >= 0")


LINK_FIELDS = tuple(f.name for f in fields(LinkConfig))


class LinkModel(nn.Module):
    """A GNN encoder and a pair scorer; ``hybrid`` also reads `heuristics` (the message-passing
    graph's `PairHeuristics`, not a parameter: rebuilt from the graph wherever the model is loaded)."""

    def __init__(self, encoder: GNN, width: int, scorer: str, heuristics: PairHeuristics | None = None):
        super().__init__()
        self.encoder = encoder
        self.scorer = scorer
        self.heuristics = heuristics
        if scorer == "hybrid" and heuristics is None:
            raise ValueError("scorer='hybrid' needs the message-passing graph's PairHeuristics")
        extra = len(FEATURE_NAMES) if scorer == "hybrid" else 0
        if scorer in ("mlp", "hybrid"):
            self.predictor = nn.Sequential(
                nn.Linear(width + extra, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1)
            )
        if scorer == "hybrid":
            self.wide = nn.Linear(extra, 1)

    def score(
        self, h: torch.Tensor, pairs: torch.Tensor, nodes: torch.Tensor | None = None, own_edges: bool = False
    ) -> torch.Tensor:
        """Logits of the pairs (int64 [2, P] row indices of `h`); `nodes` = the global node id of
        each row of `h` (None: row = node id); `own_edges`: the pairs are edges of the graph."""
        feats = None
        if self.scorer == "hybrid":
            ids = pairs if nodes is None else nodes[pairs]
            feats = self.heuristics(ids, exclude_own_edge=own_edges)
        return pair_scores(self, h[pairs[0]], h[pairs[1]], feats)

    def forward(self, blocks, x, pos_pairs, neg_pairs, nodes=None) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(blocks, x)
        return self.score(h, pos_pairs, nodes, own_edges=True), self.score(h, neg_pairs, nodes)


def pair_scores(model: LinkModel, hu: torch.Tensor, hv: torch.Tensor, feats: torch.Tensor | None = None):
    """Logits of pairs of embeddings (`feats`: their `PairHeuristics` features, hybrid only)."""
    if model.scorer == "dot":
        return (hu * hv).sum(-1)
    if model.scorer == "mlp":
        return model.predictor(hu * hv).squeeze(-1)
    return (model.predictor(torch.cat([hu * hv, feats], 1)) + model.wide(feats)).squeeze(-1)


def _features(manifest: ShardManifest, shards: Path, adjacency_block, buckets: int) -> torch.Tensor:
    """The input features: the manifest's, else one-hot log2-degree buckets of the message-passing Â."""
    x = full_features(manifest.doc, shards)
    if x is None:
        x = degree_features(adjacency_block.indptr.numpy(), buckets)
    return x


@torch.no_grad()
def embed(model: LinkModel, full_block, x: torch.Tensor, batch_size: int = 0) -> torch.Tensor:
    """Full-graph embeddings [n, width] of every node over `full_block`."""
    was = model.training
    model.eval()
    h = model.encoder.inference(full_block, x, batch_size or None)
    model.train(was)
    return h


@torch.no_grad()
def evaluate_link(
    model: LinkModel, full_block, x: torch.Tensor, split, which: str, batch_size: int = 0, h: torch.Tensor | None = None
) -> dict:
    """`link_prediction_report` of split `which` ("val" or "test") of a `SplitPairs`, from
    full-graph embeddings over `full_block` (`h` when the caller has them already)."""
    h = embed(model, full_block, x, batch_size) if h is None else h
    pos = torch.from_numpy(getattr(split, which)).T.contiguous()
    neg = torch.from_numpy(getattr(split, f"{which}_negatives")).T.contiguous()
    return link_prediction_report(model.score(h, pos).numpy(), model.score(h, neg).numpy())


@dataclass
class LinkGraph:
    """What training and scoring read besides the shards' minibatches: the message-passing
    graph as a full block (self loops as the shards have them; a typed graph's relational Â as
    a `TypedBlock`), its heuristics (over the homogeneous view), the features, and on a typed
    graph its schema (``typed``, types.json's content), the target relation and each node's type."""

    block: object
    x: torch.Tensor
    heuristics: PairHeuristics
    indices_sha256: str  # of the adjacency's indices.npy as its stage published it ("" without a record)
    typed: dict | None = None
    target: TargetRelation | None = None
    node_types: torch.Tensor | None = None

    @classmethod
    def load(cls, manifest: ShardManifest, shards: Path, adjacency_dir, degree_buckets: int) -> "LinkGraph":
        block = load_full_block(adjacency_dir)
        typed, relation = manifest.doc.get("typed"), manifest.doc.get("link", {}).get("relation")
        plain = remove_self_loops(block if typed is None else block_from_csr(*load_csr(adjacency_dir, mmap=False)))
        x = _features(manifest, shards, plain, degree_buckets)
        if not manifest.self_loops and typed is None:  # evaluate over the graph the blocks were sampled from
            block = plain
        try:
            digest = read_file_hashes(adjacency_dir, stage=Adjacency.STAGE)[Adjacency.INDICES]["sha256"]
        except (CorruptFileError, KeyError):
            digest = ""
        heuristics = PairHeuristics(plain.indptr, plain.indices, ordered=typed is not None)
        graph = cls(block, x, heuristics, digest, typed)
        if typed is not None:
            if relation is None:
                raise ValueError(f"{shards}: typed link-prediction shards name no target relation; re-materialize them")
            graph.target = TargetRelation.from_json(relation)
            graph.node_types = block.src_types
        return graph

    @property
    def typed_schema(self) -> TypedSchema | None:
        """The typed graph's schema (types.json's content read back), None for an untyped graph."""
        return None if self.typed is None else TypedSchema.from_json(self.typed, "the shards' typed schema")

    def hard_negative_walk(self) -> dict:
        """`two_hop_negatives`' walk: 2 steps to a node of the pair's own kind; on a typed graph,
        3 steps when the target relation joins two types (user -> item -> user -> item), keeping
        the ends of its destination type."""
        if self.target is None:
            return {}
        lo, hi = self.target.dst_range
        dst_type = int(self.node_types[lo])
        return {"hops": 2 if self.target.symmetric else 3, "node_types": self.node_types, "end_type": dst_type}

    def fingerprint(self) -> dict:
        """What identifies the graph a model was trained over: its size and the published digest
        of its adjacency (a re-materialized graph of the same size is another graph)."""
        return {
            "nodes": int(self.heuristics.n),
            "edges": int(len(self.heuristics.indices)),
            "indices_sha256": self.indices_sha256,
        }


def new_link_model(cfg: LinkConfig, model_cfg: ModelConfig, graph: LinkGraph) -> LinkModel:
    """A fresh (or to-be-loaded) link model of these settings over `graph` (a typed graph's
    encoder the relational model of `model_cfg`, its learned vectors dense: one optimizer)."""
    encoder = build_model(model_cfg, graph.x.shape[1], model_cfg.hidden, graph.typed, sparse_embeddings=False)
    return LinkModel(encoder, model_cfg.hidden, cfg.scorer, graph.heuristics)


def selection_metric(graph: LinkGraph) -> str:
    """The validation figure the best model is kept by (and early stopping watches): MRR against
    the fixed negatives, or on a typed relation the users' own rankings (``user_mrr``)."""
    return "mrr" if graph.target is None else "user_mrr"


def scores_in_chunks(model: LinkModel, h: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """Logits [P] of the node-id pairs [2, P] over embeddings `h`, ``_SCORE_CHUNK`` pairs at a time
    (bounds the scorer's memory)."""
    chunks = [model.score(h, pairs[:, i : i + _SCORE_CHUNK]) for i in range(0, pairs.shape[1], _SCORE_CHUNK)]
    return torch.cat(chunks) if chunks else torch.zeros(0)


def candidate_logits(model: LinkModel, h: torch.Tensor, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """Logits [U, I] of every (user, item) pair over embeddings `h`."""
    return scores_in_chunks(model, h, cross_pairs(users, items)).view(len(users), len(items))


def ranking(
    model: LinkModel, graph: LinkGraph, split, which: str, h: torch.Tensor, users: int, seed: int, baselines=True
) -> dict:
    """`training.ranking.ranking_report` of split `which` over the typed target relation (every
    candidate destination of each ranked user scored from the full-graph embeddings `h`; with
    `baselines`, Adamic-Adar's figures too); {} on an untyped graph."""
    if graph.target is None:
        return {}

    def adamic_adar(u: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return graph.heuristics(cross_pairs(u, items))[:, FEATURE_NAMES.index("adamic_adar")].view(len(u), -1)

    target = graph.target
    return ranking_report(
        lambda u, items: candidate_logits(model, h, u, items), split, which, target.dst_range, users=users,
        seed=seed, symmetric=target.symmetric,
        baselines={"adamic_adar": adamic_adar} if baselines else None,
    )  # fmt: skip


@dataclass
class SavedLinkModel:
    """A model `training.link_train.train_link` wrote, loaded with the graph and features it scores over."""

    model: LinkModel
    graph: LinkGraph
    config: LinkConfig
    eval_batch_size: int  # the run's training.eval_batch_size: rows per chunk of full-graph inference
    ranking_seed: int = 0  # the run's training.seed: the users a typed relation's ranking draws

    def embeddings(self) -> torch.Tensor:
        return embed(self.model, self.graph.block, self.graph.x, self.eval_batch_size)

    @torch.no_grad()
    def probabilities(self, pairs: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [P]: the probability that each pair (int64 [2, P] node ids) is an edge."""
        self.model.eval()
        h = self.embeddings() if h is None else h
        return torch.sigmoid(scores_in_chunks(self.model, h, torch.as_tensor(pairs, dtype=torch.int64)))


def load_saved(model_dir, shards_dir, adjacency_dir) -> SavedLinkModel:
    """The model `training.link_train.train_link` wrote into `model_dir` (its LINK_MODEL file; a StateFileError naming
    the file when it is not a usable link model, nothing in it is run), over the message-passing
    graph of `adjacency_dir` and the features of `shards_dir`; a ValueError naming the folders when
    that graph is not the one the model was trained on."""
    path = Path(model_dir) / LINK_MODEL
    state = read_state_file(path, kind=LINK_MODEL_KIND, format_version=LINK_MODEL_FORMAT, remedy=_REMEDY)
    doc = state["config"]  # the link block; files written before the training block was shared hold all in it
    cfg = LinkConfig(**{k: doc[k] for k in LINK_FIELDS if k in doc})
    model_cfg = ModelConfig(**state["model_config"])
    buckets, chunk = (int(state.get(k, doc.get(k, 0))) for k in ("degree_buckets", "eval_batch_size"))
    shards = Path(shards_dir)
    graph = LinkGraph.load(ShardManifest.open(shards), shards, adjacency_dir, buckets)
    trained, now = state["graph"], graph.fingerprint()
    if any(str(trained.get(k)) != str(v) for k, v in now.items()) or graph.x.shape[1] != int(state["in_feats"]):
        raise ValueError(
            f"{path}: trained on a graph of {trained['nodes']} nodes and {trained['edges']} message-passing edges "
            f"(adjacency indices.npy sha256 {str(trained.get('indices_sha256'))[:16] or 'unrecorded'}) with "
            f"{int(state['in_feats'])} input features, but {adjacency_dir} holds {now['nodes']} nodes and "
            f"{now['edges']} edges (sha256 {now['indices_sha256'][:16] or 'unrecorded'}) with {graph.x.shape[1]} "
            "features; re-materialize trained_model"
        )
    model = new_link_model(cfg, model_cfg, graph)
    model.load_state_dict(state["state_dict"])
    model.eval()
    return SavedLinkModel(model, graph, cfg, chunk, int(state.get("ranking_seed", 0)))


def ranked_splits(model: LinkModel, graph: LinkGraph, split, users: int, seed: int, h: torch.Tensor) -> dict:
    """{"val": ranking, "test": ranking} of a typed target relation (`ranking` from the full-graph
    embeddings `h`; empty on an untyped graph): `users` users drawn with `seed`."""
    if graph.target is None:
        return {"val": {}, "test": {}}
    return {w: ranking(model, graph, split, w, h, users, seed) for w in ("val", "test")}


def evaluate_saved(
    model_dir: str | os.PathLike, shards_dir: str | os.PathLike, split_dir: str | os.PathLike, adjacency_dir
) -> dict:
    """{"val": report, "test": report} of the model `training.link_train.train_link` wrote into `model_dir`,
    recomputed from its LINK_MODEL file (`load_saved`)."""
    saved = load_saved(model_dir, shards_dir, adjacency_dir)
    split = load_edge_split(split_dir)
    g = saved.graph
    h = saved.embeddings()  # once, for every report
    ranked = ranked_splits(saved.model, g, split, saved.config.ranking_users, saved.ranking_seed, h)
    return {w: evaluate_link(saved.model, g.block, g.x, split, w, h=h) | ranked[w] for w in ("val", "test")}
