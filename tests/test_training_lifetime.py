"""Training lives no longer than its step and writes only under its dataset lock; one node
listens on loopback only; launch settings are matched whole; a non-finite loss stops training
and publishes nothing."""

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from graphs.infra.storage import dataset_lock
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from tests.conftest import folder_bytes, wait_for_path
from tests.kill_worker import STAGES, run_stage
from training.launch import LaunchConfig, torchrun_command

ROOT = Path(__file__).resolve().parents[1]
MARK = "GNNFLOW_TEST_MARK"  # inherited by every process a test starts, so their descendants can be found


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict:
    """landing/ds and home/ds with every stage up to minibatch_shards (2 streams)."""
    root = tmp_path_factory.mktemp("lifetime")
    cfg = GenerateConfig(num_nodes=300, num_edges=2000, feature_dim=6, num_classes=3, num_edge_files=2, seed=1)
    generate_dataset(cfg, root / "landing" / "ds", progress=False)
    for stage in STAGES:
        run_stage(stage, root / "home" / "ds", root / "landing" / "ds")
    return {"home": root / "home", "landing": root / "landing", "ds": root / "home" / "ds"}


def _env(mark: str = "") -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DGLBACKEND": "pytorch", "OMP_NUM_THREADS": "1", MARK: mark}


def _run_yaml(dataset: dict, out: Path, epochs: int, **training) -> Path:
    from training.config import RunConfig

    cfg = RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 8, "num_layers": 2},
            "training": {"epochs": epochs, "device": "cpu", "profiler": "none", "eval_every": 1, **training},
            "paths": {"shards": str(dataset["ds"] / "minibatch_shards"), "out": str(out)},
        }
    )
    path = out.parent / "run.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(path)
    return path


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _marked(mark: str) -> list[int]:
    """Living processes whose environment carries MARK=mark."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"{MARK}={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    return [pid for pid in found if _alive(pid)]


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still alive after waiting up to `seconds` for them to die."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


# ----------------------------------------------------------------------------- tied to the step


def test_killing_the_step_ends_its_training_and_a_rerun_trains_alone(dataset, tmp_path):
    ds, mark, epochs = dataset["ds"], uuid.uuid4().hex, 100  # longer than the waits below
    step_cmd = [sys.executable, "-m", "tests.lifetime_worker", "step", str(dataset["home"]), str(dataset["landing"])]
    step_cmd += ["ds", str(epochs)]
    with open(tmp_path / "step.log", "w") as log:
        step = subprocess.Popen(step_cmd, cwd=ROOT, env=_env(mark), stdout=log, stderr=subprocess.STDOUT)
        wait_for_path(".trained_model.work-*/checkpoint.*", ds, step)  # training is under way
    training = [pid for pid in _marked(mark) if pid != step.pid]
    assert len(training) == 3, (training, (tmp_path / "step.log").read_text()[-3000:])  # launcher, 2 ranks
    step.send_signal(signal.SIGKILL)  # what the OOM killer does
    step.wait(30)

    assert _gone_within(training, 10) == []  # the launcher and both ranks died with the step
    with dataset_lock(ds, timeout_s=5):  # and nothing holds the dataset lock any more
        pass
    assert not (ds / "trained_model").exists()  # nothing published by the killed run

    again = subprocess.run(step_cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming from" in again.stdout + again.stderr
    per_epoch = collections.Counter(pq.read_table(ds / "trained_model" / "metrics.parquet")["epoch"].to_pylist())
    # each epoch trained once, by one training: two ranks' rows per epoch, none twice
    assert per_epoch == {epoch: 2 for epoch in range(1, epochs + 1)}
    assert list(ds.glob(".trained_model.work-*")) == []


def test_a_process_under_a_killed_holders_lock_learns_it_lost_the_lock(tmp_path):
    folder, out, trigger = tmp_path / "ds", tmp_path / "answers", tmp_path / "go"
    cmd = [sys.executable, "-m", "tests.lifetime_worker", "hold", str(folder), str(out), str(trigger)]
    holder = subprocess.Popen(cmd, cwd=ROOT, env=_env())
    try:
        wait_for_path("answers", tmp_path, holder, 60)
        time.sleep(0.2)
        assert out.read_text() == "held\n"  # runs under its ancestor's lock
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    trigger.touch()
    deadline = time.monotonic() + 30
    while len(out.read_text().splitlines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    answer = out.read_text().splitlines()[1]
    assert (
        answer.startswith("lost: ")
        and f"no longer holds the dataset lock (pid {holder.pid}, which held it, is gone)" in answer
    )


def test_a_child_given_the_lock_descriptor_keeps_the_lock_after_its_holder_dies(tmp_path):
    from graphs.infra.storage import DatasetLockTimeout

    folder, out = tmp_path / "ds", tmp_path / "child"
    cmd = [sys.executable, "-m", "tests.lifetime_worker", "share", str(folder), str(out)]
    holder = subprocess.Popen(cmd, cwd=ROOT, env=_env())
    wait_for_path("child", tmp_path, holder, 60)
    time.sleep(0.2)
    child = int(out.read_text())
    holder.send_signal(signal.SIGKILL)
    holder.wait(30)
    try:
        with pytest.raises(DatasetLockTimeout):  # the child holds it now: a re-run waits
            with dataset_lock(folder, timeout_s=1):
                pass
    finally:
        os.kill(child, signal.SIGKILL)
    assert _gone_within([child], 10) == []
    with dataset_lock(folder, timeout_s=5):  # released with the last process holding it
        pass


def test_leaving_a_tied_process_block_stops_the_process(tmp_path):
    from training.lifetime import tied_process

    with pytest.raises(RuntimeError, match="the step failed"):
        with tied_process([sys.executable, "-c", "import time; time.sleep(120)"], env=_env(), grace_s=5) as proc:
            raise RuntimeError("the step failed")
    assert proc.returncode == -signal.SIGTERM


# ----------------------------------------------------------------------------- loopback only


def _non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def test_one_node_training_listens_on_loopback_only_and_its_ranks_die_with_the_launcher(dataset, tmp_path):
    out = tmp_path / "ds" / "trained_model"
    command = torchrun_command(2, _run_yaml(dataset, out, epochs=400, early_stopping_patience=0))
    assert command[1:4] == ["-m", "training.launch", "--nproc-per-node=2"]
    with open(tmp_path / "train.log", "w") as log:
        launcher = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_path(".trained_model.work-*/checkpoint.*", out.parent, launcher)
        tree = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
        assert len(tree) == 3, (tree, (tmp_path / "train.log").read_text()[-3000:])
        listening = {
            (c.laddr.ip, c.laddr.port)
            for p in tree
            for c in p.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        rank0 = next(p for p in tree if p.environ().get("RANK") == "0")
        assert ("127.0.0.1", int(rank0.environ()["MASTER_PORT"])) in listening  # the group's store
        assert {ip for ip, _ in listening} <= {"127.0.0.1", "::1"}, listening
        other = _non_loopback_ipv4()
        for _, port in listening if other else ():  # refused from this host's network address
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((other, port), timeout=5).close()
        ranks = [p.pid for p in tree[1:]]
    finally:
        launcher.send_signal(signal.SIGKILL)  # the launcher alone: its ranks have to follow it
        launcher.wait(30)
    assert _gone_within(ranks, 15) == []


# ----------------------------------------------------------------------------- launch settings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("rdzv_endpoint", "10.0.0.1:29400\n"),
        ("rdzv_endpoint", "host\n:29400"),
        ("rdzv_endpoint", "10.0.0.1:２９４００"),
        ("local_addr", "host\n"),
        ("rdzv_id", "gnnflow\n"),
        ("socket_ifname", "eth0\n"),
        ("k8s_namespace", "ml\n"),
        ("k8s_volume_claim", "data\n"),
        ("k8s_image", "reg/gnnflow:1\n"),
    ],
)
def test_launch_settings_are_matched_whole(name, value):
    good = {"nnodes": 2, "rdzv_endpoint": "10.0.0.1:29400"}
    LaunchConfig(**{**good, name: value.replace("\n", "").replace("２９４００", "29400")})  # the same, clean
    with pytest.raises(ValueError, match=f"launch.{name}="):
        LaunchConfig(**{**good, name: value})


def test_the_one_node_launcher_refuses_options_that_replace_its_rendezvous():
    from training.launch import main

    options = ("--standalone", "--rdzv-backend=c10d", "--rdzv_endpoint=0.0.0.0:29400", "--master-addr=0.0.0.0")
    abbreviated = ("--standa", "--rdzv-b=c10d", "--nn=2", "--local_a=0.0.0.0")  # what torchrun's parser accepts
    for option in options + abbreviated:
        with pytest.raises(SystemExit, match="remove .*it runs one node with its own rendezvous on loopback"):
            main([option, "--nproc-per-node=2", "-m", "training", "--config", "run.yaml"])


def test_one_node_refuses_a_network_interface_and_the_command_checks_its_address():
    with pytest.raises(ValueError, match="socket_ifname.*loopback"):
        LaunchConfig(socket_ifname="eth0")
    launch = LaunchConfig(nnodes=2, rdzv_endpoint="10.0.0.1:29400")
    with pytest.raises(ValueError, match="local_addr"):
        torchrun_command(1, "run.yaml", launch, local_addr="10.0.0.2\n")


# ----------------------------------------------------------------------------- non-finite loss

DIVERGING = {"type": "AdamW", "lr": 100.0, "weight_decay": 100.0}  # the largest rate and decay allowed
NON_FINITE = r"(nan|-?inf)"  # how Python prints a float that is not finite


def test_a_non_finite_loss_stops_training_and_publishes_nothing(dataset, tmp_path):
    from training.config import RunConfig
    from training.loss_check import NonFiniteLossError
    from training.train import train

    out = tmp_path / "ds" / "trained_model"
    train(RunConfig.from_yaml(_run_yaml(dataset, out, epochs=2)))
    before = folder_bytes(out)
    cfg = RunConfig.from_yaml(_run_yaml(dataset, out, epochs=5, optimizer=DIVERGING))
    with pytest.raises(NonFiniteLossError) as err:
        train(cfg)
    message = str(err.value)
    # AdamW's decay at lr 100 multiplies the parameters by -1e4 each step: they overflow, and whether
    # the loss comes out NaN or infinite depends on the CPU's kernels (the logits' overflow order)
    assert re.search(rf"the training loss is {NON_FINITE} at epoch \d, optimizer step \d of 3", message), message
    assert "nothing was published" in message
    assert "training.feature_norm='row'" in message and "training.optimizer.lr=100" in message
    assert "a corrupted input" in message
    assert folder_bytes(out) == before  # the previous model, byte for byte

    # the same under the one-node launcher: the run fails with the message, nothing published
    run = subprocess.run(
        torchrun_command(2, _run_yaml(dataset, out, epochs=5, optimizer=DIVERGING)),
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode != 0
    printed = run.stdout + run.stderr
    assert re.search(
        rf"NonFiniteLossError: the training loss is {NON_FINITE} at epoch \d, optimizer step \d of 3", printed
    ), printed[-4000:]
    assert folder_bytes(out) == before


def test_link_prediction_stops_on_a_non_finite_loss(tmp_path):
    from graphs.sampling import ShardConfig, load_shard_inputs
    from graphs.sampling.link import write_link_shards
    from graphs.stages.canonical import build_canonical_graph
    from graphs.stages.compress import CompressConfig, build_compressed_graph
    from graphs.stages.edge_split import EdgeSplitConfig, build_edge_split
    from graphs.stages.normalize import build_normalized_adjacency
    from graphs.stages.partition import PartitionConfig, build_partitions
    from training.layers import ModelConfig
    from training.link import LINK_DEFAULTS, LinkConfig
    from training.link_train import train_link
    from training.loss_check import NonFiniteLossError
    from training.task_settings import task_blocks, with_values

    generate_dataset(
        GenerateConfig(num_nodes=300, num_edges=2000, feature_dim=8, seed=5), tmp_path / "l", progress=False
    )
    build_canonical_graph(tmp_path / "l", tmp_path / "canonical")
    build_edge_split(tmp_path / "canonical", tmp_path / "split", EdgeSplitConfig(eval_negatives=200, seed=1))
    build_normalized_adjacency(tmp_path / "split", tmp_path / "adj")
    build_partitions(tmp_path / "split", tmp_path / "parts", PartitionConfig(num_parts=2, write_distdgl=False))
    build_compressed_graph(
        tmp_path / "canonical", tmp_path / "adj", tmp_path / "parts", tmp_path / "cg", CompressConfig(fpr_queries=1000)
    )
    inputs = load_shard_inputs(tmp_path / "split", tmp_path / "adj", tmp_path / "parts", tmp_path / "cg")
    shard_cfg = ShardConfig(fanouts="5,5", batch_size=128, epochs=1, world_size=1)
    write_link_shards(inputs, tmp_path / "shards", shard_cfg, canonical_dir=tmp_path / "canonical")
    training = with_values(task_blocks(LINK_DEFAULTS)[1], {"epochs": 2})
    training.optimizer.lr = 1e30  # past any bound the settings may set: the loop's own check is under test
    settings = LinkConfig(), ModelConfig(dropout=0.0), training
    with pytest.raises(NonFiniteLossError, match=r"step 2 of \d+: .*training.optimizer.lr=1e\+30"):
        train_link(tmp_path / "shards", tmp_path / "split", tmp_path / "adj", tmp_path / "out", *settings, log=print)
    assert not (tmp_path / "out").exists()


def test_only_a_one_node_launcher_on_this_machine_shares_the_lock(tmp_path):
    """A pod (runner k8s) has no such descriptor: a descriptor number in its environment would
    name nothing, or another file; several nodes and nsys do not get it either."""
    from assets.trained_model import launcher_lock_fd

    k8s = LaunchConfig(runner="k8s", k8s_image="reg/gnnflow:1")
    multi = LaunchConfig(nnodes=2, rdzv_endpoint="10.0.0.1:29400")
    with dataset_lock(tmp_path):
        fd = launcher_lock_fd(LaunchConfig(), "torch", tmp_path)
        assert fd is not None and os.readlink(f"/proc/self/fd/{fd}") == str(tmp_path / ".lock")
        assert launcher_lock_fd(k8s, "torch", tmp_path) is None
        assert launcher_lock_fd(multi, "torch", tmp_path) is None
        assert launcher_lock_fd(LaunchConfig(), "nsys", tmp_path) is None
    assert launcher_lock_fd(LaunchConfig(), "torch", tmp_path) is None  # outside the lock
