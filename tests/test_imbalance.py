"""Training options of issue 14a: the class-weighted loss, model selection by validation
macro-F1, and the per-node gradient statistics that feed adaptive sampling's next round."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from graphs.formats.node_scores import NODE_SCORES_NAME, read_node_scores
from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training.config import RunConfig
from training.data import MiniBatch, cross_entropy
from training.imbalance import class_weights
from training.node_stats import NodeGradStats
from training.train import train


@pytest.fixture(scope="module")
def imbalanced(tmp_path_factory) -> dict:
    """A 600-node DC-SBM with 3 classes, the last 5 % of the nodes; uniform shards (W=1)."""
    root = tmp_path_factory.mktemp("imbalanced")
    cfg = GenerateConfig(
        num_nodes=600, num_edges=4000, feature_dim=8, num_classes=3, minority_fraction=0.05, num_edge_files=1
    )
    generate_dataset(cfg, root / "landing", progress=False)
    can, adj = root / "canonical_graph", root / "normalized_adjacency"
    build_canonical_graph(root / "landing", can)
    build_normalized_adjacency(can, adj)
    shards = root / "shards"
    write_minibatch_shards(load_shard_inputs(can, adj), shards, ShardConfig(fanouts="4,4", world_size=1, epochs=1))
    return {"root": root, "canonical": can, "adjacency": adj, "shards": shards}


def _cfg(shards, out, **training) -> RunConfig:
    return RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 16, "dropout": 0.0},
            "training": {"epochs": 4, "profiler": "none", "optimizer": {"lr": 0.01}, **training},
            "paths": {"shards": str(shards), "out": str(out)},
        }
    )


def test_class_weights_are_balanced_and_the_loss_is_their_weighted_mean():
    labels = torch.tensor([0, 0, 0, 1, 2, 2, 1, 0])
    train = torch.tensor([True, True, True, True, False, True, False, False])  # classes 0,0,0,1,2
    w = class_weights(labels, train, num_classes=4)
    # T = 5 training nodes, C = 3 classes present: T / (C * T_c); class 3 absent -> 0
    torch.testing.assert_close(w, torch.tensor([5 / 9, 5 / 3, 5 / 3, 0.0]))
    logits = torch.randn(5, 4)
    y = torch.tensor([0, 0, 0, 1, 2])
    mb = MiniBatch([], None, torch.arange(5), torch.arange(5), torch.arange(5), y, None, 0)
    per_node = -torch.log_softmax(logits, 1)[torch.arange(5), y]
    torch.testing.assert_close(cross_entropy(mb, logits, w), (w[y] * per_node).sum() / w[y].sum())
    torch.testing.assert_close(cross_entropy(mb, logits), per_node.mean())
    saint = MiniBatch([], None, torch.arange(5), torch.arange(5), torch.arange(5), y, torch.full((5,), 0.1), 0)
    torch.testing.assert_close(cross_entropy(saint, logits, w), (0.1 * w[y] * per_node).sum())


def test_node_grad_stats_record_the_norm_per_input_node():
    stats = NodeGradStats(6)
    x = stats.watch(torch.ones(3, 2))
    (x * torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]])).sum().backward()  # grad rows: norms 5, 1, 10
    stats.record(x, torch.tensor([4, 0, 2]), scale=2.0)
    stats.record(x, torch.tensor([4, 1, 5]), scale=1.0)
    torch.testing.assert_close(stats.total, torch.tensor([0.5, 1.0, 5.0, 0.0, 7.5, 10.0], dtype=torch.float64))
    assert stats.count.tolist() == [1, 1, 1, 0, 2, 1]


def test_training_writes_gradient_statistics_that_the_next_sampling_round_reads(imbalanced, tmp_path):
    out = tmp_path / "trained_model"
    summary = train(_cfg(imbalanced["shards"], out, node_grad_stats=True))
    assert summary["node_grad_stats"] == NODE_SCORES_NAME
    n = json.loads((imbalanced["canonical"] / "summary.json").read_text())["nodes"]
    total, count = read_node_scores(out / NODE_SCORES_NAME, n)
    inputs = load_shard_inputs(imbalanced["canonical"], imbalanced["adjacency"])
    # 4 epochs, each training node a seed once per epoch: read at least 4 times, with a gradient
    assert (count[inputs.train_nodes] >= 4).all() and (total[inputs.train_nodes] > 0).all()
    assert count.sum() > 4 * len(inputs.train_nodes)  # neighbours are input nodes too
    # the next round: adaptive shards from these statistics
    scored = load_shard_inputs(imbalanced["canonical"], imbalanced["adjacency"], node_scores=out / NODE_SCORES_NAME)
    m = write_minibatch_shards(
        scored,
        tmp_path / "adaptive",
        ShardConfig(fanouts="4,4", world_size=1, epochs=1, samplers={"neighbor": {"prob": "adaptive"}}),
    )
    assert m["adaptive"]["node_scores"] and m["adaptive"]["alpha"] == 0.5
    assert train(_cfg(tmp_path / "adaptive", tmp_path / "second"))["best_val_acc"] > 0.5


def test_selection_by_macro_f1_and_the_class_weighted_loss_train(imbalanced, tmp_path):
    out = tmp_path / "weighted"
    summary = train(_cfg(imbalanced["shards"], out, class_weighted_loss=True, select_by="val_macro_f1"))
    rows = pq.read_table(out / "metrics.parquet").to_pandas()
    scored = rows.dropna(subset=["val_macro_f1"])
    assert len(scored) == 4 and scored["val_macro_f1"].between(0, 1).all()
    best = scored.loc[scored["val_macro_f1"].idxmax()]
    assert summary["best_epoch"] == int(best["epoch"])  # the epoch of the highest macro-F1 is kept
    assert summary["best_val_acc"] == pytest.approx(float(best["val_acc"]))
    np.testing.assert_array_less(0, scored["val_macro_f1"].to_numpy())
