"""Operations around the model: every run that trains ends with predictions from the model its
promotion decided on, and the landing sensor says when the run for a dataset's files failed
(instead of "as last ingested"), requesting nothing more until the files change."""

import json

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from assets.canonical_graph import canonical_graph
from assets.common import dataset_partitions
from pipelines.definitions import ALL_ASSETS, defs
from pipelines.sensors import make_landing_sensor, requested_run_status, run_key, split_by_labels
from tests.conftest import write_edges


def _selected(job: str) -> set[str]:
    return {k.to_user_string() for k in defs.resolve_job_def(job).asset_layer.executable_asset_keys} - {"edge_split"}


def test_every_run_that_trains_ends_with_predictions_and_scoring_alone_ingests_nothing():
    assert "predictions" in _selected("retrain") and "promotion" in _selected("retrain")
    assert "predictions" in _selected("gnnflow_pipeline") and "predictions" in _selected("train")
    assert _selected("predict") == {"predictions"}
    every, needs_labels = split_by_labels(ALL_ASSETS)  # what the landing sensor requests
    assert dg.AssetKey("predictions") in every and dg.AssetKey("predictions") not in needs_labels
    # predictions comes after promotion in the lineage, so a run with both scores with the decided model
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("promotion") in graph.get(dg.AssetKey("predictions")).parent_keys


def _tick(sensor, instance, storage, cursor=None):
    return sensor(dg.build_sensor_context(instance=instance, cursor=cursor, resources={"storage": storage}))


def test_a_failed_ingest_is_reported_as_failed_and_retried_only_when_the_files_change(tmp_path, storage, instance):
    landing = tmp_path / "landing" / "ds"
    write_edges(landing / "edges.parquet", [1, 2], [2, 3])
    (landing / "_SUCCESS").write_text("")  # requested on the first tick
    instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
    sensor = make_landing_sensor(ALL_ASSETS)
    first = _tick(sensor, instance, storage)
    (request,) = first.run_requests
    # the requested run fails (the file's columns are wrong by the time it reads them)
    pq.write_table(pa.table({"from": [1], "to": [2]}), landing / "edges.parquet")
    (landing / "_SUCCESS").write_text("")
    again = _tick(sensor, instance, storage, first.cursor)  # the new files: requested
    (request,) = again.run_requests
    failed = dg.materialize(
        [canonical_graph],
        partition_key="ds",
        instance=instance,
        resources={"storage": storage},
        tags={"dagster/run_key": request.run_key},
        raise_on_error=False,
    )
    assert not failed.success
    fingerprint = json.loads(again.cursor)["requested"]["ds"]
    assert request.run_key == run_key("ds", fingerprint)
    assert requested_run_status(instance, "ds", fingerprint) == dg.DagsterRunStatus.FAILURE

    quiet = _tick(sensor, instance, storage, again.cursor)
    assert quiet.run_requests == []
    assert "as last ingested" not in quiet.skip_reason
    assert "the run for the current files failed, retried when they change: ds (failure)" in quiet.skip_reason

    write_edges(landing / "edges.parquet", [1, 2], [2, 4])  # fixed: requested again
    (landing / "_SUCCESS").write_text("")
    fixed = _tick(sensor, instance, storage, quiet.cursor)
    assert [r.partition_key for r in fixed.run_requests] == ["ds"]


def test_train_after_a_new_ingest_fails_at_once_naming_the_retrain_job(tmp_path, storage, instance):
    """Files ingested again after the shards were cut: `train` fails before launching anything,
    naming the job that rebuilds the shards and trains."""
    from tests.test_predict import _landing

    landing = tmp_path / "landing" / "ds"
    _landing(landing, 120, np.random.default_rng(0))
    instance.add_dynamic_partitions(dataset_partitions.name, ["ds"])
    run = {"partition_key": "ds", "instance": instance, "resources": {"storage": storage}, "raise_on_error": False}
    small = {"ops": {"minibatch_shards": {"config": {"fanouts": "3,3", "batch_size": 32, "epochs": 1}}}}
    assert defs.resolve_job_def("preprocess").execute_in_process(run_config=small, **run).success
    _landing(landing, 130, np.random.default_rng(1))
    assert defs.resolve_job_def("ingest").execute_in_process(**run).success

    trained = defs.resolve_job_def("train").execute_in_process(**run)
    assert not trained.success
    (failure,) = [e for e in trained.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    cause = failure.step_failure_data.user_failure_data.description
    assert "canonical_graph was re-materialized; re-materialize minibatch_shards" in cause, cause
    assert cause.endswith("gnnflow launch --job retrain --partition ds")
    assert not (tmp_path / "home" / "ds" / "trained_model").exists()  # nothing was launched


def test_gnnflow_launch_refuses_what_cannot_start_in_one_line(tmp_path, monkeypatch, capsys):
    from pipelines.cli import main

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as inst:
        inst.add_dynamic_partitions(dataset_partitions.name, ["ds"])
    typo = tmp_path / "run.yaml"
    typo.write_text("ops:\n  canonical_graph:\n    config:\n      symetrize: true\n")
    cases = {
        ("--assets", "canonical_graph", "--partition", "ds", "-c", str(typo)): 'unexpected config entry "symetrize"',
        ("--assets", "nosuch", "--partition", "ds"): "--assets 'nosuch'",
        (
            "--job",
            "nosuch",
            "--partition",
            "ds",
        ): "no such job; the jobs are distdgl_training, gnnflow_pipeline, ingest, predict",
        ("--job", "ingest", "--partition", "other"): "`gnnflow datasets sync`",
        ("--job", "ingest", "--partition", "../x"): "--partition: ",
    }
    for argv, expected in cases.items():
        assert main(["launch", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("gnnflow launch: ") and expected in err[0], (argv, err)
