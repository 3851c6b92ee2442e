"""evaluation and promotion assets: metrics of the newest model against the promoted one, the
`promoted` pointer moves only when the headline metric did not drop by more than the margin."""

import json
import shutil

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from assets.canonical_graph import canonical_graph
from assets.common import dataset_partitions
from assets.evaluation import NOT_WORSE, evaluation, promotion
from graphs.infra.storage import atomic_output_dir
from tests.conftest import write_edges
from training.outputs import write_predictions
from training.promotion import PromotionConfig, decide

N = 12


@pytest.fixture
def instance():
    inst = dg.DagsterInstance.ephemeral()
    inst.add_dynamic_partitions(dataset_partitions.name, ["toy"])
    return inst


def _landing(tmp_path):
    folder = tmp_path / "landing" / "toy"
    ids = np.arange(N)
    write_edges(folder / "edges.parquet", ids.tolist(), np.roll(ids, 1).tolist(), pa.int64())
    split = ["train"] * 4 + ["val"] * 2 + ["test"] * 6
    pq.write_table(
        pa.table({"node_id": pa.array(ids, pa.int64()), "label": (ids % 2).tolist(), "split": split}),
        folder / "nodes.parquet",
    )
    return folder


def _train_fake(storage, correct_test: int, run_id: str) -> str:
    """A trained_model folder whose predictions get `correct_test` of the 6 test nodes right."""
    canonical = storage.asset_dir("toy", "canonical_graph")
    nodes = pq.read_table(canonical / "nodes.parquet").to_pandas()
    label = nodes.label.to_numpy()
    pred = label.copy()
    test = np.flatnonzero(nodes.split.to_numpy() == "test")
    pred[test[correct_test:]] = 1 - label[test[correct_test:]]
    logits = torch.full((len(nodes), 2), -2.0)
    logits[torch.arange(len(nodes)), torch.from_numpy(pred)] = 2.0
    with atomic_output_dir(storage.asset_dir("toy", "trained_model")) as out:  # as training publishes
        write_predictions(out / "predictions.parquet", pa.array(nodes.original_id), logits)
        (out / "summary.json").write_text(json.dumps({"run": run_id}))
    return storage.record_model_version("toy", run_id)


def _evaluate_and_promote(storage, instance):
    result = dg.materialize(
        [evaluation, promotion], partition_key="toy", instance=instance, resources={"storage": storage}
    )
    assert result.success
    ev = result.asset_materializations_for_node("evaluation")[0].metadata
    pr = result.asset_materializations_for_node("promotion")[0].metadata
    (check,) = result.get_asset_check_evaluations()
    assert check.check_name == NOT_WORSE
    return ev, pr, check


def test_decide_rule():
    cfg = PromotionConfig()
    assert decide(0.80, None, cfg)[0]
    assert decide(0.795, 0.80, cfg)[0]  # 0.5 points down: within the 1-point margin
    ok, why = decide(0.78, 0.80, cfg)
    assert not ok and "2.00 points below" in why
    assert not decide(float("nan"), 0.8, cfg)[0]
    with pytest.raises(ValueError, match="metric"):
        PromotionConfig(metric="loss")


def test_bad_retrain_keeps_the_promoted_model(tmp_path, storage, instance):
    _landing(tmp_path)
    assert dg.materialize(
        [canonical_graph], partition_key="toy", instance=instance, resources={"storage": storage}
    ).success

    good = _train_fake(storage, 6, "aaaaaaaa-1")
    ev, pr, check = _evaluate_and_promote(storage, instance)
    assert ev["accuracy"].value == 1.0 and ev["test_nodes"].value == 6
    assert ev["roc_auc"].value == 1.0 and ev["pr_auc"].value == 1.0
    assert ev["confusion_matrix"].value.startswith("![confusion matrix](data:image/png;base64,")
    assert len(ev["confusion_matrix"].value) < 40_000  # a small plot
    assert pr["promoted"].value is True and check.passed
    promoted = storage.promoted_dir("toy")
    assert promoted.is_symlink() and storage.model_version(promoted) == good

    bad = _train_fake(storage, 2, "bbbbbbbb-2")  # 2/6 right: 66.67 points worse
    ev, pr, check = _evaluate_and_promote(storage, instance)
    assert ev["accuracy"].value == pytest.approx(2 / 6, abs=1e-4)
    assert ev["promoted_accuracy"].value == 1.0 and ev["accuracy_change_points"].value == pytest.approx(-66.67)
    assert pr["promoted"].value is False and not check.passed  # visible in the UI as a failed check
    assert check.severity == dg.AssetCheckSeverity.WARN
    assert storage.model_version(promoted) == good != bad
    kept = pq.read_table(promoted / "predictions.parquet").column("predicted").to_numpy()
    assert (kept == np.arange(N) % 2).all()  # consumers still read the good model's predictions
    assert storage.model_version(storage.asset_dir("toy", "trained_model")) == bad  # trained_model = newest

    # the dataset's gnnflow.yaml widens the margin: a 1-node drop (16.67 points) now promotes
    (tmp_path / "landing" / "toy" / "gnnflow.yaml").write_text("ops: {promotion: {config: {margin: 0.2}}}\n")
    within = _train_fake(storage, 5, "cccccccc-3")
    ev, pr, check = _evaluate_and_promote(storage, instance)
    assert pr["promoted"].value is True and check.passed
    assert pr["config"].value == {
        "metric": "accuracy",
        "margin": 0.2,
        "max_class_share": 0.99,
        "max_label_shift": 0.3,
        "accept_label_change": False,
        "keep_versions": 10,
    }
    assert storage.model_version(promoted) == within
    assert sorted(p.name for p in storage.versions_dir("toy").iterdir()) == sorted([good, bad, within])
    mode = (storage.versions_dir("toy") / good / "predictions.parquet").stat().st_mode
    assert mode & 0o222 == 0  # read-only: an in-place writer fails (for a non-root user) instead of altering it


def test_evaluation_refuses_a_damaged_prediction_file_and_records_an_unrecorded_version(tmp_path, storage, instance):
    _landing(tmp_path)
    assert dg.materialize(
        [canonical_graph], partition_key="toy", instance=instance, resources={"storage": storage}
    ).success
    good = _train_fake(storage, 6, "aaaaaaaa-1")
    shutil.rmtree(storage.versions_dir("toy"))  # the step died after publishing trained_model, before recording it
    ev, pr, _ = _evaluate_and_promote(storage, instance)
    assert ev["version"].value == good and pr["promoted_version"].value == good
    assert (storage.versions_dir("toy") / good / "predictions.parquet").is_file()

    path = storage.asset_dir("toy", "trained_model") / "predictions.parquet"
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    result = dg.materialize(
        [evaluation], partition_key="toy", instance=instance, resources={"storage": storage}, raise_on_error=False
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.message
    assert f"{path}: its SHA-256 differs from the one trained_model recorded" in message
    assert "re-materialize trained_model" in message
