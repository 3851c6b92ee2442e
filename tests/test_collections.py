"""Graph collections (many small graphs): ingest as a disjoint union, whole-graph shards, the
graph-level model, and the graph_property task through Dagster with no config."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from assets.common import dataset_partitions
from assets.settings import SettingsError, read_task
from assets.tasks.graph_property import decide_graph_promotion
from graphs.formats.graph_table import read_categories, read_graph_table
from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
from graphs.sampling.schedule import epoch_graph_batches
from graphs.stages.canonical import InputError, build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency, load_csr
from graphs.synthetic.collection import generate_collection
from pipelines.definitions import ALL_ASSETS
from training.graph_model import readout
from training.graph_train import GRAPH_DEFAULTS, GraphConfig, evaluate_graph_model, task_report, train_graphs
from training.promotion import PromotionConfig
from training.task_settings import task_blocks

DATASETS = Path(__file__).resolve().parents[1] / "datasets"


def graph_settings(values: dict) -> tuple:
    """(graph block, model, training) at graph property's defaults, with `values` (dotted keys) set."""
    defaults = {**GRAPH_DEFAULTS, **values}
    return (GraphConfig(), *task_blocks(defaults))


def _ingest(landing: Path, out: Path) -> dict:
    return build_canonical_graph(landing, out / "canonical_graph")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A generated collection, ingested, normalized and sampled into whole-graph shards."""
    root = tmp_path_factory.mktemp("collection")
    generate_collection(root / "landing" / "mols", 240, seed=3)
    summary = _ingest(root / "landing" / "mols", root)
    build_normalized_adjacency(root / "canonical_graph", root / "normalized_adjacency")
    inputs = load_shard_inputs(root / "canonical_graph", root / "normalized_adjacency")
    cfg = ShardConfig(
        sampler="whole_graphs", epochs=2, world_size=2, samplers={"whole_graphs": {"graphs_per_batch": 16}}
    )
    write_minibatch_shards(inputs, root / "minibatch_shards", cfg)
    return root, summary


def test_the_ingest_writes_the_disjoint_union_with_the_graph_table(built):
    root, summary = built
    landing = root / "landing" / "mols"
    table = read_graph_table(root / "canonical_graph")
    graphs = pq.read_table(landing / "graphs.parquet").to_pydict()
    nodes = pq.read_table(landing / "nodes.parquet").to_pydict()
    edges = pq.read_table(landing / "edges.parquet").to_pydict()
    # graphs in the order of their ids, each one's nodes contiguous
    assert table.graph_id == sorted(graphs["graph_id"])
    given = dict(zip(graphs["graph_id"], graphs["label"]))
    assert table.labels.tolist() == [given[g] for g in table.graph_id]
    sizes = {g: 0 for g in graphs["graph_id"]}
    for g in nodes["graph_id"]:
        sizes[g] += 1
    assert table.num_nodes.tolist() == [sizes[g] for g in table.graph_id]
    assert table.first_node.tolist() == np.concatenate([[0], np.cumsum(table.num_nodes)[:-1]]).tolist()
    assert summary["nodes"] == sum(sizes.values()) and summary["collection"]["graphs"] == len(sizes)
    # every input edge, mapped through (graph, local id), is an edge of the union, both ways
    index = {g: i for i, g in enumerate(table.graph_id)}
    out = pq.read_table(root / "canonical_graph" / "edges.parquet")
    union = set(zip(out.column("src").to_pylist(), out.column("dst").to_pylist()))
    for g, s, d in zip(edges["graph_id"], edges["src"], edges["dst"]):
        u, v = table.first_node[index[g]] + s, table.first_node[index[g]] + d
        assert (u, v) in union and (v, u) in union
    graph_of = np.repeat(np.arange(table.num_graphs), table.num_nodes)
    src, dst = out.column("src").to_numpy(), out.column("dst").to_numpy()
    assert (graph_of[src] == graph_of[dst]).all()  # no edge between graphs
    # the categorical codes and features follow the union's node order
    order = np.lexsort((np.array(nodes["node_id"]), [index[g] for g in nodes["graph_id"]]))
    atom = np.array(nodes["atom_type"])[order]
    assert (read_categories(root / "canonical_graph")[:, 0] == atom).all()  # types 0..4 all occur: codes = values
    feats = np.load(root / "canonical_graph" / "features.npy")
    assert np.allclose(feats, np.array(nodes["feat"], dtype=np.float32)[order])


def test_adjacency_of_a_collection_normalizes_each_graph_by_its_own_degrees(built):
    root, _ = built
    table = read_graph_table(root / "canonical_graph")
    csr = load_csr(root / "normalized_adjacency")
    for g in (0, 7, table.num_graphs - 1):
        lo, n = int(table.first_node[g]), int(table.num_nodes[g])
        rows = slice(int(csr.indptr[lo]), int(csr.indptr[lo + n]))
        dense = np.zeros((n, n))
        row_of = np.repeat(np.arange(n), np.diff(csr.indptr[lo : lo + n + 1]))
        dense[row_of, csr.indices[rows] - lo] = csr.weights[rows]
        a = (dense != 0).astype(float) - np.eye(n) * (np.diag(dense) != 0) + np.eye(n)
        d = a.sum(1) ** -0.5
        assert np.allclose(dense, d[:, None] * a * d[None, :], atol=1e-6)


def test_each_epoch_holds_every_training_graph_once_in_equal_batches_per_rank(built):
    root, _ = built
    table = read_graph_table(root / "canonical_graph")
    train = table.of_split("train")
    cfg = ShardConfig(sampler="whole_graphs", world_size=3)
    for epoch in range(3):
        plan = epoch_graph_batches(train, table.num_nodes, epoch, cfg, per_batch=10)
        assert len({len(r) for r in plan}) == 1
        got = np.sort(np.concatenate([b for r in plan for b in r]))
        assert (got == train).all()
        sizes = [int(table.num_nodes[b].sum()) for r in plan for b in r]
        bound = table.num_nodes[train].sum() / len(sizes) + table.num_nodes.max()
        assert min(sizes) > 0 and max(sizes) <= bound
    assert not np.array_equal(plan[0][0], epoch_graph_batches(train, table.num_nodes, 0, cfg, 10)[0][0])


def test_a_whole_graph_minibatch_is_the_induced_subgraph_of_its_graphs(built):
    root, _ = built
    inputs = load_shard_inputs(root / "canonical_graph", root / "normalized_adjacency")
    from graphs.sampling import make_sampler

    sampler = make_sampler(inputs, ShardConfig(sampler="whole_graphs", world_size=1))
    table = inputs.graphs
    graphs = np.array([5, 1, 30])
    mb = sampler.sample(graphs, seed=0)
    nodes, ptr = table.node_ranges(np.sort(graphs))
    assert (mb.input_nodes == nodes).all() and (mb.seeds == np.sort(graphs)).all()
    assert (mb.seed_pos == ptr[:-1]).all() and (mb.labels == table.labels[np.sort(graphs)]).all()
    indptr, local, _, _ = table.induced(inputs.indptr, inputs.indices, np.sort(graphs))
    (block,) = mb.blocks
    for v in range(len(nodes)):  # the same neighbours (Â is symmetric: rows = in-edges)
        got = sorted(block.indices[block.indptr[v] : block.indptr[v + 1]].tolist())
        assert got == sorted(local[indptr[v] : indptr[v + 1]].tolist())


@pytest.mark.parametrize("hops", [1, 2])
def test_a_khop_minibatch_keeps_each_graphs_ball_around_one_root_as_dgl_finds_it(built, hops):
    dgl = pytest.importorskip("dgl")
    from graphs.sampling import make_sampler

    root, _ = built
    inputs = load_shard_inputs(root / "canonical_graph", root / "normalized_adjacency")
    cfg = ShardConfig(sampler="khop_graphs", world_size=1, samplers={"khop_graphs": {"hops": hops}})
    sampler, table = make_sampler(inputs, cfg), inputs.graphs
    graphs = np.array([7, 2, 40, 11])
    mb = sampler.sample(graphs, seed=4)
    assert (mb.seeds == np.sort(graphs)).all() and (mb.labels == table.labels[np.sort(graphs)]).all()
    ends = np.append(mb.seed_pos[1:], len(mb.input_nodes))
    (block,) = mb.blocks
    assert block.num_dst == len(mb.input_nodes) < table.num_nodes[graphs].sum()
    for g, start, end in zip(np.sort(graphs), mb.seed_pos, ends):
        first, n = int(table.first_node[g]), int(table.num_nodes[g])
        kept = mb.input_nodes[start:end] - first
        assert end > start and kept.min() >= 0 and kept.max() < n
        rows = np.repeat(np.arange(first, first + n), np.diff(inputs.indptr[first : first + n + 1]))
        cols = inputs.indices[inputs.indptr[first] : inputs.indptr[first + n]]
        one = dgl.graph((cols - first, rows - first), num_nodes=n)
        balls = [sorted(dgl.khop_in_subgraph(one, int(r), hops)[0].ndata[dgl.NID].tolist()) for r in kept]
        assert sorted(kept.tolist()) in balls  # the nodes within `hops` of one of them
    for v in range(block.num_dst):  # the block is the subgraph the kept nodes induce
        got = set(mb.input_nodes[block.indices[block.indptr[v] : block.indptr[v + 1]]].tolist())
        want = set(inputs.indices[inputs.indptr[mb.input_nodes[v]] : inputs.indptr[mb.input_nodes[v] + 1]].tolist())
        assert got == want & set(mb.input_nodes.tolist()) - ({int(mb.input_nodes[v])} if not cfg.self_loops else set())


def test_khop_graphs_keeps_graphs_up_to_max_nodes_whole_and_trains(built, tmp_path):
    from graphs.sampling import make_sampler

    root, _ = built
    inputs = load_shard_inputs(root / "canonical_graph", root / "normalized_adjacency")
    table = inputs.graphs
    big = int(table.num_nodes.max())
    whole = make_sampler(inputs, ShardConfig(sampler="whole_graphs", world_size=1)).sample(np.arange(20), 0)
    settings = {"khop_graphs": {"hops": 1, "max_nodes": big}}
    same = make_sampler(inputs, ShardConfig(sampler="khop_graphs", world_size=1, samplers=settings)).sample(
        np.arange(20), 0
    )
    assert (same.input_nodes == whole.input_nodes).all() and (same.seed_pos == whole.seed_pos).all()
    assert (same.blocks[0].indptr == whole.blocks[0].indptr).all()
    cfg = ShardConfig(sampler="khop_graphs", epochs=1, samplers={"khop_graphs": {"hops": 2}})
    write_minibatch_shards(inputs, tmp_path / "shards", cfg)
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["graphs"]["hops"] == 2 and manifest["graphs"]["max_nodes"] == 0
    s = train_graphs(
        tmp_path / "shards", tmp_path / "model", *graph_settings({"training.epochs": 2}), log=lambda m: None
    )
    assert s["test"]["graphs"] == len(table.of_split("test"))  # evaluated on whole graphs


@pytest.mark.parametrize("bad", [{"hops": -1}, {"roots": 0}, {"max_nodes": -2}, {"graphs_per_batch": 0}])
def test_khop_settings_are_checked_by_name(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=f"samplers.khop_graphs.{key}"):
        ShardConfig(sampler="khop_graphs", samplers={"khop_graphs": bad})


@pytest.mark.parametrize("kind", ["sum", "mean", "max", "attention"])
def test_readouts_equal_dgls_pooling(kind):
    dgl = pytest.importorskip("dgl")
    from dgl.nn import AvgPooling, GlobalAttentionPooling, MaxPooling, SumPooling

    torch.manual_seed(0)
    sizes = [3, 1, 5, 2]
    g = dgl.batch([dgl.graph(([], []), num_nodes=n) for n in sizes])
    h = torch.randn(sum(sizes), 6)
    gate = torch.nn.Linear(6, 1)
    ptr = torch.tensor(np.concatenate([[0], np.cumsum(sizes)]))
    ref = {"sum": SumPooling(), "mean": AvgPooling(), "max": MaxPooling(), "attention": GlobalAttentionPooling(gate)}
    assert torch.allclose(readout(kind, h, ptr, gate(h)), ref[kind](g, h), atol=1e-6)


def test_standardized_one_hot_columns_have_mean_0_and_variance_1_on_the_training_nodes():
    from training.graph_model import GraphModel, GraphShape

    torch.manual_seed(0)
    codes = torch.stack(
        [torch.randint(0, 3, (500,)), torch.randint(0, 2, (500,)), torch.zeros(500, dtype=torch.long)], 1
    )
    model = GraphModel(GraphShape(0, (3, 2, 4), 2), categorical="one_hot_standardized")
    model.standardize(codes)
    hot = torch.cat([torch.nn.functional.one_hot(codes[:, k], c) for k, c in enumerate((3, 2, 4))], 1).float()
    z = (hot - model.hot_mean) * model.hot_scale
    seen = hot.std(0) > 0
    assert torch.allclose(z.mean(0), torch.zeros(9), atol=1e-5)
    assert torch.allclose(z[:, seen].std(0, unbiased=False), torch.ones(int(seen.sum())), atol=1e-4)
    assert torch.equal(model.hot_scale[~seen], torch.ones(int((~seen).sum())))  # a constant column is only shifted
    plain = GraphModel(GraphShape(0, (3, 2, 4), 2), categorical="one_hot")
    plain.standardize(codes)
    assert torch.equal(plain.hot_mean, torch.zeros(9)) and torch.equal(plain.hot_scale, torch.ones(9))


def _saved_in_the_earlier_shape(model_dir: Path, out: Path) -> None:
    """The model of `model_dir` as written when the graph block held the layers and the training settings."""
    from training.graph_train import GRAPH_MODEL, GRAPH_MODEL_FORMAT, GRAPH_MODEL_KIND
    from training.state_file import read_state_file, write_state_file

    fmt = {"kind": GRAPH_MODEL_KIND, "format_version": GRAPH_MODEL_FORMAT}
    state = read_state_file(model_dir / GRAPH_MODEL, **fmt, remedy="")
    old = {k: v for k, v in state.items() if k != "model_config"}
    old["config"] = {**state["config"], **state["model_config"], "lr": 1e-3, "epochs": 30,
                     "early_stopping_patience": 20, "eval_every": 1, "seed": 0, "prefetch": 2}  # fmt: skip
    out.mkdir()
    write_state_file(out / GRAPH_MODEL, old, **fmt)


def test_the_planted_property_is_learned_from_the_structure(built, tmp_path):
    root, _ = built
    s = train_graphs(
        root / "minibatch_shards", root / "trained_model", *graph_settings({"training.epochs": 30}), log=lambda m: None
    )
    assert s["test"]["roc_auc"] > 0.85 > s["baseline"]["roc_auc"]
    again = evaluate_graph_model(root / "trained_model", root / "minibatch_shards")
    assert again["test"] == pytest.approx(s["test"])
    _saved_in_the_earlier_shape(root / "trained_model", tmp_path / "old")  # one graph block held the model's layers
    assert evaluate_graph_model(tmp_path / "old", root / "minibatch_shards") == again
    predictions = pq.read_table(root / "trained_model" / "predictions.parquet").to_pydict()
    table = read_graph_table(root / "canonical_graph")
    assert predictions["graph_id"] == table.graph_id and predictions["label"] == table.labels.tolist()
    test = table.of_split("test")
    acc = np.mean(np.array(predictions["prediction"])[test] == table.labels[test])
    assert acc == pytest.approx(s["test"]["accuracy"])


def test_a_killed_graph_run_resumes_to_the_figures_of_an_uninterrupted_one(built, tmp_path):
    root, _ = built
    cfg = graph_settings({"training.epochs": 4, "training.early_stopping_patience": 0, "model.dropout": 0.5})
    whole = train_graphs(root / "minibatch_shards", tmp_path / "whole", *cfg, log=lambda m: None)

    def kill_after_second(epoch, rows):
        if epoch == 1:
            raise KeyboardInterrupt

    beside, said = tmp_path / "trained_model", []
    with pytest.raises(KeyboardInterrupt):
        train_graphs(root / "minibatch_shards", None, *cfg, log=said.append, checkpoint_beside=beside,
                     on_epoch_end=kill_after_second)  # fmt: skip
    (work,) = tmp_path.glob(".trained_model.work-*")
    again = train_graphs(root / "minibatch_shards", tmp_path / "again", *cfg, log=said.append, checkpoint_beside=beside)
    assert any("resuming from" in line and "epochs 1..2 done" in line for line in said)
    assert again["losses"] == whole["losses"] and again["test"] == whole["test"]
    assert not work.exists()  # a finished run removes its checkpoints
    other = graph_settings({"training.epochs": 4, "training.early_stopping_patience": 0, "model.dropout": 0.4})
    said.clear()
    train_graphs(root / "minibatch_shards", None, *other, log=said.append, checkpoint_beside=beside)  # a fresh run
    assert not any("resuming" in line for line in said)


def test_string_classes_come_back_as_the_users_values(tmp_path):
    landing = tmp_path / "landing" / "words"
    generate_collection(landing, 120, seed=5)
    graphs = pq.read_table(landing / "graphs.parquet").to_pydict()
    words = {0: "inert", 1: "active"}
    graphs["label"] = [words[v] for v in graphs["label"]]
    pq.write_table(pa.table(graphs), landing / "graphs.parquet")
    _ingest(landing, tmp_path)
    build_normalized_adjacency(tmp_path / "canonical_graph", tmp_path / "normalized_adjacency")
    inputs = load_shard_inputs(tmp_path / "canonical_graph", tmp_path / "normalized_adjacency")
    write_minibatch_shards(inputs, tmp_path / "minibatch_shards", ShardConfig(sampler="whole_graphs", epochs=1))
    train_graphs(
        tmp_path / "minibatch_shards", tmp_path / "model", *graph_settings({"training.epochs": 2}), log=lambda m: None
    )
    table = read_graph_table(tmp_path / "canonical_graph")
    assert table.classes == ["active", "inert"]  # sorted values: class index 0 is "active"
    predictions = pq.read_table(tmp_path / "model" / "predictions.parquet").to_pydict()
    by_id = dict(zip(graphs["graph_id"], graphs["label"]))
    assert predictions["label"] == [by_id[g] for g in predictions["graph_id"]]
    assert set(predictions["prediction"]) <= {"active", "inert"}
    best = np.argmax([predictions["prob_0"], predictions["prob_1"]], axis=0)
    assert predictions["prediction"] == [table.classes[c] for c in best]


def test_gnnflow_generate_writes_a_collection_that_ingests(tmp_path, capsys):
    from pipelines.cli import main

    assert main(["generate", "--out", str(tmp_path / "mols"), "--collection", "30", "--label-kind", "value"]) == 0
    assert json.loads(capsys.readouterr().out)["graphs"] == 30
    summary = _ingest(tmp_path / "mols", tmp_path)
    assert summary["collection"]["graphs"] == 30 and summary["collection"]["label_kind"] == "value"
    assert main(["generate", "--out", str(tmp_path / "mols"), "--collection", "30"]) == 2  # not over a dataset


def test_task_metrics_score_each_task_on_its_present_labels_only():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=(50, 3)).astype(np.float64)
    y[:, 2] = 1.0  # one class only: no ROC-AUC for task 2
    missing = rng.random(y.shape) < 0.3
    y[missing] = np.nan
    probs = rng.random(y.shape)
    r = task_report(y, probs)
    changed = probs.copy()
    changed[missing] = 1.0 - changed[missing]  # scores of missing labels must not count
    assert task_report(y, changed) == r
    assert r["tasks_scored"] == 2 and r["graphs"] == 50
    perfect = np.where(np.isnan(y), 0.5, y)
    assert task_report(y, perfect)["roc_auc"] == 1.0 and task_report(y, perfect)["accuracy"] == 1.0


def _record(test: dict, baseline: dict, promoted: dict | None) -> dict:
    return {"candidate": {"version": "v2", "test": {"graphs": 40, **test}, "baseline": baseline}, "promoted": promoted}


@pytest.mark.parametrize(
    "test, promoted, pinned, ok, said",
    [
        ({"roc_auc": 0.48, "accuracy": 0.7}, None, False, False, "does not beat a model that ignores the graphs"),
        ({"roc_auc": 0.8, "accuracy": 0.7}, None, False, True, "no promoted model yet"),
        ({"roc_auc": 0.8, "accuracy": 0.7}, {"roc_auc": 0.805}, False, True, "0.8000 vs promoted 0.8050"),
        ({"roc_auc": 0.8, "accuracy": 0.7}, {"roc_auc": 0.83}, False, False, "0.8000 vs promoted 0.8300"),
        ({"roc_auc": 0.8, "accuracy": 0.7}, {"roc_auc": 0.7}, True, False, "is pinned"),
        ({"roc_auc": float("nan"), "accuracy": 0.9}, None, False, True, "no promoted model yet"),
        ({"roc_auc": float("nan"), "accuracy": 0.5}, None, False, False, "does not beat"),
        ({"mae": 1.0, "rmse": 1.2}, {"mae": 0.995}, False, True, "at most 1.01x"),
        ({"mae": 1.0, "rmse": 1.2}, {"mae": 0.95}, False, False, "test mae 1.0000 vs promoted 0.9500"),
        ({"mae": 2.5, "rmse": 3.0}, None, False, False, "does not beat"),
    ],
)
def test_graph_promotion_compares_the_tasks_metric(test, promoted, pinned, ok, said):
    baseline = {"mae": 2.0} if "mae" in test else {"accuracy": 0.6, "roc_auc": 0.5}
    record = _record(
        test, baseline, None if promoted is None else {"version": "v1", "test": {"graphs": 40, **promoted}}
    )
    decision = decide_graph_promotion(record, pinned, PromotionConfig(margin=0.01))
    assert decision.ok is ok and said in decision.why, decision.why
    assert decision.metric == (
        "mae" if "mae" in test else "accuracy" if test["roc_auc"] != test["roc_auc"] else "roc_auc"
    )


def test_a_promoted_model_that_cannot_score_the_graphs_is_replaced():
    record = _record({"roc_auc": 0.8, "accuracy": 0.7}, {"accuracy": 0.6}, {"version": "v1", "problem": "other shape"})
    decision = decide_graph_promotion(record, False, PromotionConfig())
    assert decision.ok and "cannot be compared: other shape" in decision.why and decision.previous is None


# ----------------------------------------------------------------------------- bad input


def _write(folder: Path, graphs: dict, nodes: dict, edges: dict) -> Path:
    folder.mkdir(parents=True)
    for name, cols in (("graphs", graphs), ("nodes", nodes), ("edges", edges)):
        pq.write_table(pa.table(cols), folder / f"{name}.parquet")
    return folder


GOOD_NODES = {"graph_id": ["a", "a", "b", "b"], "node_id": [0, 1, 0, 1]}
GOOD_EDGES = {"graph_id": ["a", "b"], "src": [0, 0], "dst": [1, 1]}


@pytest.mark.parametrize(
    "graphs, nodes, edges, said",
    [
        (  # an edge of graph a naming a node only graph b has
            {"graph_id": ["a", "b"], "label": [0, 1]},
            {"graph_id": ["a", "a", "b", "b", "b"], "node_id": [0, 1, 0, 1, 2]},
            {"graph_id": ["a", "a"], "src": [0, 0], "dst": [1, 2]},
            ["edges.parquet", "'dst'", "graph 'a'", "node 2", "it is a node of graph 'b'"],
        ),
        (
            {"graph_id": ["a", "b", "c"], "label": [0, 1, 0]},
            GOOD_NODES,
            GOOD_EDGES,
            ["nodes.parquet", "graph 'c'", "has no nodes"],
        ),
        (
            {"graph_id": ["a", "b"], "label": ["3.5", "active"]},
            GOOD_NODES,
            GOOD_EDGES,
            ["graphs.parquet", "'label'", "mixed kinds", "'3.5'", "'active'"],
        ),
        ({"graph_id": ["a", "a"]}, GOOD_NODES, GOOD_EDGES, ["graphs.parquet", "'graph_id'", "repeats", "'a'"]),
        (
            {"graph_id": ["a", "b"]},
            {"graph_id": ["a", "z"], "node_id": [0, 0]},
            GOOD_EDGES,
            ["nodes.parquet", "'z'", "not a graph_id of graphs.parquet"],
        ),
        (
            {"graph_id": ["a", "b"]},
            {"graph_id": ["a", "a", "b"], "node_id": [0, 0, 0]},
            GOOD_EDGES,
            ["nodes.parquet", "graph 'a'", "node_id 0 twice"],
        ),
        (
            {"graph_id": [1, 2]},
            GOOD_NODES,
            GOOD_EDGES,
            ["'graph_id'", "different kinds", "graphs.parquet: int", "nodes.parquet: string"],
        ),
        (
            {"graph_id": ["a", "b"], "label": [[1, 0, None], [1, None]]},
            GOOD_NODES,
            GOOD_EDGES,
            ["graphs.parquet", "'label'", "different lengths", "graph 'a' has 3 items, graph 'b' 2"],
        ),
        (
            {"graph_id": ["a", "b"], "label": [[1, 0], [None, 2]]},
            GOOD_NODES,
            GOOD_EDGES,
            ["graphs.parquet", "'label'", "holds 2 for task 1 of graph 'b'", "binary"],
        ),
        (
            {"graph_id": ["a", "b"], "label": [["x"], ["y"]]},
            GOOD_NODES,
            GOOD_EDGES,
            ["graphs.parquet", "'label'", "lists of string"],
        ),
    ],
)
def test_bad_collections_are_refused_naming_the_file_column_and_value(tmp_path, graphs, nodes, edges, said):
    landing = _write(tmp_path / "landing" / "bad", graphs, nodes, edges)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "canonical_graph").mkdir()
    (tmp_path / "out" / "canonical_graph" / "kept.txt").write_text("previous")
    with pytest.raises(InputError) as err:
        _ingest(landing, tmp_path / "out")
    for part in said:
        assert part in str(err.value), (part, str(err.value))
    assert (tmp_path / "out" / "canonical_graph" / "kept.txt").read_text() == "previous"


def test_a_collection_takes_a_graph_level_task_and_a_graph_a_node_level_one(tmp_path):
    folder = _write(tmp_path / "landing" / "c", {"graph_id": ["a", "b"]}, GOOD_NODES, GOOD_EDGES)
    assert read_task(folder / "gnnflow.yaml") == "graph_property"
    (folder / "gnnflow.yaml").write_text("task: node_classification\n")
    with pytest.raises(SettingsError, match="does not apply to .*a graph collection"):
        read_task(folder / "gnnflow.yaml")
    (folder / "graphs.parquet").unlink()
    assert read_task(folder / "gnnflow.yaml") == "node_classification"
    (folder / "gnnflow.yaml").write_text("task: graph_property\n")
    with pytest.raises(SettingsError, match="which is one graph"):
        read_task(folder / "gnnflow.yaml")


# ----------------------------------------------------------------------------- through Dagster


def _materialize(storage, dataset: str, **kwargs):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, [dataset])
    return dg.materialize(
        ALL_ASSETS, partition_key=dataset, instance=instance, resources={"storage": storage}, **kwargs
    )


def _metadata(result, asset: str) -> dict:
    (m,) = result.asset_materializations_for_node(asset)
    return {k: getattr(v, "value", v) for k, v in m.metadata.items()}


@pytest.mark.parametrize("label_kind", ["class", "value", "multi_label"])
def test_an_unseen_collection_trains_through_dagster_with_no_config(tmp_path, storage, label_kind):
    landing = Path(storage.landing) / "unseen"
    generate_collection(landing, 260, seed=11, label_kind=label_kind, with_split=False, min_nodes=4, max_nodes=30)
    result = _materialize(storage, "unseen")
    model = _metadata(result, "trained_model")
    assert model["task"] == "graph_property" and model["label_kind"] == label_kind
    shards = _metadata(result, "minibatch_shards")
    assert 0 < shards["train_graphs"] < 260 and shards["graphs_sampled"] == shards["train_graphs"] * shards["epochs"]
    assert not {"fanouts", "batch_size", "train_nodes", "num_layers"} & set(shards)  # node-level settings
    if label_kind == "value":
        assert model["test_mae"] < 0.6 * model["baseline_test_mae"]
    else:  # multi_label: the mean over 3 tasks, each of its present labels only
        assert model["test_roc_auc"] > 0.8 and model["baseline_test_roc_auc"] == 0.5
    evaluation = json.loads((Path(storage.home) / "unseen" / "evaluation" / "metrics.json").read_text())
    key = "mae" if label_kind == "value" else "roc_auc"
    assert evaluation["candidate"]["test"][key] == pytest.approx(model[f"test_{key}"], abs=1e-4)
    assert "graph_property" in _metadata(result, "predictions")["skipped"]
    promotion = _metadata(result, "promotion")
    assert promotion["promoted"] is True and promotion["reason"] == "no promoted model yet"
    assert promotion["metric"] == key and promotion["candidate_value"] == pytest.approx(model[f"test_{key}"], abs=1e-4)
    if label_kind == "class":  # a second model, scored beside the promoted one on the same test graphs
        first = promotion["candidate_version"]
        again = _materialize(
            storage, "unseen", selection=["trained_model", "evaluation", "promotion"],
            run_config={"ops": {"trained_model": {"config": {"training": {"seed": 1, "epochs": 2}}}}},
        )  # fmt: skip
        scored = json.loads((Path(storage.home) / "unseen" / "evaluation" / "metrics.json").read_text())["promoted"]
        assert scored["version"] == first and scored["test"][key] == pytest.approx(model[f"test_{key}"], abs=1e-4)
        second = _metadata(again, "promotion")
        assert second["previous_value"] == pytest.approx(model[f"test_{key}"], abs=1e-4)
        worse = second["candidate_value"] < second["previous_value"] - 0.01
        assert second["promoted"] is (not worse), second["reason"]
    canonical = _metadata(result, "canonical_graph")
    assert canonical["graphs"] == 260 and canonical["categorical_node_columns"] == {"atom_type": 5}


def test_bbbp_ingests_with_the_counts_its_readme_gives(tmp_path):
    summary = _ingest(DATASETS / "bbbp", tmp_path)
    c = summary["collection"]
    assert (c["graphs"], summary["nodes"], c["train_graphs"], c["val_graphs"], c["test_graphs"]) == (
        2039, 49068, 1631, 204, 204,
    )  # fmt: skip
    assert summary["edges"] == 2 * 52921 and c["ignored_edge_columns"] == ["bond_type"]
    assert c["categorical"]["atom_type"] > 10 and c["label_kind"] == "class"
