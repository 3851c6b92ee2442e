"""The training loop with the issue-14 options on: gradient moving average, VR-GCN, a DDP
communication hook with byte counting (2 ranks through torchrun), under accumulation."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training.config import RunConfig
from training.outputs import MODEL_FINAL, load_model_weights
from training.train import train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    """A 400-node DC-SBM; shards at fanouts 2,2 for W=1 and W=2."""
    root = tmp_path_factory.mktemp("techniques")
    cfg = GenerateConfig(num_nodes=400, num_edges=3000, feature_dim=16, num_classes=4, num_edge_files=1)
    generate_dataset(cfg, root / "landing", progress=False)
    can, adj = root / "canonical_graph", root / "normalized_adjacency"
    build_canonical_graph(root / "landing", can)
    build_normalized_adjacency(can, adj)
    inputs = load_shard_inputs(can, adj)
    out = {}
    for w in (1, 2):
        out[w] = root / f"shards-w{w}"
        write_minibatch_shards(inputs, out[w], ShardConfig(fanouts="2,2", batch_size=48, epochs=2, world_size=w))
    return out


def _config(shards: Path, out: Path, **training) -> RunConfig:
    return RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 16, "dropout": 0.2},
            "training": {"epochs": 3, "profiler": "none", "optimizer": {"lr": 0.01}, **training},
            "paths": {"shards": str(shards), "out": str(out)},
        }
    )


def test_vrgcn_and_grad_ema_train_and_differ_from_the_plain_run(small, tmp_path):
    plain = train(_config(small[1], tmp_path / "plain" / "trained_model"))
    comp = {"grad_ema": 0.8, "vrgcn": True}
    both = train(_config(small[1], tmp_path / "both" / "trained_model", compensation=comp, accumulate=2))
    assert 0.25 < both["final_val_acc"] <= 1.0  # above chance (4 balanced classes) after 3 epochs
    assert both["final_loss"] != pytest.approx(plain["final_loss"])
    assert "comm_bytes_per_step" not in plain  # counting is off by default


def test_ddp_int8_hook_counts_its_bytes_in_the_summary(small, tmp_path):
    out = tmp_path / "trained_model"
    cfg = _config(small[2], out, comm={"hook": "int8", "count_bytes": True}, accumulate=2)
    cfg.to_yaml(tmp_path / "run.yaml")
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        str(torchrun),
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "training",
        "--config",
        str(tmp_path / "run.yaml"),
    ]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    summary = json.loads((out / "summary.json").read_text())
    state = load_model_weights(out / MODEL_FINAL)
    numel = sum(v.numel() for k, v in state.items() if v.is_floating_point())
    # one bucket (the model is far below 25 MB): numel int8 codes + a 4-byte scale, sent once
    # per optimizer step (accumulate 2: no_sync on the first minibatch)
    assert summary["comm_bytes_per_step"] == pytest.approx(numel + 4)
    assert summary["replicas_identical"]


def test_state_digest_covers_batch_norm_counters():
    """A model with BatchNorm (a 0-dim int64 num_batches_tracked) digests, and the counter counts."""
    from training.distributed import state_digest
    from training.layers import GNN

    model = GNN(8, 16, 3, 2, "sage", hidden_norm="batch")
    before = state_digest(model)
    model.norms[0].num_batches_tracked += 1
    assert state_digest(model) != before
