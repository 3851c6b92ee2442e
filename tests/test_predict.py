"""Scoring new data with a trained model: the model file carries its preprocessing, and the
predictions join back to the user's ids (string ids here, the case that used to fail)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from training.config import RunConfig
from training.outputs import MODEL_BEST, OUTPUT_FORMAT, load_model
from training.predict import predict
from training.train import train


def _landing(folder, n, rng, feat_shift=0.0):
    """A labelled graph with string ids 'n0'..: a ring plus chords, 8 features tied to the label."""
    ids = np.array([f"n{i}" for i in range(n)])
    src = np.concatenate([np.arange(n), np.arange(n)])
    dst = np.concatenate([(np.arange(n) + 1) % n, (np.arange(n) + 7) % n])
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"src": ids[src], "dst": ids[dst]}), folder / "edges.parquet")
    label = (np.arange(n) // 5) % 3
    pq.write_table(pa.table({"node_id": ids, "label": pa.array(label, pa.int32())}), folder / "nodes.parquet")
    feat = rng.normal(size=(n, 8)).astype(np.float32) + feat_shift
    feat[np.arange(n), label] += 3.0
    pq.write_table(
        pa.table({"node_id": ids, "feat": pa.FixedSizeListArray.from_arrays(pa.array(feat.ravel()), 8)}),
        folder / "features.parquet",
    )
    return feat


def _stages(landing, home):
    build_canonical_graph(landing, home / "canonical_graph")
    build_normalized_adjacency(home / "canonical_graph", home / "normalized_adjacency")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    rng = np.random.default_rng(0)
    feat = _landing(root / "landing" / "ds", 120, rng, feat_shift=5.0)
    home = root / "home"
    _stages(root / "landing" / "ds", home)
    shards = home / "minibatch_shards"
    write_minibatch_shards(
        load_shard_inputs(home / "canonical_graph", home / "normalized_adjacency"),
        shards,
        ShardConfig(fanouts="4,4", batch_size=32, epochs=1, world_size=1),
    )
    cfg = RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 16, "num_layers": 2},
            "training": {"epochs": 20, "profiler": "none", "feature_norm": "standard", "optimizer": {"lr": 0.02}},
            "paths": {"shards": str(shards), "out": str(home / "trained_model")},
        }
    )
    train(cfg)
    return {"root": root, "home": home, "feat": feat}


def test_model_file_holds_the_preprocessing_and_is_a_safetensors_file(trained):
    from safetensors import safe_open

    path = trained["home"] / "trained_model" / MODEL_BEST
    with safe_open(str(path), "pt") as f:  # any safetensors reader sees the weights by name
        assert f.metadata()["gnnflow.format_version"] == str(OUTPUT_FORMAT) == "3"
        names = set(f.keys())
    model, config, pre, in_feats, num_classes, epoch = load_model(path)
    assert names == {f"state_dict.{k}" for k in model.state_dict()} | {"preprocessing.mean", "preprocessing.std"}
    assert (config.conv, config.hidden, in_feats, num_classes) == ("sage", 16, 8, 3) and epoch >= 1
    assert pre.input == "features" and pre.feature_norm == "standard"
    # the statistics of the training data's features (shifted by +5), not recomputed later
    torch.testing.assert_close(pre.mean, torch.from_numpy(trained["feat"].mean(0)), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pre.std, torch.from_numpy(trained["feat"].std(0)), atol=1e-4, rtol=1e-4)


def test_predict_on_the_training_data_reproduces_the_trained_models_predictions(trained, tmp_path):
    home = trained["home"]
    summary = predict(
        home / "trained_model" / MODEL_BEST, home / "canonical_graph", home / "normalized_adjacency", tmp_path
    )
    ours = pq.read_table(tmp_path / "predictions.parquet").to_pandas()
    theirs = pq.read_table(home / "trained_model" / "predictions.parquet").to_pandas()
    assert summary["nodes"] == 120
    assert list(ours.columns) == ["node_id", "predicted", "predicted_index", "probabilities", "index"]
    assert ours.node_id.tolist() == theirs.node_id.tolist()
    assert (ours.predicted == theirs.predicted).all() and (ours.predicted_index == theirs.predicted).all()
    np.testing.assert_allclose(np.stack(ours.probabilities), np.stack(theirs.probabilities), atol=1e-5)


def test_new_nodes_are_scored_and_join_back_on_the_users_string_ids(trained, tmp_path):
    """Nodes that arrived since training get predictions from the stored model, no retraining."""
    rng = np.random.default_rng(1)
    landing = tmp_path / "landing" / "ds"
    _landing(landing, 150, rng, feat_shift=5.0)  # 30 more nodes, the same kind of data
    _stages(landing, tmp_path / "home")
    predict(
        trained["home"] / "trained_model" / MODEL_BEST,
        tmp_path / "home" / "canonical_graph",
        tmp_path / "home" / "normalized_adjacency",
        tmp_path / "out",
    )
    pred = pq.read_table(tmp_path / "out" / "predictions.parquet").to_pandas()
    user = pq.read_table(landing / "nodes.parquet").to_pandas()  # the user's own table
    joined = user.merge(pred, on="node_id")
    assert len(joined) == 150 and pred.node_id.dtype == object
    assert {f"n{i}" for i in range(120, 150)} <= set(pred.node_id)
    # the features carry the label, so a model that learned anything scores new nodes well above chance
    new = joined[joined.node_id.isin([f"n{i}" for i in range(120, 150)])]
    assert (new.predicted == new.label).mean() > 0.6


def test_predict_refuses_data_the_model_cannot_read(trained, tmp_path):
    rng = np.random.default_rng(2)
    landing = tmp_path / "landing" / "ds"
    _landing(landing, 60, rng)
    (landing / "features.parquet").unlink()
    _stages(landing, tmp_path / "home")
    with pytest.raises(ValueError, match="features.npy: missing, but the model was trained on node features"):
        predict(
            trained["home"] / "trained_model" / MODEL_BEST,
            tmp_path / "home" / "canonical_graph",
            tmp_path / "home" / "normalized_adjacency",
            tmp_path / "out",
        )


def test_the_predict_job_scores_updated_landing_files_with_the_promoted_model(trained, tmp_path):
    import shutil

    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions
    from pipelines.definitions import defs

    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    _landing(tmp_path / "landing" / "ds", 150, np.random.default_rng(3), feat_shift=5.0)
    shutil.copytree(trained["home"] / "trained_model", tmp_path / "home" / "ds" / "trained_model")
    job = defs.resolve_job_def("predict")
    # scoring alone: the published stages are never re-materialized by it
    assert {k.to_user_string() for k in job.asset_layer.executable_asset_keys} == {"predictions"}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
        result = job.execute_in_process(instance=instance, partition_key="ds", resources={"storage": storage})
        assert result.success
        md = result.asset_materializations_for_node("predictions")[0].metadata
        assert md["model"].value == str(tmp_path / "home" / "ds" / "trained_model" / MODEL_BEST)
        assert md["graph"].value == "landing files as they are now"  # nothing was ever ingested
        assert not (tmp_path / "home" / "ds" / "canonical_graph").exists()
        assert md["nodes"].value == 150 and md["nodes_since_training"].value == 30
        assert md["disk_mb"].value >= 0
        pred = pq.read_table(tmp_path / "home" / "ds" / "predictions" / "predictions.parquet")
        assert pred.num_rows == 150 and "n149" in pred.column("node_id").to_pylist()

        # a promoted model takes precedence over the latest trained one
        shutil.copytree(tmp_path / "home" / "ds" / "trained_model", tmp_path / "home" / "ds" / "promoted")
        again = job.execute_in_process(instance=instance, partition_key="ds", resources={"storage": storage})
        md = again.asset_materializations_for_node("predictions")[0].metadata
        assert md["model"].value == str(tmp_path / "home" / "ds" / "promoted" / MODEL_BEST)


def test_scoring_new_landing_files_leaves_the_published_stages_as_they_were(trained, tmp_path):
    """The predict job after the landing files grew: the new nodes are scored from a scratch ingest,
    and canonical_graph / normalized_adjacency (what the shards and the next `train` run were made
    from) stay byte for byte; with the files as ingested it scores the published stages."""
    import shutil

    import dagster as dg

    from assets.common import GnnflowStorage, dataset_partitions
    from pipelines.definitions import defs
    from tests.conftest import folder_bytes

    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    landing = tmp_path / "landing" / "ds"
    _landing(landing, 120, np.random.default_rng(0), feat_shift=5.0)
    shutil.copytree(trained["home"] / "trained_model", tmp_path / "home" / "ds" / "trained_model")
    home = tmp_path / "home" / "ds"
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
        run = {"partition_key": "ds", "instance": instance, "resources": {"storage": storage}}
        assert defs.resolve_job_def("ingest").execute_in_process(**run).success
        assert (
            defs.resolve_implicit_global_asset_job_def()
            .get_subset(asset_selection={dg.AssetKey("normalized_adjacency")})
            .execute_in_process(**run)
            .success
        )
        published = {name: folder_bytes(home / name) for name in ("canonical_graph", "normalized_adjacency")}
        predict_job = defs.resolve_job_def("predict")

        same = predict_job.execute_in_process(**run).asset_materializations_for_node("predictions")[0].metadata
        assert same["graph"].value == "published canonical_graph" and same["nodes"].value == 120

        _landing(landing, 150, np.random.default_rng(3), feat_shift=5.0)  # 30 nodes arrive
        grown = predict_job.execute_in_process(**run).asset_materializations_for_node("predictions")[0].metadata
        assert grown["graph"].value == "landing files as they are now" and grown["nodes"].value == 150
        assert grown["nodes_since_training"].value == 30
        pred = pq.read_table(home / "predictions" / "predictions.parquet")
        assert pred.num_rows == 150 and "n149" in pred.column("node_id").to_pylist()
        assert {name: folder_bytes(home / name) for name in published} == published
        assert not [p.name for p in home.iterdir() if p.name.startswith(".scoring-")]  # the scratch is gone
