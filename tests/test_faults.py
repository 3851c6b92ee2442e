"""Faults: SIGKILL of every multi-file stage mid-write (the previous version stays whole,
the next run succeeds and removes the leftovers), a training process killed mid-epoch
resumes, a dying DDP rank fails the run in bounded time naming the rank, a pickle-bearing
checkpoint is refused."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphs.synthetic.generate import GenerateConfig, generate_dataset
from tests.conftest import folder_bytes, wait_for_path
from tests.kill_worker import STAGES, run_stage
from training.checkpoint import CHECKPOINT_NAME

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict:
    """A generated landing folder and every stage materialized once (the 'previous version')."""
    root = tmp_path_factory.mktemp("faults")
    cfg = GenerateConfig(num_nodes=300, num_edges=2000, feature_dim=6, num_classes=3, num_edge_files=2, seed=1)
    generate_dataset(cfg, root / "landing", progress=False)
    home = root / "home"
    for stage in STAGES:
        run_stage(stage, home, root / "landing")
    return {"landing": root / "landing", "home": home}


# metis_partitions last: its re-run gives new (equally valid) parts that compressed_graph reads
@pytest.mark.parametrize("stage", sorted(STAGES, key=lambda s: s == "metis_partitions"))
def test_sigkill_mid_write_keeps_the_previous_version_and_the_next_run_cleans_up(dataset, stage, tmp_path):
    home, landing = dataset["home"], dataset["landing"]
    before = folder_bytes(home / stage)
    marker = tmp_path / "written"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DGLBACKEND": "pytorch"}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.kill_worker", stage, str(home), str(landing), str(marker)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), child.stderr.read().decode() if child.poll() is not None else "no write within 120 s"
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    child.stderr.close()
    leftovers = [p.name for p in home.iterdir() if ".tmp-" in p.name]
    assert leftovers, "the kill should have left a half-written staging folder"
    assert folder_bytes(home / stage) == before  # the previous version, whole

    run_stage(stage, home, landing)  # the next run takes the lock, removes the leftovers, publishes
    assert [p.name for p in home.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []
    after = folder_bytes(home / stage)
    assert after.keys() == before.keys()
    if stage != "metis_partitions":  # DGL's METIS is not reproducible; every other stage is
        assert {k: v for k, v in after.items() if k != "run_stats.json"} == {
            k: v for k, v in before.items() if k != "run_stats.json"
        }


# ----------------------------------------------------------------------------- training


def _run_yaml(dataset: dict, out: Path, epochs: int, **training) -> Path:
    from training.config import RunConfig

    cfg = RunConfig.from_dict(
        {
            "model": {"conv": "sage", "hidden": 8, "num_layers": 2},
            "training": {"epochs": epochs, "profiler": "none", "eval_every": 1, **training},
            "paths": {"shards": str(dataset["home"] / "minibatch_shards"), "out": str(out)},
        }
    )
    path = out.parent / "run.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(path)
    return path


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "DGLBACKEND": "pytorch", "OMP_NUM_THREADS": "1"}


def test_training_killed_mid_epoch_resumes_from_its_checkpoint(dataset, tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "ds" / "trained_model"
    config = _run_yaml(dataset, out, epochs=16)
    command = [sys.executable, "-m", "training", "--config", str(config)]
    first = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_for_path(f".trained_model.work-*/{CHECKPOINT_NAME}", out.parent, first)
    first.send_signal(signal.SIGKILL)  # between checkpoints: in the middle of a later epoch
    first.wait(30)
    first.stdout.close()
    assert not out.exists()  # nothing published by the killed run
    again = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming from" in again.stdout
    epochs = pq.read_table(out / "metrics.parquet").column("epoch").to_pylist()
    assert sorted(set(epochs)) == list(range(1, 17)) and len(epochs) == 16  # each epoch once (from 1), none lost
    assert list(out.parent.glob(".trained_model.work-*")) == []  # the finished run removed its work folder


def _rank_pid(torchrun_pid: int, rank: int) -> int | None:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == torchrun_pid and f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


def test_a_dying_ddp_rank_fails_the_run_quickly_and_is_named(dataset, tmp_path):
    out = tmp_path / "ds" / "trained_model"
    config = _run_yaml(dataset, out, epochs=200, dist_timeout_s=60)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", "--nproc-per-node=2", "-m", "training", "--config", str(config)]
    run = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for_path(f".trained_model.work-*/{CHECKPOINT_NAME}", out.parent, run)  # both ranks are training
    victim = _rank_pid(run.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    t = time.monotonic()
    output, _ = run.communicate(timeout=120)
    waited = time.monotonic() - t
    assert run.returncode != 0
    assert waited < 60, f"took {waited:.0f} s to fail"
    assert "rank: 1" in output and "Signal 9 (SIGKILL)" in output, output[-3000:]
    assert not out.exists()


class _Payload:
    """Pickles as a call to os.system: what a crafted checkpoint would carry."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


def test_a_pickle_bearing_checkpoint_is_refused_without_running_it(tmp_path):
    import torch

    from training.checkpoint import load_checkpoint
    from training.outputs import MODEL_FINAL, load_model
    from training.state_file import StateFileError

    target = tmp_path / "ran"
    for name in (CHECKPOINT_NAME, MODEL_FINAL):
        torch.save({"format_version": 1, "model": _Payload(target)}, tmp_path / name)
    with pytest.raises(StateFileError, match=f"{CHECKPOINT_NAME}: a ZIP archive .* never loads pickled"):
        load_checkpoint(tmp_path / CHECKPOINT_NAME)
    with pytest.raises(StateFileError, match=f"{MODEL_FINAL}: a ZIP archive .* re-materialize trained_model"):
        load_model(tmp_path / MODEL_FINAL)
    assert not target.exists()
