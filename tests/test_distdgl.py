"""DistDGL training mode: block conversion, DGL's environment, and 2 machines x (1 server +
1 trainer) in network namespaces with private /dev/shm, training from metis_partitions' files."""

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from netns import two_hosts

from graphs.canonical import build_canonical_graph
from graphs.generate import GenerateConfig, generate_dataset
from graphs.partition import PartitionConfig, build_partitions
from training.distdgl import (
    DistDGLConfig,
    block_from_dgl,
    config_from_args,
    dgl_env,
    load_distdgl_model,
    model_for_fanouts,
    read_ip_config,
)
from training.layers import ModelConfig
from training.outputs import MODEL_FINAL

ROOT = Path(__file__).resolve().parents[1]


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


def _machine_script(args: list[str], log_dir: Path, i: int) -> str:
    """One machine: a private /dev/shm, then its server in the background and its trainer."""
    common = " ".join(shlex.quote(a) for a in args)
    py = shlex.quote(sys.executable)
    server_log, trainer_log = (shlex.quote(str(log_dir / f"{r}{i}.log")) for r in ("server", "trainer"))
    return (
        "mount -t tmpfs tmpfs /dev/shm || exit 97\n"
        f"{py} -m training.distdgl server {common} > {server_log} 2>&1 &\n"
        "server=$!\n"
        f"{py} -m training.distdgl trainer {common} > {trainer_log} 2>&1\n"
        "rc=$?\n"
        "wait $server\n"
        "src=$?\n"
        '[ "$rc" -eq 0 ] && exit "$src"\n'
        'exit "$rc"\n'
    )


def test_two_machines_train_from_the_distdgl_partitions(parts, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DGLBACKEND": "pytorch", "PYTHONPATH": str(ROOT)}
    with two_hosts("gfdd", 232) as hosts:
        probe = subprocess.run(
            ["ip", "netns", "exec", hosts[0][0], "unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /dev/shm"],
            capture_output=True,
            text=True,
        )
        if probe.returncode:
            pytest.skip(f"mount namespaces refused here (`unshare -m` + tmpfs said: {probe.stderr.strip()})")
        ip = tmp_path / "ip.txt"
        ip.write_text("".join(f"{addr} 30150\n" for _, addr, _ in hosts))
        procs = []
        for i, (ns, _addr, ifname) in enumerate(hosts):
            args = ["--machine", str(i), "--ip-config", str(ip), "--part-config", str(parts["part_config"])]
            args += ["--out", str(out), "--torch-port", "29481", "--fanouts", "5,5", "--batch-size", "64"]
            args += ["--epochs", "6", "--lr", "0.03", "--model-hidden", "16", "--model-dropout", "0"]
            script = _machine_script(args, tmp_path, i)
            cmd = ["ip", "netns", "exec", ns, "unshare", "-m", "sh", "-c", script]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**env, "GLOO_SOCKET_IFNAME": ifname}))
        try:
            codes = [p.wait(timeout=240) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    logs = {f.name: f.read_text()[-2500:] for f in sorted(tmp_path.glob("*.log"))}
    assert codes == [0, 0], logs

    summary = json.loads((out / "summary.json").read_text())
    assert summary["machines"] == 2 and summary["trainers"] == 2 and summary["mode"] == "distdgl"
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
