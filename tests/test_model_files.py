"""Model and checkpoint files are data, not code: safetensors plus JSON, checked against the
hashes their stage published, a damaged checkpoint set aside, model versions recorded again
after a kill, and predictions scored with the model promotion just picked."""

import json
import logging
import os
import shutil
import struct
from pathlib import Path
from typing import Tuple

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from assets.common import GnnflowStorage, dataset_partitions
from graphs.infra.storage import CorruptFileError, staged_output, verify_files, write_file_hashes
from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from tests.conftest import write_edges
from training.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from training.config import RunConfig
from training.outputs import MODEL_BEST, MODEL_FINAL, VERSION_FILE, load_model, load_model_weights, read_version
from training.predict import predict
from training.state_file import StateFileError, read_state_file, write_state_file
from training.train import train

DS = "ds"


class _WritesAFile(torch.nn.Module):
    """A TorchScript module whose ``__setstate__`` creates (and fills) a file: torch.jit.load runs
    it, and torch 2.2's ``torch.load(weights_only=True)`` hands TorchScript archives to torch.jit.load."""

    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker
        self.buf = torch.zeros(1)

    def forward(self, x):
        return x

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, bool]:
        return (self.marker, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, bool]) -> None:
        self.marker = state[0]
        self.training = state[1]
        self.buf = torch.from_file(self.marker, True, 8, dtype=torch.uint8)
        self.buf.fill_(65)


def _torchscript_archive(path: Path, marker: Path) -> Path:
    torch.jit.script(_WritesAFile(str(marker))).save(str(path))
    return path


def _flip_bit_in_tensor_data(path: Path) -> None:
    """Flip one bit in the middle of a safetensors file's tensor bytes (past its header)."""
    os.chmod(path, 0o644)  # model_versions' files are read-only hard links
    data = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", bytes(data[:8]))[0]
    data[(start + len(data)) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _run_config(home: Path, **training) -> RunConfig:
    return RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 8, "num_layers": 2, "dropout": 0.3},
            "training": {"epochs": 4, "profiler": "none", "optimizer": {"lr": 0.02}, **training},
            "paths": {"shards": str(home / "minibatch_shards"), "out": str(home / "trained_model")},
        }
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """GNNFLOW_HOME with one dataset: canonical graph, Â, shards and a trained model."""
    root = tmp_path_factory.mktemp("model_files")
    cfg = GenerateConfig(num_nodes=150, num_edges=900, feature_dim=6, num_classes=3, num_edge_files=1, seed=3)
    generate_dataset(cfg, root / "landing" / DS, progress=False)
    home = root / "home" / DS
    build_canonical_graph(root / "landing" / DS, home / "canonical_graph")
    build_normalized_adjacency(home / "canonical_graph", home / "normalized_adjacency")
    write_minibatch_shards(
        load_shard_inputs(home / "canonical_graph", home / "normalized_adjacency"),
        home / "minibatch_shards",
        ShardConfig(fanouts="4,4", batch_size=32, epochs=1, world_size=1),
    )
    train(_run_config(home))
    return root


@pytest.fixture
def copy(built, tmp_path) -> tuple[GnnflowStorage, Path]:
    """A private copy of the built home (tests damage files): the storage resource and the dataset folder."""
    shutil.copytree(built / "home", tmp_path / "home", symlinks=True)
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(built / "landing"))
    return storage, tmp_path / "home" / DS


def _materialize(assets, storage, **kwargs):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, [DS])
    return dg.materialize(
        assets, partition_key=DS, instance=instance, resources={"storage": storage}, raise_on_error=False, **kwargs
    )


def _failure(result) -> str:
    (event,) = [e for e in result.all_events if e.is_step_failure]
    return event.step_failure_data.error.message


# ----------------------------------------------------------------------------- the file format


def test_a_state_file_round_trips_every_value_exactly(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    state = {
        "optimizer": opt.state_dict(),  # int keys, tuples (betas), 0-d tensors (step)
        "history": [{"epoch": 1, "loss": 0.1 + 0.2, "val_acc": float("nan"), "lr": float("inf")}],
        "half": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4),
        "same": model.weight,  # two names for one storage
        "again": model.weight,
        "nothing": None,
    }
    write_state_file(tmp_path / "s.safetensors", state, kind="test", format_version=7)
    back = read_state_file(tmp_path / "s.safetensors", kind="test", format_version=7, remedy="x")
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert list(back["optimizer"]["state"]) == [0, 1]
    for k, v in opt.state_dict()["state"][0].items():
        assert torch.equal(back["optimizer"]["state"][0][k], v) and back["optimizer"]["state"][0][k].dtype == v.dtype
    row = back["history"][0]
    assert row["loss"] == 0.1 + 0.2 and np.isnan(row["val_acc"]) and row["lr"] == float("inf")
    assert torch.equal(back["half"], state["half"]) and back["empty"].shape == (0, 4)
    assert torch.equal(back["same"], model.weight.detach()) and torch.equal(back["again"], model.weight.detach())
    assert back["nothing"] is None
    with pytest.raises(StateFileError, match=r"s.safetensors: a 'test' file, expected a gnnflow model file; x"):
        read_state_file(tmp_path / "s.safetensors", kind="model", format_version=7, remedy="x")
    with pytest.raises(StateFileError, match=r"s.safetensors: test file format 7, this code reads 8; x"):
        read_state_file(tmp_path / "s.safetensors", kind="test", format_version=8, remedy="x")


def test_a_damaged_or_truncated_state_file_is_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    write_state_file(path, {"w": torch.arange(64, dtype=torch.float32)}, kind="model", format_version=1)
    whole = path.read_bytes()
    _flip_bit_in_tensor_data(path)
    with pytest.raises(StateFileError, match=r"m.safetensors: damaged .*; retrain"):
        read_state_file(path, kind="model", format_version=1, remedy="retrain")
    path.write_bytes(whole[:-10])
    with pytest.raises(StateFileError, match=r"m.safetensors: unreadable safetensors file .*; retrain"):
        read_state_file(path, kind="model", format_version=1, remedy="retrain")
    path.write_bytes(whole[:5])
    with pytest.raises(StateFileError, match=r"m.safetensors: not a safetensors file \(or a truncated one\)"):
        read_state_file(path, kind="model", format_version=1, remedy="retrain")


def test_state_files_of_every_header_length_read_back(tmp_path):
    """The header length's lowest byte can be anything (0x80 included, a pickle's first byte):
    32 header sizes in steps of 8 bytes cover every residue the writer produces."""
    lengths = set()
    for pad in range(0, 256, 8):
        path = tmp_path / f"m{pad}.safetensors"
        state = {"w": torch.arange(3, dtype=torch.float32), "pad": "x" * pad}
        write_state_file(path, state, kind="model", format_version=1)
        lengths.add(struct.unpack("<Q", path.read_bytes()[:8])[0] % 256)
        back = read_state_file(path, kind="model", format_version=1, remedy="retrain")
        assert back["pad"] == state["pad"] and torch.equal(back["w"], state["w"])
    assert 0x80 in lengths and len(lengths) == 32


def test_a_crafted_state_nested_too_deep_is_refused_with_its_file_named(tmp_path):
    from safetensors.torch import save_file

    from training.state_file import _digest

    text = "[" * 100_000 + "]" * 100_000
    meta = {"gnnflow.kind": "model", "gnnflow.format_version": "1", "gnnflow.state": text}
    save_file({}, str(tmp_path / "deep.safetensors"), metadata={**meta, "gnnflow.sha256": _digest("model", text, {})})
    with pytest.raises(StateFileError, match=r"deep.safetensors: malformed gnnflow.state \(maximum recursion"):
        read_state_file(tmp_path / "deep.safetensors", kind="model", format_version=1, remedy="retrain")


def test_torch_load_runs_the_archive_and_gnnflow_refuses_it_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    archive = _torchscript_archive(tmp_path / "evil.zip", marker)
    with pytest.warns(UserWarning, match="TorchScript"):
        torch.load(archive, weights_only=True)  # the pinned torch runs it: the archive is a live one
    assert marker.read_bytes() == b"A" * 8
    marker.unlink()
    for name, load in ((MODEL_BEST, load_model), (MODEL_FINAL, load_model_weights), (CHECKPOINT_NAME, load_checkpoint)):
        shutil.copy(archive, tmp_path / name)
        with pytest.raises(StateFileError, match=f"{name}: a ZIP archive \\(a torch.save or TorchScript file\\)"):
            load(tmp_path / name)
    assert not marker.exists()


# ----------------------------------------------------------------------------- promoted model


def _promote_current(storage: GnnflowStorage) -> Path:
    version = storage.record_model_version(DS, "test-run")
    storage.promote(DS, version)
    return storage.promoted_dir(DS)


def test_a_torchscript_archive_as_the_promoted_model_is_refused_and_never_run(copy, tmp_path):
    from assets.predictions import predictions

    storage, home = copy
    promoted = _promote_current(storage)
    marker = tmp_path / "ran"
    target = promoted / MODEL_BEST
    target.unlink()
    _torchscript_archive(target, marker)
    write_file_hashes(promoted)  # whoever can replace the file can rewrite the hash record too
    result = _materialize([predictions], storage)
    assert not result.success
    message = _failure(result)
    assert f"{promoted / MODEL_BEST}: a ZIP archive (a torch.save or TorchScript file)" in message
    assert "never loads pickled or TorchScript files" in message and "re-materialize trained_model" in message
    assert not marker.exists()
    assert not (home / "predictions").exists()


def test_a_pickled_model_of_an_older_gnnflow_as_the_promoted_model_is_named_and_never_loaded(copy, tmp_path):
    from assets.predictions import predictions
    from training.outputs import PICKLED_MODEL_BEST

    storage, _ = copy
    promoted = _promote_current(storage)
    marker = tmp_path / "ran"
    (promoted / MODEL_BEST).unlink()
    _torchscript_archive(promoted / PICKLED_MODEL_BEST, marker)
    result = _materialize([predictions], storage)
    assert not result.success
    message = _failure(result)
    assert f"{promoted / PICKLED_MODEL_BEST}: a model file of an older gnnflow (a torch pickle" in message
    assert f"re-materialize trained_model to write {MODEL_BEST}" in message
    assert not marker.exists()


def test_a_flipped_bit_in_the_promoted_model_fails_predictions_naming_the_file_and_stage(copy):
    from assets.predictions import predictions

    storage, home = copy
    promoted = _promote_current(storage)
    ok = _materialize([predictions], storage)
    assert ok.success
    version = read_version(promoted)
    md = ok.asset_materializations_for_node("predictions")[0].metadata
    assert md["model_version"].value == version
    before = (home / "predictions" / "predictions.parquet").read_bytes()

    _flip_bit_in_tensor_data(promoted / MODEL_BEST)
    result = _materialize([predictions], storage)
    assert not result.success
    message = _failure(result)
    assert f"{promoted / MODEL_BEST}: its SHA-256 differs from the one trained_model recorded" in message
    assert "re-materialize trained_model" in message
    assert (home / "predictions" / "predictions.parquet").read_bytes() == before  # the last good scores stay

    write_file_hashes(promoted)  # a hash record rewritten to match: the file's own digest still refuses it
    with pytest.raises(StateFileError, match=f"{MODEL_BEST}: damaged"):
        predict(promoted / MODEL_BEST, home / "canonical_graph", home / "normalized_adjacency", home / "scored")


def test_a_flipped_bit_in_features_fails_predictions_naming_canonical_graph(copy):
    _, home = copy
    features = home / "canonical_graph" / "features.npy"
    arr = np.load(features)
    arr.view(np.uint32)[7, 2] ^= 1 << 30
    np.save(features, arr)
    with pytest.raises(CorruptFileError, match=r"features.npy: its SHA-256 differs .* re-materialize canonical_graph"):
        predict(
            home / "trained_model" / MODEL_BEST, home / "canonical_graph", home / "normalized_adjacency", home / "x"
        )
    assert not (home / "x").exists()


# ----------------------------------------------------------------------------- checkpoints


class _Killed(Exception):
    pass


def _kill_after(epoch_to_die: int):
    def hook(epoch, rows):
        if epoch == epoch_to_die:
            raise _Killed

    return hook


def _inputs_only(built: Path, tmp_path: Path) -> Path:
    """A copy of the dataset's folder without its trained model."""
    home = tmp_path / DS
    shutil.copytree(built / "home" / DS, home, ignore=lambda d, names: {"trained_model"} & set(names))
    return home


def _weights(home: Path) -> dict:
    return {name: load_model_weights(home / "trained_model" / name) for name in (MODEL_FINAL, MODEL_BEST)}


def _same(a: dict, b: dict) -> bool:
    return all(a[f].keys() == b[f].keys() and all(torch.equal(a[f][k], b[f][k]) for k in a[f]) for f in a)


def test_a_killed_run_resumes_from_its_checkpoint_bit_for_bit(built, tmp_path):
    home = _inputs_only(built, tmp_path)
    cfg = _run_config(home)
    with pytest.raises(_Killed):
        train(cfg, on_epoch_end=_kill_after(1))
    (ckpt,) = home.glob(f".trained_model.work-*/{CHECKPOINT_NAME}")
    assert load_checkpoint(ckpt)["epoch"] == 1
    seen = []
    train(cfg, on_epoch_end=lambda epoch, rows: seen.append(epoch))
    assert seen == [2, 3]  # resumed, not restarted
    assert _same(_weights(home), _weights(built / "home" / DS))  # identical to the uninterrupted run


@pytest.mark.parametrize("damage", ["flipped_bit", "truncated", "torchscript", "other_format"])
def test_an_unusable_checkpoint_is_set_aside_and_training_starts_over(built, tmp_path, caplog, damage):
    home = _inputs_only(built, tmp_path)
    cfg = _run_config(home)
    with pytest.raises(_Killed):
        train(cfg, on_epoch_end=_kill_after(1))
    (ckpt,) = home.glob(f".trained_model.work-*/{CHECKPOINT_NAME}")
    marker = tmp_path / "ran"
    if damage == "flipped_bit":
        _flip_bit_in_tensor_data(ckpt)
    elif damage == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    elif damage == "torchscript":
        _torchscript_archive(ckpt, marker)
    else:
        state = load_checkpoint(ckpt)
        write_state_file(ckpt, state, kind="checkpoint", format_version=2)
    seen: list[int] = []
    with caplog.at_level(logging.WARNING, logger="training"):
        train(cfg, on_epoch_end=lambda epoch, rows: seen.append(epoch))  # the retry is not blocked
    assert seen == [0, 1, 2, 3]  # from the first epoch
    (warning,) = [r.getMessage() for r in caplog.records if CHECKPOINT_NAME in r.getMessage()]
    assert warning.startswith(f"{ckpt}: ") and warning.endswith("training restarts from the first epoch")
    assert f"set aside as {CHECKPOINT_NAME}.unusable-" in warning
    assert not marker.exists()
    assert _same(_weights(home), _weights(built / "home" / DS))  # a clean restart: the uninterrupted run's model


def test_a_checkpoint_save_leaves_no_temporary_and_loads_back(tmp_path):
    path = tmp_path / "w" / CHECKPOINT_NAME
    save_checkpoint(path, {"epoch": 3, "model": {"w": torch.ones(2)}})
    assert [p.name for p in path.parent.iterdir()] == [CHECKPOINT_NAME]
    state = load_checkpoint(path)
    assert state["epoch"] == 3 and state["format_version"] == 3 and torch.equal(state["model"]["w"], torch.ones(2))


# ----------------------------------------------------------------------------- model versions


def test_a_kill_between_publishing_and_recording_the_version_is_completed_by_evaluation(copy):
    """train() published trained_model/ with its version.json; the step died before
    record_model_version. evaluation records it, promotion promotes it, predictions names it."""
    from assets.evaluation import evaluation, promotion
    from assets.predictions import predictions

    storage, home = copy
    version = read_version(home / "trained_model")
    assert version is not None and not storage.versions_dir(DS).exists()
    verify_files(home / "trained_model", [VERSION_FILE, MODEL_BEST], stage="trained_model")  # named before the swap

    result = _materialize([evaluation, promotion, predictions], storage)
    assert result.success
    assert [p.name for p in storage.versions_dir(DS).iterdir()] == [version]
    assert os.readlink(storage.promoted_dir(DS)) == f"model_versions/{version}"
    pr = result.asset_materializations_for_node("promotion")[0].metadata
    assert pr["candidate_version"].value == pr["promoted_version"].value == version
    md = result.asset_materializations_for_node("predictions")[0].metadata
    assert md["model_version"].value == version
    verify_files(home / "trained_model", stage="trained_model")  # recording rewrote none of its files
    verify_files(storage.versions_dir(DS) / version, stage="trained_model")
    assert storage.record_model_version(DS, "another-run") == version  # idempotent
    assert [p.name for p in storage.versions_dir(DS).iterdir()] == [version]


def test_the_next_training_keeps_an_unrecorded_model_before_replacing_it(copy):
    """The step died before record_model_version, and the next step is trained_model again:
    the model it is about to replace is kept as its version first (once), and a damaged
    version.json only warns (that run replaces the folder anyway)."""
    from assets.trained_model import keep_unrecorded_model

    storage, home = copy
    version = read_version(home / "trained_model")
    log = logging.getLogger("test")
    keep_unrecorded_model(storage, DS, "run-2", log)
    assert [p.name for p in storage.versions_dir(DS).iterdir()] == [version]
    verify_files(storage.versions_dir(DS) / version, stage="trained_model")
    keep_unrecorded_model(storage, DS, "run-2", log)  # already kept: nothing more
    assert [p.name for p in storage.versions_dir(DS).iterdir()] == [version]
    (home / "trained_model" / VERSION_FILE).write_text("{not json")
    keep_unrecorded_model(storage, DS, "run-2", log)
    assert [p.name for p in storage.versions_dir(DS).iterdir()] == [version]


def test_a_damaged_unrecorded_model_is_not_kept_as_a_version(copy):
    """Recording writes the version's own hashes.json: it must not vouch for a file damaged
    after training published it."""
    from assets.evaluation import evaluation

    storage, home = copy
    _flip_bit_in_tensor_data(home / "trained_model" / MODEL_FINAL)
    result = _materialize([evaluation], storage)
    assert not result.success
    message = _failure(result)
    assert f"{home / 'trained_model' / MODEL_FINAL}: its SHA-256 differs" in message
    assert "re-materialize trained_model" in message
    assert not storage.versions_dir(DS).exists()


def test_a_promoted_model_that_cannot_be_verified_is_left_out_and_replaced(copy):
    """A promoted folder without hashes.json (kept by an older gnnflow) or damaged cannot be
    compared with: evaluation leaves it out, with a warning, and promotion moves the pointer."""
    from assets.evaluation import evaluation, promotion

    storage, home = copy
    old = storage.versions_dir(DS) / "20200101T000000Z-old"
    shutil.copytree(home / "trained_model", old)
    (old / "hashes.json").unlink()
    storage.promoted_dir(DS).symlink_to("model_versions/20200101T000000Z-old")
    result = _materialize([evaluation, promotion], storage)
    assert result.success
    version = read_version(home / "trained_model")
    record = json.loads((home / "evaluation" / "metrics.json").read_text())
    assert record["candidate"]["version"] == version and record["promoted"] is None
    assert os.readlink(storage.promoted_dir(DS)) == f"model_versions/{version}"


def test_predictions_wait_for_promotion_and_the_predict_job_leaves_training_out():
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("promotion") in graph.get(dg.AssetKey("predictions")).parent_keys
    job = defs.resolve_job_def("predict")
    assert "promotion" not in {k.to_user_string() for k in job.asset_layer.executable_asset_keys}


def test_a_full_run_scores_predictions_with_the_model_promotion_just_promoted(built, tmp_path):
    from pipelines.definitions import ALL_ASSETS

    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(built / "landing"))
    run_config = {
        "ops": {
            "minibatch_shards": {"config": {"fanouts": "4,4", "batch_size": 32, "epochs": 1, "world_size": 1}},
            # a model that learns: promotion refuses one that does no better than the majority class
            "trained_model": {"config": {"model": {"hidden": 16}, "training": {"epochs": 30, "profiler": "none"}}},
            "promotion": {"config": {"margin": 1.0}},  # any retrain is promoted
        }
    }
    retrain = {"ops": {k: v for k, v in run_config["ops"].items() if k != "minibatch_shards"}}
    retrained = ["trained_model", "evaluation", "promotion", "predictions"]
    assert [a.key.to_user_string() for a in ALL_ASSETS[-4:]] == retrained
    versions = []
    for assets, config in ((ALL_ASSETS, run_config), (ALL_ASSETS[-4:], retrain)):
        result = _materialize(assets, storage, run_config=config)
        assert result.success
        promoted = result.asset_materializations_for_node("promotion")[0].metadata
        scored = result.asset_materializations_for_node("predictions")[0].metadata
        assert promoted["promoted"].value is True
        assert scored["model_version"].value == promoted["promoted_version"].value
        versions.append(scored["model_version"].value)
    assert versions[0] != versions[1]  # the second run's predictions used the model it had just promoted


def test_training_on_a_single_labelled_class_is_refused_before_it_starts(tmp_path):
    """A nodes.parquet whose training labels are all one class would train to loss 0, score 1.0
    on those same labels and be promoted over a useful model."""
    from assets.trained_model import refuse_unfit_training_labels
    from training.promotion import PromotionConfig

    landing = tmp_path / "landing"
    write_edges(landing / "edges.parquet", [0, 1, 2, 3, 4], [1, 2, 3, 4, 0])
    nodes = {"node_id": [0, 1, 2, 3, 4], "label": [1, 1, 1, 0, -1], "split": ["train"] * 3 + ["test", "train"]}
    pq.write_table(pa.table(nodes), landing / "nodes.parquet")
    with staged_output(tmp_path / "canonical_graph") as out:
        build_canonical_graph(landing, out)
    with pytest.raises(dg.Failure) as err:
        refuse_unfit_training_labels(tmp_path / "canonical_graph", "d", PromotionConfig())
    assert "the labelled training nodes hold one class only (class 1: 3 nodes)" in err.value.description
    nodes["label"][0] = 0  # a second class among the training nodes: trains
    pq.write_table(pa.table(nodes), landing / "nodes.parquet")
    with staged_output(tmp_path / "canonical_graph") as out:
        build_canonical_graph(landing, out)
    refuse_unfit_training_labels(tmp_path / "canonical_graph", "d", PromotionConfig())
