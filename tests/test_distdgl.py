"""DistDGL training mode: block conversion, DGL's environment, and 2 machines x (1 server +
1 trainer) in network namespaces with private /dev/shm, training from metis_partitions' files."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from netns import run_distdgl_machines, skip_without_mount_namespaces, two_hosts

from graphs.stages.canonical import build_canonical_graph
from graphs.stages.partition import PartitionConfig, build_partitions
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training.checkpoint import CHECKPOINT_NAME
from training.distdgl import block_from_dgl, load_distdgl_model
from training.distdgl_config import DistDGLConfig, config_from_args, dgl_env, model_for_fanouts, read_ip_config
from training.distdgl_epochs import epoch_seed, read_checkpoint, run_identity, save_checkpoint
from training.layers import ModelConfig
from training.outputs import METRICS, MODEL_BEST, MODEL_FINAL, SUMMARY


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("distdgl")
    gen = GenerateConfig(num_nodes=600, num_edges=4000, feature_dim=8, num_classes=3, num_edge_files=1)
    generate_dataset(gen, root / "landing", progress=False)
    can, out = root / "canonical_graph", root / "metis_partitions"
    build_canonical_graph(root / "landing", can)
    summary = build_partitions(can, out, PartitionConfig(num_parts=2, clusters_per_part=2), graph_name="gen")
    return {"root": root, "canonical": can, "part_config": out / summary["distdgl_config"], "parts": out}


def test_dgl_blocks_become_csc_blocks_with_the_same_edges():
    import dgl

    g = dgl.graph((torch.tensor([0, 1, 2, 3, 4, 2, 5]), torch.tensor([1, 2, 3, 0, 0, 0, 2])), num_nodes=6)
    dgl.seed(0)
    block = dgl.to_block(dgl.sampling.sample_neighbors(g, torch.tensor([0, 2]), 2), torch.tensor([0, 2]))
    ours = block_from_dgl(block)
    assert (ours.num_src, ours.num_dst) == (block.num_src_nodes(), block.num_dst_nodes())
    src, dst = block.edges()
    want = sorted(zip(dst.tolist(), src.tolist()))
    got = sorted(zip(ours.dst_ids().tolist(), ours.indices.tolist()))
    assert got == want and len(got) == 4
    # destination nodes are the first sources (the layers read x[:num_dst])
    assert block.srcdata[dgl.NID][: ours.num_dst].tolist() == block.dstdata[dgl.NID].tolist() == [0, 2]


def test_flags_become_dgls_environment(parts, tmp_path):
    ip = tmp_path / "ip.txt"
    ip.write_text("10.0.0.1 30050\n10.0.0.2 30050\n")
    assert read_ip_config(ip) == ["10.0.0.1", "10.0.0.2"]
    role, cfg = config_from_args(
        ["server", "--machine", "1", "--server-index", "1", "--servers", "2", "--trainers", "3"]
        + ["--ip-config", str(ip), "--part-config", str(parts["part_config"]), "--model-hidden", "8"]
    )
    assert role == "server" and cfg.index == 1 and cfg.model.hidden == 8
    env = dgl_env(cfg, "server")
    assert env["DGL_SERVER_ID"] == "3" and env["DGL_NUM_CLIENT"] == "6" and env["DGL_NUM_SERVER"] == "2"
    assert "DGL_SERVER_ID" not in dgl_env(cfg, "trainer") and dgl_env(cfg, "trainer")["DGL_ROLE"] == "client"
    with pytest.raises(ValueError, match="lists 2 machines"):
        dgl_env(DistDGLConfig(ip_config=str(ip), part_config=str(parts["part_config"]), machine=2), "server")
    assert model_for_fanouts(replace(cfg, fanouts="4,3,2")).num_layers == 3  # 0 (default): follow the fanouts
    with pytest.raises(ValueError, match="samples 2 blocks"):
        model_for_fanouts(replace(cfg, fanouts="4,4", model=ModelConfig(num_layers=3)))
    ip.write_text("10.0.0.1 30050\nnot-an-ip\n")
    with pytest.raises(ValueError, match="line 2: 'not-an-ip'"):
        read_ip_config(ip)
    with pytest.raises(FileNotFoundError, match="run metis_partitions"):
        DistDGLConfig(ip_config=str(ip), part_config=str(tmp_path / "missing.json"))


def _flags(out: Path, *extra: str) -> list[str]:
    flags = ["--out", str(out), "--torch-port", "29481", "--batch-size", "64", "--lr", "0.03"]
    return flags + ["--model-hidden", "16", "--model-dropout", "0", *extra]


def test_two_machines_train_from_the_distdgl_partitions(parts, tmp_path):
    out = tmp_path / "out"
    with two_hosts("gfdd", 232) as hosts:
        skip_without_mount_namespaces(hosts[0][0])
        flags = _flags(out, "--part-config", str(parts["part_config"]), "--fanouts", "5,5", "--epochs", "6")
        run_distdgl_machines(hosts, flags, tmp_path)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["machines"] == 2 and summary["trainers"] == 2 and summary["mode"] == "distdgl"
    # each machine's veth received at least the feature rows its trainer pulled from the other part
    # (8 float32 features per row), besides the sampled blocks and the gradients
    remote = sum(sum(r["trainer_remote"]) for r in summary["history"])
    feature_bytes = remote * 8 * 4 / (2 * summary["steps_per_trainer"])
    assert all(b > 0 for r in summary["history"] for b in r["trainer_rx_bytes"])
    assert summary["rx_bytes_per_step"] > feature_bytes > 0
    orig_nids = np.load(parts["parts"] / "distdgl" / "orig_nids.npy")
    nodes = pq.read_table(parts["canonical"] / "nodes.parquet", columns=["label", "split"])
    label = nodes.column("label").to_numpy()
    train_ids = np.flatnonzero(nodes.column("split").to_numpy(zero_copy_only=False) == "train")
    seeds = []
    for r in range(2):
        mine = out / f"trainer-{r}"
        s = np.load(mine / "seeds.npy")
        orig = orig_nids[s]
        # DGL's reshuffled ids map back to canonical training nodes, with the labels DistGraph served
        assert np.isin(orig, train_ids).all()
        assert np.array_equal(np.load(mine / "labels.npy"), label[orig])
        losses = json.loads((mine / "losses.json").read_text())
        assert losses["steps"] == summary["steps_per_trainer"] > 0
        assert losses["losses"][-1] < 0.85 * losses["losses"][0], losses
        # seeds come from this machine's part (force_even moves only the surplus), and most
        # sampled input rows live there too
        part_id = np.load(parts["parts"] / "part_id.npy")
        assert losses["part"] == r and np.mean(part_id[orig] == r) == pytest.approx(losses["local_seed_share"])
        assert losses["local_seed_share"] > 0.8 and 0 < losses["remote_input_share"] < 0.5
        seeds.append(orig)
    assert len(seeds[0]) == len(seeds[1]) == summary["seeds_per_trainer"]
    assert not np.intersect1d(seeds[0], seeds[1]).size  # disjoint
    assert len(train_ids) - 1 <= len(seeds[0]) + len(seeds[1]) <= len(train_ids)  # all (one dropped if odd)
    state = load_distdgl_model(out / MODEL_FINAL)["state_dict"]
    assert all(torch.isfinite(v).all() for v in state.values())

    # evaluation: every trainer's share of val/test, counts summed over both
    history = summary["history"]
    assert [r["epoch"] for r in history] == list(range(1, 7))
    val = [r["val_acc"] for r in history]
    test = [r["test_acc"] for r in history]
    assert all(0 <= a <= 1 for a in val + test)
    assert val[-1] > val[0] and max(val) > 0.6 and max(test) > 0.6  # 3 classes: chance is ~1/3
    assert summary["best_val_acc"] == max(val) and val.index(max(val)) + 1 == summary["best_epoch"]
    assert summary["test_acc_at_best_val"] == test[summary["best_epoch"] - 1]
    assert (summary["final_val_acc"], summary["final_test_acc"]) == (val[-1], test[-1])
    assert [r["loss"] for r in history] == pytest.approx(
        [np.mean(r["trainer_losses"]) for r in history]  # equal seed counts: the mean of the trainers'
    )
    metrics = pq.read_table(out / METRICS).to_pylist()
    assert [m["epoch"] for m in metrics] == list(range(1, 7))
    assert [m["val_acc"] for m in metrics] == val and [m["loss"] for m in metrics] == [r["loss"] for r in history]
    assert all(m["steps"] == summary["steps_per_trainer"] // 6 and m["epoch_seconds"] > 0 for m in metrics)
    best = load_distdgl_model(out / MODEL_BEST)
    assert best["epoch"] == summary["best_epoch"] and best["model"]["hidden"] == 16


def test_a_stopped_run_resumes_from_its_checkpoint_as_if_uninterrupted(parts, tmp_path):
    # full neighbourhoods: the servers' neighbour sampling (remote seeds) draws from their own
    # random streams, so sampled fanouts differ between any two runs, resumed or not
    flags = ["--part-config", str(parts["part_config"]), "--fanouts=-1,-1", "--epochs", "3"]
    with two_hosts("gfdr", 233) as hosts:
        skip_without_mount_namespaces(hosts[0][0])
        run_distdgl_machines(hosts, _flags(tmp_path / "full", *flags), tmp_path / "full-logs")
        stopped = _flags(tmp_path / "resumed", *flags, "--stop-after-epoch", "2")
        run_distdgl_machines(hosts, stopped, tmp_path / "stop-logs")
        assert (tmp_path / "resumed" / CHECKPOINT_NAME).is_file()
        assert not (tmp_path / "resumed" / MODEL_FINAL).exists() and not (tmp_path / "resumed" / SUMMARY).exists()
        run_distdgl_machines(
            hosts, stopped, tmp_path / "resume-logs"
        )  # the same command: epoch 2 is behind it, so to the end
    full = json.loads((tmp_path / "full" / SUMMARY).read_text())
    resumed = json.loads((tmp_path / "resumed" / SUMMARY).read_text())
    assert resumed["resumed_after_epoch"] == 2 and full["resumed_after_epoch"] == 0
    assert [r["epoch"] for r in resumed["history"]] == [1, 2, 3]
    # the same rows: DGL merges a batch's locally and remotely sampled edges in arrival order, so
    # the aggregation's float32 sums may be ordered differently (~1e-7 apart between any two runs)
    for a, b in zip(full["history"], resumed["history"], strict=True):
        assert a["trainer_inputs"] == b["trainer_inputs"] and a["steps"] == b["steps"]
        assert b["trainer_losses"] == pytest.approx(a["trainer_losses"], rel=1e-5), (a, b)
        for key in ("val_acc", "test_acc", "minibatch_acc"):
            assert b[key] == pytest.approx(a[key], abs=0.01), (key, a, b)  # one node at most
    for r in range(2):  # every trainer's losses.json holds the epochs before the resume too
        losses = json.loads((tmp_path / "resumed" / f"trainer-{r}" / "losses.json").read_text())["losses"]
        assert losses == [row["trainer_losses"][r] for row in resumed["history"]]
    final, final_resumed = (load_distdgl_model(tmp_path / d / MODEL_FINAL)["state_dict"] for d in ("full", "resumed"))
    for name, value in final.items():
        torch.testing.assert_close(final_resumed[name], value, rtol=1e-4, atol=1e-5)


def test_a_checkpoint_of_another_run_is_refused_with_the_differing_setting(tmp_path):
    identity = run_identity({"lr": 0.03, "epochs": 3, "out": "a", "model": {"hidden": 16}}, machines=2)
    assert "out" not in identity and identity["machines"] == 2
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(path, {"epoch": 2, "rows": [], "best": None, "config": identity})
    assert read_checkpoint(path, run_identity({"lr": 0.03, "epochs": 3, "out": "b", "model": {"hidden": 16}}, 2))
    assert read_checkpoint(tmp_path / "none.safetensors", identity) is None
    with pytest.raises(
        ValueError, match=r"checkpoint\.safetensors: a checkpoint of another run \(model\.hidden=16 there"
    ):
        read_checkpoint(path, identity | {"model": {"hidden": 32}})
    with pytest.raises(ValueError, match="machines=2 there, 3 here"):
        read_checkpoint(path, identity | {"machines": 3})
    seeds = {epoch_seed(0, rank, epoch) for rank in range(2) for epoch in range(1, 4)}
    assert len(seeds) == 6 and max(seeds) < 2**31 and epoch_seed(0, 1, 2) == epoch_seed(0, 1, 2)
