"""distdgl_model: DistDGL training started from Dagster (machine scripts, one machine here,
two machines in network namespaces with a stop and a resume)."""

import json
import os
import shlex
import socket
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
from netns import in_namespace, skip_without_mount_namespaces, two_hosts

import assets.distdgl_model as distdgl_asset
from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from assets.config import resolve_blocks
from assets.distdgl_model import distdgl_model
from assets.metis_partitions import metis_partitions
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from training.checkpoint import CHECKPOINT_NAME
from training.distdgl import load_distdgl_model
from training.distdgl_cluster import DistDGLCluster, machine_command, machine_script, run_machines
from training.distdgl_config import DistDGLConfig, DistDGLTraining, config_from_args, process_args
from training.layers import ModelConfig
from training.outputs import METRICS, MODEL_BEST, MODEL_FINAL, SUMMARY
from training.profiling import PROFILE_DIR, TRACE_FILE

SETTINGS = {
    "model": {"hidden": 16, "dropout": 0.0},
    "training": {"epochs": 3, "optimizer": {"lr": 0.03}},
    "distdgl": {"fanouts": "5,5", "batch_size": 64},
}


def test_process_flags_read_back_as_the_same_config(tmp_path):
    part = tmp_path / "g.json"
    part.write_text("{}")
    model = ModelConfig(conv="gcn", hidden=24, dropout=0.25, residual=True, hidden_norm="layer", edge_weights=True)
    cfg = DistDGLConfig(
        ip_config="ip 1.txt",
        part_config=str(part),
        machine=1,
        index=2,
        servers=2,
        trainers=3,
        torch_port=29411,
        out="a b/'o'",
        fanouts="-1,4",
        batch_size=17,
        epochs=5,
        lr=0.125,
        seed=9,
        stop_after_epoch=2,
        model=model,
    )
    for role in ("server", "trainer"):
        back_role, back = config_from_args(process_args(role, cfg))
        assert (back_role, back) == (role, cfg)
    assert config_from_args(process_args("trainer", replace(cfg, model=ModelConfig())))[1].model == ModelConfig()


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"hosts": ["10.0.0.1", "host-b"]}, r"cluster.hosts\[1\]='host-b': expected an IPv4 address"),
        ({"hosts": ["10.0.0.1", "10.0.0.1"], "launcher": "ssh"}, "lists a machine twice"),
        ({"hosts": ["10.0.0.1", "10.0.0.2"]}, "launcher='local' starts one machine .* lists 2: use launcher 'ssh'"),
        ({"launcher": "rsh"}, "cluster.launcher='rsh' is not one of"),
        ({"socket_ifname": "eth0; reboot"}, "is not an interface name"),
        ({"trainers": 0}, "cluster.trainers=0 must be at least 1"),
    ],
)
def test_cluster_settings_are_checked_naming_the_field(fields, says):
    with pytest.raises(ValueError, match=says):
        DistDGLCluster(**fields)


def _stub_python(tmp_path: Path, calls: Path, behaviour: str) -> Path:
    """A stand-in interpreter for machine scripts: logs its role, index, threads and pid, then
    runs `behaviour` (sh, with the role as $3 and the index as $5)."""
    stub = tmp_path / "python"
    stub.write_text(f'#!/bin/sh\necho "$3 $5 $OMP_NUM_THREADS $$" >> {calls}\n{behaviour}')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return stub


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").is_dir() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def _still_alive(pids: list[int], grace: float = 5.0) -> list[int]:
    """The `pids` still running after up to `grace` seconds: a stopped process dies once the signal
    is delivered, which may be a moment after the call that sent it returned."""
    deadline = time.monotonic() + grace
    while (alive := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@pytest.mark.parametrize("stuck_trainer", [False, True])
def test_a_failing_process_stops_every_other_one_of_its_machine(tmp_path, monkeypatch, stuck_trainer):
    # servers wait (as DGL's do, for their trainers); trainer 1 fails once both servers are up,
    # while trainer 0 either ends well or waits forever (as one blocked in a collective would)
    calls = tmp_path / "calls.txt"
    behaviour = (
        'case "$3" in server) exec sleep 300;; esac\n'
        f'until [ "$(grep -c server {calls})" -eq 2 ]; do sleep 0.05; done\n'
        '[ "$5" = 1 ] && exit 7\n' + ("exec sleep 300\n" if stuck_trainer else "exit 0\n")
    )
    monkeypatch.setattr(sys, "executable", str(_stub_python(tmp_path, calls, behaviour)))
    part = tmp_path / "odd 'dir'" / "g.json"
    part.parent.mkdir()
    part.write_text("{}")
    cluster = DistDGLCluster(servers=2, trainers=2, threads=3)
    script = machine_script(
        cluster, DistDGLTraining(), 0, ip_config=tmp_path / "ip.txt", part_config=part, out=part.parent, logs=tmp_path
    )
    assert machine_command(cluster, 0, script) == ["sh", "-c", script]
    assert run_machines([machine_command(cluster, 0, script)], env={"PATH": "/usr/bin:/bin"}) == [7]
    seen = [line.split() for line in calls.read_text().splitlines()]
    assert sorted(row[:3] for row in seen) == [[r, i, "3"] for r in ("server", "trainer") for i in "01"]
    assert not _still_alive([int(row[3]) for row in seen])  # the sleeping servers (and trainer) were stopped
    assert (tmp_path / "machine0-trainer1.exit").read_text().strip() == "7"
    assert sorted(p.name for p in tmp_path.glob("machine0-*.log")) == [
        "machine0-server0.log",
        "machine0-server1.log",
        "machine0-trainer0.log",
        "machine0-trainer1.log",
    ]


def test_every_process_ending_well_ends_the_machine_well(tmp_path, monkeypatch):
    calls = tmp_path / "calls.txt"
    monkeypatch.setattr(sys, "executable", str(_stub_python(tmp_path, calls, "exit 0\n")))
    part = tmp_path / "g.json"
    part.write_text("{}")
    cluster = DistDGLCluster(servers=1, trainers=3)
    script = machine_script(
        cluster, DistDGLTraining(), 0, ip_config="ip", part_config=part, out=tmp_path, logs=tmp_path
    )
    assert run_machines([machine_command(cluster, 0, script)] * 2, env={"PATH": "/usr/bin:/bin"}) == [0, 0]


def test_ssh_runs_the_script_under_sh_whatever_the_login_shell(tmp_path):
    cluster = DistDGLCluster(hosts=["10.0.0.7"], launcher="ssh")
    script = "echo 'it''s' \"$HOME\"\n"
    ssh, remote = machine_command(cluster, 0, script)[:-1], machine_command(cluster, 0, script)[-1]
    assert ssh == ["ssh", "-tt", "-o", "BatchMode=yes", "10.0.0.7"]
    # the remote login shell parses `remote` into sh -c SCRIPT, the script unchanged
    assert shlex.split(remote) == ["exec", "sh", "-c", script]
    with pytest.raises(ValueError, match=r"hosts\[0\]='fe80::1': expected an IPv4 address"):
        DistDGLCluster(hosts=["fe80::1"], launcher="ssh")


def _home(tmp_path, num_parts: int) -> tuple[GnnflowStorage, dg.DagsterInstance]:
    gen = GenerateConfig(num_nodes=600, num_edges=4000, feature_dim=8, num_classes=3, num_edge_files=1, seed=2)
    generate_dataset(gen, tmp_path / "landing" / "g", progress=False)
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["g"])
    parts = {"num_parts": num_parts, "clusters_per_part": 2}
    assert dg.materialize(
        [canonical_graph, metis_partitions],
        partition_key="g",
        instance=instance,
        resources={"storage": storage},
        run_config={"ops": {"metis_partitions": {"config": parts}}},
    ).success
    return storage, instance


def _train(storage, instance, settings: dict, cluster: dict | None = None) -> dg.ExecuteInProcessResult:
    config = {**settings, "cluster": cluster or {}}
    return dg.materialize(
        [distdgl_model],
        partition_key="g",
        instance=instance,
        resources={"storage": storage},
        run_config={"ops": {"distdgl_model": {"config": config}}},
        raise_on_error=False,
    )


def _materialization(result: dg.ExecuteInProcessResult) -> dict:
    [event] = result.asset_materializations_for_node("distdgl_model")
    return {k: v.value for k, v in event.metadata.items()}


def test_one_machine_trains_from_dagster_and_publishes_the_model(tmp_path):
    storage, instance = _home(tmp_path, num_parts=1)
    result = _train(storage, instance, SETTINGS)
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    meta = _materialization(result)
    out = storage.asset_dir("g", "distdgl_model")
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["machines"] == meta["machines"] == 1 and meta["launcher"] == "local"
    assert meta["own_defaults"] == {} and "ignored_settings" not in meta  # epochs set: no default applied
    assert [r["epoch"] for r in summary["history"]] == [1, 2, 3]
    assert (
        meta["test_acc_at_best_val"] == round(summary["test_acc_at_best_val"], 4) and meta["test_acc_at_best_val"] > 0.5
    )
    assert [m["epoch"] for m in pq.read_table(out / METRICS).to_pylist()] == [1, 2, 3]
    assert load_distdgl_model(out / MODEL_BEST)["epoch"] == summary["best_epoch"]
    assert load_distdgl_model(out / MODEL_FINAL)["model"]["hidden"] == 16
    assert not (out / CHECKPOINT_NAME).exists() and (out / "logs" / "machine0-trainer0.log").is_file()
    trace = json.loads((out / PROFILE_DIR / TRACE_FILE).read_text())  # training.profiler: torch (default)
    assert trace["traceEvents"] and meta["profiler_trace"] == str(out / PROFILE_DIR / TRACE_FILE)
    assert not list(out.parent.glob(".distdgl_model.work-*"))  # the finished run's work folder is gone
    [check] = result.get_asset_check_evaluations()
    assert check.passed and check.metadata["test_acc"].value == summary["test_acc_at_best_val"]


def test_parts_and_machines_must_match(tmp_path):
    storage, instance = _home(tmp_path, num_parts=2)
    skipped = _train(storage, instance, SETTINGS)  # no hosts named: nothing to run on, said why
    assert skipped.success and "set distdgl_model.cluster.hosts" in _materialization(skipped)["skipped"]
    three = {"hosts": ["10.9.0.1", "10.9.0.2", "10.9.0.3"], "launcher": "ssh"}
    failed = _train(storage, instance, SETTINGS, three)
    assert not failed.success
    [failure] = [e for e in failed.all_events if e.is_step_failure]
    assert "metis_partitions has 2 parts but distdgl_model.cluster.hosts lists 3 machines" in str(
        failure.step_failure_data.error
    )


def test_two_machines_stop_and_resume_from_dagster(tmp_path, monkeypatch):
    storage, instance = _home(tmp_path, num_parts=2)
    out = storage.asset_dir("g", "distdgl_model")
    with two_hosts("gfda", 234) as hosts:
        skip_without_mount_namespaces(hosts[0][0])
        # each "machine" of the cluster is a network namespace with its own /dev/shm
        monkeypatch.setattr(distdgl_asset, "machine_command", lambda cluster, m, script: in_namespace(hosts[m], script))
        cluster = {"hosts": [addr for _, addr, _ in hosts], "launcher": "ssh", "torch_port": 29483}
        stopped = _train(
            storage, instance, SETTINGS | {"distdgl": SETTINGS["distdgl"] | {"stop_after_epoch": 2}}, cluster
        )
        assert not stopped.success and not out.exists()
        [failure] = [e for e in stopped.all_events if e.is_step_failure]
        assert "stopped after epoch 2" in str(failure.step_failure_data.error)
        [work] = out.parent.glob(".distdgl_model.work-*")
        assert (work / CHECKPOINT_NAME).is_file()
        resumed = _train(storage, instance, SETTINGS, cluster)  # the same settings continue to the end
    assert resumed.success, [e.message for e in resumed.all_events if e.is_failure]
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["resumed_after_epoch"] == 2 and summary["machines"] == 2
    assert [r["epoch"] for r in summary["history"]] == [1, 2, 3]
    assert _materialization(resumed)["resumed_after_epoch"] == 2
    assert sorted(p.name for p in (out / "logs").glob("*.log")) == [
        "machine0-server0.log",
        "machine0-trainer0.log",
        "machine1-server0.log",
        "machine1-trainer0.log",
    ]
    assert not work.exists()
    assert (out / PROFILE_DIR / TRACE_FILE).is_file()  # recorded by the first run, before its stop


def test_settings_that_cannot_train_fail_before_any_machine_starts(tmp_path):
    storage, instance = _home(tmp_path, num_parts=1)
    failed = _train(storage, instance, SETTINGS | {"distdgl": {"fanouts": "5,5,5"}, "model": {"num_layers": 2}})
    assert not failed.success and not list(storage.dataset_dir("g").glob(".distdgl_model.work-*"))
    [failure] = [e for e in failed.all_events if e.is_step_failure]
    assert "model.num_layers=2 but fanouts='5,5,5' samples 3 blocks" in str(failure.step_failure_data.error)


def test_a_failing_trainer_ends_the_run_with_its_error(tmp_path):
    storage, instance = _home(tmp_path, num_parts=1)
    with socket.socket() as taken:  # the trainers' torch port is in use: rank 0 cannot host its store
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed = _train(storage, instance, SETTINGS, {"torch_port": port})
    assert not failed.success and not storage.asset_dir("g", "distdgl_model").exists()
    [failure] = [e for e in failed.all_events if e.is_step_failure]
    error = str(failure.step_failure_data.error)
    assert "machine 0 (127.0.0.1) exited with 1" in error and "machine0-trainer0.log" in error, error
    assert "trainer 0 of machine 0 failed" in error, error


def test_distdgl_reads_the_shared_blocks_at_its_own_defaults_and_names_its_old_keys_new_places():
    """distdgl_model has trained_model's model and training blocks (DistDGL reads epochs, its own
    default 3, optimizer.lr, seed and profiler), its sampling in distdgl; its earlier training
    block's keys are refused naming where they went."""
    from assets.distdgl_model import DISTDGL_DEFAULTS, DISTDGL_READS, DistDGLModelConfig
    from assets.settings import moved_keys

    config = DistDGLModelConfig(**{"training": {"optimizer": {"lr": 0.01}, "accumulate": 2}, "model": {"hidden": 8}})
    training, _ = config.to_dataclass()
    assert (training.epochs, training.lr, training.model.hidden, training.fanouts) == (3, 0.01, 8, "10,10")
    resolved = resolve_blocks(config, DISTDGL_DEFAULTS, DISTDGL_READS)
    assert resolved.own_defaults == {"training.epochs": 3} and resolved.ignored == ["training.accumulate"]
    assert DistDGLModelConfig(**{"training": {"epochs": 7}}).to_dataclass()[0].epochs == 7
    with pytest.raises(ValueError, match=r"training.profiler='nsys' is not one of \('torch', 'none'\)"):
        DistDGLModelConfig(**{"training": {"profiler": "nsys"}}).to_dataclass()
    with pytest.raises(ValueError, match="distdgl.fanouts"):
        DistDGLModelConfig(**{"distdgl": {"fanouts": "5,x"}}).to_dataclass()
    old = {"training": {"fanouts": "5,5", "lr": 0.1, "model": {"hidden": 8}, "epochs": 2}}
    said = moved_keys({"ops": {"distdgl_model": {"config": old}}})
    root = "ops.distdgl_model.config"
    assert said == [
        f"'{root}.training.fanouts' is now '{root}.distdgl.fanouts'",
        f"'{root}.training.lr' is now '{root}.training.optimizer.lr'",
        f"'{root}.training.model' is now '{root}.model'",
    ]
