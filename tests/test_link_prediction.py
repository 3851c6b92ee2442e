"""Link prediction: the edge split, Bloom-filtered negatives, edge-seed shards, metrics, training."""

import itertools
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from graphs.formats.shard_format import FORMAT_VERSION, read_manifest
from graphs.sampling import ShardConfig, load_shard_inputs
from graphs.sampling.config import LinkShardSettings
from graphs.sampling.link import write_link_shards
from graphs.stages.canonical import CanonicalConfig, build_canonical_graph, edge_batches, read_summary
from graphs.stages.compress import CompressConfig, build_compressed_graph, load_bloom_filters
from graphs.stages.edge_split import EdgeSplitConfig, build_edge_split, load_edge_split
from graphs.stages.negatives import EdgeKeys, NegativeSampler, compare_rejection, sizes_at
from graphs.stages.normalize import build_normalized_adjacency, load_csr
from graphs.stages.partition import PartitionConfig, build_partitions
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training.data import ShardStream
from training.link import LINK_DEFAULTS
from training.metrics import link_prediction_report, positive_ranks, roc_auc
from training.outputs import LINK_MODEL
from training.task_settings import task_blocks, with_values


def link_training(values: dict):
    """The training block at link prediction's defaults, with `values` (dotted keys) set."""
    return with_values(task_blocks(LINK_DEFAULTS)[1], values)


def _edge_set(folder):
    return {(int(s), int(d)) for src, dst in edge_batches(folder) for s, d in zip(src, dst)}


@pytest.fixture(scope="module")
def lp(tmp_path_factory):
    """A generated 1500-node graph through canonical -> split -> adjacency -> parts -> compressed."""
    root = tmp_path_factory.mktemp("lp")
    generate_dataset(
        GenerateConfig(num_nodes=1500, num_edges=12000, feature_dim=16, seed=5), root / "landing", progress=False
    )
    build_canonical_graph(root / "landing", root / "canonical", CanonicalConfig())
    build_edge_split(root / "canonical", root / "split", EdgeSplitConfig(eval_negatives=2000, seed=1))
    build_normalized_adjacency(root / "split", root / "adj")
    build_partitions(root / "split", root / "parts", PartitionConfig(num_parts=2, write_distdgl=False))
    build_compressed_graph(
        root / "canonical", root / "adj", root / "parts", root / "compressed", CompressConfig(fpr_queries=100_000)
    )
    return root


def test_split_leaves_no_held_out_edge_in_the_message_passing_graph(lp):
    split = load_edge_split(lp / "split")
    full = _edge_set(lp / "canonical")
    mp = _edge_set(lp / "split")
    held_out = {tuple(p) for p in np.concatenate([split.val, split.test]).tolist()}
    train = {tuple(p) for p in split.train.tolist()}
    # every undirected canonical edge is in exactly one of train / val / test
    undirected = {(min(u, v), max(u, v)) for u, v in full}
    assert train | held_out == undirected and not train & held_out
    assert len(split.val) == round(0.05 * len(undirected)) and len(split.test) == round(0.1 * len(undirected))
    # the message-passing graph is exactly the training pairs in both directions: no held-out edge
    assert mp == train | {(v, u) for u, v in train}
    assert not mp & (held_out | {(v, u) for u, v in held_out})
    assert read_summary(lp / "split")["edges"] == len(mp) == 2 * len(train)
    # the adjacency built from it has no held-out entry either
    csr = load_csr(lp / "adj")
    rows = np.repeat(np.arange(csr.n), np.diff(csr.indptr))
    entries = set(zip(rows.tolist(), np.asarray(csr.indices).tolist()))
    assert not entries & held_out
    # evaluation negatives are non-edges of the full graph in both directions, no self pairs
    for neg in (split.val_negatives, split.test_negatives):
        assert len(neg) == 2000 and (neg[:, 0] != neg[:, 1]).all()
        assert not {tuple(p) for p in neg.tolist()} & full
        assert not {(v, u) for u, v in neg.tolist()} & full
    # seeded: the same settings give the same split
    build_edge_split(lp / "canonical", lp / "split2", EdgeSplitConfig(eval_negatives=2000, seed=1))
    again = load_edge_split(lp / "split2")
    assert np.array_equal(again.test, split.test) and np.array_equal(again.val_negatives, split.val_negatives)


def test_the_split_reads_the_linked_features_once_to_check_them_not_again_to_publish(lp, tmp_path, monkeypatch):
    from graphs.infra import storage

    real, read = storage.file_sha256, []
    monkeypatch.setattr(storage, "file_sha256", lambda path, *a: read.append(Path(path).name) or real(path, *a))
    monkeypatch.setattr(storage, "_DIGESTS", {})  # nothing known from earlier tests of this process
    build_edge_split(lp / "canonical", tmp_path / "split", EdgeSplitConfig(eval_negatives=2000, seed=1))
    assert read.count("features.npy") == 1 and read.count("nodes.parquet") == 1
    storage.verify_files(tmp_path / "split", stage="edge_split")  # and the record is right


def test_bloom_filtered_sampler_never_returns_a_known_positive(lp):
    n = read_summary(lp / "canonical")["nodes"]
    exact = EdgeKeys.from_canonical(lp / "canonical", n)
    filters = load_bloom_filters(lp / "compressed")
    part = np.load(lp / "parts" / "part_id.npy")
    split = load_edge_split(lp / "split")
    for distribution in ("uniform", "degree"):
        sampler = NegativeSampler(
            n, filter="bloom", distribution=distribution, filters=filters, part=part, degree=np.arange(n) % 7 + 1
        )
        # sources = the endpoints of held-out edges, so their held-out partners are likely candidates
        src = np.concatenate([split.test[:, 0], split.val[:, 1]])
        neg_src, neg_dst = sampler.corrupt(src, 20, np.random.default_rng(0))
        assert np.array_equal(neg_src, np.repeat(src, 20))
        assert not exact.contains(neg_src, neg_dst).any()  # no edge of the full graph, held-out included
        assert (neg_src != neg_dst).all()
        assert sampler.stats.rejected_as_edge > 0  # candidates that hit an edge were drawn and rejected
    # the uniform sampler without a filter does return edges (what the filter prevents)
    plain = NegativeSampler(n, filter="none")
    s, d = plain.corrupt(np.repeat(split.test[:, 0], 50), 1, np.random.default_rng(0))
    assert exact.contains(s, d).any()


def test_wrongly_rejected_share_matches_the_measured_fpr(lp):
    n = read_summary(lp / "canonical")["nodes"]
    exact = EdgeKeys.from_canonical(lp / "canonical", n)
    filters = load_bloom_filters(lp / "compressed")
    part = np.load(lp / "parts" / "part_id.npy")
    r = compare_rejection(filters, part, exact, 400_000, np.random.default_rng(7), repeats=1)
    assert r["bloom_missed_edges"] == 0
    assert r["bloom_rejected"] == r["exact_rejected"] + r["bloom_wrongly_rejected"]
    measured = read_summary(lp / "compressed")["bloom"]["measured_fpr"]  # compressed_graph's own measurement
    # the share of true non-edges wrongly rejected is the filters' false-positive rate: within 4 sigma
    # of the rate compressed_graph measured on other random non-edges
    sigma = np.sqrt(measured * (1 - measured) / r["true_non_edges"]) + np.sqrt(measured * (1 - measured) / 100_000)
    assert abs(r["measured_fpr"] - measured) < 4 * sigma
    assert 0.002 < r["measured_fpr"] < 0.02  # a 1% target
    assert r["bloom_filter_bytes"] < r["exact_bytes"]


def test_sizes_at_100m_edges_follow_the_formats():
    s = sizes_at(200_000_000, 10_000_000, 0.01)
    assert s["exact_bytes"] == 8 * 200_000_000
    from graphs.kernels.bloom import optimal_parameters

    bits, _ = optimal_parameters(200_000_000, 0.01)
    assert s["bloom_bytes"] == bits // 8 + 64 + 4 * 10_000_000
    assert 9.5 < 8 * (s["bloom_bytes"] - 4e7) / 2e8 < 10.5  # ~10.1 bits per key at 1%


def test_link_metrics_equal_a_brute_force_reference():
    rng = np.random.default_rng(3)
    pos = rng.integers(0, 20, 60).astype(float)  # integer scores: many ties
    neg = rng.integers(0, 20, 150).astype(float)
    r = link_prediction_report(pos, neg, ks=(1, 10, 50))
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg))
    assert r["auc"] == pytest.approx(wins / (len(pos) * len(neg)))
    ranks = []
    for p in pos:
        opt = sum(q > p for q in neg)
        pess = sum(q >= p for q in neg)
        ranks.append(1 + (opt + pess) / 2)
    assert np.allclose(positive_ranks(pos, neg), ranks)
    assert r["mrr"] == pytest.approx(np.mean([1 / x for x in ranks]))
    for k in (1, 10, 50):
        assert r[f"hits@{k}"] == pytest.approx(np.mean([x <= k for x in ranks]))
    # no ties: Hits@K = share of positives above the K-th best negative (ogbl-collab)
    pos, neg = rng.normal(size=40), rng.normal(size=300)
    kth = np.sort(neg)[-10]
    assert link_prediction_report(pos, neg)["hits@10"] == pytest.approx(np.mean(pos > kth))
    assert roc_auc(np.r_[np.ones(40), np.zeros(300)], np.r_[pos, neg]) == link_prediction_report(pos, neg)["auc"]


def test_edge_seed_shards_hold_pairs_negatives_and_blocks_without_seed_edges(lp, tmp_path):
    inputs = load_shard_inputs(lp / "split", lp / "adj", lp / "parts", lp / "compressed")
    cfg = ShardConfig(fanouts="5,5", batch_size=256, epochs=1, world_size=2, link=LinkShardSettings(negatives=2))
    m = write_link_shards(inputs, tmp_path / "shards", cfg, canonical_dir=lp / "canonical")
    for placement in ("partition", "vertex_cut"):  # seed edges are not placed: refused, not ignored
        with pytest.raises(ValueError, match=f"placement='{placement}' places seed nodes"):
            write_link_shards(inputs, tmp_path / "x", replace(cfg, placement=placement), canonical_dir=lp / "canonical")
    manifest = read_manifest(tmp_path / "shards")
    assert manifest["task"] == "link_prediction" and manifest["format_version"] == FORMAT_VERSION
    seed_edges = manifest["link"]["seed_edges"]
    assert seed_edges == read_summary(lp / "split")["edges"]
    assert m["link"]["negative_sampling"]["candidates"] >= 2 * seed_edges
    # one process draws the same files and counts as the forked workers (their counts sent back)
    one = write_link_shards(inputs, tmp_path / "one", replace(cfg, workers=1), canonical_dir=lp / "canonical")
    assert m["sampling_processes"] > 1 or len(os.sched_getaffinity(0)) == 1
    assert one["link"] == m["link"] and one["streams"] == m["streams"]
    n = inputs.n
    full = EdgeKeys.from_canonical(lp / "canonical", n)
    mp = EdgeKeys.from_canonical(lp / "split", n)
    seen = 0
    for rank in range(2):
        with ShardStream(tmp_path / "shards", rank, 0, features=None, manifest=manifest) as stream:
            for mb in stream:
                nodes = mb.input_nodes.numpy()
                last = mb.blocks[-1]
                dst_nodes = nodes[: last.num_dst]
                pos = mb.extra["pos_pairs"].numpy()
                neg = mb.extra["neg_pairs"].numpy()
                pu, pv = dst_nodes[pos[0]], dst_nodes[pos[1]]
                nu, nv = dst_nodes[neg[0]], dst_nodes[neg[1]]
                assert mp.contains(pu, pv).all()  # positives are message-passing edges
                assert not full.contains(nu, nv).any()  # negatives are no edge at all
                assert np.array_equal(nu, np.repeat(pu, 2))
                # the seed edges (either direction) are not among the last block's sampled edges
                dst_of_edge = np.repeat(np.arange(last.num_dst), np.diff(last.indptr.numpy()))
                src_g, dst_g = nodes[last.indices.numpy()], dst_nodes[dst_of_edge]
                sampled = set(zip(src_g.tolist(), dst_g.tolist()))
                assert not sampled & set(zip(pu.tolist(), pv.tolist()))
                assert not sampled & set(zip(pv.tolist(), pu.tolist()))
                seen += len(pu)
    assert seen == seed_edges  # every seed edge once per epoch
    adaptive = write_link_shards(
        inputs,
        tmp_path / "adaptive",
        replace(cfg, samplers={"neighbor": {"prob": "adaptive"}}),
        canonical_dir=lp / "canonical",
    )
    assert adaptive["adaptive"]["alpha"] == 1.0 and adaptive["adaptive"]["node_scores"] is False  # degree only
    assert adaptive["non_uniform_draws"] == "sampler 'neighbor' with samplers.neighbor.prob 'adaptive'"


def test_training_learns_and_writes_metrics(lp, tmp_path, monkeypatch):
    import functools

    from graphs.infra.progress import Progress
    from training import link_train
    from training.layers import ModelConfig
    from training.link import LinkConfig
    from training.link_train import train_link

    monkeypatch.setattr(link_train, "Progress", functools.partial(Progress, every=0.0))  # a line per step

    inputs = load_shard_inputs(lp / "split", lp / "adj", lp / "parts", lp / "compressed")
    cfg = ShardConfig(fanouts="5,5", batch_size=512, epochs=2, world_size=1)
    write_link_shards(inputs, tmp_path / "shards", cfg, canonical_dir=lp / "canonical")
    lines = []
    summary = train_link(
        tmp_path / "shards",
        lp / "split",
        lp / "adj",
        tmp_path / "out",
        LinkConfig(),
        ModelConfig(hidden=32, dropout=0.0),
        link_training({"optimizer.lr": 0.005, "epochs": 2}),
        log=lines.append,
    )
    assert summary["test"]["auc"] > 0.65  # a homophilous SBM after 2 epochs: random scoring gives 0.5
    table = pq.read_table(tmp_path / "out" / "metrics.parquet").to_pylist()
    assert [(r["epoch"], r["split"]) for r in table] == [(1, "val"), (2, "val"), (summary["best_epoch"], "test")]
    assert table[-1]["auc"] == pytest.approx(summary["test"]["auc"])
    assert (tmp_path / "out" / LINK_MODEL).is_file()
    # epochs numbered from 1 in the log; the best validation MRR is the model kept and tested
    assert [line.split(":")[0] for line in lines if line.startswith("epoch ")] == ["epoch 1/2", "epoch 2/2"]
    best = max(table[:2], key=lambda r: r["mrr"])
    assert summary["best_epoch"] == best["epoch"] and summary["val"]["mrr"] == pytest.approx(best["mrr"])
    # the saved file is that model: evaluation recomputes the same test figures from it
    from training.link import evaluate_saved

    again = evaluate_saved(tmp_path / "out", tmp_path / "shards", lp / "split", lp / "adj")
    assert again["test"]["mrr"] == pytest.approx(summary["test"]["mrr"])
    assert again["val"]["mrr"] == pytest.approx(best["mrr"])
    # within-epoch progress: steps, seeds/s and ETA, epochs from 1
    steps = [line for line in lines if line.startswith("step ")]
    assert steps[0].startswith("step 1/") and "ETA" in steps[0] and "epoch 1/2" in steps[0]
    assert all(" seeds/s" in line for line in steps) and "epoch 2/2" in steps[-1]


def test_pair_features_see_the_message_passing_graph_only(lp):
    """A held-out edge is never an edge of the heuristics' graph nor a common-neighbour path."""
    import torch

    from training.blocks import remove_self_loops
    from training.evaluate import load_full_block
    from training.pair_features import PairHeuristics

    split = load_edge_split(lp / "split")
    block = remove_self_loops(load_full_block(lp / "adj"))  # what train_link and score_pairs build it from
    g = PairHeuristics(block.indptr, block.indices)
    held_out = torch.from_numpy(np.concatenate([split.val, split.test])).T
    assert not g.is_edge(held_out).any() and not g.is_edge(held_out.flip(0)).any()

    def brute_force(edges, pairs):
        nbrs = {}
        for u, v in edges:
            nbrs.setdefault(u, set()).add(v)
            nbrs.setdefault(v, set()).add(u)
        return [len(nbrs.get(u, set()) & nbrs.get(v, set())) for u, v in pairs]

    pairs = split.test.tolist()
    cn = g.counts(torch.tensor(pairs).T)[0].tolist()
    assert cn == brute_force(_edge_set(lp / "split"), pairs)  # the message-passing graph's counts
    full = brute_force(_edge_set(lp / "canonical"), pairs)
    assert sum(f > c for f, c in zip(full, cn)) > 0  # with held-out edges some counts would be higher


def test_early_stopping_keeps_the_best_validation_epoch(lp, tmp_path, monkeypatch):
    from training import link, link_train
    from training.layers import ModelConfig

    inputs = load_shard_inputs(lp / "split", lp / "adj", lp / "parts", lp / "compressed")
    shard_cfg = ShardConfig(fanouts="5", batch_size=2048, epochs=1, world_size=1)
    write_link_shards(inputs, tmp_path / "shards", shard_cfg, canonical_dir=lp / "canonical")
    real, mrrs = link.evaluate_link, iter([0.5, 0.4, 0.45, 0.3, 0.9])
    monkeypatch.setattr(link_train, "evaluate_link", lambda *a, **k: {**real(*a, **k), "mrr": next(mrrs)})
    lines = []
    training = link_training({"epochs": 5, "early_stopping_patience": 2})
    s = link_train.train_link(
        tmp_path / "shards", lp / "split", lp / "adj", None, link.LinkConfig(), ModelConfig(hidden=8), training,
        lines.append,
    )  # fmt: skip
    assert s["epochs"] == 3 and s["best_epoch"] == 1 and s["val"]["mrr"] == 0.5
    assert "early stopping after epoch 3: validation MRR has not improved for 2 evaluations" in lines


def _materializations(result) -> dict:
    """Asset key -> its materialization in a materialize() result (a step may produce several)."""
    out = {}
    for event in result.get_asset_materialization_events():
        m = event.event_specific_data.materialization
        out[m.asset_key.to_user_string()] = m
    return out


def test_link_prediction_pipeline_materializes_through_dagster(tmp_path):
    """task: link_prediction in gnnflow.yaml: every asset of the pipeline on an unlabelled graph."""
    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions
    from pipelines.definitions import ALL_ASSETS

    landing = tmp_path / "landing" / "lp"
    generate_dataset(GenerateConfig(num_nodes=600, num_edges=5000, feature_dim=8, seed=2), landing, progress=False)
    (landing / "nodes.parquet").unlink()  # no labels: link prediction needs none
    (landing / "gnnflow.yaml").write_text(
        "task: link_prediction\n"
        "ops:\n"
        "  edge_split: {config: {eval_negatives: 500}}\n"
        "  metis_partitions: {config: {num_parts: 2, write_distdgl: false}}\n"
        "  compressed_graph: {config: {fpr_queries: 20000}}\n"
        "  minibatch_shards: {config: {fanouts: '5,5', epochs: 2, world_size: 2, batch_size: 256}}\n"
        "  trained_model: {config: {model: {hidden: 16, dropout: 0.0}, training: {optimizer: {lr: 0.005}, min_steps: 64}}}\n"
    )
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["lp"])
    result = dg.materialize(ALL_ASSETS, partition_key="lp", instance=instance, resources={"storage": storage})
    assert result.success
    mats = _materializations(result)
    meta = {a: mats[a].metadata for a in ("edge_split", "minibatch_shards")}
    assert meta["edge_split"]["test_edges"].value > 0
    assert meta["minibatch_shards"]["task"].value == "link_prediction"
    assert meta["minibatch_shards"]["negatives_rejected_as_edge"].value > 0
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks["no_held_out_edge_in_message_passing"]
    # the training block of every task, at link prediction's defaults where gnnflow.yaml leaves a key unset
    applied = mats["trained_model"].metadata["own_defaults"].value
    assert applied == {
        k: v for k, v in LINK_DEFAULTS.items() if k not in ("training.optimizer.lr", "training.min_steps")
    }
    summary = json.loads((tmp_path / "home" / "lp" / "trained_model" / "summary.json").read_text())
    assert summary["training"]["optimizer"]["lr"] == 0.005 and summary["training"]["early_stopping_patience"] == 5
    evaluation = mats["evaluation"].metadata
    assert 0.5 < evaluation["test_auc"].value <= 1.0
    assert "gnnflow score-pairs" in mats["predictions"].metadata["skipped"].value  # pairs, not nodes
    home = tmp_path / "home" / "lp"
    # normalized_adjacency was built from the message-passing graph: its entries are 2 x train edges + n loops
    split = load_edge_split(home / "edge_split")
    csr = load_csr(home / "normalized_adjacency")
    assert csr.nnz == 2 * len(split.train) + split.n
    table = pq.read_table(home / "trained_model" / "metrics.parquet").to_pylist()
    assert table[-1]["split"] == "test" and "hits@100" in table[-1]
    # made once: re-running the step keeps the split (same canonical edges and settings)
    from assets.normalized_adjacency import normalized_adjacency

    again = dg.materialize(
        [normalized_adjacency], partition_key="lp", instance=instance, resources={"storage": storage}
    )
    assert again.success and set(_materializations(again)) == {"normalized_adjacency"}
    assert np.array_equal(load_edge_split(home / "edge_split").test, split.test)


def test_node_classification_runs_no_split_and_no_extra_step(tmp_path):
    import dagster as dg

    from assets.canonical_graph import canonical_graph
    from assets.common import GnnflowStorage, dataset_partitions
    from assets.normalized_adjacency import normalized_adjacency
    from tests.conftest import write_edges

    write_edges(tmp_path / "landing" / "nc" / "edges.parquet", [0, 1, 2], [1, 2, 0])
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["nc"])
    result = dg.materialize(
        [canonical_graph, normalized_adjacency], partition_key="nc", instance=instance, resources={"storage": storage}
    )
    assert result.success
    # edge_split is an asset of the normalized_adjacency step: no step of its own, not materialized
    assert sorted(e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS") == [
        "canonical_graph",
        "normalized_adjacency",
    ]
    assert set(_materializations(result)) == {"canonical_graph", "normalized_adjacency"}
    assert not (tmp_path / "home" / "nc" / "edge_split").exists()


def test_task_setting_is_validated_naming_the_file(tmp_path):
    from assets.settings import SettingsError, read_task

    path = tmp_path / "gnnflow.yaml"
    assert read_task(path) == "node_classification"  # no file: the default
    path.write_text("task: link_prediction\n")
    assert read_task(path) == "link_prediction"
    path.write_text("task: clustering\n")
    with pytest.raises(SettingsError, match=r"gnnflow.yaml: key 'task': 'clustering' is not one of"):
        read_task(path)
    from assets.settings import registered_configs, resolve

    with pytest.raises(SettingsError, match=r"ops.edge_split.config"):
        resolve(registered_configs()["edge_split"], "edge_split", {}, {"test_fraction": 2}, path)


def test_normalized_adjacency_and_edge_split_can_be_selected_alone(tmp_path):
    """`--select normalized_adjacency` (one asset of the two-asset step) runs for either task;
    link prediction without a current split fails naming the selection that makes one."""
    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions
    from pipelines.definitions import ALL_ASSETS
    from tests.conftest import write_edges

    write_edges(tmp_path / "landing" / "nc" / "edges.parquet", [0, 1, 2, 3], [1, 2, 0, 0])
    landing = tmp_path / "landing" / "lp"
    generate_dataset(GenerateConfig(num_nodes=300, num_edges=2000, feature_dim=4, seed=3), landing, progress=False)
    (landing / "gnnflow.yaml").write_text(
        "task: link_prediction\nops:\n  edge_split: {config: {eval_negatives: 100}}\n"
    )
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["nc", "lp"])

    def run(select: str, dataset: str):
        return dg.materialize(
            ALL_ASSETS,
            selection=select,
            partition_key=dataset,
            instance=instance,
            resources={"storage": storage},
            raise_on_error=False,
        )

    for dataset in ("nc", "lp"):
        assert run("canonical_graph", dataset).success
    nc = run("normalized_adjacency", "nc")
    assert nc.success and set(_materializations(nc)) == {"normalized_adjacency"}
    assert {c.check_name for c in nc.get_asset_check_evaluations()} == {
        "symmetric",
        "finite_weights",
        "weights_in_0_1",
        "largest_eigenvalue_at_most_1",
    }
    failed = run("normalized_adjacency", "lp")
    assert not failed.success
    failure = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"][0]
    assert "--select edge_split,normalized_adjacency" in str(failure.event_specific_data.error.message)
    assert not (tmp_path / "home" / "lp" / "normalized_adjacency").exists()
    split = run("edge_split", "lp")
    assert split.success and set(_materializations(split)) == {"edge_split"}
    assert not (tmp_path / "home" / "lp" / "normalized_adjacency").exists()
    adj = run("normalized_adjacency", "lp")  # the split is current now
    assert adj.success and set(_materializations(adj)) == {"normalized_adjacency"}
    csr = load_csr(tmp_path / "home" / "lp" / "normalized_adjacency")
    assert csr.nnz == 2 * len(load_edge_split(tmp_path / "home" / "lp" / "edge_split").train) + csr.n


class _Stopped(Exception):
    pass


def test_a_stopped_run_continues_from_its_checkpoint_to_the_uninterrupted_figures(lp, tmp_path):
    """The link head on the shared loop checkpoints after every epoch beside its outputs; a run
    stopped after epoch 2 continues from there and ends with the figures and metrics of an
    uninterrupted run (dropout on: torch's generator is restored too), then drops the work folder."""
    from training.layers import ModelConfig
    from training.link import LinkConfig
    from training.link_train import train_link
    from training.outputs import METRICS

    inputs = load_shard_inputs(lp / "split", lp / "adj", lp / "parts", lp / "compressed")
    shard_cfg = ShardConfig(fanouts="5", batch_size=1024, epochs=2, world_size=1)
    write_link_shards(inputs, tmp_path / "shards", shard_cfg, canonical_dir=lp / "canonical")
    model_cfg = ModelConfig(hidden=8, dropout=0.5)
    training = link_training({"epochs": 4, "early_stopping_patience": 0})

    def run(out: Path, **kw) -> dict:
        args = (tmp_path / "shards", lp / "split", lp / "adj", out, LinkConfig(), model_cfg, training)
        return train_link(*args, kw.pop("log", lambda m: None), checkpoint_beside=out, **kw)

    whole = run(tmp_path / "whole")

    def stop(epoch, rows):
        if epoch == 1:
            raise _Stopped

    with pytest.raises(_Stopped):
        run(tmp_path / "out", on_epoch_end=stop)
    (work,) = tmp_path.glob(".out.work-*")
    assert (work / "checkpoint.safetensors").is_file() and not (tmp_path / "out").exists()
    lines = []
    resumed = run(tmp_path / "out", log=lines.append)
    assert any(line.startswith("resuming from") and line.endswith("epochs 1..2 done") for line in lines), lines
    assert not any(line.startswith("epoch 2/4:") for line in lines) and any(
        line.startswith("epoch 3/4:") for line in lines
    )
    for key in ("epochs", "best_epoch", "losses", "val", "test"):
        assert resumed[key] == whole[key], key
    assert pq.read_table(tmp_path / "out" / METRICS).equals(pq.read_table(tmp_path / "whole" / METRICS))
    assert not work.exists() and not list(tmp_path.glob(".whole.work-*"))
