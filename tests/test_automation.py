"""Jobs and the retraining schedule: job selections, configurable cron, a fresh sampling seed
per retrain unless the dataset pins one, the seed recorded in the run's tags and config."""

import datetime
import json

import dagster as dg
import pytest

from assets.common import GnnflowStorage, dataset_partitions
from assets.minibatch_shards import MinibatchShardsConfig
from assets.settings import explicit_run_config, resolve
from pipelines.definitions import defs, retrain_job
from pipelines.schedules import DEFAULT_RETRAIN_CRON, SEED_TAG, make_retrain_schedule


def _keys(job_name):
    job = defs.resolve_job_def(job_name)
    return sorted(k.to_user_string() for k in job.asset_layer.executable_asset_keys)


def test_jobs_cover_their_stages_and_old_names_still_resolve():
    assert _keys("preprocess") == sorted(
        [
            "canonical_graph",
            "edge_split",  # link prediction's split, an asset of the normalized_adjacency step
            "normalized_adjacency",
            "metis_partitions",
            "compressed_graph",
            "minibatch_shards",
        ]
    )
    # every job that trains ends with predictions from the model its promotion decided on
    trains = ["trained_model", "evaluation", "promotion", "predictions"]
    assert _keys("retrain") == sorted(["minibatch_shards", *trains])
    assert _keys("train") == sorted(trains)
    assert _keys("ingest") == ["canonical_graph"]
    assert _keys("predict") == ["predictions"]
    assert len(_keys("gnnflow_pipeline")) == 10
    for name in ("preprocess", "retrain", "train", "ingest", "predict", "gnnflow_pipeline"):
        assert defs.resolve_job_def(name).partitions_def == dataset_partitions


def test_schedule_cron_is_configurable_and_stopped_by_default(monkeypatch):
    schedule = defs.resolve_schedule_def("retrain_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedule.cron_schedule == DEFAULT_RETRAIN_CRON == "0 3 * * 0"  # weekly
    assert schedule.job_name == "retrain"
    monkeypatch.setenv("GNNFLOW_RETRAIN_CRON", "15 2 * * *")
    assert make_retrain_schedule(retrain_job).cron_schedule == "15 2 * * *"
    with pytest.raises(ValueError, match="GNNFLOW_RETRAIN_CRON='every day'"):
        make_retrain_schedule(retrain_job, "every day")


def _labelled(home, name):
    folder = home / name / "canonical_graph"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"format_version": 1, "has_labels": True, "train_nodes": 5}))


def _tick(schedule, instance, storage, when):
    with dg.build_schedule_context(
        instance=instance, resources={"storage": storage}, scheduled_execution_time=when
    ) as ctx:
        return {r.partition_key: r for r in schedule(ctx)}


def test_each_retrain_samples_with_a_fresh_seed_unless_pinned(tmp_path):
    home, landing = tmp_path / "home", tmp_path / "landing"
    storage = GnnflowStorage(home=str(home), landing=str(landing))
    for name in ("free", "pinned"):
        _labelled(home, name)
    (landing / "pinned").mkdir(parents=True)
    (landing / "pinned" / "gnnflow.yaml").write_text("ops: {minibatch_shards: {config: {seed: 17}}}\n")
    schedule = make_retrain_schedule(retrain_job)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(dataset_partitions.name, ["free", "pinned"])
        week1 = _tick(schedule, instance, storage, datetime.datetime(2026, 1, 4, 3))
        week2 = _tick(schedule, instance, storage, datetime.datetime(2026, 1, 11, 3))
        again = _tick(schedule, instance, storage, datetime.datetime(2026, 1, 4, 3))

    s1 = explicit_run_config(week1["free"].run_config, "minibatch_shards")["seed"]
    s2 = explicit_run_config(week2["free"].run_config, "minibatch_shards")["seed"]
    assert s1 != s2  # new samples each retrain
    assert week1["free"].tags[SEED_TAG] == str(s1) and week1["free"].tags["gnnflow/seed_source"] == "fresh"
    assert explicit_run_config(again["free"].run_config, "minibatch_shards")["seed"] == s1  # same tick, same run
    assert week1["free"].run_key != week2["free"].run_key

    for week in (week1, week2):  # the pinned dataset: no run config, its file's seed applies
        req = week["pinned"]
        assert explicit_run_config(req.run_config, "minibatch_shards") == {}
        assert req.tags[SEED_TAG] == "17" and req.tags["gnnflow/seed_source"] == "pinned"
        cfg, prov = resolve(MinibatchShardsConfig, "minibatch_shards", {}, {"seed": 17}, tmp_path / "f.yaml")
        assert cfg.seed == 17 and prov["from_file"] == ["seed"]

    # the fresh seed reaches minibatch_shards' effective config (run config beats the default 0)
    cfg, prov = resolve(
        MinibatchShardsConfig,
        "minibatch_shards",
        explicit_run_config(week2["free"].run_config, "minibatch_shards"),
        {},
        tmp_path / "f.yaml",
    )
    assert cfg.seed == s2 != MinibatchShardsConfig().seed and prov["from_run_config"] == ["seed"]
