"""Typed graphs from the landing folder to a trained relational model: the typed layout's checks,
the ingest over one id space, the relational Â against DGL's HeteroGraphConv, typed shards whose
every edge keeps its relation, and training and predictions on the target type."""

from __future__ import annotations

import json
import os
import shutil

os.environ.setdefault("DGLBACKEND", "pytorch")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from graphs.formats.graph_schema import TypedSchema  # noqa: E402
from graphs.sampling.config import ShardConfig  # noqa: E402
from graphs.sampling.inputs import load_shard_inputs  # noqa: E402
from graphs.sampling.writer import write_minibatch_shards  # noqa: E402
from graphs.stages.canonical import CanonicalConfig, InputError, build_canonical_graph  # noqa: E402
from graphs.stages.normalize import build_normalized_adjacency, load_relational_csr  # noqa: E402
from graphs.synthetic.typed import generate_typed  # noqa: E402
from tests.conftest import datasets_folder  # noqa: E402
from training.config import RunConfig  # noqa: E402
from training.evaluate import load_full_block  # noqa: E402
from training.predict import predict  # noqa: E402
from training.train import train  # noqa: E402
from training.typed_blocks import TypedBlock  # noqa: E402


def _write(path, **cols):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)


@pytest.fixture
def shop(tmp_path):
    """A small typed landing folder: string user ids with string labels and 3 features, integer
    item ids with 2 features, featureless tags; buys, follows and tagged relations."""
    root = tmp_path / "landing" / "shop"
    users = ["ann", "bob", "cy", "dee", "eve", "fay"]
    feats = [[float(i), 1.0, -1.0] for i in range(6)]
    _write(root / "nodes" / "user.parquet", node_id=users, label=["x", "y", "x", "y", None, "x"], feat=feats)
    _write(root / "nodes" / "item.parquet", node_id=[30, 10, 20], feat=[[1.0, 3.0], [1.0, 1.0], [1.0, 2.0]])
    _write(root / "nodes" / "tag.parquet", node_id=["t1", "t2"])
    buys = {"src": ["ann", "bob", "bob", "cy", "ann", "fay"], "dst": [10, 10, 20, 30, 10, 30]}
    _write(root / "edges" / "user__buys__item.parquet", **buys)
    _write(
        root / "edges" / "user__follows__user.parquet", src=["ann", "bob", "cy", "cy"], dst=["bob", "ann", "cy", "dee"]
    )
    _write(root / "edges" / "item__tagged__tag.parquet", src=[10, 20, 30], dst=["t1", "t1", "t2"])
    return root


def test_typed_ingest_keeps_types_ids_and_relations(shop, tmp_path):
    out = tmp_path / "canonical"
    summary = build_canonical_graph(shop, out, CanonicalConfig(add_reverse=True))
    typed = TypedSchema.read(out)
    # node types in name order, each type's ids sorted: item 10, 20, 30 | tag t1, t2 | user ann..fay
    assert typed.schema.node_types == ("item", "tag", "user")
    assert typed.counts == (3, 2, 6) and list(typed.offsets) == [0, 3, 5, 11]
    assert typed.feat_widths == (2, 0, 3) and typed.target == "user"
    keys = [r.key for r in typed.schema.relations]
    assert keys == [
        "item__tagged__tag",
        "user__buys__item",
        "user__follows__user",
        "tag__rev-tagged__item",
        "item__rev-buys__user",
        "user__rev-follows__user",
    ]
    nodes = pq.read_table(out / "nodes.parquet").to_pydict()
    assert nodes["original_id"] == ["10", "20", "30", "t1", "t2", "ann", "bob", "cy", "dee", "eve", "fay"]
    assert nodes["node_type"] == ["item"] * 3 + ["tag"] * 2 + ["user"] * 6
    assert nodes["label"][5:] == [0, 1, 0, 1, -1, 0]  # "x" -> 0, "y" -> 1, null unknown
    assert set(nodes["label"][:5]) == {-1}
    assert summary["null_labels_as_unknown"] == 1  # eve's; the items' and tags' rows are no user's nulls
    edges = pq.read_table(out / "typed_edges.parquet").to_pandas()
    # buys: (ann,10) given twice -> once; the self loop cy->cy dropped; rows sorted by (dst, src, etype)
    buys = edges[edges.etype == 1]
    assert sorted(zip(buys.src, buys.dst)) == [(5, 0), (6, 0), (6, 1), (7, 2), (10, 2)]
    rev = edges[edges.etype == 4]
    assert sorted(zip(rev.src, rev.dst)) == sorted(zip(buys.dst, buys.src))
    assert list(edges.sort_values(["dst", "src", "etype"]).index) == list(edges.index)
    assert summary["typed"]["relations"]["user__follows__user"] == 3
    feats = np.load(out / "features.npy")
    assert feats.shape == (11, 3)
    np.testing.assert_array_equal(feats[:3], [[1, 1, 0], [1, 2, 0], [1, 3, 0]])  # items 10, 20, 30 padded
    np.testing.assert_array_equal(feats[3:5], 0)  # tags have none
    np.testing.assert_array_equal(feats[5:, 0], np.arange(6))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: _write(r / "edges" / "user__likes__shop.parquet", src=["ann"], dst=["x"]), "names node type 'shop'"),
        (lambda r: _write(r / "edges" / "likes.parquet", src=["ann"], dst=["bob"]), "must be <src_type>__<relation>"),
        (lambda r: _write(r / "edges" / "user__likes__item.parquet", src=["ann"], dst=[99]), "id 99, which nodes/item"),
        (lambda r: _write(r / "edges" / "user__likes__item.parquet", src=[1], dst=[10]), "holds int ids, nodes/user"),
        (lambda r: _write(r / "nodes" / "tag.parquet", node_id=["t1", "t1"]), "repeats the id 't1'"),
        (lambda r: _write(r / "nodes" / "tag.parquet", node_id=["t1", "t2"], label=[1, 0]), "labels on 2 node types"),
        (lambda r: _write(r / "nodes.parquet", node_id=[1]), "a dataset is typed"),
        (lambda r: _write(r / "edges" / "item__rev-buys__user.parquet", src=[10], dst=["ann"]), "add_reverse"),
        (lambda r: _write(r / "nodes" / "bad__name.parquet", node_id=[1]), "hold no '__'"),
        (lambda r: _write(r / "features" / "tag.parquet", node_id=["t1", "t2"], feat=[[1.0], [1.0, 2.0]]), "one width"),
    ],
)
def test_bad_typed_input_names_the_file_and_value(shop, tmp_path, change, message):
    change(shop)
    with pytest.raises(InputError, match=message):
        build_canonical_graph(shop, tmp_path / "canonical", CanonicalConfig(add_reverse=True))
    assert not (tmp_path / "canonical").exists()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A generated typed graph (2000 users) through canonical_graph, normalized_adjacency and shards."""
    root = tmp_path_factory.mktemp("typed")
    landing = root / "landing" / "shop"
    facts = generate_typed(landing, 2000, seed=1)
    canonical, adjacency, shards = root / "canonical", root / "adjacency", root / "shards"
    build_canonical_graph(landing, canonical, CanonicalConfig(add_reverse=True))
    build_normalized_adjacency(canonical, adjacency)
    inputs = load_shard_inputs(canonical, adjacency)
    write_minibatch_shards(inputs, shards, ShardConfig(fanouts="10,10", batch_size=256, epochs=2, world_size=1))
    return {"root": root, "facts": facts, "canonical": canonical, "adjacency": adjacency, "shards": shards}


def test_generator_is_seeded_and_typed(generated, tmp_path):
    again = generate_typed(tmp_path / "again", 2000, seed=1)
    assert again == generated["facts"]
    for name in ("nodes/user.parquet", "edges/user__buys__item.parquet"):
        assert pq.read_table(tmp_path / "again" / name).equals(pq.read_table(generated["root"] / "landing/shop" / name))
    typed = TypedSchema.read(generated["canonical"])
    assert typed.schema.node_types == ("category", "item", "user") and typed.feat_widths == (0, 8, 16)


def test_relational_adjacency_is_heterographconv_of_graphconv(generated):
    """Â_r's entries: ``HeteroGraphConv({r: GraphConv(norm='both')}, aggregate='sum')`` on the typed graph."""
    dgl = pytest.importorskip("dgl")
    typed = TypedSchema.read(generated["canonical"])
    rel = load_relational_csr(generated["adjacency"])
    edges = pq.read_table(generated["canonical"] / "typed_edges.parquet").to_pandas()
    n, offsets = int(sum(typed.counts)), typed.offsets
    x = torch.randn(n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    rows = np.repeat(np.arange(n), np.diff(rel.indptr))
    ours = torch.zeros(n, 4, dtype=torch.float64).index_add_(
        0,
        torch.from_numpy(rows),
        torch.from_numpy(rel.weights.astype(np.float64))[:, None] * x[torch.from_numpy(rel.indices.astype(np.int64))],
    )
    data = {}
    for r, relation in enumerate(typed.schema.relations):
        part = edges[edges.etype == r]
        s, d = (typed.schema.node_types.index(t) for t in (relation.src_type, relation.dst_type))
        data[(relation.src_type, relation.key, relation.dst_type)] = (
            torch.from_numpy(part.src.to_numpy() - offsets[s]),
            torch.from_numpy(part.dst.to_numpy() - offsets[d]),
        )
    counts = dict(zip(typed.schema.node_types, typed.counts))
    g = dgl.heterograph(data, num_nodes_dict=counts)
    conv = dgl.nn.HeteroGraphConv(
        {
            key: dgl.nn.GraphConv(4, 4, norm="both", weight=False, bias=False, allow_zero_in_degree=True)
            for _, key, _ in data
        },
        aggregate="sum",
    )
    feats = {t: x[offsets[i] : offsets[i + 1]] for i, t in enumerate(typed.schema.node_types)}
    ref = conv(g, feats)
    for i, t in enumerate(typed.schema.node_types):
        got = ours[offsets[i] : offsets[i + 1]]
        want = ref.get(t, torch.zeros_like(got))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_every_sampled_edge_keeps_its_relation(generated):
    """Each stored block edge's etype is a relation that joins those two nodes in typed_edges."""
    from graphs.formats.shard_codec import decode_minibatch

    manifest = json.loads((generated["shards"] / "manifest.json").read_text())
    assert manifest["typed"]["target"] == "user" and not manifest["self_loops"]
    edges = pq.read_table(generated["canonical"] / "typed_edges.parquet").to_pandas()
    n, rels = manifest["n"], len(manifest["typed"]["relations"])
    known = set((edges.src * n + edges.dst) * rels + edges.etype)
    path = generated["shards"] / manifest["streams"][0]["files"][0]["path"]
    arrays = dict(np.load(path, allow_pickle=False))
    mb = decode_minibatch(arrays, 0, 2, manifest["weight_encoding"])
    for b in mb.blocks:
        etype = b.extra["etype"].astype(np.int64)
        dst = mb.input_nodes[np.repeat(np.arange(b.num_dst), np.diff(b.indptr))]
        src = mb.input_nodes[b.indices]
        assert len(etype) == len(src) > 0
        assert set(((src * n + dst) * rels + etype).tolist()) <= known


def test_full_typed_block_and_training_on_the_target_type(generated, tmp_path):
    block = load_full_block(generated["adjacency"])
    assert isinstance(block, TypedBlock) and block.num_src == block.num_dst == 2000 + 500 + 10
    out = tmp_path / "trained_model"
    run = RunConfig.from_dict(
        {
            "model": {"conv": "rgcn", "hidden": 32, "num_bases": 2},
            "training": {"epochs": 8, "profiler": "none", "optimizer": {"lr": 0.01}},
            "paths": {"shards": str(generated["shards"]), "out": str(out)},
        }
    )
    torch.manual_seed(0)
    summary = train(run)
    # 5 planted segments: chance is 0.2; a linear model of the users' own features reaches about 0.5
    assert summary["test_acc_at_best_val"] > 0.62, summary
    predictions = pq.read_table(out / "predictions.parquet").to_pandas()
    assert len(predictions) == 2000 and predictions.node_id.str.startswith("u").all()  # the users, by their ids
    scored = predict(out / "model_best.safetensors", generated["canonical"], generated["adjacency"], tmp_path / "pred")
    assert scored["nodes"] == 2000
    again = pq.read_table(tmp_path / "pred" / "predictions.parquet").to_pandas()
    assert (again.node_id == predictions.node_id).all()
    assert (again.predicted_index == predictions.predicted).all()
    assert again.predicted.str.startswith("segment-").all()  # the user's label values


def test_metis_balances_every_node_type(generated, tmp_path):
    from graphs.stages.partition import PartitionConfig, build_partitions

    cfg = PartitionConfig(num_parts=2, write_distdgl=False, clusters_per_part=2)
    summary = build_partitions(generated["canonical"], tmp_path / "parts", cfg)
    assert summary["balance_node_types"]
    per_type = summary["metis"]["node_types"]
    assert set(per_type) == {"category", "item", "user"}
    assert sum(per_type["user"]["nodes"]) == 2000
    for name, facts in per_type.items():  # METIS's default tolerance is 5 % per constraint
        assert facts["imbalance"] <= 1.06, (name, facts)
    assert "node_types" in summary["random"]


def test_cora_typed_learns_topics_from_words_and_citations(tmp_path):
    """The repository's typed Cora (papers and words, no features): R-GCN learns a vector per
    paper and word and reads a paper's topic from its words and citations."""
    landing = tmp_path / "landing" / "cora-typed"
    shutil.copytree(datasets_folder() / "cora-typed", landing)
    canonical, adjacency, shards = tmp_path / "canonical", tmp_path / "adjacency", tmp_path / "shards"
    summary = build_canonical_graph(landing, canonical, CanonicalConfig(add_reverse=True))  # as its gnnflow.yaml
    assert summary["typed"]["relations"] == {  # cites: Cora's 10556 unique directed rows
        "paper__cites__paper": 10556,
        "paper__has__word": 49216,
        "paper__rev-cites__paper": 10556,
        "word__rev-has__paper": 49216,
    }
    build_normalized_adjacency(canonical, adjacency)
    write_minibatch_shards(
        load_shard_inputs(canonical, adjacency),
        shards,
        ShardConfig(fanouts="10,10", batch_size=32, epochs=2, world_size=1),
    )
    run = RunConfig.from_dict(
        {
            "model": {"conv": "rgcn", "hidden": 64},
            "training": {"epochs": 30, "profiler": "none", "optimizer": {"type": "Adam", "lr": 0.01}},
            "paths": {"shards": str(shards), "out": str(tmp_path / "out")},
        }
    )
    torch.manual_seed(0)
    result = train(run)
    # 7 topics (the largest class is about 0.3 of the test papers); no paper has features
    assert result["test_acc_at_best_val"] > 0.5, result


def test_the_landing_sensor_sees_a_typed_folder_and_its_labels(shop):
    from graphs.stages.landing import landing_fingerprint
    from graphs.stages.user_files import landing_has_labels

    assert landing_has_labels(shop)
    before = landing_fingerprint(shop)
    _write(shop / "nodes" / "tag.parquet", node_id=["t1", "t2", "t3"])  # a per-type file changed
    assert landing_fingerprint(shop) != before
    _write(shop / "nodes" / "user.parquet", node_id=["ann", "bob", "cy", "dee", "eve", "fay"])  # no labels left
    assert not landing_has_labels(shop)


def test_a_typed_graph_trains_rgcn_unless_the_user_names_a_layer(tmp_path):
    """Node classification's typed default (R-GCN) applies where model.conv is unset, and a value
    the user writes wins even when it equals the dataclass's default (which Dagster's Config
    leaves out of the fields it marks as set); so does link prediction's own learning rate."""
    from assets.settings import resolve
    from assets.task_registry import task_class, task_settings
    from assets.trained_model import TrainedModelConfig

    node = task_class("node_classification")
    unset, _ = resolve(TrainedModelConfig, "trained_model", {"model": {"hidden": 64}}, {}, tmp_path / "gnnflow.yaml")
    assert task_settings(node, unset, typed=True).own_defaults == {"model.conv": "rgcn"}
    assert task_settings(node, unset, typed=False).own_defaults == {}
    named, _ = resolve(TrainedModelConfig, "trained_model", {}, {"model": {"conv": "sage"}}, tmp_path / "gnnflow.yaml")
    assert task_settings(node, named, typed=True).own_defaults == {}
    assert task_settings(node, named, typed=True).blocks["model"].conv == "sage"
    link = task_class("link_prediction")
    default_lr = TrainedModelConfig().training.optimizer.lr
    given, _ = resolve(
        TrainedModelConfig, "trained_model", {"training": {"optimizer": {"lr": default_lr}}}, {}, tmp_path / "x.yaml"
    )
    assert task_settings(link, given).blocks["training"].optimizer.lr == default_lr


def test_a_killed_typed_run_resumes_to_the_uninterrupted_model(generated, tmp_path):
    """The checkpoint holds the learned vectors and both optimizers (Adam and SparseAdam): a run
    killed after its second epoch and run again ends with the weights of an uninterrupted run."""
    from training.outputs import MODEL_FINAL, load_model_weights

    def run_config(out):
        return RunConfig.from_dict(
            {
                "model": {"conv": "rgcn", "hidden": 16},
                "training": {"epochs": 4, "profiler": "none", "early_stopping_patience": 0},
                "paths": {"shards": str(generated["shards"]), "out": str(out)},
            }
        )

    torch.manual_seed(0)
    train(run_config(tmp_path / "a" / "trained_model"))

    class Killed(Exception):
        pass

    def kill_after_second_epoch(epoch, rows):
        if epoch == 1:
            raise Killed

    cfg = run_config(tmp_path / "b" / "trained_model")
    with pytest.raises(Killed):
        train(cfg, on_epoch_end=kill_after_second_epoch)
    seen = []
    train(cfg, on_epoch_end=lambda epoch, rows: seen.append(epoch))
    assert seen == [2, 3]
    a = load_model_weights(tmp_path / "a" / "trained_model" / MODEL_FINAL)
    b = load_model_weights(tmp_path / "b" / "trained_model" / MODEL_FINAL)
    assert any(k.startswith("net.input.embed.") for k in a)  # the featureless categories' vectors
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)


def test_compressed_graph_quantizes_each_node_type_with_its_own_parameters(shop, tmp_path):
    """Items whose features are a thousand times the users' on the same columns: per-column INT8
    parameters shared across the types would leave the users' features a step of ~4000 / 255; each
    type's own keep the users' error at their own step, and every reader decodes with them."""
    from graphs.kernels.quantize import quantize_int8_columns
    from graphs.stages.compress import build_compressed_graph, load_features, verify_compressed_graph
    from graphs.stages.partition import PartitionConfig, build_partitions
    from training.data import FeatureRows
    from training.feature_cache import TieredFeatures

    _write(
        shop / "nodes" / "item.parquet", node_id=[30, 10, 20], feat=[[1000.0, 3000.0], [-1000.0, 1.0], [9.0, -2000.0]]
    )
    canonical, adjacency, parts = tmp_path / "canonical", tmp_path / "adjacency", tmp_path / "parts"
    build_canonical_graph(shop, canonical, CanonicalConfig(add_reverse=True))
    build_normalized_adjacency(canonical, adjacency)
    build_partitions(canonical, parts, PartitionConfig(num_parts=2, write_distdgl=False, clusters_per_part=1))
    summary = build_compressed_graph(canonical, adjacency, parts, tmp_path / "compressed")
    typed = TypedSchema.read(canonical)
    x = np.load(canonical / "features.npy")
    users = slice(int(typed.offsets[2]), int(typed.offsets[3]))  # types in name order: item, tag, user
    assert typed.schema.node_types == ("item", "tag", "user")

    errors = summary["features"]["node_types"]
    assert set(errors) == {"item", "user"}  # tags have no features
    q, scale, zero = quantize_int8_columns(x)  # the shared parameters, for comparison
    shared = np.abs(q[users].astype(np.float32) * scale + zero - x[users]).max()
    assert shared > 1.0
    assert errors["user"]["max_abs"] < shared / 100
    assert errors["user"]["max_abs"] <= (5.0 / 255) / 2 + 1e-6  # half a step of the users' own range 0..5
    assert summary["features"]["type_offsets"] == [int(o) for o in typed.offsets]
    checks = verify_compressed_graph(tmp_path / "compressed", canonical, adjacency, parts)
    assert checks["feature_columns_over_bound"] == 0 and checks["feature_bound_excess"] == 0.0

    feats = load_features(tmp_path / "compressed")
    assert feats.arrays["scale"].shape == (3, x.shape[1])
    decoded = feats.decode()
    assert np.abs(decoded[users] - x[users]).max() == pytest.approx(errors["user"]["max_abs"], rel=1e-5)
    rows = np.array([8, 0, 5, 3, 8])
    assert np.array_equal(feats.decode_gathered(feats.gather(rows), rows), decoded[rows])
    assert torch.equal(feats.decode_rows_torch(rows), torch.from_numpy(decoded[rows]))
    with pytest.raises(ValueError, match="node ids"):
        feats.decode_gathered(feats.gather(rows))
    cache = TieredFeatures(feats, warm_rows=3, hot_rows=2, degree=np.arange(len(x)))
    assert torch.equal(cache.gather(rows), torch.from_numpy(decoded[rows]))
    entry = {
        "encoding": "compressed",
        "path": "compressed",
        "codes": "int8",
        "transform": "none",
        "shape": list(x.shape),
    }
    source = FeatureRows("manifest", {"features": entry}, tmp_path)
    compact = source.gather_host(rows, decode=False)  # what a CUDA rank moves, decoded on the device
    assert torch.equal(source.finish(compact.to("cpu"), torch.from_numpy(rows)), torch.from_numpy(decoded[rows]))


def test_metis_balances_node_types_on_the_coarsened_path_too(generated, tmp_path):
    """Above metis_max_edges the multilevel path carries one constraint per node type through
    its levels, so the default (balance_node_types) works at any size."""
    from graphs.stages.partition import PartitionConfig, build_partitions

    cfg = PartitionConfig(num_parts=2, write_distdgl=False, clusters_per_part=2, metis_max_edges=20_000)
    summary = build_partitions(generated["canonical"], tmp_path / "parts", cfg)
    assert summary["metis_coarsened"] and summary["balance_node_types"]
    for name, facts in summary["metis"]["node_types"].items():
        assert facts["imbalance"] <= 1.06, (name, facts)


def test_per_relation_draws_take_the_fanout_from_each_relation(generated, tmp_path):
    """samplers.neighbor.per_relation: each destination gets min(fanout, deg_r) in-edges of every
    relation r, each with the correction deg_r / sampled_r."""
    from graphs.formats.shard_codec import decode_minibatch

    inputs = load_shard_inputs(generated["canonical"], generated["adjacency"])
    cfg = ShardConfig(
        fanouts="3,3", batch_size=256, epochs=1, world_size=1, samplers={"neighbor": {"per_relation": True}}
    )
    manifest = write_minibatch_shards(inputs, tmp_path / "shards", cfg)
    rels = len(manifest["typed"]["relations"])
    edges = pq.read_table(generated["canonical"] / "typed_edges.parquet").to_pandas()
    n = manifest["n"]
    degree = np.bincount(edges.dst.to_numpy() * rels + edges.etype.to_numpy(), minlength=n * rels).reshape(n, rels)
    arrays = dict(np.load(tmp_path / "shards" / manifest["streams"][0]["files"][0]["path"], allow_pickle=False))
    mb = decode_minibatch(arrays, 0, 2, manifest["weight_encoding"])
    for b in mb.blocks:
        etype = b.extra["etype"].astype(np.int64)
        dst = np.repeat(np.arange(b.num_dst), np.diff(b.indptr))
        sampled = np.bincount(dst * rels + etype, minlength=b.num_dst * rels).reshape(b.num_dst, rels)
        full = degree[mb.input_nodes[: b.num_dst]]
        np.testing.assert_array_equal(sampled, np.minimum(full, 3))
        np.testing.assert_allclose(b.correction, full[dst, etype] / sampled[dst, etype], rtol=1e-6)
    with pytest.raises(ValueError, match="per_relation draws uniformly"):
        ShardConfig(samplers={"neighbor": {"per_relation": True, "prob": "weight"}})


def test_gradient_clipping_counts_the_sparse_gradients_of_learned_vectors():
    """training.gradient_clipping on a model with sparse embedding gradients: the same clipped
    gradients as torch's clip_grad_norm_ gives the dense twin (torch's own refuses sparse ones)."""
    from training.epoch_loop import clip_gradients

    def model(sparse):
        torch.manual_seed(0)
        return torch.nn.ModuleDict({"e": torch.nn.Embedding(10, 4, sparse=sparse), "l": torch.nn.Linear(4, 3)})

    ids = torch.tensor([1, 3, 3, 7])  # a repeated row: its two gradient entries add up
    grads = []
    for sparse in (True, False):
        m = model(sparse)
        (m["l"](m["e"](ids)) ** 2).sum().mul(10).backward()
        total = clip_gradients(m, 0.5) if sparse else torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        grads.append((float(total), [p.grad.to_dense() for p in m.parameters()]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5) and grads[0][0] > 0.5
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
