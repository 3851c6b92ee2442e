"""Promotion that cannot go backwards on bad data: the label checks before training, the rules of
`training.promotion.decide_promotion`, retention and pins of model versions, and the issue's
scenario on Cora (a good model promoted, then a single-class nodes.parquet and a relabelled one:
the promoted model stays in both)."""

import json
import shutil

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from assets.evaluation import NOT_WORSE, evaluation, promotion
from assets.trained_model import refuse_unfit_training_labels, trained_model
from graphs.formats.label_classes import copy_label_classes
from graphs.infra.storage import atomic_output_dir
from tests.conftest import datasets_folder
from training.outputs import write_predictions
from training.promotion import (
    Evidence,
    LabelRecord,
    PromotionConfig,
    decide_promotion,
    describe_change,
    label_change,
    same_label_mask,
    total_variation,
    training_label_problem,
)

# ---------------------------------------------------------------- the rules, on hand-checked values


def test_training_label_problems_name_the_figures_and_the_setting():
    cfg = PromotionConfig()
    one = training_label_problem({3: 140}, None, None, cfg)
    assert "one class only (class 3: 140 nodes)" in one
    share = training_label_problem({0: 139, 1: 1}, None, None, cfg)
    assert "class 0 holds 139 of the 140 labelled training nodes (99.29%)" in share
    assert "max_class_share=0.99" in share
    assert training_label_problem({0: 139, 1: 1}, None, None, PromotionConfig(max_class_share=1.0)) is None
    balanced = {k: 20 for k in range(7)}
    shifted = {0: 80, **{k: 10 for k in range(1, 7)}}
    assert total_variation(shifted, balanced) == pytest.approx(60 / 140)
    moved = training_label_problem(shifted, balanced, "v1", cfg)
    assert "moved from the promoted model v1's by a total-variation distance of 0.429" in moved
    assert "max_label_shift=0.3" in moved and "class 0 14.3% -> 57.1%" in moved and "accept_label_change" in moved
    assert training_label_problem(shifted, balanced, "v1", PromotionConfig(accept_label_change=True)) is None
    assert training_label_problem(shifted, balanced, "v1", PromotionConfig(max_label_shift=0.5)) is None
    with pytest.raises(ValueError, match="max_class_share"):
        PromotionConfig(max_class_share=0.0)
    with pytest.raises(ValueError, match="keep_versions"):
        PromotionConfig(keep_versions=0)


def test_label_changes_are_found_by_user_id_and_class_value():
    before = LabelRecord(pa.array(["a", "b", "c", "d"]), np.array([0, 1, 1, 0]), ["cat", "dog"])
    # "dog" is now class 0 and "cat" class 2: the same values under other indices are no change
    same = LabelRecord(pa.array(["d", "c", "x", "a"]), np.array([2, 0, 1, 2]), ["dog", "eel", "cat"])
    change = label_change(before, same)
    assert change == {
        "compared_nodes": 3,
        "changed_nodes": 0,
        "examples": [],
        "classes_added": ["eel"],
        "classes_removed": [],
    }
    assert same_label_mask(before, same).tolist() == [True, True, False, True]
    relabelled = LabelRecord(pa.array(["a", "b"]), np.array([1, 1]), ["cat", "dog"])
    change = label_change(before, relabelled)
    assert change["changed_nodes"] == 1 and change["examples"] == [["a", "cat", "dog"]]
    assert describe_change(change) == (
        "1 of the 2 labelled test nodes the promoted model was evaluated on have another label now "
        "(e.g. node 'a': 'cat' -> 'dog')"
    )
    assert describe_change(label_change(before, before)) is None
    # integer classes have no fixed value set: a class absent from today's test labels is no change
    ints = LabelRecord(pa.array([1, 2, 3]), np.array([0, 6, 2]), None)
    fewer = LabelRecord(pa.array([1, 3]), np.array([0, 2]), None)
    assert describe_change(label_change(ints, fewer)) is None


def test_decide_promotion_applies_its_rules_in_order():
    cfg = PromotionConfig()
    pair = {
        "nodes": 10,
        "candidate": {"accuracy": 0.8, "macro_f1": 0.7},
        "promoted": {"accuracy": 0.82, "macro_f1": 0.7},
    }
    base = dict(candidate_accuracy=0.8, majority_accuracy=0.3, majority_class=2, promoted_version="v1")
    ok, why = decide_promotion(Evidence(**{**base, "majority_accuracy": 0.8}), cfg)
    assert (
        not ok
        and why == "test accuracy 0.8000 does not beat always predicting the most frequent training class 2 (0.8000)"
    )
    ok, why = decide_promotion(Evidence(**base, pinned=True, same_labels=pair), cfg)
    assert not ok and "the promoted version v1 is pinned; run `gnnflow models unpin v1" in why
    ok, why = decide_promotion(Evidence(**base, label_change="3 nodes", same_labels=pair), cfg)
    assert not ok and "the labels changed since the promoted version v1 was evaluated: 3 nodes" in why
    assert "accept_label_change: true" in why
    ok, why = decide_promotion(Evidence(**base, same_labels=pair), cfg)
    assert not ok and "2.00 points below" in why and "on 10 labelled test nodes (both evaluated on, same labels)" in why
    current = {**pair, "nodes": 12, "promoted": {"accuracy": 0.1, "macro_f1": 0.1}}
    accepted = PromotionConfig(accept_label_change=True)
    ok, why = decide_promotion(
        Evidence(**base, label_change="3 nodes", same_labels=pair, current_labels=current), accepted
    )
    assert ok and why.endswith("on 12 labelled test nodes (current labels)")
    empty = {**pair, "nodes": 0}
    ok, why = decide_promotion(Evidence(**base, same_labels=empty), cfg)
    assert not ok and why.startswith("no labelled test node that both the new model and the promoted version v1")
    assert decide_promotion(Evidence(**{**base, "promoted_version": None}), cfg) == (True, "no promoted model yet")


# ---------------------------------------------------------------- the scenario on Cora

CLASSES = 7


@pytest.fixture
def instance():
    inst = dg.DagsterInstance.ephemeral()
    inst.add_dynamic_partitions(dataset_partitions.name, ["cora"])
    return inst


def _cora_labels() -> pa.Table:
    return pq.read_table(datasets_folder() / "cora" / "nodes.parquet")


def _land(storage, instance, labels: np.ndarray) -> None:
    """landing/cora with Cora's edges and these labels, ingested by canonical_graph."""
    folder = storage.landing_dir("cora")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(datasets_folder() / "cora" / "edges.parquet", folder / "edges.parquet")
    nodes = _cora_labels()
    pq.write_table(nodes.set_column(1, "label", pa.array(labels, pa.int32())), folder / "nodes.parquet")
    assert dg.materialize([canonical_graph], partition_key="cora", instance=instance, resources={"storage": storage})


def _fake_model(storage, fitted: np.ndarray, run_id: str) -> str:
    """A trained_model whose prediction for each node is `fitted` (by the user's id), recorded."""
    canonical = storage.asset_dir("cora", "canonical_graph")
    nodes = pq.read_table(canonical / "nodes.parquet").to_pandas()
    pred = fitted[nodes.original_id.to_numpy()]
    logits = torch.full((len(nodes), CLASSES), -2.0)
    logits[torch.arange(len(nodes)), torch.from_numpy(pred.astype(np.int64))] = 2.0
    with atomic_output_dir(storage.asset_dir("cora", "trained_model")) as out:
        write_predictions(out / "predictions.parquet", pa.array(nodes.original_id), logits)
        (out / "summary.json").write_text(json.dumps({"run": run_id}))
    return storage.record_model_version("cora", run_id)


def _mostly(labels: np.ndarray) -> np.ndarray:
    """Predictions right except for every fifth node (about 80 % test accuracy, like Cora's GCN)."""
    wrong = np.arange(labels.size) % 5 == 0
    return np.where(wrong, (labels + 1) % CLASSES, labels)


def _evaluate_and_promote(storage, instance):
    result = dg.materialize(
        [evaluation, promotion], partition_key="cora", instance=instance, resources={"storage": storage}
    )
    assert result.success
    pr = result.asset_materializations_for_node("promotion")[0].metadata
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == NOT_WORSE
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if e.level == 30]  # logging.WARNING
    return pr, check, warnings


def _train_refusal(storage, instance) -> str:
    result = dg.materialize(
        [trained_model], partition_key="cora", instance=instance, resources={"storage": storage}, raise_on_error=False
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    return failure.step_failure_data.error.message


def test_bad_labels_on_cora_never_replace_the_promoted_model(tmp_path, instance):
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    true = _cora_labels().column("label").to_numpy().astype(np.int64)
    _land(storage, instance, true)
    good = _fake_model(storage, _mostly(true), "aaaaaaaa-1")
    pr, check, _ = _evaluate_and_promote(storage, instance)
    assert pr["promoted"].value is True and check.passed
    promoted = storage.promoted_dir("cora")
    kept = (promoted / "predictions.parquet").read_bytes()
    recorded = json.loads((promoted / "training_labels.json").read_text())
    assert recorded == {"classes": list(range(CLASSES)), "counts": [20] * CLASSES}

    # every label one class: refused before training, naming the class and its count
    _land(storage, instance, np.full(true.size, 3))
    message = _train_refusal(storage, instance)
    assert "the labelled training nodes hold one class only (class 3: 140 nodes)" in message
    assert str(storage.asset_dir("cora", "canonical_graph") / "nodes.parquet") in message
    assert not storage.asset_dir("cora", "trained_model").joinpath("model_best.safetensors").exists()
    assert storage.promoted_version("cora") == good and (promoted / "predictions.parquet").read_bytes() == kept

    # 60 training nodes moved into class 0: the training labels' distribution moved by 0.429
    split = _cora_labels().column("split").to_numpy(zero_copy_only=False)
    moved = true.copy()
    moved[np.flatnonzero((split == "train") & (true != 0))[:60]] = 0
    _land(storage, instance, moved)
    message = _train_refusal(storage, instance)
    assert f"moved from the promoted model {good}'s by a total-variation distance of 0.429" in message
    assert "ops.promotion.config.max_label_shift=0.3" in message
    assert storage.promoted_version("cora") == good

    # labels permuted: the same class shares (the training split is 20 per class), so training is not refused
    permuted = (true + 1) % CLASSES
    _land(storage, instance, permuted)
    canonical = storage.asset_dir("cora", "canonical_graph")
    counts = json.loads((promoted / "training_labels.json").read_text())
    refuse_unfit_training_labels(
        canonical, "cora", PromotionConfig(), dict(zip(counts["classes"], counts["counts"])), good
    )
    # a model fitted to the permuted labels scores 0.8 on them, the promoted one 0.2: promotion refuses
    shifted = _fake_model(storage, _mostly(permuted), "bbbbbbbb-2")
    pr, check, warnings = _evaluate_and_promote(storage, instance)
    assert pr["promoted"].value is False and not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    reason = pr["reason"].value
    assert f"the labels changed since the promoted version {good} was evaluated" in reason
    assert "1000 of the 1000 labelled test nodes the promoted model was evaluated on have another label now" in reason
    assert "accept_label_change: true" in reason
    assert any(
        w.startswith(f"promotion refused: did not promote {shifted} (promoted: {good}): the labels") for w in warnings
    )
    assert storage.promoted_version("cora") == good and (promoted / "predictions.parquet").read_bytes() == kept

    # the user says the change is intended: both models are compared on the current labels
    (storage.landing_dir("cora") / "gnnflow.yaml").write_text(
        "ops: {promotion: {config: {accept_label_change: true}}}\n"
    )
    pr, check, _ = _evaluate_and_promote(storage, instance)
    assert pr["promoted"].value is True and check.passed, pr["reason"].value
    assert "0.8000 vs promoted 0.2000" in pr["reason"].value and "(current labels)" in pr["reason"].value
    assert storage.promoted_version("cora") == shifted


# ---------------------------------------------------------------- pins, retention, `gnnflow models`


def _toy(tmp_path, instance, labels=None) -> GnnflowStorage:
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    _land_toy(storage, (np.arange(12) % 2).tolist() if labels is None else labels)
    instance.add_dynamic_partitions(dataset_partitions.name, ["toy"])
    assert dg.materialize([canonical_graph], partition_key="toy", instance=instance, resources={"storage": storage})
    return storage


def _land_toy(storage, labels: list) -> None:
    from tests.conftest import write_edges

    folder = storage.landing_dir("toy")
    ids = np.arange(12)
    write_edges(folder / "edges.parquet", ids.tolist(), np.roll(ids, 1).tolist(), pa.int64())
    split = ["train"] * 4 + ["val"] * 2 + ["test"] * 6
    pq.write_table(pa.table({"node_id": ids, "label": labels, "split": split}), folder / "nodes.parquet")


def _toy_model(storage, correct_test: int, run_id: str, **summary) -> str:
    """A model right on the first `correct_test` of the 6 test nodes (labels, classes: canonical's)."""
    canonical = storage.asset_dir("toy", "canonical_graph")
    nodes = pq.read_table(canonical / "nodes.parquet").to_pandas()
    classes = int(nodes.label.max()) + 1
    pred = nodes.label.to_numpy().copy()
    pred[6 + correct_test :] = (pred[6 + correct_test :] + 1) % classes
    logits = torch.full((12, classes), -2.0)
    logits[torch.arange(12), torch.from_numpy(pred.astype(np.int64))] = 2.0
    with atomic_output_dir(storage.asset_dir("toy", "trained_model")) as out:
        write_predictions(out / "predictions.parquet", pa.array(nodes.original_id), logits)
        (out / "summary.json").write_text(json.dumps({"run": run_id, **summary}))
        copy_label_classes(canonical, out)  # as training does
    return storage.record_model_version("toy", run_id)


def _cli(monkeypatch, storage, capsys, *argv) -> tuple[int, str, str]:
    import argparse

    from pipelines.models_cli import add_parser

    monkeypatch.setenv("GNNFLOW_HOME", storage.home)
    monkeypatch.setenv("GNNFLOW_LANDING", storage.landing)
    parser = argparse.ArgumentParser(prog="gnnflow")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def _promote_toy(storage, instance):
    result = dg.materialize(
        [evaluation, promotion], partition_key="toy", instance=instance, resources={"storage": storage}
    )
    return result.asset_materializations_for_node("promotion")[0].metadata


def test_pins_rollback_and_retention(tmp_path, instance, monkeypatch, capsys):
    storage = _toy(tmp_path, instance)
    (storage.landing_dir("toy") / "gnnflow.yaml").write_text("ops: {promotion: {config: {keep_versions: 2}}}\n")
    first = _toy_model(storage, 5, "aaaaaaaa-1")
    assert _promote_toy(storage, instance)["promoted"].value is True
    code, out, _ = _cli(monkeypatch, storage, capsys, "pin", first, "--dataset", "toy")
    assert code == 0 and out.strip() == f"dataset toy: {first} pinned"
    second = _toy_model(storage, 6, "bbbbbbbb-2")  # better, but the promoted version is pinned
    pr = _promote_toy(storage, instance)
    assert pr["promoted"].value is False and f"the promoted version {first} is pinned" in pr["reason"].value
    third = _toy_model(storage, 6, "cccccccc-3")
    fourth = _toy_model(storage, 6, "dddddddd-4")  # keep 2: the newest two, plus the pinned promoted one
    assert storage.model_versions("toy") == [fourth, third, first]
    assert not (storage.evaluations_dir("toy") / second).exists()

    code, out, _ = _cli(monkeypatch, storage, capsys, "list", "--dataset", "toy")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("dataset toy: 3 model version(s)") and "keep_versions 2" in lines[0]
    assert lines[1].split() == ["VERSION", "ACCURACY", "MACRO_F1", "TEST_NODES", "STATUS"]
    assert lines[2].split() == [fourth, "-", "-", "-"]  # never evaluated
    assert lines[4].split() == [first, "0.8333", "0.8286", "6", "promoted,", "pinned"]

    code, out, _ = _cli(monkeypatch, storage, capsys, "unpin", first, "--dataset", "toy")
    assert code == 0 and out.strip() == f"dataset toy: {first} unpinned"
    pr = _promote_toy(storage, instance)  # fourth, evaluated now, replaces the unpinned one
    assert pr["promoted"].value is True and storage.promoted_version("toy") == fourth
    assert storage.model_versions("toy") == [fourth, third]  # the unpinned first is beyond keep_versions

    code, out, _ = _cli(monkeypatch, storage, capsys, "promote", third, "--dataset", "toy")  # rollback
    assert code == 0 and out.strip() == f"dataset toy: promoted {third} (was {fourth})"
    assert storage.promoted_version("toy") == third
    code, _, err = _cli(monkeypatch, storage, capsys, "promote", first, "--dataset", "toy")
    assert code == 2 and f"dataset 'toy' has no model version '{first}'" in err and third in err
    code, _, err = _cli(monkeypatch, storage, capsys, "promote", "../x" + "y" * 200, "--dataset", "toy")
    assert code == 2 and "is not a valid name" in err and len(err) < 300
    path = storage.versions_dir("toy") / fourth / "predictions.parquet"
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    code, _, err = _cli(monkeypatch, storage, capsys, "promote", fourth, "--dataset", "toy")
    assert code == 2 and f"{path}: its SHA-256 differs" in err and storage.promoted_version("toy") == third


def test_string_labels_are_compared_by_value_and_a_new_class_value_is_a_label_change(tmp_path, instance):
    labels = ["cat" if i % 2 else "dog" for i in range(12)]
    storage = _toy(tmp_path, instance, labels)
    first = _toy_model(storage, 6, "aaaaaaaa-1")
    assert _promote_toy(storage, instance)["promoted"].value is True
    # a new value "ant" sorts first: "cat" and "dog" become classes 1 and 2, no test node changes its value
    _land_toy(storage, ["ant" if i == 4 else v for i, v in enumerate(labels)])
    assert dg.materialize([canonical_graph], partition_key="toy", instance=instance, resources={"storage": storage})
    second = _toy_model(storage, 6, "bbbbbbbb-2")
    pr = _promote_toy(storage, instance)
    assert pr["promoted"].value is False
    assert pr["reason"].value == (
        f"the labels changed since the promoted version {first} was evaluated: new class values: ['ant']; check the "
        "label column, or set ops.promotion.config.accept_label_change: true when the change is intended"
    )
    record = json.loads((storage.asset_dir("toy", "evaluation") / "metrics.json").read_text())
    assert record["label_change"]["changed_nodes"] == 0 and record["label_change"]["compared_nodes"] == 6
    same = record["same_labels"]  # the promoted model's "cat"/"dog" read as the new indices: all 6 right
    assert same["nodes"] == 6 and same["candidate"]["accuracy"] == same["promoted"]["accuracy"] == 1.0
    (storage.landing_dir("toy") / "gnnflow.yaml").write_text(
        "ops: {promotion: {config: {accept_label_change: true}}}\n"
    )
    assert _promote_toy(storage, instance)["promoted"].value is True
    assert storage.promoted_version("toy") == second


def test_a_version_records_its_training_labels_unless_trained_on_other_files(tmp_path, instance):
    storage = _toy(tmp_path, instance)
    first = _toy_model(storage, 6, "aaaaaaaa-1")
    recorded = json.loads((storage.versions_dir("toy") / first / "training_labels.json").read_text())
    assert recorded == {"classes": [0, 1], "counts": [2, 2]}
    # a model whose summary names other input files than canonical_graph holds now
    second = _toy_model(storage, 6, "bbbbbbbb-2", data_version="0123456789abcdef")
    assert second != first and not (storage.versions_dir("toy") / second / "training_labels.json").exists()
