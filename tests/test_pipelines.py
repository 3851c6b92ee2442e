"""Dagster wiring: the code location loads, canonical_graph materializes per dataset
partition, the landing sensor registers partitions and selects stages by labels."""

import json
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.canonical_graph import canonical_graph
from assets.common import NEEDS_LABELS_TAG, dataset_partitions
from pipelines.definitions import ALL_ASSETS, defs
from pipelines.sensors import make_landing_sensor, register_datasets
from tests.conftest import write_edges


def _instance_with(*names: str) -> dg.DagsterInstance:
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, list(names))
    return instance


def test_definitions_load_and_every_job_resolves():
    dg.Definitions.validate_loadable(defs)
    names = {j.name for j in defs.resolve_all_job_defs()}
    assert {"gnnflow_pipeline", "ingest"} <= names
    for name in ("gnnflow_pipeline", "ingest"):
        job = defs.resolve_job_def(name)
        assert job.partitions_def == dataset_partitions
    assert defs.resolve_sensor_def("landing_sensor").default_status == dg.DefaultSensorStatus.RUNNING


def test_canonical_graph_materializes_with_metadata_and_check(tmp_path, storage):
    write_edges(
        tmp_path / "landing" / "tiny" / "edges.parquet", ["u", "v", "w", "w"], ["v", "w", "u", "w"], pa.string()
    )
    result = dg.materialize(
        [canonical_graph], partition_key="tiny", instance=_instance_with("tiny"), resources={"storage": storage}
    )
    assert result.success
    mat = result.asset_materializations_for_node("canonical_graph")[0]
    assert mat.partition == "tiny"
    assert mat.metadata["nodes"].value == 3
    assert mat.metadata["edges"].value == 6
    assert mat.metadata["dropped_self_loop"].value == 1
    assert mat.metadata["degree_distribution"].value.startswith("![degree distribution](data:image/png;base64,")
    checks = result.get_asset_check_evaluations()
    assert [(c.check_name, c.passed) for c in checks] == [("edges_valid", True)]
    edges = pq.read_table(tmp_path / "home" / "tiny" / "canonical_graph" / "edges.parquet")
    assert edges.num_rows == 6


def test_bad_input_fails_the_run_and_keeps_previous_files(tmp_path, storage):
    landing = tmp_path / "landing" / "tiny"
    write_edges(landing / "edges" / "a.parquet", [1, 2], [2, 3])
    instance = _instance_with("tiny")
    assert dg.materialize(
        [canonical_graph], partition_key="tiny", instance=instance, resources={"storage": storage}
    ).success
    out = tmp_path / "home" / "tiny" / "canonical_graph"
    before = (out / "edges.parquet").read_bytes()
    pq.write_table(pa.table({"src": [1]}), landing / "edges" / "b.parquet")
    result = dg.materialize(
        [canonical_graph], partition_key="tiny", instance=instance, resources={"storage": storage}, raise_on_error=False
    )
    assert not result.success
    failure = result.failure_data_for_node("canonical_graph")
    assert "b.parquet" in failure.error.message and "missing column 'dst'" in failure.error.message
    assert (out / "edges.parquet").read_bytes() == before


def _landing(tmp_path):
    write_edges(tmp_path / "landing" / "plain" / "edges.parquet", [1, 2], [2, 3])
    labelled = tmp_path / "landing" / "labelled"
    write_edges(labelled / "edges" / "0.parquet", [1, 2], [2, 3])
    pq.write_table(
        pa.table({"node_id": [1, 2, 3], "label": pa.array([0, 1, -1], pa.int32())}), labelled / "nodes.parquet"
    )
    (tmp_path / "landing" / "not-a-dataset").mkdir()  # no edge files: ignored


def test_landing_sensor_registers_and_selects_by_labels(tmp_path, storage):
    _landing(tmp_path)
    needs_labels = dg.AssetSpec("needs_labels_stage", tags={NEEDS_LABELS_TAG: "labels"})

    @dg.multi_asset(specs=[needs_labels])
    def needs_labels_stage():
        return None

    assets = [canonical_graph, needs_labels_stage]
    sensor = make_landing_sensor(assets)
    instance = dg.DagsterInstance.ephemeral()
    ctx = dg.build_sensor_context(instance=instance, resources={"storage": storage})
    first = sensor(ctx)
    # new folders are registered at once; their runs wait one tick for the files to settle
    assert [list(r.partition_keys) for r in first.dynamic_partitions_requests] == [["labelled", "plain"]]
    assert first.run_requests == []
    instance.add_dynamic_partitions(dataset_partitions.name, ["labelled", "plain"])
    result = sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor, resources={"storage": storage}))
    by_key = {r.partition_key: {k.to_user_string() for k in r.asset_selection} for r in result.run_requests}
    assert by_key == {"labelled": {"canonical_graph", "needs_labels_stage"}, "plain": {"canonical_graph"}}
    assert result.dynamic_partitions_requests == []

    # the same files again: nothing new is requested (the runs asked for are pending)
    again = sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor, resources={"storage": storage}))
    assert again.run_requests == [] and again.dynamic_partitions_requests == []


def test_register_datasets_adds_only_new_partitions(tmp_path, storage):
    _landing(tmp_path)
    instance = _instance_with("plain")
    assert register_datasets(instance, storage) == ["labelled"]
    assert register_datasets(instance, storage) == []
    assert sorted(instance.get_dynamic_partitions("dataset")) == ["labelled", "plain"]


def test_every_asset_is_partitioned_by_dataset():
    for a in ALL_ASSETS:
        assert a.partitions_def == dataset_partitions, a.key


def _cli(args, env_extra, cwd):
    import os
    import subprocess
    import sys

    env = {**os.environ, **env_extra}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_cli_generate_then_datasets_sync(tmp_path):
    """`gnnflow generate` writes the landing layout; `gnnflow datasets sync` registers it in DAGSTER_HOME."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {"DAGSTER_HOME": str(home), "GNNFLOW_LANDING": str(tmp_path / "landing"), "PYTHONPATH": str(repo)}
    gen = _cli(
        [
            "generate",
            "--out",
            str(tmp_path / "landing" / "g1"),
            "--num-nodes",
            "500",
            "--num-edges",
            "3000",
            "--num-edge-files",
            "3",
            "--quiet",
        ],
        env,
        tmp_path,
    )
    assert gen.returncode == 0, gen.stderr
    summary = json.loads(gen.stdout)
    assert summary["nodes"] == 500 and summary["edge_rows"] == 3000
    assert len(list((tmp_path / "landing" / "g1" / "edges").glob("*.parquet"))) == 3
    labels = pq.read_table(tmp_path / "landing" / "g1" / "nodes.parquet").column("label").to_numpy()
    assert labels.min() >= 0 and len(np.unique(labels)) > 1

    sync = _cli(["datasets", "sync"], env, tmp_path)
    assert sync.returncode == 0, sync.stderr
    assert "newly registered: g1" in sync.stdout
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        assert instance.get_dynamic_partitions("dataset") == ["g1"]
    again = _cli(["datasets", "sync"], env, tmp_path)
    assert "newly registered: none" in again.stdout

    bad = _cli(["generate", "--out", str(tmp_path / "x"), "--homophily", "1.5", "--quiet"], env, tmp_path)
    assert bad.returncode != 0 and "homophily" in bad.stderr


def test_real_definitions_keep_label_stages_from_unlabelled_datasets():
    from pipelines.sensors import split_by_labels

    every, needs = split_by_labels(ALL_ASSETS)
    assert {k.to_user_string() for k in needs} == {"minibatch_shards", "trained_model", "evaluation", "promotion"}
    assert {k.to_user_string() for k in every} - {k.to_user_string() for k in needs} == {
        "canonical_graph",
        "edge_split",  # link prediction's split, made by the normalized_adjacency step
        "normalized_adjacency",
        "metis_partitions",
        "compressed_graph",
        "predictions",  # scores with a model trained earlier; skipped when there is none
    }


def test_every_fill_and_drop_is_counted_in_metadata_and_logged(tmp_path, storage):
    """Nothing silent: rows dropped and values filled by the ingest show with their counts."""
    import logging

    from assets.canonical_graph import FILLS_AND_DROPS

    landing = tmp_path / "landing" / "filled"
    write_edges(landing / "edges.parquet", [1, 2, 2, 3, 4, None], [2, 3, 3, 3, 5, 1])  # dup 2-3, loop 3-3, null
    pq.write_table(
        pa.table(
            {
                "node_id": [1, 2, 3],
                "label": pa.array([0, None, 1], pa.int32()),
                "split": pa.array(["train", None, "test"]),
            }
        ),
        landing / "nodes.parquet",
    )
    feats = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(4, np.float32)), 2)
    pq.write_table(pa.table({"node_id": [1, 2], "feat": feats}), landing / "features.parquet")
    instance = _instance_with("filled")
    result = dg.materialize(
        [canonical_graph], partition_key="filled", instance=instance, resources={"storage": storage}
    )
    md = result.asset_materializations_for_node("canonical_graph")[0].metadata
    counts = {k: md[k].value for k in FILLS_AND_DROPS}
    assert counts == {
        "dropped_null_id": 1,
        "dropped_self_loop": 1,
        "dropped_duplicate": 1,
        "nodes_without_node_row": 2,  # 4 and 5 appear only in edges
        "null_labels_as_unknown": 1,
        "null_splits_as_other": 1,
        "unknown_splits_as_other": 0,
        "nodes_without_features": 3,  # 3, 4, 5
        "dropped_invalid_weight": 0,  # no weight column
    }
    assert md["disk_mb"].value > 0
    warnings = [
        r.user_message
        for r in instance.all_logs(result.run_id)
        if r.level == logging.WARNING and r.user_message.startswith("dataset 'filled':")
    ]
    assert len(warnings) == sum(1 for v in counts.values() if v)
    assert "dataset 'filled': 3 nodes with no features.parquet row: a feature row of zeros" in warnings


@pytest.mark.parametrize("recipe", sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml")))
def test_every_recipe_is_a_valid_run_config_of_the_pipeline(recipe):
    import yaml

    from graphs.sampling import ShardConfig
    from training.config import RunConfig

    data = yaml.safe_load(recipe.read_text())
    result = dg.validate_run_config(defs.resolve_job_def("gnnflow_pipeline"), data)  # what `-c` is checked against
    assert (
        result["ops"]["trained_model"]["config"]["model"]["conv"]
        == data["ops"]["trained_model"]["config"]["model"]["conv"]
    )
    ShardConfig(**data["ops"]["minibatch_shards"]["config"])  # and the library configs accept it
    cfg = RunConfig.from_dict({**data, "paths": {"shards": "s", "out": "o"}})
    assert cfg.model.conv == data["ops"]["trained_model"]["config"]["model"]["conv"]


def test_edges_valid_check_streams_and_compares_rows_across_batches(tmp_path):
    from assets.canonical_graph import check_edges

    def check(src, dst, n=5, batch_rows=2):
        out = tmp_path / "out"
        write_edges(out / "edges.parquet", src, dst, pa.int64())
        pq.write_table(pa.table({"node_id": np.arange(n)}), out / "nodes.parquet")
        results = [check_edges(out, batch_rows=b) for b in (batch_rows, 1 << 20)]
        assert results[0].metadata == results[1].metadata  # batches change nothing
        return results[0].passed, {k: v.value for k, v in results[0].metadata.items()}

    ok = {"unsorted_or_duplicate": 0, "self_loops": 0, "out_of_range": 0}
    assert check([0, 0, 1, 2, 3], [1, 2, 0, 4, 1]) == (True, ok)
    # row 2 (the first of the second batch) repeats row 1: found across the batch boundary
    assert check([0, 0, 0, 2, 3], [1, 2, 2, 4, 1]) == (False, ok | {"unsorted_or_duplicate": 1})
    assert check([0, 1, 0, 2, 3], [1, 2, 3, 4, 1]) == (False, ok | {"unsorted_or_duplicate": 1})
    # a self loop and an out-of-range id as a batch's first row: counted once
    assert check([0, 0, 2, 3, 3], [1, 2, 2, 4, 5]) == (False, ok | {"self_loops": 1, "out_of_range": 1})
    assert check([0, 0, 1, 5, 6], [1, 2, 0, 0, 0]) == (False, ok | {"out_of_range": 2})
