"""Per-dataset settings (landing/<dataset>/gnnflow.yaml): validation naming file and key,
precedence explicit run config > file > defaults, the effective config in the metadata, and
runs requested by the landing sensor and the retraining schedule reading the file."""

import datetime
import os
import time

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.canonical_graph import CanonicalGraphConfig, canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from assets.minibatch_shards import MinibatchShardsConfig
from assets.settings import SettingsError, explicit_run_config, read_settings_file, registered_configs, resolve
from assets.trained_model import TrainedModelConfig
from pipelines.definitions import ALL_ASSETS, train_job
from pipelines.schedules import make_retrain_schedule
from pipelines.sensors import make_landing_sensor
from tests.conftest import write_edges


@pytest.fixture
def storage(tmp_path) -> GnnflowStorage:
    return GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))


def _landing(tmp_path, name="tiny"):
    """A directed 4-cycle with labels (so the schedule counts it as labelled)."""
    folder = tmp_path / "landing" / name
    write_edges(folder / "edges.parquet", [0, 1, 2, 3], [1, 2, 3, 0], pa.int64())
    pq.write_table(
        pa.table({"node_id": pa.array([0, 1, 2, 3], pa.int64()), "label": [0, 1, 0, 1]}), folder / "nodes.parquet"
    )
    return folder


def _write(folder, text):
    (folder / "gnnflow.yaml").write_text(text)
    return folder / "gnnflow.yaml"


def _edges(tmp_path, name="tiny") -> int:
    return pq.read_metadata(tmp_path / "home" / name / "canonical_graph" / "edges.parquet").num_rows


@pytest.mark.parametrize(
    "text, says",
    [
        ("- a list\n", "expected a mapping"),
        ("resources: {}\n", "key 'resources' is not allowed"),
        ("ops: {nosuch: {config: {}}}\n", "key 'ops.nosuch': no asset with settings is named 'nosuch'"),
        ("ops: {canonical_graph: {config: {symetrize: false}}}\n", "key 'ops.canonical_graph.config.symetrize'"),
        ("ops: {trained_model: {config: {model: {hiden: 3}}}}\n", "key 'ops.trained_model.config.model.hiden'"),
        ("ops: {canonical_graph: {config: {}, extra: 1}}\n", "must hold only a 'config' mapping"),
        ("ops: [1\n", "not valid YAML"),
    ],
)
def test_settings_file_shape_errors_name_file_and_key(tmp_path, text, says):
    path = _write(_landing(tmp_path), text)
    with pytest.raises(SettingsError) as err:
        read_settings_file(path, registered_configs())
    assert str(path) in str(err.value) and says in str(err.value)


def test_settings_values_are_validated_like_run_config(tmp_path):
    path = tmp_path / "gnnflow.yaml"
    with pytest.raises(SettingsError, match=r"gnnflow.yaml: key 'ops.canonical_graph.config.batch_rows'.*'many'"):
        resolve(CanonicalGraphConfig, "canonical_graph", {}, {"batch_rows": "many"}, path)
    # the dataclass's own check (__post_init__) fires on a file value too, naming the file
    with pytest.raises(SettingsError, match=r"gnnflow.yaml: ops.canonical_graph.config:.*weight_combine"):
        resolve(CanonicalGraphConfig, "canonical_graph", {}, {"weight_combine": "bogus"}, path)
    with pytest.raises(SettingsError, match=r"ops.minibatch_shards.config.*seed"):
        resolve(MinibatchShardsConfig, "minibatch_shards", {}, {"seed": -1}, path)


def test_precedence_explicit_then_file_then_defaults(tmp_path):
    path = tmp_path / "gnnflow.yaml"
    file_block = {"model": {"hidden": 7}, "training": {"epochs": 3}}
    cfg, prov = resolve(TrainedModelConfig, "trained_model", {"training": {"epochs": 5}}, file_block, path)
    default = TrainedModelConfig()
    assert cfg.training.epochs == 5  # explicit beats the file
    assert cfg.model.hidden == 7  # the file beats the default
    assert (
        cfg.model.conv == default.model.conv and cfg.training.optimizer.lr == default.training.optimizer.lr
    )  # defaults otherwise
    assert prov == {"settings_file": str(path), "from_file": ["model.hidden"], "from_run_config": ["training.epochs"]}
    assert default.model.hidden != 7 and default.training.epochs not in (3, 5)


def test_asset_reads_the_file_at_run_time_and_records_the_effective_config(tmp_path, storage):
    folder = _landing(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["tiny"])

    def run(run_config=None):
        result = dg.materialize(
            [canonical_graph],
            partition_key="tiny",
            instance=instance,
            resources={"storage": storage},
            run_config=run_config or {},
        )
        assert result.success
        return result.asset_materializations_for_node("canonical_graph")[0].metadata

    md = run()  # no file: defaults (symmetrized)
    assert _edges(tmp_path) == 8 and md["config"].value["symmetrize"] is True
    assert md["config_sources"].value == {"settings_file": None, "from_file": [], "from_run_config": []}

    path = _write(folder, "ops:\n  canonical_graph:\n    config: {symmetrize: false, split_seed: 4}\n")
    md = run()
    assert _edges(tmp_path) == 4 and md["config"].value["symmetrize"] is False
    assert md["config"].value["split_seed"] == 4
    assert md["config_sources"].value["from_file"] == ["split_seed", "symmetrize"]
    assert md["config_sources"].value["settings_file"] == str(path)

    md = run({"ops": {"canonical_graph": {"config": {"symmetrize": True}}}})  # explicit wins
    assert _edges(tmp_path) == 8 and md["config"].value["symmetrize"] is True
    assert md["config_sources"].value["from_file"] == ["split_seed"]
    assert md["config_sources"].value["from_run_config"] == ["symmetrize"]


def test_bad_settings_file_fails_the_run_naming_file_and_key(tmp_path, storage):
    path = _write(_landing(tmp_path), "ops: {canonical_graph: {config: {symmetrize: perhaps}}}\n")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["tiny"])
    result = dg.materialize(
        [canonical_graph], partition_key="tiny", instance=instance, resources={"storage": storage}, raise_on_error=False
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = failure.step_failure_data.error.message
    assert str(path) in message and "ops.canonical_graph.config.symmetrize" in message


def test_sensor_and_schedule_requested_runs_use_the_file(tmp_path, storage):
    folder = _landing(tmp_path)
    _write(folder, "ops:\n  canonical_graph:\n    config: {symmetrize: false}\n")
    marker = folder / "_SUCCESS"  # the copy is complete: the sensor requests at its first tick
    marker.touch()
    later = time.time() + 5
    os.utime(marker, (later, later))
    with dg.instance_for_test() as instance:
        _sensor_then_schedule(tmp_path, storage, folder, instance)


def _sensor_then_schedule(tmp_path, storage, folder, instance):
    sensor = make_landing_sensor(ALL_ASSETS)
    result = sensor(dg.build_sensor_context(instance=instance, resources={"storage": storage}))
    instance.add_dynamic_partitions(dataset_partitions.name, ["tiny"])
    (req,) = result.run_requests
    assert explicit_run_config(req.run_config, "canonical_graph") == {}  # the request carries no settings
    done = dg.materialize(
        [canonical_graph],
        partition_key=req.partition_key,
        run_config=req.run_config,
        tags=req.tags,
        instance=instance,
        resources={"storage": storage},
    )
    assert done.success and _edges(tmp_path) == 4  # the file's symmetrize: false

    # the setting changes in the file; the schedule's next request reads the new value
    _write(
        folder,
        "ops:\n  canonical_graph:\n    config: {symmetrize: true}\n"
        "  trained_model:\n    config:\n      training: {epochs: 2}\n",
    )
    schedule = make_retrain_schedule(train_job)
    tick = datetime.datetime(2026, 1, 4, 3, tzinfo=datetime.timezone.utc)
    requests = schedule(
        dg.build_schedule_context(instance=instance, resources={"storage": storage}, scheduled_execution_time=tick)
    )
    (req,) = requests
    assert req.partition_key == "tiny"
    assert explicit_run_config(req.run_config, "canonical_graph") == {}
    blocks = read_settings_file(storage.settings_file("tiny"), registered_configs())
    cfg, prov = resolve(
        TrainedModelConfig,
        "trained_model",
        explicit_run_config(req.run_config, "trained_model"),
        blocks["trained_model"],
        storage.settings_file("tiny"),
    )
    assert cfg.training.epochs == 2 and prov["from_file"] == ["training.epochs"]
    done = dg.materialize(  # the request's config minus its minibatch_shards seed (not in this one-asset job)
        [canonical_graph],
        partition_key=req.partition_key,
        run_config={"ops": {k: v for k, v in (req.run_config.get("ops") or {}).items() if k == "canonical_graph"}},
        tags=req.tags,
        instance=instance,
        resources={"storage": storage},
    )
    assert done.success and _edges(tmp_path) == 8  # the changed file's symmetrize: true
