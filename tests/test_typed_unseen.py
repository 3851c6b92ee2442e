"""A typed dataset of the user's own kind, never seen by the other tests, through every asset in
Dagster with no configuration: the labels on one node type name the target."""

from __future__ import annotations

import json

import dagster as dg
import dgl
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from assets.common import GnnflowStorage, dataset_partitions
from pipelines.definitions import ALL_ASSETS


def _write(path, table):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _market(root, users=600, items=120, stores=6, seed=3):
    """Users (string ids, 3 features, a segment label) buying items (integer ids, 5 features) in
    their own segment's range, with a quantity as weight; items sold by stores (no features);
    users following users of their segment."""
    rng = np.random.default_rng(seed)
    segment = rng.integers(0, 3, users)
    uid = np.array([f"u-{i:04d}" for i in range(users)])
    ufeat = rng.normal(size=(users, 3)) + 0.3 * segment[:, None]
    _write(
        root / "nodes" / "user.parquet",
        pa.table(
            {
                "node_id": uid,
                "label": [f"segment-{s}" for s in segment],
                "feat": pa.array(list(ufeat.astype(np.float32)), type=pa.list_(pa.float32())),
            }
        ),
    )
    item_ids = 1000 + 7 * np.arange(items)
    item_segment = np.arange(items) % 3
    ifeat = rng.normal(size=(items, 5)) + item_segment[:, None]
    _write(
        root / "nodes" / "item.parquet",
        pa.table({"node_id": item_ids, "feat": pa.array(list(ifeat.astype(np.float32)), type=pa.list_(pa.float32()))}),
    )
    _write(root / "nodes" / "store.parquet", pa.table({"node_id": np.arange(stores) * 11}))
    buyer = np.repeat(np.arange(users), 6)
    bought = np.array(
        [
            rng.choice(np.flatnonzero(item_segment == segment[u])) if rng.random() < 0.8 else rng.integers(items)
            for u in buyer
        ]
    )
    pairs = np.unique(np.stack([buyer, bought], 1), axis=0)
    _write(
        root / "edges" / "user__buys__item.parquet",
        pa.table(
            {
                "src": uid[pairs[:, 0]],
                "dst": item_ids[pairs[:, 1]],
                "weight": rng.integers(1, 5, len(pairs)).astype(np.float64),
            }
        ),
    )
    _write(
        root / "edges" / "item__soldby__store.parquet",
        pa.table({"src": item_ids, "dst": (np.arange(items) % stores) * 11}),
    )
    follower = rng.integers(0, users, 1500)
    followed = np.array([rng.choice(np.flatnonzero(segment == segment[u])) for u in follower])
    keep = follower != followed
    _write(
        root / "edges" / "user__follows__user.parquet",
        pa.table({"src": uid[follower[keep]], "dst": uid[followed[keep]]}),
    )


def test_an_unseen_typed_dataset_runs_every_asset_with_no_configuration(tmp_path):
    _market(tmp_path / "landing" / "market")
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["market"])
    result = dg.materialize(ALL_ASSETS, partition_key="market", instance=instance, resources={"storage": storage})
    assert result.success
    assert all(c.passed for c in result.get_asset_check_evaluations())
    mats = {
        e.event_specific_data.materialization.asset_key.to_user_string(): e.event_specific_data.materialization.metadata
        for e in result.get_asset_materialization_events()
    }
    home = tmp_path / "home" / "market"
    # the labelled type is the target: its segments are learned well above the majority class
    evaluation = mats["evaluation"]
    assert evaluation["accuracy"].value > evaluation["majority_class_accuracy"].value + 0.2
    assert mats["promotion"]["promoted"].value
    predictions = pq.read_table(home / "predictions" / "predictions.parquet").to_pandas()
    assert len(predictions) == 600 and predictions.node_id.str.startswith("u-").all()  # the users' own ids
    assert predictions.predicted.str.startswith("segment-").all()  # and label values

    # each node type keeps its own width in DGL's heterogeneous partitions; buys keeps its weights
    config = next((home / "metis_partitions" / "distdgl").glob("*.json"))
    g, feats, edge_feats, *_ = dgl.distributed.load_partition(str(config), 0)
    assert feats["user/feat"].shape[1] == 3 and feats["item/feat"].shape[1] == 5 and "store/feat" not in feats
    assert "user:buys:item/weight" in edge_feats and float(edge_feats["user:buys:item/weight"].min()) >= 1.0
    compressed = json.loads((home / "compressed_graph" / "summary.json").read_text())["features"]
    assert set(compressed["node_types"]) == {"item", "user"} and len(compressed["type_offsets"]) == 4
