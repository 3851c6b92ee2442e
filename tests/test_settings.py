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
import yaml

from assets.canonical_graph import CanonicalGraphConfig, canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from assets.minibatch_shards import MinibatchShardsConfig
from assets.settings import (
    SettingsError,
    explicit_run_config,
    moved_keys,
    read_settings_file,
    read_task,
    registered_configs,
    resolve,
)
from assets.trained_model import TrainedModelConfig
from graphs.infra import config_checks
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
        ("ops: {nosuch: {config: {}}}\n", "key 'ops.nosuch': no asset with settings has this name"),
        ("ops: {canonical_graph: {config: {symetrize: false}}}\n", "key 'ops.canonical_graph.config.symetrize'"),
        ("ops: {trained_model: {config: {model: {hiden: 3}}}}\n", "key 'ops.trained_model.config.model.hiden'"),
        ("ops: {canonical_graph: {config: {}, extra: 1}}\n", "must hold only a 'config' mapping"),
        (
            "ops: {minibatch_shards: {config: {saint_coverage: 5}}}\n",
            "key 'ops.minibatch_shards.config.saint_coverage' is now "
            "'ops.minibatch_shards.config.samplers.saint.coverage'",
        ),
        (
            "ops: {minibatch_shards: {config: {samplers: {saint: {size: 5}}}}}\n",
            "key 'ops.minibatch_shards.config.samplers.saint.size' is not a setting of minibatch_shards",
        ),
        ("ops: [1\n", "not valid YAML"),
        (
            "ops:\n  trained_model:\n    config:\n      model: {hiden: 3}\n      model: {hidden: 8}\n",
            "line 5: key 'model' is written twice in one mapping",
        ),
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


# ----------------------------------------------------------------------------- hostile settings files

# the "billion laughs": 9^9 strings in about 350 bytes, as the value of a key whose invalid value
# is shown in the error message
BILLION_LAUGHS = 'task:\n  - &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"  - &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


def test_alias_bomb_is_refused_at_once_naming_the_file_and_line(tmp_path, storage):
    folder = _landing(tmp_path)
    path = _write(folder, BILLION_LAUGHS)
    assert path.stat().st_size < 500
    constructed = []  # refused while composing the nodes: no object (nor any alias's expansion) is built
    original = config_checks._SettingsLoader.construct_document
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            config_checks._SettingsLoader,
            "construct_document",
            lambda self, node: constructed.append(node) or original(self, node),
        )
        with pytest.raises(SettingsError) as err:
            read_settings_file(path, registered_configs())
        assert constructed == []
        assert str(err.value) == (
            f"{path}: line 2: YAML anchor &a: anchors and aliases are not allowed in a settings file; "
            "write each value out"
        )
        # the landing sensor's tick reads the same file: it requests the run (which then fails naming the
        # file) without constructing the document either
        (folder / "_SUCCESS").touch()
        later = time.time() + 5
        os.utime(folder / "_SUCCESS", (later, later))
        with dg.instance_for_test() as instance:
            result = make_landing_sensor(ALL_ASSETS)(
                dg.build_sensor_context(instance=instance, resources={"storage": storage})
            )
        assert constructed == []
    assert [r.partition_key for r in result.run_requests] == ["tiny"]
    with pytest.raises(dg.Failure, match=r"line 2: YAML anchor &a"):
        storage.task("tiny")


def test_an_alias_without_anchor_text_and_deep_nesting_are_refused(tmp_path):
    path = _write(_landing(tmp_path), "ops:\n  canonical_graph:\n    config: {symmetrize: *x}\n")
    with pytest.raises(SettingsError, match=r"gnnflow.yaml: line 3: YAML alias \*x"):
        read_settings_file(path, registered_configs())
    path = _write(_landing(tmp_path), "ops: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(SettingsError, match=r"gnnflow.yaml: line 1: nested more than 32 levels deep"):
        read_settings_file(path, registered_configs())


@pytest.mark.parametrize(
    "text, says",
    [
        ("task: " + "z" * 100_000 + "\n", "key 'task': 'zzzz"),
        ("ops: {canonical_graph: {config: {" + "k" * 1000 + ": 1}}}\n", "key 'ops.canonical_graph.config.kkkk"),
        ("ops: {" + "n" * 1000 + ": {config: {}}}\n", "key 'ops.nnnn"),
        ("t" * 1000 + ": 1\n", "key 'tttt"),
    ],
)
def test_long_keys_and_values_are_cut_in_messages(tmp_path, text, says):
    path = _write(_landing(tmp_path), text)
    with pytest.raises(SettingsError) as err:
        read_settings_file(path, registered_configs())
    message = str(err.value)
    assert says in message and "..." in message
    assert says[-1] * 100 not in message and len(message) < len(str(path)) + 400


def test_a_long_value_is_cut_in_the_message(tmp_path):
    path = _write(_landing(tmp_path), "ops: {canonical_graph: {config: {memory_limit: " + "9" * 100_000 + "GB}}}\n")
    blocks = read_settings_file(path, registered_configs())
    with pytest.raises(SettingsError) as err:
        resolve(CanonicalGraphConfig, "canonical_graph", {}, blocks["canonical_graph"], path)
    message = str(err.value)
    assert "key 'ops.canonical_graph.config.memory_limit': String should have at most 4096 characters" in message
    assert "(got '99999999" in message and "..." in message and "9" * 100 not in message
    assert len(message) < len(str(path)) + 300


HOSTILE_NUMBERS = [  # (asset, YAML config block, what the message says after the file name)
    (
        "canonical_graph",
        "{threads: 1000000000000000000}",
        "key 'ops.canonical_graph.config.threads': Input should be "
        "less than or equal to 4096 (got 1000000000000000000)",
    ),
    (
        "canonical_graph",
        "{threads: 1e18}",
        "key 'ops.canonical_graph.config.threads': Input should be a valid integer "
        "(got '1e18'); write an integer as digits, e.g. 1000000 (YAML reads 1e6 as text)",
    ),
    (
        "canonical_graph",
        "{split_seed: true}",
        "key 'ops.canonical_graph.config.split_seed': Input should be a valid integer (got True)",
    ),
    (
        "canonical_graph",
        "{train_fraction: .nan}",
        "key 'ops.canonical_graph.config.train_fraction': Input should be a finite number (got nan)",
    ),
    (
        "normalized_adjacency",
        "{self_loop_weight: .inf}",
        "key 'ops.normalized_adjacency.config.self_loop_weight': Input should be a finite number (got inf)",
    ),
    (
        "normalized_adjacency",
        "{power_iterations: 1000000000}",
        "power_iterations': Input should be less than or equal to 100000",
    ),
    (
        "metis_partitions",
        "{num_parts: 1000000000000000000}",
        "key 'ops.metis_partitions.config.num_parts': Input should be less than or equal to 1048576",
    ),
    (
        "compressed_graph",
        "{bloom_fpr: .nan}",
        "key 'ops.compressed_graph.config.bloom_fpr': Input should be a finite number",
    ),
    (
        "compressed_graph",
        "{fpr_queries: 1000000000000}",
        "fpr_queries': Input should be less than or equal to 268435456",
    ),
    (
        "edge_split",
        "{val_fraction: -.inf}",
        "key 'ops.edge_split.config.val_fraction': Input should be a finite number",
    ),
    (
        "edge_split",
        "{eval_negatives: 1000000000000}",
        "eval_negatives': Input should be less than or equal to 16777216",
    ),
    ("promotion", "{margin: .nan}", "key 'ops.promotion.config.margin': Input should be a finite number"),
    (
        "minibatch_shards",
        "{epochs: 1000000000000000000}",
        "key 'ops.minibatch_shards.config.epochs': Input should be less than or equal to 10000",
    ),
    (
        "minibatch_shards",
        "{samplers: {saint: {coverage: .nan}}}",
        "key 'ops.minibatch_shards.config.samplers.saint.coverage': Input should be a finite number",
    ),
    (
        "minibatch_shards",
        "{samplers: {saint: {coverage: 1.0e+18}}}",
        "samplers.saint.coverage': Input should be less than or equal to 1000",
    ),
    ("minibatch_shards", "{workers: 100000}", "workers': Input should be less than or equal to 4096"),
    (
        "minibatch_shards",
        "{fanouts: '10,1000000000'}",
        "ops.minibatch_shards.config: fanouts='10,1000000000': need 1 to 1024 layers, each -1 (all) or in [1, 1048576]",
    ),
    (
        "trained_model",
        "{training: {optimizer: {lr: .nan}}}",
        "key 'ops.trained_model.config.training.optimizer.lr': Input should be a finite number (got nan)",
    ),
    (
        "trained_model",
        "{training: {optimizer: {weight_decay: .inf}}}",
        "training.optimizer.weight_decay': Input should be a finite number",
    ),
    (
        "trained_model",
        "{training: {optimizer: {betas: [0.9, .nan]}}}",
        "ops.trained_model.config: training.optimizer.betas[1]=nan: must be a finite number",
    ),
    (
        "trained_model",
        "{training: {gradient_clipping: .nan}}",
        "training.gradient_clipping': Input should be a finite number",
    ),
    (
        "trained_model",
        "{training: {lr_schedule: {warmup_epochs: .nan}}}",
        "training.lr_schedule.warmup_epochs': Input should be a finite number",
    ),
    (
        "trained_model",
        "{training: {epochs: 1000000000000}}",
        "key 'ops.trained_model.config.training.epochs': Input should be less than or equal to 100000",
    ),
    (
        "trained_model",
        "{training: {comm: {bucket_cap_mb: .inf}}}",
        "training.comm.bucket_cap_mb': Input should be a finite number",
    ),
    (
        "trained_model",
        "{training: {compensation: {grad_ema: .nan}}}",
        "training.compensation.grad_ema': Input should be a finite number",
    ),
    (
        "trained_model",
        "{model: {hidden: 100000000000}}",
        "key 'ops.trained_model.config.model.hidden': Input should be less than or equal to 1048576",
    ),
    ("trained_model", "{model: {dropout: .nan}}", "model.dropout': Input should be a finite number"),
    ("trained_model", "{training: {optimizer: {lr: .nan}}}", "training.optimizer.lr': Input should be a finite number"),
    ("trained_model", "{training: {epochs: 1000000000000}}", "epochs': Input should be less than or equal to 100000"),
    (
        "trained_model",
        "{graph: {eval_graphs_per_batch: 1000000000000}}",
        "key 'ops.trained_model.config.graph.eval_graphs_per_batch': Input should be less than or equal to 16777216",
    ),
]


@pytest.mark.parametrize("asset, block, says", HOSTILE_NUMBERS)
def test_non_finite_numbers_and_huge_counts_are_refused_naming_the_setting(tmp_path, asset, block, says):
    path = _write(_landing(tmp_path), f"ops:\n  {asset}:\n    config: {block}\n")
    blocks = read_settings_file(path, registered_configs())
    with pytest.raises(SettingsError) as err:
        resolve(registered_configs()[asset], asset, {}, blocks[asset], path)
    assert str(err.value).startswith(f"{path}: ")
    assert says in str(err.value)


def test_the_launchpad_refuses_a_huge_count_before_the_stage_runs(tmp_path, storage):
    _landing(tmp_path)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["tiny"])
    result = dg.materialize(
        [canonical_graph],
        partition_key="tiny",
        instance=instance,
        resources={"storage": storage},
        run_config={"ops": {"canonical_graph": {"config": {"threads": 10**18}}}},
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    message = str(failure.step_failure_data.error.cause or failure.step_failure_data.error)
    assert "threads" in message and "less than or equal to 4096" in message
    assert not (tmp_path / "home" / "tiny" / "canonical_graph").exists()


def test_the_link_block_is_validated_with_the_other_training_settings(tmp_path):
    path = _write(_landing(tmp_path), "ops: {trained_model: {config: {link: {scorer: cosine}}}}\n")
    blocks = read_settings_file(path, registered_configs())
    with pytest.raises(SettingsError) as err:
        resolve(TrainedModelConfig, "trained_model", {}, blocks["trained_model"], path)
    assert str(err.value).startswith(f"{path}: ops.trained_model.config: ") and "link.scorer='cosine'" in str(err.value)


@pytest.mark.parametrize(
    "block, now",
    [
        (
            "{link: {lr: 0.01}}",
            "'ops.trained_model.config.link.lr' is now 'ops.trained_model.config.training.optimizer.lr'",
        ),
        ("{link: {min_steps: 64}}", "link.min_steps' is now 'ops.trained_model.config.training.min_steps'"),
        (
            "{graph: {hidden: 32}}",
            "'ops.trained_model.config.graph.hidden' is now 'ops.trained_model.config.model.hidden'",
        ),
        ("{graph: {epochs: 5}}", "graph.epochs' is now 'ops.trained_model.config.training.epochs'"),
    ],
)
def test_a_task_setting_of_the_shared_blocks_is_refused_in_its_old_place_naming_the_new(tmp_path, block, now):
    """lr, epochs, early stopping, seed and the graph model's layers are set in the training and
    model blocks for every task; the link and graph blocks' old keys say where they went, in a
    dataset's gnnflow.yaml and in a run config file."""
    path = _write(_landing(tmp_path), f"ops: {{trained_model: {{config: {block}}}}}\n")
    with pytest.raises(SettingsError) as err:
        read_settings_file(path, registered_configs())
    assert now in str(err.value)
    assert any(now in m for m in moved_keys(yaml.safe_load(f"ops: {{trained_model: {{config: {block}}}}}")))


def test_a_settings_file_linked_out_of_landing_or_dangling_is_refused_unread(tmp_path):
    """gnnflow.yaml passes the landing folder's symlink rule before it is opened: a link to a
    file outside landing (whose text an error message would otherwise show) is refused by name."""
    secret = tmp_path / "secret.txt"
    secret.write_text("aws_secret_access_key: AKIAEXAMPLE\n")
    folder = _landing(tmp_path)
    (folder / "gnnflow.yaml").symlink_to(secret)
    for read in (lambda p: read_settings_file(p, registered_configs()), read_task):
        with pytest.raises(SettingsError) as err:
            read(folder / "gnnflow.yaml")
        assert str(err.value).startswith(f"{folder / 'gnnflow.yaml'}: resolves to {secret}, outside the landing")
        assert "AKIAEXAMPLE" not in str(err.value)
    (folder / "gnnflow.yaml").unlink()
    (folder / "gnnflow.yaml").symlink_to(tmp_path / "missing.yaml")
    with pytest.raises(SettingsError, match="a symlink whose target does not exist"):
        read_task(folder / "gnnflow.yaml")
    (folder / "gnnflow.yaml").unlink()
    (tmp_path / "landing" / "shared.yaml").write_text("task: link_prediction\n")
    (folder / "gnnflow.yaml").symlink_to(tmp_path / "landing" / "shared.yaml")  # inside landing: followed
    assert read_task(folder / "gnnflow.yaml") == "link_prediction"


def test_a_run_config_with_a_setting_of_an_older_shape_is_refused_naming_its_new_place(tmp_path):
    """gnnflow launch -c: the moved key named with its new path, before Dagster calls it unexpected."""
    from pipelines.launch_cli import LaunchError, _run_config

    run = tmp_path / "run.yaml"
    run.write_text("ops:\n  minibatch_shards:\n    config: {sampler: saint, saint_coverage: 5, cluster_batch: 4}\n")
    with pytest.raises(LaunchError) as err:
        _run_config([str(run)], verbose=False)
    assert str(err.value) == (
        f"-c {run}: 'ops.minibatch_shards.config.saint_coverage' is now "
        "'ops.minibatch_shards.config.samplers.saint.coverage'; 'ops.minibatch_shards.config.cluster_batch' is now "
        "'ops.minibatch_shards.config.samplers.cluster_gcn.clusters'"
    )
    run.write_text("ops:\n  minibatch_shards:\n    config: {sampler: saint, samplers: {saint: {coverage: 5}}}\n")
    assert _run_config([str(run)], verbose=False)["ops"]["minibatch_shards"]["config"]["samplers"] == {
        "saint": {"coverage": 5}
    }
