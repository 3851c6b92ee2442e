"""Every stage's config dataclass refuses non-finite floats and counts above their declared bound,
naming the setting (graphs/infra/config_checks.py); the run YAML read by torchrun is parsed without
anchors or aliases; error messages cut long values."""

import dataclasses
import math
import subprocess
import sys
import typing

import pytest

from assets.canonical_graph import CanonicalGraphConfig
from assets.minibatch_shards import MinibatchShardsConfig
from graphs.infra import config_checks
from graphs.infra.config_checks import (
    MAX_REPR,
    RunConfigShapeError,
    asset_config_block,
    bounded_repr,
    dump_yaml,
    load_yaml,
)
from graphs.sampling.config import LinkShardSettings, ShardConfig, sampler_settings_classes
from graphs.stages.canonical import CanonicalConfig
from graphs.stages.compress import CompressConfig
from graphs.stages.edge_split import EdgeSplitConfig
from graphs.stages.normalize import AdjacencyConfig
from graphs.stages.partition import PartitionConfig
from graphs.synthetic.generate import GenerateConfig
from training.comm_hooks import CommConfig
from training.compensation import CompensationConfig
from training.config import LRScheduleConfig, OptimizerConfig, PathsConfig, RunConfig, TrainingConfig
from training.distdgl_config import DistDGLConfig
from training.graph_train import GraphConfig
from training.layers import ModelConfig
from training.link import LinkConfig
from training.promotion import PromotionConfig

PATHS = {"shards": "s", "out": "o"}
# config class -> (the arguments it needs, the prefix its errors give a field)
CONFIGS = {
    AdjacencyConfig: ({}, ""),
    PartitionConfig: ({}, ""),
    CanonicalConfig: ({}, ""),
    CompressConfig: ({}, ""),
    EdgeSplitConfig: ({}, ""),
    GenerateConfig: ({}, "GenerateConfig."),
    ShardConfig: ({}, ""),
    LinkShardSettings: ({}, "link."),
    PromotionConfig: ({}, ""),
    LinkConfig: ({}, "link."),
    GraphConfig: ({}, "graph."),
    ModelConfig: ({}, "model."),
    OptimizerConfig: ({}, "training.optimizer."),
    LRScheduleConfig: ({}, "training.lr_schedule."),
    TrainingConfig: ({}, "training."),
    CommConfig: ({}, "training.comm."),
    CompensationConfig: ({}, "training.compensation."),
    PathsConfig: (PATHS, "paths."),
    DistDGLConfig: ({"ip_config": "ip.txt", "part_config": "missing.json"}, "distdgl."),
}
# every registered sampler's own settings (graphs/sampling/kinds/), checked the same way
CONFIGS.update({cls: ({}, f"samplers.{name}.") for name, cls in sampler_settings_classes().items()})


def _fields(kind):
    for cls, (args, prefix) in CONFIGS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] is kind:
                yield pytest.param(cls, args, prefix, f, id=f"{cls.__name__}.{f.name}")


@pytest.mark.parametrize("cls, args, prefix, f", list(_fields(int)))
def test_every_count_declares_a_bound_and_refuses_more_naming_it(cls, args, prefix, f):
    bound = f.metadata.get("max")
    assert isinstance(bound, int) and bound >= (f.default if isinstance(f.default, int) else 1), f.name
    with pytest.raises(ValueError, match=rf"^{prefix}{f.name}={bound + 1}: must be at most {bound}$"):
        cls(**args, **{f.name: bound + 1})
    with pytest.raises(ValueError, match=rf"^{prefix}{f.name}=True: must be an integer$"):
        cls(**args, **{f.name: True})


@pytest.mark.parametrize("cls, args, prefix, f", list(_fields(float)))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_setting_must_be_finite(cls, args, prefix, f, value):
    with pytest.raises(ValueError, match=rf"^{prefix}{f.name}={value!r}: must be a finite number$"):
        cls(**args, **{f.name: value})


def test_bounds_become_pydantic_constraints_and_help_text():
    field = CanonicalGraphConfig.model_fields["threads"]
    assert field.description.endswith("(at most 4096)")
    assert MinibatchShardsConfig(epochs=10_000).epochs == 10_000
    for bad, key in (
        ({"epochs": 10_001}, "epochs"),
        ({"epochs": True}, "epochs"),
        ({"samplers": {"saint": {"coverage": math.nan}}}, "coverage"),
        ({"samplers": {"neighbor": {"adaptive_alpha": math.inf}}}, "adaptive_alpha"),
        ({"samplers": {"saint": {"coverage": 1001.0}}}, "less than or equal to 1000"),
    ):
        with pytest.raises(Exception, match=key):
            MinibatchShardsConfig(**bad)
    with pytest.raises(Exception, match="at most 4096 characters"):
        CanonicalGraphConfig(memory_limit="9" * 5000)
    with pytest.raises(ValueError, match=r"^fanouts='10,1048577': need 1 to 1024 layers"):
        ShardConfig(fanouts="10,1048577")
    with pytest.raises(ValueError, match=r"^fanouts='1,1,1.*': need 1 to 1024 layers"):
        ShardConfig(fanouts=",".join(["1"] * 1025))
    assert ShardConfig(fanouts="-1,1048576").fanout_list == [-1, 1_048_576]


def test_long_values_are_cut_in_messages():
    assert bounded_repr("x" * 10_000) == repr("x" * 10_000)[:38] + "..." + repr("x" * 10_000)[-39:]
    assert len(bounded_repr([["y" * 1000] * 1000] * 1000)) <= MAX_REPR
    with pytest.raises(ValueError) as err:
        ModelConfig(conv="z" * 5000)
    assert "must be at most 4096 characters long" in str(err.value) and len(str(err.value)) < 200
    with pytest.raises(ValueError) as err:
        ModelConfig(conv="z" * 4000)  # within the length bound: the choice check's message
    assert "model.conv=" in str(err.value) and len(str(err.value)) < 200


LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{n}: &{n} [{','.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)


def test_run_yaml_with_aliases_is_refused_at_once_naming_the_file(tmp_path, monkeypatch):
    path = tmp_path / "run.yaml"
    path.write_text("paths: {shards: s, out: o}\ntraining: {optimizer: {betas: *b}}\n" + LAUGHS)
    constructed = []  # refused while composing the nodes: no object (nor any alias's expansion) is built
    original = config_checks._SettingsLoader.construct_document
    monkeypatch.setattr(
        config_checks._SettingsLoader,
        "construct_document",
        lambda self, node: constructed.append(node) or original(self, node),
    )
    with pytest.raises(ValueError, match=rf"^{path}: line 2: YAML alias \*b: anchors and aliases are not allowed"):
        RunConfig.from_yaml(path)
    assert constructed == []
    # torchrun's entry point reads the file the same way
    proc = subprocess.run(
        [sys.executable, "-m", "training", "--config", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and f"{path}: line 2: YAML alias *b" in proc.stderr


@pytest.mark.parametrize(
    "block, says",
    [
        ("training: {optimizer: {lr: .nan}}", "training.optimizer.lr=nan: must be a finite number"),
        (
            "training: {optimizer: {weight_decay: -.inf}}",
            "training.optimizer.weight_decay=-inf: must be a finite number",
        ),
        ("training: {gradient_clipping: .inf}", "training.gradient_clipping=inf: must be a finite number"),
        ("training: {lr_schedule: {warmup_epochs: .NaN}}", "training.lr_schedule.warmup_epochs=nan: must be a finite"),
        ("training: {epochs: 1e18}", "training.epochs='1e18': expected an integer, written as digits, e.g. 1000000"),
        ("training: {optimizer: {lr: 1e-3}}", "training.optimizer.lr='1e-3': expected a number, e.g. 0.001 or 1.0e-3"),
        ("training: {epochs: 1000000000000000000}", "training.epochs=1000000000000000000: must be at most 100000"),
        ("training: {dist_timeout_s: 100000000}", "training.dist_timeout_s=100000000: must be at most 2592000"),
        ("model: {hidden: 10000000000}", "model.hidden=10000000000: must be at most 1048576"),
        ("training: {comm: {bucket_cap_mb: .nan}}", "training.comm.bucket_cap_mb=nan: must be a finite number"),
    ],
)
def test_run_yaml_refuses_non_finite_and_huge_values_naming_the_setting(tmp_path, block, says):
    path = tmp_path / "run.yaml"
    path.write_text(f"paths: {{shards: s, out: o}}\n{block}\n")
    with pytest.raises((ValueError, TypeError)) as err:
        RunConfig.from_yaml(path)
    assert str(err.value) == f"{path}: {says}" or str(err.value).startswith(f"{path}: {says}")


def test_the_run_yaml_written_for_torchrun_reads_back(tmp_path):
    shared = [0.8, 0.9]
    assert dump_yaml({"a": shared, "b": shared}) == "a:\n- 0.8\n- 0.9\nb:\n- 0.8\n- 0.9\n"  # no &id001 / *id001
    cfg = RunConfig(paths=PathsConfig(**PATHS), training=TrainingConfig(optimizer=OptimizerConfig(betas=shared)))
    cfg.to_yaml(tmp_path / "run.yaml")
    assert RunConfig.from_yaml(tmp_path / "run.yaml") == cfg


def test_deep_nesting_and_huge_files_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^x.yaml: line 1: nested more than 32 levels deep$"):
        load_yaml("[" * 100_000 + "]" * 100_000, "x.yaml")
    big = tmp_path / "run.yaml"
    big.write_text("# padding\n" * 200_000)
    with pytest.raises(ValueError, match=rf"^{big}: more than the 1048576 bytes allowed for a settings file$"):
        RunConfig.from_yaml(big)


@pytest.mark.parametrize(
    "run_config,kwargs,expected",
    [
        ({"ops": {"a": {"config": {"x": 1}}}}, {}, {"x": 1}),
        ({"ops": {"a": {"config": None}}}, {}, {}),
        ({"ops": {"b": {"config": {"x": 1}}}}, {}, {}),  # no block for `a`
        ({"ops": None, "paths": {}}, {}, {}),
        ({}, {}, {}),
        ({"ops": {"a": {"config": {"x": 1}, "outputs": {}}}}, {}, {"x": 1}),  # Dagster's other op keys
        ({"ops": {"a": {"config": {"x": 1}}}}, {"needs": "{x}", "only_config": True}, {"x": 1}),
    ],
)
def test_asset_config_block_reads_the_dagster_shape(run_config, kwargs, expected):
    assert asset_config_block(run_config, "a", **kwargs) == expected


@pytest.mark.parametrize(
    "run_config,kwargs,says",
    [
        ({"ops": ["a"]}, {}, "key 'ops' must be a mapping of asset names, got list"),
        ({"ops": {"a": 3}}, {}, "key 'ops.a' must hold only a 'config' mapping"),
        ({"ops": {"a": {"config": {}, "x": 1}}}, {"only_config": True}, "key 'ops.a' must hold only a 'config'"),
        ({"ops": {"a": {"config": [1]}}}, {}, "key 'ops.a.config' must be a mapping, got list"),
        ({"ops": {"b": {}}}, {"needs": "{x, y}"}, "a Dagster run config needs ops: a: config: {x, y}"),
        ({"ops": {"a": {}}}, {"needs": "{x, y}"}, "a Dagster run config needs ops: a: config: {x, y}"),
    ],
)
def test_asset_config_block_names_the_malformed_key(run_config, kwargs, says):
    with pytest.raises(RunConfigShapeError) as exc:
        asset_config_block(run_config, "a", **kwargs)
    assert says in str(exc.value)
