"""Rebalancing between retrains (`graphs.sampling.rebalance`): a rank made slower per seed gets a
smaller share of the next shards' seeds, the ranks' busy times even out, and a balanced run changes
nothing."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from graphs.formats.shard_manifest import ShardManifest
from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
from graphs.sampling.rebalance import rank_shares, share_sizes
from graphs.sampling.schedule import epoch_seed_batches
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from tests.conftest import folder_bytes
from training.data import ShardStream, cross_entropy
from training.layers import ModelConfig, build_model
from training.outputs import METRICS, rank_seeds_per_second

ROOT = Path(__file__).resolve().parents[1]
SHARDS = dict(sampler="neighbor", fanouts="5,5", batch_size=40, epochs=1, world_size=2, workers=1)


def test_shares_follow_speed_and_stay_equal_within_the_tolerance():
    assert rank_shares([100.0, 95.0, 104.0], 0.1) is None
    np.testing.assert_allclose(rank_shares([300.0, 100.0], 0.1), [0.75, 0.25])
    with pytest.raises(ValueError, match="positive and finite"):
        rank_shares([100.0, 0.0], 0.1)


@pytest.mark.parametrize(
    "total, shares, batch_size", [(1000, [0.75, 0.25], 100), (1000, [0.97, 0.01, 0.02], 64), (17, [0.5, 0.5], 4)]
)
def test_share_sizes_cover_every_seed_with_one_minibatch_count(total, shares, batch_size):
    sizes, batches = share_sizes(total, np.array(shares), batch_size)
    assert sizes.sum() == total and sizes.min() >= batches  # one seed per minibatch at least
    assert sizes.max() <= batches * batch_size
    ideal = np.array(shares) * total
    lifted = ideal < batches  # raised to the floor, the seeds taken from the largest share
    assert np.all(sizes[lifted] == batches)
    moved = int((batches - np.floor(ideal[lifted])).sum())
    assert np.all(np.abs(sizes - ideal) <= moved + 1)


def test_a_rebalanced_epoch_gives_each_rank_its_share_in_equal_step_counts():
    train = np.arange(5, 1205, dtype=np.int64)
    cfg = ShardConfig(**SHARDS)
    equal = epoch_seed_batches(train, 0, cfg)
    assert [len(np.concatenate(r)) for r in equal] == [600, 600]
    placed = epoch_seed_batches(train, 0, cfg, rank_shares=np.array([0.8, 0.2]))
    assert [len(r) for r in placed] == [24, 24]  # ceil(960 / 40) minibatches on each rank
    assert [len(np.concatenate(r)) for r in placed] == [960, 240]
    assert np.array_equal(np.sort(np.concatenate([np.concatenate(r) for r in placed])), train)


@pytest.fixture(scope="module")
def graph(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("rebalance")
    gen = GenerateConfig(num_nodes=1200, num_edges=9000, feature_dim=16, num_classes=4, num_edge_files=1)
    generate_dataset(gen, root / "landing", progress=False)
    build_canonical_graph(root / "landing", root / "canonical_graph")
    build_normalized_adjacency(root / "canonical_graph", root / "normalized_adjacency")
    return {"root": root, "canonical": root / "canonical_graph", "adjacency": root / "normalized_adjacency"}


def _shards(graph: dict, name: str, shares=None, **settings) -> Path:
    out = graph["root"] / name
    inputs = load_shard_inputs(graph["canonical"], graph["adjacency"], rank_shares=shares)
    write_minibatch_shards(inputs, out, ShardConfig(**{**SHARDS, **settings}))
    return out


def test_balanced_ranks_leave_the_shard_files_unchanged(graph):
    plain = _shards(graph, "plain")
    balanced = _shards(graph, "balanced", rank_shares([812.0, 790.0], 0.1), rebalance=True)
    shard_files = {k: v for k, v in folder_bytes(plain).items() if k.endswith(".npz")}
    assert len(shard_files) > 2
    assert shard_files == {k: v for k, v in folder_bytes(balanced).items() if k.endswith(".npz")}
    assert "rebalance" not in ShardManifest.open(balanced).doc
    assert ShardManifest.open(balanced).loss_scales == [1.0, 1.0]


def _train_slowed(shards: Path, out: Path, seconds_per_seed: float) -> dict:
    """Two ranks through the one-node launcher, rank 1 slowed; {rank: (busy seconds, seeds, steps)}
    over the epochs after the first (whose first calls cost both ranks about a second here)."""
    run = {
        "model": {"conv": "sage", "hidden": 16, "num_layers": 2, "dropout": 0.0},
        "training": {"epochs": 3, "profiler": "none", "device": "cpu", "prefetch": 0},
        "paths": {"shards": str(shards), "out": str(out)},
    }
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump(run))
    env = {**os.environ, "SLOW_SECONDS_PER_SEED": str(seconds_per_seed), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "training.launch", "--nproc-per-node=2", "-m", "tests.slow_rank_worker"]
    proc = subprocess.run(
        [*command, "--config", str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = [r for r in pq.read_table(out / METRICS).to_pylist() if r["epoch"] > 1]
    ranks = {
        r: (
            sum(x["data_seconds"] + x["forward_seconds"] for x in rows if x["rank"] == r),
            sum(x["seeds"] for x in rows if x["rank"] == r),
            {x["steps"] for x in rows if x["rank"] == r},
        )
        for r in (0, 1)
    }
    epochs = {x["epoch"] for x in rows}
    epoch_seconds = sum(max(x["train_seconds"] for x in rows if x["epoch"] == e) for e in epochs) / len(epochs)
    return {"ranks": ranks, "epoch_seconds": epoch_seconds}


def _imbalance(run: dict) -> float:
    busy = [rank[0] for rank in run["ranks"].values()]
    return max(busy) / np.mean(busy)


def test_a_slowed_rank_gets_fewer_seeds_and_the_busy_times_even_out(graph):
    slow = 0.0005  # seconds per seed on rank 1
    # minibatches of 180 seeds: the per-seed work, which shares move, outweighs the per-minibatch costs
    plain = _shards(graph, "slowed-plain", batch_size=180)
    before = _train_slowed(plain, graph["root"] / "run-before", slow)
    speeds = rank_seeds_per_second(graph["root"] / "run-before" / METRICS)
    assert speeds[1] < speeds[0] / 2  # the sleep dominates rank 1's time
    shares = rank_shares([speeds[0], speeds[1]], 0.1)
    rebalanced = _shards(graph, "slowed-rebalanced", shares, rebalance=True, batch_size=180)
    manifest = ShardManifest.open(rebalanced)
    np.testing.assert_allclose(manifest.loss_scales, 2 * shares)
    after = _train_slowed(rebalanced, graph["root"] / "run-after", slow)

    b, a = before["ranks"], after["ranks"]
    assert b[0][1] == b[1][1] and a[0][1] > 2 * a[1][1]  # seeds moved to the fast rank
    assert a[0][1] + a[1][1] == b[0][1] + b[1][1]  # every seed still once per epoch
    assert a[0][2] == a[1][2]  # equal step counts on both ranks
    print(
        f"busy-time imbalance (max/mean) {_imbalance(before):.3f} -> {_imbalance(after):.3f}; "
        f"epoch {before['epoch_seconds']:.3f} s -> {after['epoch_seconds']:.3f} s; shares {np.round(shares, 4)}"
    )
    assert _imbalance(after) < _imbalance(before)
    assert after["epoch_seconds"] < before["epoch_seconds"] / 1.5


def test_the_loss_scales_make_the_averaged_gradient_the_mean_over_all_seeds(graph):
    """What DDP computes from rebalanced shards, (1/W) sum_r grad(W s_r L_r) with L_r a rank's mean
    loss, is the gradient of the mean over both ranks' seeds; without the scales the smaller
    rank's seeds would weigh three times as much."""
    shards = _shards(graph, "scaled", np.array([0.75, 0.25]), rebalance=True, batch_size=1000)
    scales = ShardManifest.open(shards).loss_scales
    assert scales == [1.5, 0.5]
    torch.manual_seed(0)
    model = build_model(ModelConfig(conv="sage", hidden=16, num_layers=2, dropout=0.0), 16, 4)
    first = [next(iter(ShardStream(shards, r, 0, prefetch=0))) for r in (0, 1)]  # one minibatch per rank
    n = [mb.num_seeds for mb in first]
    assert n == [540, 180]

    def grad(weights) -> torch.Tensor:
        model.zero_grad()
        sum(w * cross_entropy(mb, model(mb.blocks, mb.x)) for w, mb in zip(weights, first)).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    scaled = grad([s / 2 for s in scales])
    mean_over_seeds = grad([k / sum(n) for k in n])
    unscaled = grad([0.5, 0.5])
    torch.testing.assert_close(scaled, mean_over_seeds, rtol=1e-5, atol=1e-7)
    assert (unscaled - mean_over_seeds).abs().max() > 100 * (scaled - mean_over_seeds).abs().max()
