"""Tasks (a dataset's gnnflow.yaml ``task:``) are registered classes whose declared traits the
stages read: a task registered from this module alone changes what the sensor selects and which
graph message passing sees, and the registry refuses a task that declares no traits."""

import os

import dagster as dg
import pytest

from assets.settings import SettingsError, read_task
from assets.task_registry import DEFAULT_TASK, Task, TaskTraits, register_task, task_class, task_names, task_settings
from assets.tasks.node_classification import NodeClassification
from graphs.stages.canonical import READY_MARKER
from pipelines.definitions import ALL_ASSETS
from pipelines.sensors import make_landing_sensor, split_by_labels
from tests.conftest import write_edges


@register_task
class TrainsWithoutLabels(NodeClassification):
    """A toy task: node classification's stages, declared to need no node labels and to hold out edges."""

    name = "toy_without_labels"
    traits = TaskTraits(holds_out_edges=True, needs_labels=False, seeds="nodes", not_promoted="toy: not promoted")


def test_the_built_in_tasks_declare_their_traits():
    assert {"node_classification", "link_prediction"} <= set(task_names())
    assert DEFAULT_TASK == "node_classification"
    nc, lp = task_class("node_classification").traits, task_class("link_prediction").traits
    assert (nc.holds_out_edges, nc.needs_labels, nc.seeds, nc.not_promoted, nc.no_node_predictions) == (
        False,
        True,
        "nodes",
        None,
        None,
    )
    assert (lp.holds_out_edges, lp.needs_labels, lp.seeds) == (True, False, "edges")
    assert "promotion" in lp.not_promoted and "score-pairs" in lp.no_node_predictions
    gp = task_class("graph_property").traits
    assert (gp.graph_level, gp.seeds, nc.graph_level, lp.graph_level) == (True, "graphs", False, False)


def test_registration_refuses_a_task_without_traits_or_of_another_kind():
    class NoTraits(Task):
        name = "toy_no_traits"

    with pytest.raises(TypeError, match="declares no TaskTraits"):
        register_task(NoTraits)
    with pytest.raises(TypeError, match="is not a Task subclass"):
        register_task(type("NotATask", (), {"name": "toy_not_a_task"}))
    with pytest.raises(ValueError, match="seeds='molecules' is not one of"):
        TaskTraits(holds_out_edges=False, needs_labels=True, seeds="molecules")
    with pytest.raises(ValueError, match="task='nope' is not one of"):
        task_class("nope")


def test_a_settings_file_names_a_registered_task_only(tmp_path):
    path = tmp_path / "gnnflow.yaml"
    path.write_text("task: toy_without_labels\n")
    assert read_task(path) == "toy_without_labels"
    path.write_text("task: graph_regression\n")
    with pytest.raises(SettingsError, match="'graph_regression' is not one of .*toy_without_labels"):
        read_task(path)


def test_message_passing_reads_the_graph_the_task_declares(tmp_path, storage):
    for stage in ("canonical_graph", "edge_split"):
        (tmp_path / "home" / "ds" / stage).mkdir(parents=True)
        (tmp_path / "home" / "ds" / stage / "summary.json").write_text("{}")
    landing = tmp_path / "landing" / "ds"
    landing.mkdir(parents=True)
    assert storage.graph_dir("ds").name == "canonical_graph"
    (landing / "gnnflow.yaml").write_text("task: toy_without_labels\n")
    assert storage.task("ds") is TrainsWithoutLabels
    assert storage.graph_dir("ds").name == "edge_split"


@pytest.mark.parametrize("task", [None, "toy_without_labels"])
def test_the_sensor_selects_the_label_stages_by_the_tasks_needs_labels(tmp_path, storage, instance, task):
    landing = tmp_path / "landing" / "ds"
    edges = write_edges(landing / "edges.parquet", [1, 2], [2, 3])  # no labels anywhere
    if task is not None:
        (landing / "gnnflow.yaml").write_text(f"task: {task}\n")
    (landing / READY_MARKER).write_text("")
    os.utime(landing / READY_MARKER, ns=(edges.stat().st_mtime_ns + 1, edges.stat().st_mtime_ns + 1))
    tick = make_landing_sensor(ALL_ASSETS)(dg.build_sensor_context(instance=instance, resources={"storage": storage}))
    [request] = tick.run_requests
    every, needs_labels = split_by_labels(ALL_ASSETS)
    selected = set(request.asset_selection)
    assert needs_labels and set(needs_labels) <= set(every)
    if task is None:  # node classification without labels: ingest and prepare only
        assert selected == set(every) - set(needs_labels)
    else:
        assert selected == set(every)


def _trained_model_config(block: dict):
    from assets.trained_model import TrainedModelConfig

    return TrainedModelConfig(**block)


def test_every_task_reads_the_one_training_block_with_its_own_defaults_where_it_is_unset():
    """A key the run config or gnnflow.yaml sets wins; where it is unset, the task's own default
    applies (link prediction: Adam at 1e-3, patience 5; graph property: GIN of width 64); node
    classification keeps the shared defaults. A key the task does not read is reported."""
    from training.config import TrainingConfig
    from training.layers import ModelConfig

    config = _trained_model_config({"training": {"early_stopping_patience": 7, "precision": "bf16"}})
    link = task_settings(task_class("link_prediction"), config)
    assert link.blocks["training"].early_stopping_patience == 7  # set: the user's
    assert (link.blocks["training"].optimizer.type, link.blocks["training"].optimizer.lr) == ("Adam", 1e-3)
    assert link.blocks["training"].min_steps == 1000 and link.blocks["model"] == ModelConfig()
    assert "training.early_stopping_patience" not in link.own_defaults
    assert link.ignored == ["training.precision"]  # link prediction trains in fp32
    node = task_settings(task_class("node_classification"), config)
    shared = TrainingConfig(early_stopping_patience=7, precision="bf16")
    assert node.blocks["training"] == shared and node.own_defaults == {} and node.ignored == []

    config = _trained_model_config({"model": {"conv": "gat", "residual": True}, "graph": {"readout": "sum"}})
    graph = task_settings(task_class("graph_property"), config)
    model = graph.blocks["model"]
    assert (model.conv, model.hidden, model.heads, model.num_layers) == ("gat", 64, 1, 3)
    assert graph.blocks["graph"].readout == "sum" and graph.blocks["training"].epochs == 100
    assert graph.ignored == ["model.residual"]
    assert task_settings(task_class("node_classification"), config).ignored == ["graph.readout"]
