"""docs/extending.md, run as written: its sampler and its layer, registered from the page alone,
cut shards of Cora and train on them; and the registries' own rules."""

import dataclasses
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from graphs.infra.config_checks import check_fields
from graphs.infra.variants import Registry
from graphs.sampling import (
    MinibatchSampler,
    SamplerTraits,
    ShardConfig,
    load_shard_inputs,
    make_sampler,
    register_sampler,
    sampler_class,
    sampler_names,
    write_minibatch_shards,
)
from graphs.sampling.base import NoSettings
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency, load_csr
from tests.conftest import datasets_folder
from training.config import RunConfig
from training.layer_registry import LayerKind, layer_names, register_layer
from training.layers import ModelConfig
from training.run_plan import check_sampler_supports
from training.train import train

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "extending.md"


def _guide_module() -> types.ModuleType:
    """The page's Python blocks, executed in order as one module (registering what they define)."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 2, "docs/extending.md should hold the sampler example and the layer example"
    module = types.ModuleType("extending_guide")
    sys.modules[module.__name__] = module
    exec(compile("\n".join(blocks), str(GUIDE), "exec"), module.__dict__)
    return module


GUIDE_MODULE = _guide_module()


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> dict:
    home = tmp_path_factory.mktemp("extending")
    build_canonical_graph(datasets_folder() / "cora", home / "canonical_graph")
    build_normalized_adjacency(home / "canonical_graph", home / "normalized_adjacency")
    return {"home": home, "inputs": load_shard_inputs(home / "canonical_graph", home / "normalized_adjacency")}


def test_the_guide_registers_its_sampler_and_layer():
    assert "full_neighbors" in sampler_names() and "sum_conv" in layer_names()
    assert ShardConfig(sampler="full_neighbors").sampler == "full_neighbors"
    assert ModelConfig(conv="sum_conv").conv == "sum_conv"


def test_the_guide_sampler_takes_every_neighbour_of_every_destination(cora):
    cfg = ShardConfig(sampler="full_neighbors", fanouts="-1,-1", batch_size=32, world_size=1)
    sampler = make_sampler(cora["inputs"], cfg)
    csr = load_csr(cora["home"] / "normalized_adjacency")
    seeds = cora["inputs"].train_nodes[:32]
    mb = sampler.sample(seeds, seed=0)
    assert mb.seeds.tolist() == seeds.tolist() and len(mb.blocks) == 2
    node_ids = mb.input_nodes
    for block in mb.blocks:
        dst = node_ids[: block.num_dst]
        for v in range(block.num_dst):  # a handful of destinations per block is enough; checked exactly
            if v % 97:
                continue
            row = slice(csr.indptr[dst[v]], csr.indptr[dst[v] + 1])
            expected = dict(zip(np.asarray(csr.indices[row]).tolist(), np.asarray(csr.weights[row]).tolist()))
            got = block.indices[block.indptr[v] : block.indptr[v + 1]]
            assert sorted(node_ids[got].tolist()) == sorted(expected)  # Â's row, self loop included
        assert np.all(block.correction == 1.0)  # nothing was drawn
    assert sampler.non_uniform_draws(cfg) is None


def test_shards_of_the_guide_sampler_train_the_guide_layer_on_cora(cora, tmp_path):
    cfg = ShardConfig(sampler="full_neighbors", fanouts="-1,-1", world_size=1, epochs=2, seed=3)
    shards = cora["home"] / "minibatch_shards"
    manifest = write_minibatch_shards(cora["inputs"], shards, cfg)
    assert manifest["sampler"] == "full_neighbors" and manifest["non_uniform_draws"] is None
    again = write_minibatch_shards(cora["inputs"], tmp_path / "again", ShardConfig(**{**vars(cfg), "workers": 2}))
    assert again["streams"] == manifest["streams"]  # the same bytes for any number of workers
    out = tmp_path / "trained_model"
    run = RunConfig.from_dict(
        {
            "model": {"conv": "sum_conv", "hidden": 64, "num_layers": 0, "dropout": 0.5},
            "training": {"epochs": 30, "profiler": "none", "optimizer": {"lr": 0.01, "weight_decay": 5e-4}},
            "paths": {"shards": str(shards), "out": str(out)},
        }
    )
    torch.manual_seed(0)
    summary = train(run)
    # chance is 1/7 and a model that ignores the graph reaches about 0.58 on this split
    assert summary["test_acc_at_best_val"] > 0.70, summary


class _Drawn(MinibatchSampler):
    name = "drawn_for_test"
    traits = SamplerTraits(seeds=True, non_uniform=True)


class _Max(LayerKind):
    name = "max_for_test"
    linear = False
    aggregates_by = "max"


def test_checks_read_the_declared_traits(tmp_path):
    register_sampler(_Drawn)
    register_layer(_Max)
    draws = _Drawn.non_uniform_draws(ShardConfig(sampler="drawn_for_test"))
    assert draws == "sampler 'drawn_for_test'"
    with pytest.raises(ValueError, match="model.conv='max_for_test' cannot be trained on shards cut with sampler "):
        check_sampler_supports("max_for_test", draws, tmp_path)
    check_sampler_supports("sum_conv", draws, tmp_path)  # linear: takes the correction
    with pytest.raises(ValueError, match="placement='partition' places seed nodes; sampler='saint'"):
        ShardConfig(sampler="saint", placement="partition")
    ShardConfig(sampler="drawn_for_test", placement="partition")  # a seed sampler


def test_registration_refuses_a_taken_name_or_missing_traits():
    class Other(MinibatchSampler):
        name = "neighbor"
        traits = SamplerTraits(seeds=True)

    with pytest.raises(ValueError, match="sampler 'neighbor' is already registered by graphs.sampling.kinds"):
        register_sampler(Other)

    class NoTraits(MinibatchSampler):
        name = "no_traits"

    with pytest.raises(TypeError, match="declares no SamplerTraits"):
        register_sampler(NoTraits)

    class Unsaid(LayerKind):
        name = "unsaid"

    with pytest.raises(TypeError, match="declares no bool `linear`"):
        register_layer(Unsaid)
    with pytest.raises(ValueError, match=r"model.conv='nope' is not one of \("):
        ModelConfig(conv="nope")
    with pytest.raises(ValueError, match=r"sampler='nope' is not one of \("):
        ShardConfig(sampler="nope")


@dataclasses.dataclass(kw_only=True)
class _WalkSettings:
    steps: int = dataclasses.field(default=3, metadata={"max": 64, "help": "walk steps"})

    def __post_init__(self):
        check_fields(self, "samplers.walk_for_test")
        if self.steps < 1:
            raise ValueError(f"samplers.walk_for_test.steps={self.steps} must be at least 1")


class _Walk(MinibatchSampler):
    name = "walk_for_test"
    traits = SamplerTraits(seeds=True)
    Settings = _WalkSettings


def test_a_samplers_own_settings_are_declared_in_its_class_and_checked_there():
    register_sampler(_Walk)
    cfg = ShardConfig(sampler="walk_for_test", samplers={"walk_for_test": {"steps": 5}})
    assert cfg.options == _WalkSettings(steps=5) and ShardConfig(sampler="walk_for_test").options.steps == 3
    assert ShardConfig().options == sampler_class("neighbor").Settings()  # the other samplers keep theirs
    with pytest.raises(ValueError, match="samplers.walk_for_test.steps=0 must be at least 1"):
        ShardConfig(samplers={"walk_for_test": {"steps": 0}})
    with pytest.raises(ValueError, match="samplers.walk_for_test.steps=65: must be at most 64"):
        ShardConfig(samplers={"walk_for_test": {"steps": 65}})
    assert ShardConfig(sampler="full_neighbors").options == NoSettings()  # the guide's sampler has none

    class Required(MinibatchSampler):
        name = "required_for_test"
        traits = SamplerTraits(seeds=True)

        @dataclasses.dataclass(kw_only=True)
        class Settings:
            steps: int

    with pytest.raises(TypeError, match=r"Settings fields \['steps'\] need defaults"):
        register_sampler(Required)


def test_a_module_that_fails_to_import_fails_every_lookup_naming_it(tmp_path, monkeypatch):
    package = tmp_path / "broken_variants"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a_good.py").write_text("X = 1\n")
    (package / "b_bad.py").write_text("raise RuntimeError('missing dependency')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("widget", "widget", "broken_variants", lambda cls: None)
    for _ in range(2):  # not marked discovered after a failure
        with pytest.raises(ImportError, match=r"widget module broken_variants.b_bad cannot be imported: missing dep"):
            registry.get("anything")
