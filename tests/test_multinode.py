"""Multi-node torchrun: the launch settings, and 2 nodes x 1 process across two network namespaces."""

import json
import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest
import torch
from netns import two_hosts

from assets.trained_model import TrainedModelConfig, process_count
from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.normalize import build_normalized_adjacency
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training.config import RunConfig, unwrap_dagster_run_config
from training.launch import LaunchConfig, launch_env, other_node_command, torchrun_command
from training.outputs import MODEL_FINAL, load_model_weights
from training.train import train

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- launch settings


def test_launch_config_validates_what_reaches_the_command_line():
    with pytest.raises(ValueError, match="needs launch.rdzv_endpoint"):
        LaunchConfig(nnodes=2)
    for bad in ("10.0.0.1", "10.0.0.1:0", "host;rm -rf /:29400", "a b:1"):
        with pytest.raises(ValueError, match="rdzv_endpoint"):
            LaunchConfig(nnodes=2, rdzv_endpoint=bad)
    with pytest.raises(ValueError, match="socket_ifname"):
        LaunchConfig(socket_ifname="eth0 && x")
    with pytest.raises(ValueError, match="local_addr"):
        LaunchConfig(local_addr="$(hostname)")
    LaunchConfig(nnodes=2, rdzv_endpoint="[fe80::1]:29400")  # IPv6 in brackets is fine


def test_commands_for_one_node_and_for_many(tmp_path):
    one = torchrun_command(4, tmp_path / "run.yaml")
    assert one[1:4] == ["-m", "training.launch", "--nproc-per-node=4"]  # loopback only (training.launch)
    assert one[4:] == ["-m", "training", "--config", str(tmp_path / "run.yaml")]
    launch = LaunchConfig(nnodes=3, rdzv_endpoint="10.1.0.1:29400", local_addr="10.1.0.1", socket_ifname="ib0")
    host = torchrun_command(2, "run.yaml", launch)
    assert "--standalone" not in host
    for arg in (
        "--nnodes=3",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.1.0.1:29400",
        "--rdzv-conf=is_host=1",
        "--local-addr=10.1.0.1",
    ):
        assert arg in host
    other = torchrun_command(2, "run.yaml", launch, is_host=False, local_addr="10.1.0.7")
    assert "--rdzv-conf=is_host=0" in other and "--local-addr=10.1.0.7" in other
    assert launch_env(launch) == {"GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    line = other_node_command(2, "run.yaml", launch)
    assert line.startswith("GLOO_SOCKET_IFNAME=ib0 NCCL_SOCKET_IFNAME=ib0 torchrun --nnodes=3")
    assert "is_host=0 --local-addr=ADDR -m training --config run.yaml" in line


def test_processes_per_node_divide_the_world_size():
    assert process_count(4, "cpu", LaunchConfig(nnodes=2, rdzv_endpoint="h:1")) == 2
    assert process_count(8, "cpu", LaunchConfig(nnodes=2, nproc_per_node=2, rdzv_endpoint="h:1")) == 2
    with pytest.raises(dg.Failure, match="does not divide"):
        process_count(4, "cpu", LaunchConfig(nnodes=3, rdzv_endpoint="h:1"))


def test_dagster_run_config_carries_the_launch_block():
    cfg = TrainedModelConfig(launch={"nnodes": 2, "rdzv_endpoint": "10.0.0.1:29400", "socket_ifname": "eth1"})
    launch = cfg.launch.to_dataclass()
    assert launch == LaunchConfig(nnodes=2, rdzv_endpoint="10.0.0.1:29400", socket_ifname="eth1")
    # python -m training reads the same Dagster YAML and leaves the launcher's block alone
    data = {
        "ops": {"trained_model": {"config": {"model": {"hidden": 8}, "launch": {"nnodes": 2}}}},
        "paths": {"shards": "s", "out": "o"},
    }
    assert RunConfig.from_dict(unwrap_dagster_run_config(data)).model.hidden == 8


# ----------------------------------------------------------------------------- two hosts


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("multinode")
    gen = GenerateConfig(num_nodes=400, num_edges=3000, feature_dim=8, num_classes=3, num_edge_files=1)
    generate_dataset(gen, root / "landing", progress=False)
    can, adj = root / "canonical_graph", root / "normalized_adjacency"
    build_canonical_graph(root / "landing", can)
    build_normalized_adjacency(can, adj)
    out = root / "shards"
    cfg = ShardConfig(fanouts="4,4", batch_size=32, epochs=2, world_size=2)
    write_minibatch_shards(load_shard_inputs(can, adj), out, cfg)
    return {"root": root, "shards": out, "canonical": can, "adjacency": adj}


def _run_config(shards: dict, out: Path) -> RunConfig:
    return RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 16, "num_layers": 2, "dropout": 0.0},
            "training": {"epochs": 3, "device": "cpu", "profiler": "none", "optimizer": {"lr": 0.02}},
            "paths": {
                "shards": str(shards["shards"]),
                "canonical": str(shards["canonical"]),
                "adjacency": str(shards["adjacency"]),
                "out": str(out),
            },
        }
    )


def test_two_nodes_in_network_namespaces_train_the_single_process_model(shards, tmp_path):
    cfg = _run_config(shards, tmp_path / "two_nodes")
    run_yaml = tmp_path / "run.yaml"
    cfg.to_yaml(run_yaml)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DGLBACKEND": "pytorch", "PYTHONPATH": str(ROOT)}
    with two_hosts() as hosts:
        host_addr = hosts[0][1]
        procs = []
        for i, (ns, addr, ifname) in enumerate(hosts):
            launch = LaunchConfig(nnodes=2, rdzv_endpoint=f"{host_addr}:29471", local_addr=addr, socket_ifname=ifname)
            cmd = ["ip", "netns", "exec", ns, *torchrun_command(1, run_yaml, launch, is_host=i == 0)]
            log = open(tmp_path / f"node{i}.log", "w")
            procs.append(
                (subprocess.Popen(cmd, cwd=ROOT, env={**env, **launch_env(launch)}, stdout=log, stderr=log), log)
            )
        try:
            codes = [p.wait(timeout=300) for p, _ in procs]
        finally:
            for p, log in procs:
                if p.poll() is None:
                    p.kill()
                log.close()
    logs = [(tmp_path / f"node{i}.log").read_text()[-3000:] for i in range(2)]
    assert codes == [0, 0], logs
    summary = json.loads((tmp_path / "two_nodes" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["backend"] == "gloo"
    # the two nodes' models are identical (rank 0 gathers every rank's state digest)
    assert len(summary["replica_sha256"]) == 2 and summary["replicas_identical"]

    # one process reading both streams takes the same global batch per step
    single = train(_run_config(shards, tmp_path / "one_process"))
    assert single["processes"] == 1 and single["replicas_identical"]
    a = load_model_weights(tmp_path / "two_nodes" / MODEL_FINAL)
    b = load_model_weights(tmp_path / "one_process" / MODEL_FINAL)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5, rtol=1e-4), k
    assert summary["epochs_trained"] == 3
