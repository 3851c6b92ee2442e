"""training: config, AMP shim, schedule, features, DDP gradients, resume, no-DGL run,
outputs, a short Cora run through the pipeline's functions, and the Dagster asset via pipes."""

import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from assets.common import GnnflowStorage, dataset_partitions
from assets.trained_model import TrainedModelConfig, trained_model
from graphs.formats.shard_manifest import ShardManifest
from graphs.sampling import ShardConfig, load_shard_inputs, sampler_class, write_minibatch_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training import precision as precision_mod
from training.checkpoint import CHECKPOINT_NAME, load_checkpoint
from training.config import LRScheduleConfig, RunConfig, TrainingConfig
from training.data import ShardStream, read_manifest
from training.feature_cache import CacheSpec
from training.features import FeatureTransform, degree_features
from training.layers import ModelConfig
from training.outputs import MODEL_BEST, MODEL_FINAL, Preprocessing, load_model, load_model_weights
from training.run_plan import (
    check_sampler_supports,
    epoch_passes,
    learning_rate,
    replay_order_seed,
    resolve_num_layers,
    training_epochs,
)
from training.train import train

ROOT = Path(__file__).resolve().parents[1]
ID_OFFSET = 1000


# ----------------------------------------------------------------------------- fixtures


def _pipeline(landing: Path, home: Path, **shard_kw) -> dict:
    """canonical -> adjacency -> shards with the library functions; the folders."""
    can, adj = home / "canonical_graph", home / "normalized_adjacency"
    if not can.exists():
        build_canonical_graph(landing, can)
        build_normalized_adjacency(can, adj)
    shards = home / f"shards-{'-'.join(f'{k}{v}' for k, v in sorted(shard_kw.items()))}"
    if not shards.exists():
        write_minibatch_shards(load_shard_inputs(can, adj), shards, ShardConfig(**shard_kw))
    return {"canonical": can, "adjacency": adj, "shards": shards}


@pytest.fixture(scope="module")
def sbm(tmp_path_factory) -> dict:
    """A 400-node DC-SBM (ids 1000..1399, 16 features, 4 classes); shards for W=2 and W=1."""
    root = tmp_path_factory.mktemp("train_sbm")
    cfg = GenerateConfig(
        num_nodes=400,
        num_edges=3000,
        feature_dim=16,
        num_classes=4,
        num_edge_files=1,
        id_offset=ID_OFFSET,
        feature_noise=1.0,
    )
    generate_dataset(cfg, root / "landing", progress=False)
    kw = dict(fanouts="5,5", batch_size=48, epochs=2)
    two = _pipeline(root / "landing", root / "home", world_size=2, **kw)
    one = _pipeline(root / "landing", root / "home", world_size=1, **kw)
    return {"root": root, "landing": root / "landing", "w2": two, "w1": one}


def _run_config(shards: Path, out: Path, **training) -> RunConfig:
    return RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 16, "num_layers": 2, "dropout": 0.2},
            "training": {"epochs": 3, "profiler": "none", "optimizer": {"lr": 0.01}, **training},
            "paths": {"shards": str(shards), "out": str(out)},
        }
    )


# ----------------------------------------------------------------------------- config


def test_config_yaml_round_trips_and_accepts_the_dagster_shape(tmp_path):
    cfg = RunConfig.from_dict(
        {
            "model": {"conv": "gcn", "hidden": 32, "hidden_norm": "layer"},
            "training": {
                "precision": "mixed_float16",
                "optimizer": {"type": "AdamW", "lr": 0.001, "weight_decay": 0.01},
                "gradient_clipping": 1.0,
                "accumulate": 4,
                "lr_schedule": {"type": "cosine", "warmup_epochs": 1},
            },
            "paths": {"shards": "s", "out": "o"},
        }
    )
    assert cfg.training.optimizer.weight_decay == 0.01 and cfg.training.lr_schedule.type == "cosine"
    path = tmp_path / "run.yaml"
    cfg.to_yaml(path)
    assert RunConfig.from_yaml(path) == cfg
    # the same blocks inside a Dagster run-config file, paths at the top level
    dagster_file = tmp_path / "dagster.yaml"
    d = cfg.to_dict()
    block = {"model": d["model"], "training": d["training"]}
    dagster_file.write_text(json.dumps({"ops": {"trained_model": {"config": block}}, "paths": d["paths"]}))
    assert RunConfig.from_yaml(dagster_file) == cfg
    # and the Dagster Config class maps onto the dataclasses field for field
    dg_cfg = TrainedModelConfig(model=d["model"], training=d["training"])
    assert dg_cfg.to_run_config(cfg.paths) == cfg
    assert TrainedModelConfig().to_run_config(cfg.paths) == RunConfig(paths=cfg.paths)  # same defaults


@pytest.mark.parametrize(
    "data,field",
    [
        ({"training": {"optimizer": {"lr": -1}}}, "training.optimizer.lr"),
        ({"training": {"precision": "fp8"}}, "training.precision"),
        ({"training": {"accumulate": "4"}}, "training.accumulate"),
        ({"training": {"optimiser": {"lr": 0.1}}}, "training.optimiser"),
        ({"training": {"lr_schedule": {"type": "linear"}}}, "training.lr_schedule.type"),
        ({"model": {"conv": "transformer"}}, "model.conv"),
        ({"paths": {"out": "o"}}, "paths.shards"),
    ],
)
def test_bad_config_values_raise_naming_the_field(data, field):
    data = {"paths": {"shards": "s", "out": "o"}, **data}
    with pytest.raises((ValueError, TypeError), match=field.replace(".", r"\.")):
        RunConfig.from_dict(data)


def test_renamed_fields_say_their_new_name():
    with pytest.raises(ValueError, match=r"model\.norm was renamed model\.hidden_norm"):
        RunConfig.from_dict({"model": {"norm": "layer"}})
    with pytest.raises(ValueError, match=r"training\.normalize was renamed training\.feature_norm"):
        RunConfig.from_dict({"training": {"normalize": "row"}})


def test_cli_set_overrides_nested_values():
    from training.__main__ import _apply_override

    data = {"training": {"optimizer": {"lr": 0.1}}}
    _apply_override(data, "training.optimizer.lr=0.5")
    _apply_override(data, "model.hidden_norm=null")
    assert data == {"training": {"optimizer": {"lr": 0.5}}, "model": {"hidden_norm": None}}


# ----------------------------------------------------------------------------- AMP, schedule, features


def test_grad_scaler_shim_picks_what_this_torch_has(monkeypatch):
    # torch 2.2.1: no torch.amp.GradScaler, so the CUDA one
    monkeypatch.delattr(torch.amp, "GradScaler", raising=False)
    assert precision_mod.grad_scaler_class() is torch.cuda.amp.GradScaler
    assert not precision_mod.grad_scaler(enabled=False).is_enabled()

    class NewScaler:  # torch >= 2.3 signature: GradScaler(device, enabled=...)
        def __init__(self, device, enabled=True):
            self.device, self.enabled = device, enabled

    monkeypatch.setattr(torch.amp, "GradScaler", NewScaler, raising=False)
    scaler = precision_mod.grad_scaler(enabled=True)
    assert isinstance(scaler, NewScaler) and scaler.device == "cuda" and scaler.enabled


def test_precision_means_fp16_with_scaling_on_cuda_and_bf16_on_cpu():
    cuda = precision_mod.resolve_precision("mixed_float16", torch.device("cuda"))
    assert cuda.autocast_dtype == torch.float16 and cuda.loss_scaling
    cpu = precision_mod.resolve_precision("mixed_float16", torch.device("cpu"))
    assert not cpu.loss_scaling
    assert cpu.autocast_dtype == (torch.bfloat16 if precision_mod.cpu_bf16_supported() else None)
    fp32 = precision_mod.resolve_precision("fp32", torch.device("cuda"))
    assert fp32.autocast_dtype is None and not fp32.loss_scaling


def test_learning_rate_warmup_cosine_and_step():
    cos = LRScheduleConfig(type="cosine", warmup_epochs=1, min_lr_ratio=0.1)
    assert learning_rate(cos, 1.0, 0, 10, 100) == pytest.approx(0.1)  # first warmup step
    assert learning_rate(cos, 1.0, 9, 10, 100) == pytest.approx(1.0)  # warmup done
    assert learning_rate(cos, 1.0, 10, 10, 100) == pytest.approx(1.0)
    assert learning_rate(cos, 1.0, 55, 10, 100) == pytest.approx(0.55)  # halfway: (0.1 + 1) / 2
    assert learning_rate(cos, 1.0, 100, 10, 100) == pytest.approx(0.1)
    step = LRScheduleConfig(type="step", step_epochs=2, gamma=0.5)
    assert [learning_rate(step, 1.0, s, 10, 100) for s in (0, 19, 20, 45)] == [1.0, 1.0, 0.5, 0.25]


def test_feature_transforms_and_degree_buckets():
    x = torch.tensor([[1.0, 3.0], [0.0, 0.0], [2.0, -2.0]])
    assert torch.allclose(FeatureTransform("row")(x), torch.tensor([[0.25, 0.75], [0, 0], [0.5, -0.5]]))
    std = FeatureTransform.fit("standard", iter([x[:2], x[2:]]))
    z = std(x)
    assert torch.allclose(z.mean(0), torch.zeros(2), atol=1e-6)
    assert torch.allclose(z.std(0, unbiased=False), torch.ones(2), atol=1e-5)
    # degrees 1, 2, 3, 4, 9 -> buckets floor(log2): 0, 1, 1, 2, 3 (capped at 2 with 3 buckets)
    indptr = np.cumsum([0, 1, 2, 3, 4, 9])
    assert degree_features(indptr, 4).argmax(1).tolist() == [0, 1, 1, 2, 3]
    assert degree_features(indptr, 3).argmax(1).tolist() == [0, 1, 1, 2, 2]


# ----------------------------------------------------------------------------- DDP


def test_ddp_gradients_are_identical_across_ranks_and_the_mean_of_local_ones(sbm, tmp_path):
    out = tmp_path / "grads.pt"
    from tests.ddp_worker import ddp_gradient_worker

    torch.multiprocessing.spawn(
        ddp_gradient_worker, args=(str(sbm["w2"]["shards"]), str(tmp_path / "store"), str(out)), nprocs=2, join=True
    )
    g = torch.load(out, weights_only=True)
    assert torch.equal(g["ddp"][0], g["ddp"][1])  # identical on both ranks
    assert not torch.allclose(g["local"][0], g["local"][1])  # the ranks saw different data
    torch.testing.assert_close(g["ddp"][0], (g["local"][0] + g["local"][1]) / 2, atol=1e-6, rtol=1e-5)


# ----------------------------------------------------------------------------- the loop


def test_training_writes_loadable_outputs_that_join_back_to_original_ids(sbm, tmp_path):
    out = tmp_path / "trained_model"
    summary = train(_run_config(sbm["w2"]["shards"], out, profiler="torch", eval_every=2))
    assert summary["epochs_trained"] == 3 and summary["processes"] == 1 and summary["world_size"] == 2
    assert summary["global_batch"] == 48 * 2
    names = {p.name for p in out.iterdir()}
    assert {
        MODEL_FINAL,
        MODEL_BEST,
        "version.json",
        "predictions.parquet",
        "embeddings.npy",
        "metrics.parquet",
        "curves.png",
        "summary.json",
        "run.yaml",
        "profile",
    } <= names
    assert {p.name for p in (out / "profile").iterdir()} == {"trace.json", "key_averages.txt"}
    json.loads((out / "profile" / "trace.json").read_text())  # valid Chrome-trace JSON
    assert not list(tmp_path.glob(".trained_model.work-*"))  # work folder removed after success

    # predictions: every original id once, probabilities sum to 1, predicted = argmax
    pred = pq.read_table(out / "predictions.parquet").to_pandas()
    nodes = pq.read_table(sbm["w2"]["canonical"] / "nodes.parquet").to_pandas()
    assert list(pred.columns) == ["node_id", "predicted", "probabilities", "index"]
    assert sorted(pred.node_id) == list(range(ID_OFFSET, ID_OFFSET + 400))  # the user's ids, not 0..n-1
    # the user's join: their node table (landing nodes.parquet) on node_id
    landing_nodes = pq.read_table(sbm["landing"] / "nodes.parquet").to_pandas()
    user_join = pred.merge(landing_nodes, on="node_id")
    assert len(user_join) == 400
    joined = pred.merge(nodes, left_on="index", right_on="node_id", suffixes=("", "_c"))
    assert (joined.node_id == joined.original_id).all()
    probs = np.stack(pred.probabilities.to_numpy())
    assert probs.shape == (400, 4) and np.allclose(probs.sum(1), 1, atol=1e-5)
    assert (probs.argmax(1) == pred.predicted).all()
    test = joined[joined.split == "test"]
    assert (test.predicted == test.label).mean() == pytest.approx(summary["test_acc_at_best_val"])
    assert np.load(out / "embeddings.npy").shape == (400, 16)

    # model files (safetensors) load and reproduce the predictions
    model, model_cfg, preprocessing, *_ = load_model(out / MODEL_BEST)
    assert model_cfg.hidden == 16 and preprocessing.input == "features"
    from training.data import read_manifest
    from training.evaluate import load_full_block
    from training.features import full_features

    x = FeatureTransform.fit("row", iter(()))(full_features(read_manifest(sbm["w2"]["shards"]), sbm["w2"]["shards"]))
    logits = model.inference(load_full_block(sbm["w2"]["adjacency"]), x)
    assert (logits.argmax(1).numpy() == pred.predicted.to_numpy()).all()

    metrics = pq.read_table(out / "metrics.parquet").to_pandas()
    assert metrics.epoch.tolist() == [1, 2, 3] and (metrics["rank"] == 0).all()
    assert metrics.val_acc.isna().tolist() == [True, False, False]  # eval_every=2, and after the last
    assert (metrics.data_wait_share.between(0, 1)).all() and (metrics.seeds == 400 * 0.6).all()
    assert (metrics.disk_read_bytes >= 0).all()  # Linux reports it: never NaN here


def test_a_killed_run_resumes_from_its_checkpoint_and_matches_an_uninterrupted_one(sbm, tmp_path):
    shards = sbm["w1"]["shards"]
    full = train(_run_config(shards, tmp_path / "a" / "trained_model", epochs=4))

    class Killed(Exception):
        pass

    def kill_after_second_epoch(epoch, rows):
        if epoch == 1:
            raise Killed

    out = tmp_path / "b" / "trained_model"
    cfg = _run_config(shards, out, epochs=4)
    with pytest.raises(Killed):
        train(cfg, on_epoch_end=kill_after_second_epoch)
    assert not out.exists()  # only a finished run writes the asset folder
    (work,) = out.parent.glob(".trained_model.work-*")
    ckpt = load_checkpoint(work / CHECKPOINT_NAME)  # safetensors: no pickle
    steps = json.loads((shards / "manifest.json").read_text())["minibatches_per_epoch_per_rank"]
    assert ckpt["epoch"] == 1 and ckpt["step"] == 2 * steps and len(ckpt["history"]) == 2

    seen = []
    resumed = train(cfg, on_epoch_end=lambda epoch, rows: seen.append(epoch))
    assert seen == [2, 3]  # epochs 0 and 1 were not repeated
    metrics = pq.read_table(out / "metrics.parquet").to_pandas()
    assert metrics.epoch.tolist() == [1, 2, 3, 4]
    a = load_model_weights(tmp_path / "a" / "trained_model" / MODEL_FINAL)
    b = load_model_weights(out / MODEL_FINAL)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)
    assert resumed["final_test_acc"] == pytest.approx(full["final_test_acc"])


def test_automatic_budget_floors_the_steps_and_caps_the_epochs():
    auto = TrainingConfig(min_steps=400, max_epochs=200)
    assert training_epochs(auto, 3, 1) == 200  # one step per epoch: capped by max_epochs
    assert training_epochs(auto, 3, 4) == 100  # ceil(400 / 4)
    assert training_epochs(auto, 3, 30) == 14  # ceil(400 / 30)
    assert training_epochs(auto, 3, 500) == 3  # never fewer epochs than the shards hold
    assert training_epochs(TrainingConfig(epochs=7), 3, 1) == 7  # an explicit count wins
    assert epoch_passes(7, 3) == [3, 2, 2] and epoch_passes(2, 3) == [1, 1, 0]
    # first pass in stored order; replays get a seed per (seed, epoch, stream), all different
    assert replay_order_seed(0, 2, 3, 0) is None
    seeds = {replay_order_seed(s, e, 3, r) for s in (0, 1) for e in (3, 4) for r in (0, 1)}
    assert None not in seeds and len(seeds) == 8 and replay_order_seed(0, 3, 3, 0) == replay_order_seed(0, 3, 3, 0)


def test_a_replayed_epoch_reads_every_minibatch_once_in_a_new_order(sbm):
    shards = sbm["w1"]["shards"]

    def seeds_of(order_seed):
        with ShardStream(shards, 0, 0, prefetch=0, order_seed=order_seed) as stream:
            return [tuple(mb.seeds.tolist()) for mb in stream]

    stored, again = seeds_of(None), seeds_of(None)
    first, second, first_again = seeds_of(11), seeds_of(12), seeds_of(11)
    assert stored == again and first == first_again  # deterministic
    assert len(stored) == 5  # 240 training nodes in minibatches of <= 48
    for order in (first, second):
        assert sorted(order) == sorted(stored)  # the same minibatches, each once
    assert len({tuple(stored), tuple(first), tuple(second)}) == 3  # in three different orders


class _RecordedCopies:
    """Stands in for `training.copy_streams.CudaCopies`: records what would run on which stream."""

    def __init__(self, log: list):
        self.log, self.on_side, self.events = log, False, 0

    @contextlib.contextmanager
    def side(self):
        self.on_side = True
        yield
        self.on_side = False

    def record(self):
        self.events += 1
        self.log.append(("record", self.events))
        return self.events

    def wait(self, event):
        self.log.append(("wait", event))

    def keep(self, tensor):
        self.log.append(("keep", tensor.data_ptr()))


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_next_minibatch_is_copied_on_the_side_stream_before_the_current_one_computes(sbm, prefetch):
    shards = sbm["w1"]["shards"]
    with ShardStream(shards, 0, 0, prefetch=prefetch) as stream:
        plain = [(mb.index, mb.input_nodes.clone(), mb.x.clone()) for mb in stream]
    log = []
    copies = _RecordedCopies(log)
    stream = ShardStream(shards, 0, 0, prefetch=prefetch, copies=copies)
    move = stream._to_device

    def logged_move(host):
        log.append(("copy", host.index, copies.on_side))
        return move(host)

    stream._to_device = logged_move
    got = []
    with stream:
        for mb in stream:
            log.append(("compute", mb.index))
            got.append((mb.index, mb.input_nodes, mb.x))
    assert len(got) == len(plain) > 2
    for (i, nodes, x), (j, nodes_plain, x_plain) in zip(got, plain):  # the same minibatches, in order
        assert i == j and torch.equal(nodes, nodes_plain) and torch.equal(x, x_plain)
    at = {entry: k for k, entry in enumerate(log) if entry[0] != "keep"}
    events = [entry[1] for entry in log if entry[0] == "record"]
    for t, (i, _, _) in enumerate(got):
        assert at[("copy", i, True)] < at[("record", events[t])] < at[("wait", events[t])] < at[("compute", i)]
        if t + 1 < len(got):
            following = at[("copy", got[t + 1][0], True)]
            assert following < at[("compute", i)]  # the next copy runs while this minibatch computes
            assert not t or at[("compute", got[t - 1][0])] < following  # one minibatch ahead, not more
    kept = [k for k, entry in enumerate(log) if entry[0] == "keep"]
    first_wait, first_compute = at[("wait", events[0])], at[("compute", got[0][0])]
    assert any(first_wait < k < first_compute for k in kept)  # its tensors marked for the compute stream


def _plain_and_cached_rows(sbm, **tiers):
    """(the W=1 shards, their first stream's feature rows read without a cache, a FeatureRows
    with the cache `tiers` asks for, the nodes' degrees)."""
    from training.data import FeatureRows

    shards = sbm["w1"]["shards"]
    with ShardStream(shards, 0, 0, prefetch=0) as stream:
        plain = [mb.x for mb in stream]
    degree = np.diff(np.load(sbm["w1"]["adjacency"] / "indptr.npy"))
    spec = CacheSpec(**{"hot_share": 0.0, **tiers}, device="cpu", degree=degree)
    return shards, plain, FeatureRows("manifest", stream.manifest, Path(shards), cache=spec), degree


def test_a_feature_cache_serves_the_same_rows_and_hits_on_the_next_epoch(sbm):
    shards, plain, rows, _ = _plain_and_cached_rows(sbm, warm_share=1.0, warm_policy="lru")
    for _ in range(2):  # the second pass finds every row in the cache
        with ShardStream(shards, 0, 0, prefetch=1, features=rows) as stream:
            cached = [mb.x for mb in stream]
        assert len(cached) == len(plain) and all(torch.equal(a, b) for a, b in zip(plain, cached, strict=True))
    stats = rows.cache.stats
    assert stats.cold_reads > 0 and stats.warm_hits >= stats.requested // 2


def test_the_degree_policy_caches_the_highest_degree_rows_before_the_first_minibatch(sbm):
    shards, plain, rows, degree = _plain_and_cached_rows(sbm, warm_share=0.25, warm_policy="degree")
    top = np.sort(np.argsort(-degree, kind="stable")[:100])  # 25 % of 400 nodes, ties to the lower id
    assert np.array_equal(rows.cache.cached_nodes(), top)
    with ShardStream(shards, 0, 0, prefetch=1, features=rows) as stream:
        cached = [mb.x for mb in stream]
    assert all(torch.equal(a, b) for a, b in zip(plain, cached, strict=True))
    stats = rows.cache.stats
    assert stats.warm_hits > 0 and stats.warm_hits + stats.cold_reads == stats.requested
    assert np.array_equal(rows.cache.cached_nodes(), top)  # static: nothing was evicted or inserted


def test_a_hot_tier_serves_the_highest_degree_rows_beside_the_host_ones(sbm):
    """With a hot share the host reads only the rows that are not hot; `finish` puts the hot tier's
    rows beside them (on the CPU here, the GPU's memory in CUDA training)."""
    shards, plain, rows, degree = _plain_and_cached_rows(sbm, warm_share=0.1, warm_policy="degree", hot_share=0.1)
    order = np.argsort(-degree, kind="stable")
    assert np.array_equal(rows.cache.hot_nodes, np.sort(order[:40]))  # the top 10 %, then the next 10 % warm
    assert np.array_equal(rows.cache.cached_nodes(), np.sort(order[40:80]))
    with ShardStream(shards, 0, 0, prefetch=1, features=rows) as stream:
        cached = [mb.x for mb in stream]
    assert all(torch.equal(a, b) for a, b in zip(plain, cached, strict=True))
    s = rows.cache.stats
    assert s.hot_hits > 0 and s.warm_hits > 0 and s.hot_hits + s.warm_hits + s.cold_reads == s.requested


def test_the_cuda_path_pins_and_moves_a_hot_split(sbm, monkeypatch):
    """On CUDA the host half of a hot-tier gather is pinned, copied without blocking and finished
    on the device (`pin_memory` needs CUDA: a copy stands in for it here)."""
    shards, plain, rows, _ = _plain_and_cached_rows(sbm, warm_share=0.1, warm_policy="lru", hot_share=0.2)
    pinned_calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t: pinned_calls.append(1) or t.clone())
    pinned = ShardStream(shards, 0, 0, prefetch=1, features=rows)
    pinned.pin, pinned.decode_on_host = True, False
    with pinned:
        got = [mb.x for mb in pinned]
    assert pinned_calls and all(torch.equal(a, b) for a, b in zip(plain, got, strict=True))
    assert rows.cache.stats.hot_hits > 0


def test_training_through_the_feature_cache_learns_the_same_weights(sbm, tmp_path):
    """The cache (either warm policy, with and without a hot tier) hands every minibatch the rows
    the file holds, so a run through it ends with the weights of a run without it."""
    shards = sbm["w1"]["shards"]
    plain = train(_run_config(shards, tmp_path / "plain" / "trained_model", epochs=2))
    ref = load_model_weights(tmp_path / "plain" / "trained_model" / MODEL_FINAL)
    tiers = {
        "degree": dict(feature_cache=0.3),
        "lru": dict(feature_cache=0.3, feature_cache_policy="lru"),
        "hot": dict(feature_cache=0.1, feature_cache_hot=0.2),
    }
    for name, settings in tiers.items():
        out = tmp_path / name / "trained_model"
        s = train(_run_config(shards, out, epochs=2, **settings))
        got = load_model_weights(out / MODEL_FINAL)
        assert all(torch.equal(ref[k], got[k]) for k in ref), name
        assert s["final_test_acc"] == plain["final_test_acc"]
        assert 0 < s["feature_cache_hit_rate"] < 1
        warm, hot = (40, 80) if name == "hot" else (120, 0)  # shares of 400 rows
        assert (s["feature_cache_rows"], s["feature_cache_hot_rows"]) == (warm, hot), name
        assert (s["feature_cache_hot_hit_rate"] > 0) == (name == "hot")
    assert "feature_cache_hit_rate" not in plain
    with pytest.raises(ValueError, match=r"training.feature_cache_hot.*share of the rows"):
        _run_config(shards, tmp_path / "x", feature_cache_hot=1.5)
    with pytest.raises(ValueError, match=r"training.feature_cache_policy.*must be one of"):
        _run_config(shards, tmp_path / "x", feature_cache_policy="fifo")


def test_automatic_budget_replays_the_shards_and_reports_it(sbm, tmp_path):
    # W=1 shards: 2 sampled epochs of 5 minibatches; floor of 12 steps -> ceil(12 / 5) = 3 epochs
    s = train(_run_config(sbm["w1"]["shards"], tmp_path / "out", epochs=0, min_steps=12, early_stopping_patience=0))
    assert s["epochs_planned"] == 3 and s["epochs_trained"] == 3 and s["optimizer_steps"] == 15
    assert s["sampled_epochs"] == 2 and s["sampled_epoch_passes"] == [2, 1]


def test_num_layers_follows_the_shards_and_a_mismatch_is_an_error(sbm, tmp_path):
    shards = sbm["w1"]["shards"]
    manifest = ShardManifest.open(shards)
    assert resolve_num_layers(0, manifest, shards) == 2 == manifest.num_layers
    with pytest.raises(ValueError, match=r"model.num_layers=3 .* holds 2 sampled blocks"):
        resolve_num_layers(3, manifest, shards)
    with pytest.raises(ValueError, match=r"model.num_layers=1 "):
        resolve_num_layers(1, manifest, shards)
    assert resolve_num_layers(5, dataclasses.replace(manifest, shared_block=True), shards) == 5  # cluster_gcn / saint
    cfg = _run_config(shards, tmp_path / "out", epochs=1)
    cfg.model.num_layers = 0
    train(cfg)
    assert load_model(tmp_path / "out" / MODEL_BEST).model.num_layers == 2
    assert "num_layers: 2" in (tmp_path / "out" / "run.yaml").read_text()


def test_gat_and_sage_pool_refuse_non_uniform_samplers(tmp_path):
    for sampler in ("importance", "saint"):
        manifest = _shard_manifest(sampler=sampler)
        for conv in ("gat", "sage_pool"):
            with pytest.raises(
                ValueError, match=rf"model.conv='{conv}' cannot be trained on shards cut with sampler '{sampler}' \("
            ):
                check_sampler_supports(conv, manifest, tmp_path)
        for conv in ("sage", "gcn", "gin"):
            check_sampler_supports(conv, manifest, tmp_path)
    for sampler in ("neighbor", "cluster_gcn"):
        check_sampler_supports("gat", _shard_manifest(sampler=sampler), tmp_path)


def _shard_manifest(**shard_settings) -> str | None:
    """The manifest's ``non_uniform_draws`` as graphs.sampling.writer writes it for these settings."""
    cfg = ShardConfig(**shard_settings)
    return sampler_class(cfg.sampler).non_uniform_draws(cfg)


@pytest.mark.parametrize("prob", ["weight", "adaptive"])
@pytest.mark.parametrize("conv", ["gat", "sage_pool"])
def test_gat_and_sage_pool_refuse_neighbor_draws_in_proportion_to_a_weight(tmp_path, conv, prob):
    manifest = _shard_manifest(sampler="neighbor", samplers={"neighbor": {"prob": prob}})
    with pytest.raises(ValueError) as err:
        check_sampler_supports(ModelConfig(conv=conv).conv, manifest, tmp_path)
    assert str(err.value).startswith(
        f"model.conv='{conv}' cannot be trained on shards cut with sampler 'neighbor' with samplers.neighbor.prob '{prob}' "
        f"({tmp_path / 'manifest.json'}): a "
    )
    assert "re-materialize minibatch_shards with sampler neighbor (samplers.neighbor.prob uniform)" in str(err.value)
    for ok in ("sage", "gcn", "gin"):  # a (weighted) sum or mean takes the Hansen-Hurwitz correction
        check_sampler_supports(ok, manifest, tmp_path)
    check_sampler_supports(
        conv, _shard_manifest(sampler="neighbor", samplers={"neighbor": {"prob": "uniform"}}), tmp_path
    )


def test_early_stopping_stops_every_rank_when_validation_stalls(sbm, tmp_path):
    # a learning rate too small to change any prediction: validation accuracy never improves after epoch 1
    s = train(
        _run_config(
            sbm["w1"]["shards"], tmp_path / "out", epochs=10, early_stopping_patience=2, optimizer={"lr": 1e-12}
        )
    )
    assert s["stopped_early"] and s["epochs_trained"] == 3 and s["best_epoch"] == 1
    assert pq.read_table(tmp_path / "out" / "metrics.parquet").column("epoch").to_pylist() == [1, 2, 3]


def test_training_runs_with_dgl_unimportable(sbm, tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.modules["dgl"] = None          # `import dgl` now raises ImportError
        sys.modules["dagster"] = None      # and training never needs Dagster either
        sys.modules["dagster_pipes"] = None
        from training.config import RunConfig
        from training.train import train
        cfg = RunConfig.from_dict({{
            "model": {{"conv": "gcn", "hidden": 8, "num_layers": 2}},
            "training": {{"epochs": 1, "profiler": "none"}},
            "paths": {{"shards": {str(sbm["w1"]["shards"])!r}, "out": {str(tmp_path / "out")!r}}},
        }})
        s = train(cfg)
        from training import aggregate
        assert aggregate._dgl_module is None, "DGL kernels were used"
        print("OK", s["final_val_acc"])
    """)
    env = {**os.environ, "DGLBACKEND": "pytorch"}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK" in proc.stdout
    assert (tmp_path / "out" / MODEL_FINAL).is_file()


def test_a_dataset_without_features_trains_on_degree_buckets(tmp_path):
    landing = tmp_path / "landing"
    cfg = GenerateConfig(num_nodes=200, num_edges=1500, feature_dim=4, num_classes=2, num_edge_files=1)
    generate_dataset(cfg, landing, progress=False)
    (landing / "features.parquet").unlink()
    d = _pipeline(landing, tmp_path / "home", fanouts="4", batch_size=64, epochs=1, world_size=1)
    s = train(
        RunConfig.from_dict(
            {
                "model": {"conv": "sage", "hidden": 8, "num_layers": 1},
                "training": {"epochs": 1, "profiler": "none", "degree_buckets": 6},
                "paths": {"shards": str(d["shards"]), "out": str(tmp_path / "out")},
            }
        )
    )
    assert s["in_feats"] == 6
    assert load_model(tmp_path / "out" / MODEL_FINAL).in_feats == 6


def test_cora_short_run_reaches_a_sane_accuracy(shared_datasets, tmp_path):
    d = _pipeline(shared_datasets / "cora", tmp_path, fanouts="-1,-1", batch_size=140, epochs=1, world_size=1)
    cfg = RunConfig.from_dict(
        {
            "model": {"conv": "gcn", "hidden": 32, "num_layers": 2, "dropout": 0.5},
            "training": {
                "epochs": 60,
                "eval_every": 20,
                "checkpoint_every": 100,
                "profiler": "none",
                "feature_norm": "row",
                "optimizer": {"type": "Adam", "lr": 0.01, "weight_decay": 5e-4},
            },
            "paths": {"shards": str(d["shards"]), "out": str(tmp_path / "trained_model")},
        }
    )
    s = train(cfg)
    assert s["final_test_acc"] > 0.75, s


# ----------------------------------------------------------------------------- the asset


def _instance(*names):
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, list(names))
    return instance


def test_asset_trains_with_torchrun_through_pipes(sbm, tmp_path, capfd):
    """Also the guard of quiet, truthful logs: on the instance settings `make demo` uses, the console
    shows no DEBUG and no ERROR line, one summary line per stage, progress lines with percent, and
    no beta / preview notice is raised, while the event log keeps Dagster's step events."""
    import warnings

    import yaml

    from assets.canonical_graph import canonical_graph
    from assets.minibatch_shards import minibatch_shards
    from assets.normalized_adjacency import normalized_adjacency

    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(sbm["root"]))
    run_config = {
        "ops": {
            "minibatch_shards": {"config": {"fanouts": "5,5", "batch_size": 48, "epochs": 2, "world_size": 2}},
            # DDP with gradient accumulation (no_sync), CPU bf16 autocast, clipping, checkpointing
            "trained_model": {
                "config": {
                    "model": {"hidden": 16, "activation_checkpointing": True},  # 2 layers: the shards' count
                    "training": {
                        "epochs": 8,
                        "optimizer": {"lr": 0.05},
                        "accumulate": 2,
                        "precision": "mixed_float16",
                        "gradient_clipping": 1.0,
                    },
                }
            },
        }
    }
    from pipelines.dagster_cli_hooks import quiet_dagster_notices

    stages = ["canonical_graph", "normalized_adjacency", "minibatch_shards", "trained_model"]
    settings = yaml.safe_load((Path(__file__).resolve().parents[1] / "pipelines" / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides=settings) as instance, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_dagster_notices()  # what loading pipelines.definitions does in the CLI and the step workers
        instance.add_dynamic_partitions(dataset_partitions.name, ["landing"])
        result = dg.materialize(
            [canonical_graph, normalized_adjacency, minibatch_shards, trained_model],
            partition_key="landing",
            instance=instance,
            resources={"storage": storage},
            run_config=run_config,
        )
        assert result.success
        assert instance.all_logs(result.run_id, of_type=dg.DagsterEventType.STEP_START)  # the UI's history
    captured = capfd.readouterr()
    console = (captured.out + captured.err).splitlines()
    assert not [line for line in console if " - DEBUG - " in line or "ERROR" in line or "STAGE:" in line]
    assert not [line for line in console if "[rank " in line]  # rank 0's lines reach the console once, via pipes
    for stage in stages:
        assert sum(f" - {stage} - {stage} (landing): " in line for line in console) == 1, stage
    assert any(" - trained_model - epoch 8/8 (100%), " in line for line in console), console
    assert any(re.search(r" - minibatch_shards - sampling (\d+)/\1 minibatches \(100%\)", line) for line in console)
    assert not [w for w in caught if issubclass(w.category, (dg.BetaWarning, dg.PreviewWarning))], caught
    (mat,) = result.asset_materializations_for_node("trained_model")
    md = mat.metadata
    assert md["processes"].value == 2 and "--nproc-per-node=2" in md["launch"].value
    assert md["backend"].value == "gloo"  # reported by rank 0 over dagster-pipes
    assert md["global_batch"].value == 48 * 2 * 2 and md["precision"].value.startswith("CPU: mixed_float16")
    assert 0 < md["best_val_acc"].value <= 1 and md["epochs_trained"].value == 8
    for key in ("seconds", "best_val_acc", "seeds_per_s"):  # reported over pipes, rounded like every metadata float
        assert md[key].value == float(f"{md[key].value:.4g}"), (key, md[key].value)
    assert md["sampled_epochs"].value == 2 and md["sampled_epoch_passes"].value == "4,4"  # replayed 4 times each
    assert md["curves"].value.startswith("![training curves](data:image/png;base64,")
    checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    evals = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert checks["test_accuracy_above_majority_class"], evals["test_accuracy_above_majority_class"].metadata
    out = tmp_path / "home" / "landing" / "trained_model"
    metrics = pq.read_table(out / "metrics.parquet").to_pandas()
    assert sorted(zip(metrics.epoch, metrics["rank"])) == [(e, r) for e in range(1, 9) for r in (0, 1)]
    assert (out / "profile" / "trace.json").is_file()
    assert "num_layers: 2" in (out / "run.yaml").read_text()
    assert not list(out.parent.glob(".trained_model.work-*"))  # the launcher and the run used one work folder


def test_asset_skips_a_dataset_without_labels(tmp_path):
    from assets.canonical_graph import canonical_graph
    from tests.conftest import write_edges

    write_edges(tmp_path / "landing" / "plain" / "edges.parquet", [1, 2, 3], [2, 3, 1])
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    # entered, so the current definitions-state storage is this instance's (not a stale one of an
    # earlier test whose instance was collected: the "undefined DagsterInstance weakref" flake)
    with _instance("plain") as instance:
        result = dg.materialize(
            [canonical_graph, trained_model],
            partition_key="plain",
            instance=instance,
            resources={"storage": storage},
        )
    assert result.success
    (mat,) = result.asset_materializations_for_node("trained_model")
    assert mat.metadata["skipped"].value == "no labels"
    assert not (tmp_path / "home" / "plain" / "trained_model").exists()


def test_nsys_wraps_the_command_only_when_installed(monkeypatch, tmp_path):
    from assets import trained_model as tm

    cmd = tm.torchrun_command(2, tmp_path / "run.yaml")
    assert cmd[-6:-4] == ["training.launch", "--nproc-per-node=2"]
    assert cmd[-4:] == ["-m", "training", "--config", str(tmp_path / "run.yaml")]
    monkeypatch.setattr(tm.shutil, "which", lambda name: None)
    assert tm.nsys_wrap(cmd, tmp_path / "r") == (cmd, tm.nsys_wrap(cmd, tmp_path / "r")[1])
    assert tm.nsys_wrap(cmd, tmp_path / "r")[1].startswith("skipped: nsys is not on the PATH")
    monkeypatch.setattr(tm.shutil, "which", lambda name: "/opt/nsys/bin/nsys")
    wrapped, note = tm.nsys_wrap(cmd, tmp_path / "r")
    assert wrapped[:2] == ["/opt/nsys/bin/nsys", "profile"] and wrapped[-len(cmd) :] == cmd and "profiled" in note


def test_retrain_schedule_requests_every_labelled_dataset(sbm, tmp_path):
    from pipelines.definitions import defs

    home = tmp_path / "home"
    (home / "labelled").mkdir(parents=True)
    shutil.copytree(sbm["w1"]["canonical"], home / "labelled" / "canonical_graph")
    (home / "plain" / "canonical_graph").mkdir(parents=True)
    plain = {"format_version": 1, "has_labels": False}
    (home / "plain" / "canonical_graph" / "summary.json").write_text(json.dumps(plain))
    schedule = defs.resolve_schedule_def("retrain_schedule")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    with dg.instance_for_test() as instance:  # schedule contexts need a persistent instance
        instance.add_dynamic_partitions(dataset_partitions.name, ["labelled", "plain", "not-built"])
        with dg.build_schedule_context(
            instance=instance,
            resources={"storage": GnnflowStorage(home=str(home))},
            scheduled_execution_time=datetime.datetime(2026, 1, 4, 3),
        ) as ctx:
            requests = schedule(ctx)
    assert [(r.partition_key, r.run_key) for r in requests] == [("labelled", "labelled:2026-01-04T03:00")]
    assert defs.resolve_job_def("train").partitions_def == dataset_partitions


@pytest.mark.parametrize("encoding", ["fp32", "int8"])
def test_streamed_evaluation_under_a_small_bound_matches_the_in_memory_one(sbm, tmp_path, encoding):
    from training.data import FeatureRows
    from training.evaluate import StreamingEval, load_full_block, row_block
    from training.features import full_features
    from training.layers import ModelConfig, build_model

    d = sbm["w1"]
    if encoding == "int8":  # shards naming compressed_graph's INT8 codes (one part: its Bloom filters are unused)
        from graphs.infra.storage import write_file_hashes
        from graphs.stages.compress import CompressConfig, build_compressed_graph

        part = tmp_path / "one_part"
        part.mkdir()
        np.save(part / "part_id.npy", np.zeros(400, dtype=np.int32))
        (part / "summary.json").write_text('{"format_version": 1, "num_parts": 1}')  # its readers open it
        write_file_hashes(part)  # as a stage publishes it, so compressed_graph can check what it reads
        compressed = tmp_path / "compressed_graph"
        cfg = CompressConfig(feature_encoding="int8", fpr_queries=1000, compare_encodings=False)
        build_compressed_graph(d["canonical"], d["adjacency"], part, compressed, cfg)
        inputs = load_shard_inputs(d["canonical"], d["adjacency"], None, compressed)
        shard_cfg = ShardConfig(fanouts="5,5", batch_size=48, epochs=1, world_size=1, feature_encoding="compressed")
        d = {**d, "shards": tmp_path / "int8_shards"}
        write_minibatch_shards(inputs, d["shards"], shard_cfg)
    shards = d["shards"]
    manifest = read_manifest(shards)
    transform = FeatureTransform.fit("row", iter(()))
    torch.manual_seed(0)
    for conv in ("sage", "gcn", "gat"):
        model = build_model(ModelConfig(conv=conv, hidden=16, num_layers=2, heads=2), 16, 4)
        model.eval()
        emb_mem, logits_mem = model.inference_with_embeddings(
            load_full_block(d["adjacency"]), transform(full_features(manifest, shards))
        )
        features = FeatureRows("manifest", manifest, shards)
        seen = []

        def rows(ids, features=features, seen=seen):
            seen.append(len(ids))
            return transform(features.gather_host(ids, decode=True))

        # 32 destination rows per chunk: far less than the 400 x 16 feature matrix at a time
        threads = torch.get_num_threads()
        stream = StreamingEval(d["adjacency"], rows, 32, tmp_path / conv, "cpu", threads=threads + 1)
        emb, logits = stream.forward(model)
        assert torch.get_num_threads() == threads  # restored after the forward
        assert max(seen) == 32 and len(seen) == 13  # ceil(400 / 32) chunks of the input, read once
        torch.testing.assert_close(logits, logits_mem, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(emb, emb_mem, atol=1e-5, rtol=1e-4)
        assert (logits.argmax(1) == logits_mem.argmax(1)).all()
        # the layer files (written with pwrite) are the in-memory forward's layers
        layer0, layer1 = (np.load(tmp_path / conv / f"layer{i}.npy") for i in (0, 1))
        np.testing.assert_allclose(layer0, emb_mem.numpy(), atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(layer1, logits_mem.numpy(), atol=1e-5, rtol=1e-4)
        assert not (tmp_path / conv / "input.npy").exists()  # dropped once layer 0 is written
        stream.save_embeddings(tmp_path / f"{conv}_embeddings.npy")
        np.testing.assert_array_equal(np.load(tmp_path / f"{conv}_embeddings.npy"), layer0)
        assert not (tmp_path / conv / "layer0.npy").exists()  # moved, not copied

    # a one-layer model: its embeddings are the transformed input features, kept in input.npy
    model = build_model(ModelConfig(conv="sage", hidden=16, num_layers=1), 16, 4)
    model.eval()
    emb, logits = StreamingEval(d["adjacency"], rows, 50, tmp_path / "one", "cpu").forward(model)
    torch.testing.assert_close(emb, transform(full_features(manifest, shards)))
    torch.testing.assert_close(logits, model.inference(load_full_block(d["adjacency"]), emb), atol=1e-5, rtol=1e-4)

    # a row block reads only its rows: destinations first, then the other neighbours ascending
    indptr, indices = np.array([0, 2, 3, 5, 6]), np.array([1, 3, 0, 2, 0, 3])
    block, src = row_block(indptr, indices, None, 1, 3)
    assert src.tolist() == [1, 2, 0] and block.indices.tolist() == [2, 1, 2] and block.indptr.tolist() == [0, 1, 3]
    # reused scratch arrays give the same blocks, chunk after chunk, and are left clean
    scratch = (np.zeros(4, dtype=bool), np.full(4, -7, dtype=np.int64))
    for start, stop in ((1, 3), (0, 2), (2, 4), (1, 3)):
        fresh, fresh_src = row_block(indptr, indices, None, start, stop)
        reused, reused_src = row_block(indptr, indices, None, start, stop, scratch)
        assert reused_src.tolist() == fresh_src.tolist() and reused.indices.tolist() == fresh.indices.tolist()
        assert not scratch[0].any()
    block, src = row_block(indptr, indices, None, 0, 2)
    assert src.tolist() == [0, 1, 3] and block.indices.tolist() == [1, 2, 0] and block.num_src == 3


def test_training_with_streamed_evaluation_matches_in_memory_evaluation(sbm, tmp_path):
    a = train(_run_config(sbm["w1"]["shards"], tmp_path / "a", epochs=2))
    b = train(_run_config(sbm["w1"]["shards"], tmp_path / "b", epochs=2, eval_batch_size=50))
    assert a["best_val_acc"] == b["best_val_acc"] and a["test_acc_at_best_val"] == b["test_acc_at_best_val"]
    pa_, pb = (pq.read_table(tmp_path / x / "predictions.parquet").to_pandas() for x in "ab")
    assert (pa_.predicted == pb.predicted).all()


@pytest.mark.parametrize("eval_batch_size", [0, 50])
def test_a_best_last_epoch_is_not_evaluated_twice(sbm, tmp_path, monkeypatch, eval_batch_size):
    """When the last epoch's model is the best, the final outputs reuse that evaluation's pass
    (a full-graph pass over a large graph costs minutes); they equal a fresh pass."""
    import training.run_setup as run_setup
    import training.train as train_module

    calls = []
    for cls in (run_setup.InMemoryEval, run_setup.StreamedEval):
        original = cls.forward

        def counted(self, model, original=original):
            calls.append(1)
            return original(self, model)

        monkeypatch.setattr(cls, "forward", counted)
    a = train(_run_config(sbm["w1"]["shards"], tmp_path / "a", epochs=1, eval_batch_size=eval_batch_size))
    assert a["best_epoch"] == 1 and len(calls) == 1  # one epoch: its evaluation is the best and the last
    calls.clear()
    b = train(_run_config(sbm["w1"]["shards"], tmp_path / "b", epochs=2, eval_batch_size=eval_batch_size))
    assert len(calls) == (2 if b["best_epoch"] == 2 else 3)
    # the same run with the reuse turned off: one more pass, the same files
    keep = train_module.evaluate_epoch

    def forget(run, epoch, row):
        stop = keep(run, epoch, row)
        run.best_outputs = None
        return stop

    monkeypatch.setattr(train_module, "evaluate_epoch", forget)
    calls.clear()
    c = train(_run_config(sbm["w1"]["shards"], tmp_path / "c", epochs=1, eval_batch_size=eval_batch_size))
    assert len(calls) == 2 and c["best_val_acc"] == a["best_val_acc"]
    assert pq.read_table(tmp_path / "a" / "predictions.parquet").equals(
        pq.read_table(tmp_path / "c" / "predictions.parquet")
    )
    np.testing.assert_array_equal(
        np.load(tmp_path / "a" / "embeddings.npy"), np.load(tmp_path / "c" / "embeddings.npy")
    )


def test_a_model_trained_without_self_loops_is_evaluated_and_applied_without_them(sbm, tmp_path):
    from training.evaluate import load_full_block
    from training.predict import predict

    d = _pipeline(
        sbm["landing"], sbm["root"] / "home", world_size=1, fanouts="5,5", batch_size=48, epochs=1, self_loops=False
    )
    assert read_manifest(d["shards"])["self_loops"] is False
    runs = {}
    for name, eval_batch_size in (("memory", 0), ("streamed", 50)):
        train(_run_config(d["shards"], tmp_path / name, epochs=2, eval_batch_size=eval_batch_size))
        runs[name] = pq.read_table(tmp_path / name / "predictions.parquet").to_pandas()
    assert (runs["memory"].predicted == runs["streamed"].predicted).all()
    loaded = load_model(tmp_path / "memory" / MODEL_BEST)
    assert loaded.preprocessing.self_loops is False and loaded.preprocessing.to_state()["self_loops"] is False
    full = load_full_block(d["adjacency"])
    assert loaded.preprocessing.graph(full).num_edges == full.num_edges - 400  # Â holds every node's loop
    # scoring the same files with the model file gives the predictions training wrote, over the same graph
    predict(tmp_path / "memory" / MODEL_BEST, d["canonical"], d["adjacency"], tmp_path / "scored")
    scored = pq.read_table(tmp_path / "scored" / "predictions.parquet").to_pandas()
    assert (
        scored.sort_values("index").predicted.to_numpy() == runs["memory"].sort_values("index").predicted.to_numpy()
    ).all()
    # a model file written before the key existed reads as trained with self loops
    state = loaded.preprocessing.to_state()
    del state["self_loops"]
    assert Preprocessing(**state).self_loops is True
