"""Link prediction on a typed graph's target relation: the split, the shards, per-user ranking,
training, scoring pairs by the user's ids of both types, and the Dagster path."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from graphs.formats.graph_schema import TypedSchema
from graphs.formats.shard_format import read_manifest
from graphs.sampling import ShardConfig, load_shard_inputs
from graphs.sampling.config import LinkShardSettings
from graphs.sampling.link import write_link_shards
from graphs.stages.canonical import CanonicalConfig, build_canonical_graph
from graphs.stages.compress import CompressConfig, build_compressed_graph
from graphs.stages.edge_split import EdgeSplitConfig, build_edge_split, load_edge_split
from graphs.stages.edge_split_typed import TargetRelation
from graphs.stages.negatives import EdgeKeys
from graphs.stages.normalize import build_normalized_adjacency
from graphs.stages.partition import PartitionConfig, build_partitions
from graphs.synthetic.typed import generate_typed
from training.data import ShardStream
from training.ranking import ranking_report


def _typed_edges(folder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = pq.read_table(folder / "typed_edges.parquet")
    return tuple(t.column(c).to_numpy().astype(np.int64) for c in ("src", "dst", "etype"))


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """A generated 800-user shop through canonical (reverses added) -> split on buys -> Â -> parts -> compressed."""
    root = tmp_path_factory.mktemp("typed_link")
    generate_typed(root / "landing", 800, seed=3)
    build_canonical_graph(root / "landing", root / "canonical", CanonicalConfig(add_reverse=True))
    build_edge_split(root / "canonical", root / "split", EdgeSplitConfig(relation="buys", eval_negatives=1000))
    build_normalized_adjacency(root / "split", root / "adj")
    build_partitions(root / "split", root / "parts", PartitionConfig(num_parts=2, write_distdgl=False))
    build_compressed_graph(
        root / "canonical", root / "adj", root / "parts", root / "compressed", CompressConfig(fpr_queries=20_000)
    )
    return root


def _trained(shop, tmp_path, shards: ShardConfig, link, hidden: int, training: dict) -> dict:
    """Shards of `shards` from the shop's split and an R-GCN link model trained on them into
    tmp_path/out (the link block `link`, the training block's `training` values); its summary."""
    from training.layers import ModelConfig
    from training.link import LINK_DEFAULTS
    from training.link_train import train_link
    from training.task_settings import task_blocks, with_values

    inputs = load_shard_inputs(shop / "split", shop / "adj", shop / "parts", shop / "compressed")
    write_link_shards(inputs, tmp_path / "shards", shards, canonical_dir=shop / "canonical")
    return train_link(
        tmp_path / "shards", shop / "split", shop / "adj", tmp_path / "out", link,
        ModelConfig(hidden=hidden, conv="rgcn", dropout=0.0), with_values(task_blocks(LINK_DEFAULTS)[1], training),
        log=lambda m: None,
    )  # fmt: skip


def test_the_split_holds_out_the_target_relation_only(shop):
    full, split_schema = TypedSchema.read(shop / "canonical"), TypedSchema.read(shop / "split")
    split = load_edge_split(shop / "split")
    target = TargetRelation.from_json(split.summary["split"]["relation"])
    assert target.key == "user__buys__item"
    keys = [r.key for r in full.schema.relations]
    assert target.reverse == keys.index("item__rev-buys__user")
    users, items = (full.offsets[full.schema.type_index(t)] for t in ("user", "item"))
    assert target.src_range == (int(users), int(users) + 800)
    assert target.dst_range == (int(items), int(items) + full.counts[full.schema.type_index("item")])
    held = np.concatenate([split.val, split.test])
    n = split.n
    # held-out pairs are buys of the full graph, source a user and destination an item
    src, dst, et = _typed_edges(shop / "canonical")
    buys = set((src[et == target.index] * n + dst[et == target.index]).tolist())
    assert {int(u) * n + int(v) for u, v in held} <= buys
    assert len(split.train) + len(held) == len(buys)
    for pairs, (lo, hi) in ((held[:, 0], target.src_range), (held[:, 1], target.dst_range)):
        assert ((pairs >= lo) & (pairs < hi)).all()
    # they are gone from the split's buys and rev-buys; every other relation is whole
    s_src, s_dst, s_et = _typed_edges(shop / "split")
    left = set((s_src[s_et == target.index] * n + s_dst[s_et == target.index]).tolist())
    left_rev = set((s_dst[s_et == target.reverse] * n + s_src[s_et == target.reverse]).tolist())
    assert not {int(u) * n + int(v) for u, v in held} & (left | left_rev)
    assert left == left_rev == {int(u) * n + int(v) for u, v in split.train}
    others = [i for i in range(len(keys)) if i not in (target.index, target.reverse)]
    assert [split_schema.relation_edges[i] for i in others] == [full.relation_edges[i] for i in others]
    assert split_schema.relation_edges[target.index] == len(split.train)
    # evaluation negatives: a user and an item joined by no edge of the full graph
    exact = EdgeKeys.from_canonical(shop / "canonical", n)
    neg = np.concatenate([split.val_negatives, split.test_negatives])
    assert not exact.contains(neg[:, 0], neg[:, 1]).any()
    assert ((neg[:, 0] >= target.src_range[0]) & (neg[:, 0] < target.src_range[1])).all()
    assert ((neg[:, 1] >= target.dst_range[0]) & (neg[:, 1] < target.dst_range[1])).all()
    # the homogeneous view holds every remaining pair in both directions and no held-out pair
    mp = EdgeKeys.from_canonical(shop / "split", n)
    assert not mp.contains(held[:, 0], held[:, 1]).any()
    from assets.edge_split import check_split

    assert check_split(shop / "split", shop / "canonical").passed


def test_the_relation_setting_is_checked(shop, tmp_path):
    with pytest.raises(ValueError, match=r"needs edge_split.relation, one of .*user__buys__item"):
        build_edge_split(shop / "canonical", tmp_path / "a", EdgeSplitConfig())
    with pytest.raises(ValueError, match=r"relation='likes' names no relation; the relations are"):
        build_edge_split(shop / "canonical", tmp_path / "b", EdgeSplitConfig(relation="likes"))
    # a key names the relation too, and gives the same split as its name
    build_edge_split(
        shop / "canonical", tmp_path / "c", EdgeSplitConfig(relation="user__buys__item", eval_negatives=1000)
    )
    assert np.array_equal(load_edge_split(tmp_path / "c").test, load_edge_split(shop / "split").test)
    from graphs.synthetic.generate import GenerateConfig, generate_dataset

    generate_dataset(GenerateConfig(num_nodes=50, num_edges=200, seed=1), tmp_path / "plain", progress=False)
    build_canonical_graph(tmp_path / "plain", tmp_path / "plain_canonical", CanonicalConfig())
    with pytest.raises(ValueError, match="names a relation of a typed graph; .* holds an untyped graph"):
        build_edge_split(tmp_path / "plain_canonical", tmp_path / "d", EdgeSplitConfig(relation="buys"))


def test_typed_shards_hold_the_relations_pairs_and_typed_blocks_without_the_seed_edges(shop, tmp_path):
    inputs = load_shard_inputs(shop / "split", shop / "adj", shop / "parts", shop / "compressed")
    cfg = ShardConfig(fanouts="5,5", batch_size=256, epochs=1, world_size=1, link=LinkShardSettings(negatives=3))
    write_link_shards(inputs, tmp_path / "shards", cfg, canonical_dir=shop / "canonical")
    manifest = read_manifest(tmp_path / "shards")
    split = load_edge_split(shop / "split")
    target = TargetRelation.from_json(manifest["link"]["relation"])
    assert manifest["typed"] is not None and manifest["link"]["seed_edges"] == len(split.train)
    n = split.n
    train = {int(u) * n + int(v) for u, v in split.train}
    full = EdgeKeys.from_canonical(shop / "canonical", n)
    seen = 0
    with ShardStream(tmp_path / "shards", 0, 0, features=None, manifest=manifest) as stream:
        for mb in stream:
            nodes = mb.seeds.numpy()
            pos, neg = mb.extra["pos_pairs"].numpy(), mb.extra["neg_pairs"].numpy()
            pu, pv, nu, nv = nodes[pos[0]], nodes[pos[1]], nodes[neg[0]], nodes[neg[1]]
            assert set((pu * n + pv).tolist()) <= train  # each positive a training buy, user first
            assert np.array_equal(nu, np.repeat(pu, 3)) and not full.contains(nu, nv).any()
            assert ((nv >= target.dst_range[0]) & (nv < target.dst_range[1])).all()  # negatives are items
            last = mb.blocks[-1]  # a TypedBlock: the seed edges are in none of its relations' edges
            b = last.block
            src_g = mb.input_nodes.numpy()[b.indices.numpy()]
            dst_g = nodes[np.repeat(np.arange(b.num_dst), np.diff(b.indptr.numpy()))]
            sampled = set(zip(src_g.tolist(), dst_g.tolist(), last.etypes.tolist()))
            assert not sampled & set(zip(pu.tolist(), pv.tolist(), [target.index] * len(pu)))
            assert not sampled & set(zip(pv.tolist(), pu.tolist(), [target.reverse] * len(pu)))
            seen += len(pu)
    assert seen == len(split.train)


def test_ranking_report_equals_a_brute_force_count():
    rng = np.random.default_rng(0)
    lo, hi, users = 10, 40, 12
    items = hi - lo
    pairs = {(u, lo + v) for u in range(users) for v in rng.choice(items, 6, replace=False)}
    pairs = np.array(sorted(pairs), dtype=np.int64)
    rng.shuffle(pairs)
    split = type("S", (), {"train": pairs[:40], "val": pairs[40:55], "test": pairs[55:]})
    table = torch.from_numpy(rng.normal(size=(users, items)).astype(np.float32))
    table[0, :5] = 1.0  # ties

    def score(u, it):
        return table[u][:, it - lo]

    got = ranking_report(score, split, "test", (lo, hi), users=0, ks=(3, 10), chunk_pairs=50)
    ranks_by_user: dict[int, list[float]] = {}
    known = {(int(u), int(v)) for u, v in np.concatenate([split.train, split.val])}
    for u, v in split.test:
        s = table[u, v - lo].item()
        others = [table[u, j - lo].item() for j in range(lo, hi) if j != v and (int(u), j) not in known]
        rank = 1 + sum(o > s for o in others) + 0.5 * sum(o == s for o in others)
        ranks_by_user.setdefault(int(u), []).append(rank)
    want_mrr = np.mean([1 / min(r) for r in ranks_by_user.values()])
    want_recall = np.mean([np.mean(np.array(r) <= 3) for r in ranks_by_user.values()])
    want_hits = np.mean([min(r) <= 10 for r in ranks_by_user.values()])
    assert got["ranked_users"] == len(ranks_by_user) and got["ranked_items"] == items
    assert got["user_mrr"] == pytest.approx(want_mrr)
    assert got["recall@3"] == pytest.approx(want_recall)
    assert got["user_hits@10"] == pytest.approx(want_hits)
    # popularity: items by their training count, the same way
    pop = np.bincount(split.train[:, 1] - lo, minlength=items)
    assert got["popularity_user_mrr"] == pytest.approx(
        ranking_report(
            lambda u, it: torch.from_numpy(pop[it - lo]).float().expand(len(u), -1), split, "test", (lo, hi), users=0
        )["user_mrr"]
    )
    assert ranking_report(score, split, "test", (lo, hi), users=5, seed=1)["ranked_users"] == 5


def test_hard_negatives_walk_to_the_destination_type():
    from training.pair_features import PairHeuristics, two_hop_negatives

    # users 0-3, items 4-7: a user's 2-hop ends are users, its 3-hop ends items it has not bought
    buys = [(0, 4), (0, 5), (1, 5), (1, 6), (2, 6), (2, 7), (3, 7), (3, 4)]
    src = torch.tensor([u for u, v in buys] + [v for u, v in buys])
    dst = torch.tensor([v for u, v in buys] + [u for u, v in buys])
    order = torch.argsort(src * 8 + dst)
    src, dst = src[order], dst[order]
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(src, minlength=8).cumsum(0)])
    g = PairHeuristics(indptr, dst, ordered=True)
    types = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    nodes = torch.arange(8)
    sources = torch.tensor([0, 1, 2, 3] * 50)
    hard = two_hop_negatives(g, nodes, sources, torch.Generator().manual_seed(0), hops=3, node_types=types, end_type=1)
    assert hard.shape[1] > 0 and (types[hard[1]] == 1).all()
    assert not g.is_edge(hard).any()
    # ordered degree columns: (deg u, deg v) as given, not min/max
    feats = g(torch.tensor([[0], [4]]))
    assert feats[0, 3].item() == pytest.approx(np.log1p(2)) and feats[0, 4].item() == pytest.approx(np.log1p(2))


def test_training_ranks_each_users_items_and_the_saved_model_scores_by_the_users_ids(shop, tmp_path):
    from training.link import LinkConfig, evaluate_saved
    from training.score_pairs import PairsError, score_pairs

    shards = ShardConfig(fanouts="5,5", batch_size=512, epochs=2, world_size=1)
    s = _trained(shop, tmp_path, shards, LinkConfig(ranking_users=0), 32, {"optimizer.lr": 0.01, "epochs": 3})
    test = s["test"]
    split = load_edge_split(shop / "split")
    items = test["ranked_items"]
    assert test["ranked_users"] == len(np.unique(split.test[:, 0]))
    assert test["auc"] > 0.6
    # far better than a random ranking (recall@50 of a random list is about 50 / items)
    assert test["recall@50"] > 2 * 50 / items
    assert 0 < test["popularity_recall@50"] <= 1 and "recall@20" in s["val"]
    again = evaluate_saved(tmp_path / "out", tmp_path / "shards", shop / "split", shop / "adj")
    assert again["test"]["recall@20"] == pytest.approx(test["recall@20"])
    assert again["test"]["auc"] == pytest.approx(test["auc"])
    # pairs in the user's own ids: users are strings, items integers; each looked up in its own type
    nodes = pq.read_table(shop / "canonical" / "nodes.parquet").to_pandas()
    user_ids = nodes[nodes.node_type == "user"].set_index("node_id").original_id
    item_ids = nodes[nodes.node_type == "item"].set_index("node_id").original_id
    u, v = split.test[:3, 0], split.test[:3, 1]
    pq.write_table(
        pa.table({"src": [user_ids[i] for i in u], "dst": [int(item_ids[i]) for i in v]}), tmp_path / "pairs.parquet"
    )
    folders = {
        "model_dir": tmp_path / "out",
        "canonical_dir": shop / "canonical",
        "shards_dir": tmp_path / "shards",
        "adjacency_dir": shop / "adj",
    }
    score_pairs(tmp_path / "pairs.parquet", tmp_path / "scores.parquet", **folders)
    scores = pq.read_table(tmp_path / "scores.parquet").column("score").to_numpy()
    from training.link import load_saved

    saved = load_saved(tmp_path / "out", tmp_path / "shards", shop / "adj")
    want = saved.probabilities(torch.from_numpy(np.stack([u, v]))).numpy()
    assert np.allclose(scores, want, atol=1e-6)
    # an item id given as a user: named with its type
    pq.write_table(pa.table({"src": [str(item_ids.iloc[0])], "dst": [int(item_ids.iloc[0])]}), tmp_path / "bad.parquet")
    if str(item_ids.iloc[0]) not in set(user_ids):
        with pytest.raises(PairsError, match=r"column 'src': 1 ids are not 'user' nodes"):
            score_pairs(tmp_path / "bad.parquet", tmp_path / "x.parquet", **folders)


def test_typed_link_prediction_materializes_through_dagster(tmp_path):
    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions
    from pipelines.definitions import ALL_ASSETS

    landing = tmp_path / "landing" / "shop"
    generate_typed(landing, 500, seed=4)
    (landing / "gnnflow.yaml").write_text(
        "task: link_prediction\n"
        "ops:\n"
        "  canonical_graph: {config: {add_reverse: true}}\n"
        "  edge_split: {config: {relation: buys, eval_negatives: 500}}\n"
        "  metis_partitions: {config: {num_parts: 2, write_distdgl: false}}\n"
        "  compressed_graph: {config: {fpr_queries: 20000}}\n"
        "  minibatch_shards: {config: {fanouts: '5,5', epochs: 1, world_size: 1, batch_size: 512}}\n"
        "  trained_model: {config: {model: {hidden: 16, dropout: 0.0}, training: {min_steps: 8, max_epochs: 2}}}\n"
    )
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["shop"])
    result = dg.materialize(ALL_ASSETS, partition_key="shop", instance=instance, resources={"storage": storage})
    assert result.success
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert checks["no_held_out_edge_in_message_passing"]
    home = tmp_path / "home" / "shop"
    summary = json.loads((home / "trained_model" / "summary.json").read_text())
    assert summary["model_config"]["conv"] == "rgcn"  # the typed default
    mats = {
        e.event_specific_data.materialization.asset_key.to_user_string(): e.event_specific_data.materialization
        for e in result.get_asset_materialization_events()
    }
    evaluation = mats["evaluation"].metadata
    assert 0.0 < evaluation["test_recall@20"].value <= 1.0 and "test_popularity_recall@20" in evaluation
    split = json.loads((home / "edge_split" / "summary.json").read_text())["split"]
    assert split["relation"]["key"] == "user__buys__item"
    # predictions: the top 20 items of every user, by the user's ids
    recs = pq.read_table(home / "predictions" / "recommendations.parquet")
    assert mats["predictions"].metadata["rows"].value == len(recs) == 20 * 500
    assert recs.column("rank").to_pylist()[:20] == list(range(1, 21))


def test_a_relation_within_one_type_is_split_and_sampled_by_unordered_pairs(shop, tmp_path):
    """follows joins users to users: (u, v) and (v, u) are one pair, held out or kept together,
    and a seed edge's mirror and both reverses are left out of its blocks."""
    build_edge_split(shop / "canonical", tmp_path / "split", EdgeSplitConfig(relation="follows", eval_negatives=500))
    split = load_edge_split(tmp_path / "split")
    target = TargetRelation.from_json(split.summary["split"]["relation"])
    assert target.symmetric and target.key == "user__follows__user"
    held = np.concatenate([split.val, split.test])
    assert (held[:, 0] < held[:, 1]).all()
    n = split.n
    s_src, s_dst, s_et = _typed_edges(tmp_path / "split")
    mine = (s_et == target.index) | (s_et == target.reverse)
    left = set((s_src[mine] * n + s_dst[mine]).tolist())
    both = {int(u) * n + int(v) for u, v in held} | {int(v) * n + int(u) for u, v in held}
    assert not both & left
    build_normalized_adjacency(tmp_path / "split", tmp_path / "adj")
    inputs = load_shard_inputs(tmp_path / "split", tmp_path / "adj", None, None)
    cfg = ShardConfig(fanouts="-1", batch_size=128, epochs=1, world_size=1, link=LinkShardSettings(filter="exact"))
    write_link_shards(inputs, tmp_path / "shards", cfg, canonical_dir=shop / "canonical")
    manifest = read_manifest(tmp_path / "shards")
    with ShardStream(tmp_path / "shards", 0, 0, features=None, manifest=manifest) as stream:
        for mb in stream:
            nodes = mb.seeds.numpy()
            pos = mb.extra["pos_pairs"].numpy()
            pu, pv = nodes[pos[0]], nodes[pos[1]]
            b = mb.blocks[-1].block
            src_g = mb.input_nodes.numpy()[b.indices.numpy()]
            dst_g = nodes[np.repeat(np.arange(b.num_dst), np.diff(b.indptr.numpy()))]
            et = mb.blocks[-1].etypes.numpy()
            sampled = set(zip(src_g.tolist(), dst_g.tolist(), et.tolist()))
            for r in (target.index, target.reverse):  # every neighbour drawn: only the exclusion keeps them out
                assert not sampled & set(zip(pu.tolist(), pv.tolist(), [r] * len(pu)))
                assert not sampled & set(zip(pv.tolist(), pu.tolist(), [r] * len(pu)))


def test_recommendations_are_each_sources_best_unknown_destinations(shop, tmp_path):
    from training.link import LinkConfig, load_saved
    from training.recommend import recommend

    shards = ShardConfig(fanouts="5", batch_size=1024, epochs=1, world_size=1)
    _trained(shop, tmp_path, shards, LinkConfig(scorer="dot"), 8, {"epochs": 1, "min_steps": 1})
    saved = load_saved(tmp_path / "out", tmp_path / "shards", shop / "adj")
    split = load_edge_split(shop / "split")
    table = recommend(saved, split, shop / "canonical" / "nodes.parquet", k=5, chunk_pairs=1000)
    target = saved.graph.target
    # every user of the shop, five items each, by the user's ids (strings) and the items' (integers)
    assert table.column("src").type == pa.string() and table.column("dst").type == pa.int64()
    assert len(table) == 5 * (target.src_range[1] - target.src_range[0])
    # brute force: every user's scores over every item, its known buys set aside
    nodes = pq.read_table(shop / "canonical" / "nodes.parquet").to_pandas()
    gid = {(t, str(o)): i for i, (t, o) in enumerate(zip(nodes.node_type, nodes.original_id))}
    h = saved.embeddings()
    lo, hi = target.dst_range
    known = {(int(u), int(v)) for u, v in np.concatenate([split.train, split.val, split.test])}
    rows = table.to_pylist()
    for r in rows[:15]:
        u = gid[("user", str(r["src"]))]
        scores = (h[u] * h[lo:hi]).sum(1)
        free = [j for j in range(lo, hi) if (u, j) not in known]
        best = sorted(free, key=lambda j: -scores[j - lo].item())[: r["rank"]]
        assert gid[("item", str(r["dst"]))] == best[-1]
        assert r["score"] == pytest.approx(torch.sigmoid(scores[best[-1] - lo]).item(), abs=1e-5)
    assert [r["rank"] for r in rows[:5]] == [1, 2, 3, 4, 5]
