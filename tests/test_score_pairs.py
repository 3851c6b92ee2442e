"""score_pairs: candidate pairs in the user's ids scored by a dataset's link-prediction model."""

import argparse
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from graphs.sampling import ShardConfig, load_shard_inputs
from graphs.sampling.link import write_link_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.compress import CompressConfig, build_compressed_graph
from graphs.stages.edge_split import EdgeSplitConfig, build_edge_split
from graphs.stages.normalize import build_normalized_adjacency
from graphs.stages.partition import PartitionConfig, build_partitions
from tests.conftest import write_edges
from training.layers import ModelConfig
from training.link import LINK_DEFAULTS, LinkConfig, load_saved
from training.link_train import train_link
from training.outputs import LINK_MODEL
from training.score_pairs import PairsError, score_dataset_pairs
from training.task_settings import task_blocks, with_values


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """<home>/social: a 120-node graph with string ids through every link-prediction stage."""
    root = tmp_path_factory.mktemp("sp")
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 120, 900), rng.integers(0, 120, 900)
    write_edges(root / "landing" / "edges.parquet", [f"user-{i}" for i in src], [f"user-{i}" for i in dst], pa.string())
    d = root / "home" / "social"
    build_canonical_graph(root / "landing", d / "canonical_graph")
    build_edge_split(d / "canonical_graph", d / "edge_split", EdgeSplitConfig(eval_negatives=200, seed=1))
    build_normalized_adjacency(d / "edge_split", d / "normalized_adjacency")
    build_partitions(d / "edge_split", d / "parts", PartitionConfig(num_parts=1, write_distdgl=False))
    build_compressed_graph(
        d / "canonical_graph", d / "normalized_adjacency", d / "parts", d / "cg", CompressConfig(fpr_queries=1000)
    )
    inputs = load_shard_inputs(d / "edge_split", d / "normalized_adjacency", d / "parts", d / "cg")
    cfg = ShardConfig(fanouts="5", batch_size=512, epochs=1, world_size=1)
    write_link_shards(inputs, d / "minibatch_shards", cfg, canonical_dir=d / "canonical_graph")
    train_link(
        d / "minibatch_shards",
        d / "edge_split",
        d / "normalized_adjacency",
        d / "trained_model",
        LinkConfig(),
        ModelConfig(hidden=8),
        with_values(task_blocks(LINK_DEFAULTS)[1], {"epochs": 1}),
        log=lambda msg: None,
    )
    return root


def _pairs(path, src, dst, type_=pa.string()):
    pq.write_table(pa.table({"src": pa.array(src, type=type_), "dst": pa.array(dst, type=type_)}), path)
    return path


def test_scores_join_back_on_the_users_string_ids(home, tmp_path):
    d = home / "home" / "social"
    nodes = pq.read_table(d / "canonical_graph" / "nodes.parquet").to_pydict()
    node_of = dict(zip(nodes["original_id"], nodes["node_id"]))
    src, dst = ["user-5", "user-7", "user-5", "user-99"], ["user-7", "user-5", "user-60", "user-1"]
    pairs = _pairs(tmp_path / "pairs.parquet", src, dst)
    done = score_dataset_pairs(home / "home", "social", pairs, tmp_path / "scores.parquet")
    out = pq.read_table(tmp_path / "scores.parquet")
    assert done["pairs"] == 4 and done["model_dir"] == str(d / "trained_model")
    assert out.column_names == ["src", "dst", "score"] and out.schema.field("src").type == pa.string()
    assert out.column("src").to_pylist() == src and out.column("dst").to_pylist() == dst
    # the scores are the saved model's probabilities of the mapped node ids, in the input's order
    saved = load_saved(d / "trained_model", d / "minibatch_shards", d / "normalized_adjacency")
    ids = torch.tensor([[node_of[s] for s in src], [node_of[t] for t in dst]])
    expected = saved.probabilities(ids).numpy()
    assert np.allclose(out.column("score").to_numpy(), expected, atol=1e-6)
    assert np.all((expected > 0) & (expected < 1)) and expected[0] == pytest.approx(expected[1], abs=1e-6)


def test_unknown_ids_and_wrong_types_are_refused_naming_the_file_and_column(home, tmp_path):
    pairs = _pairs(tmp_path / "pairs.parquet", ["user-1", "user-2"], ["user-3", "nobody"])
    with pytest.raises(PairsError, match=r"pairs\.parquet: column 'dst': 1 ids are not nodes .*\['nobody'\]"):
        score_dataset_pairs(home / "home", "social", pairs, tmp_path / "out.parquet")
    ints = _pairs(tmp_path / "ints.parquet", [1], [2], pa.int64())
    with pytest.raises(PairsError, match=r"column 'src': 1 ids are not nodes .*\['1'\]"):
        score_dataset_pairs(home / "home", "social", ints, tmp_path / "out.parquet")
    pq.write_table(pa.table({"source": ["user-1"], "dst": ["user-2"]}), tmp_path / "cols.parquet")
    with pytest.raises(PairsError, match=r"cols\.parquet: no column 'src'.*has \['source', 'dst'\]"):
        score_dataset_pairs(home / "home", "social", tmp_path / "cols.parquet", tmp_path / "out.parquet")
    long = "x" * 5000
    many = _pairs(tmp_path / "long.parquet", [long] * 3, ["user-1"] * 3)
    with pytest.raises(PairsError) as err:
        score_dataset_pairs(home / "home", "social", many, tmp_path / "out.parquet")
    assert "3 ids are not nodes" in str(err.value) and len(str(err.value)) < 1000  # a bounded sample
    assert not (tmp_path / "out.parquet").exists()


def test_paths_are_checked_before_anything_is_written(home, tmp_path):
    pairs = _pairs(tmp_path / "pairs.parquet", ["user-1"], ["user-2"])
    before = pairs.read_bytes()
    with pytest.raises(PairsError, match="is the pairs file; choose another output path"):
        score_dataset_pairs(home / "home", "social", pairs, pairs)
    assert pairs.read_bytes() == before
    inside = home / "home" / "social" / "trained_model" / "x.parquet"
    with pytest.raises(PairsError, match="lies among the pipeline's files under"):
        score_dataset_pairs(home / "home", "social", pairs, inside)
    with pytest.raises(PairsError, match=r"name it \*\.parquet"):
        score_dataset_pairs(home / "home", "social", pairs, tmp_path / "out.csv")
    with pytest.raises(ValueError, match="dataset name '../social' is not allowed"):
        score_dataset_pairs(home / "home", "../social", pairs, tmp_path / "out.parquet")
    with pytest.raises(PairsError, match="no link-prediction model in .*promoted nor .*trained_model"):
        score_dataset_pairs(home / "home", "other", pairs, tmp_path / "out.parquet")


def test_the_promoted_model_is_preferred_and_the_cli_scores(home, tmp_path, monkeypatch, capsys):
    from pipelines.score_pairs_cli import add_parser

    d = home / "home" / "social"
    shutil.copytree(d / "trained_model", d / "promoted")
    try:
        pairs = _pairs(tmp_path / "pairs.parquet", ["user-1", "user-2"], ["user-3", "user-4"])
        parser = argparse.ArgumentParser(prog="gnnflow")
        add_parser(parser.add_subparsers(dest="command", required=True))
        monkeypatch.setenv("GNNFLOW_HOME", str(home / "home"))
        argv = ["score-pairs", "--dataset", "social", "--pairs", str(pairs), "--out", str(tmp_path / "s.parquet")]
        args = parser.parse_args(argv)
        assert args.func(args) == 0
        assert f"scored 2 pairs with {d / 'promoted'}" in capsys.readouterr().out
        assert pq.read_table(tmp_path / "s.parquet").num_rows == 2
        args = parser.parse_args(argv[:-1] + [str(pairs)])
        assert args.func(args) == 2
        assert "is the pairs file" in capsys.readouterr().err
        (d / "promoted" / LINK_MODEL).write_bytes(b"not a model")
        args = parser.parse_args(argv)
        assert args.func(args) == 2
        assert str(d / "promoted" / LINK_MODEL) in capsys.readouterr().err
    finally:
        shutil.rmtree(d / "promoted")


def test_a_model_is_refused_over_a_graph_it_was_not_trained_on(home, tmp_path):
    d = home / "home" / "social"
    build_normalized_adjacency(d / "canonical_graph", tmp_path / "full_adj")  # held-out edges included
    trained = load_saved(d / "trained_model", d / "minibatch_shards", d / "normalized_adjacency").graph
    with pytest.raises(
        ValueError, match=r"model\.safetensors: trained on a graph of 120 nodes and \d+ message-passing"
    ):
        load_saved(d / "trained_model", d / "minibatch_shards", tmp_path / "full_adj")
    assert trained.fingerprint()["nodes"] == 120


def test_a_model_is_refused_over_another_graph_of_the_same_size(home, tmp_path):
    """The message-passing graph with its nodes renumbered: the same node and edge counts, other
    adjacency bytes (a re-materialized graph): refused, so pairs are never scored on another graph."""
    d = home / "home" / "social"
    edges = pq.read_table(d / "edge_split" / "edges.parquet")
    perm = np.random.default_rng(5).permutation(120)
    src, dst = perm[edges.column("src").to_numpy()], perm[edges.column("dst").to_numpy()]
    write_edges(tmp_path / "landing" / "edges.parquet", src, dst, pa.int64())
    pq.write_table(pa.table({"node_id": pa.array(np.arange(120), pa.int64())}), tmp_path / "landing" / "nodes.parquet")
    build_canonical_graph(tmp_path / "landing", tmp_path / "canonical_graph")
    build_normalized_adjacency(tmp_path / "canonical_graph", tmp_path / "adj")
    trained = load_saved(d / "trained_model", d / "minibatch_shards", d / "normalized_adjacency").graph
    with pytest.raises(ValueError, match=r"trained on a graph of 120 nodes and \d+ message-passing edges \(adjacency"):
        load_saved(d / "trained_model", d / "minibatch_shards", tmp_path / "adj")
    other = pq.read_table(tmp_path / "canonical_graph" / "edges.parquet").num_rows
    assert other == len(trained.heuristics.indices)  # the counts alone would not have told them apart


def test_a_model_saved_before_the_training_block_was_shared_scores_the_same(home, tmp_path):
    """A link model written when the link block held the learning rate, the budget, the
    evaluation chunk and the degree buckets (all in its "config") loads and scores as before."""
    from training.link import LINK_MODEL_FORMAT, LINK_MODEL_KIND
    from training.state_file import read_state_file, write_state_file

    d = home / "home" / "social"
    folders = d / "minibatch_shards", d / "normalized_adjacency"
    now = load_saved(d / "trained_model", *folders)
    pairs = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    state = read_state_file(
        d / "trained_model" / LINK_MODEL, kind=LINK_MODEL_KIND, format_version=LINK_MODEL_FORMAT, remedy=""
    )
    old = {k: v for k, v in state.items() if k not in ("degree_buckets", "eval_batch_size")}
    old["config"] = {**state["config"], "lr": 1e-3, "epochs": 1, "min_steps": 1000, "max_epochs": 100,
                     "early_stopping_patience": 5, "eval_every": 1, "eval_batch_size": state["eval_batch_size"],
                     "degree_buckets": state["degree_buckets"], "seed": 0, "prefetch": 2}  # fmt: skip
    (tmp_path / "old").mkdir()
    write_state_file(tmp_path / "old" / LINK_MODEL, old, kind=LINK_MODEL_KIND, format_version=LINK_MODEL_FORMAT)
    then = load_saved(tmp_path / "old", *folders)
    assert then.config == now.config and then.eval_batch_size == now.eval_batch_size
    assert torch.equal(then.probabilities(pairs), now.probabilities(pairs))
