"""Reliability and security: no SQL from settings or paths, one dataset-name validator, the
per-dataset lock, checks that refuse to publish, the generator's --out guard, lineage, and the
instance's per-partition run limit."""

import dataclasses
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from graphs.infra import duck
from graphs.infra.dataset_names import DatasetNameError, validate_dataset_name
from graphs.infra.folder_swap import clean_stale_temporaries
from graphs.infra.storage import DatasetLockTimeout, dataset_lock, staged_output
from graphs.stages.canonical import CanonicalConfig, build_canonical_graph
from graphs.stages.normalize import AdjacencyConfig, edge_degrees
from tests.conftest import write_edges
from tests.lock_worker import hold_lock

ROOT = Path(__file__).resolve().parents[1]


def _instance_with(*names: str) -> dg.DagsterInstance:
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, list(names))
    return instance


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ----------------------------------------------------------------------------- (1) SQL


INJECTION = "1GB'; COPY (SELECT 42 AS pwned) TO '{target}' (FORMAT csv); SET memory_limit='1GB"


@pytest.mark.parametrize("config_type", [CanonicalConfig, AdjacencyConfig])
def test_memory_limit_with_sql_is_refused_and_runs_nothing(tmp_path, config_type):
    target = tmp_path / "pwned.csv"
    with pytest.raises(ValueError, match="memory_limit=.*not a memory size"):
        config_type(memory_limit=INJECTION.format(target=target))
    with pytest.raises(ValueError, match="not a memory size"):
        duck.connect(INJECTION.format(target=target))
    edges = write_edges(tmp_path / "e.parquet", [0, 1], [1, 0])
    with pytest.raises(ValueError, match="not a memory size"):
        edge_degrees(edges, 2, True, INJECTION.format(target=target))
    assert not target.exists()


@pytest.mark.parametrize("size", ["4GB", "512MiB", "1.5gb", " 2 GB ", "100kb"])
def test_ordinary_memory_sizes_are_accepted(size):
    assert CanonicalConfig(memory_limit=size).memory_limit == size.strip()
    duck.connect(size).close()


def test_paths_with_quotes_reach_duckdb_as_values(tmp_path):
    # a folder name that would end a '...' SQL literal: read as data, not as SQL
    landing = tmp_path / "it's'); DROP TABLE x; --"
    write_edges(landing / "edges" / "a'b.parquet", [1, 2, 3], [2, 3, 1])
    out = tmp_path / "o'ut"
    s = build_canonical_graph(landing, out / "canonical_graph", CanonicalConfig(memory_limit="1GB"))
    assert s["nodes"] == 3 and s["edges"] == 6
    out_deg, _ = edge_degrees(out / "canonical_graph" / "edges.parquet", 3, True, "1GB")
    assert out_deg.tolist() == [2, 2, 2]


# ----------------------------------------------------------------------------- (2) names


@pytest.mark.parametrize(
    "name",
    ["", "..", "../x", "a/b", "/abs", "a..b", "it's", 'q"', "a b", ".hidden", "-x", "x\n", "a\\b", "é", "x" * 129],
)
def test_bad_dataset_names_are_refused(name):
    with pytest.raises(DatasetNameError, match="dataset name"):
        validate_dataset_name(name)
    storage = GnnflowStorage(home="/tmp/h", landing="/tmp/l")
    with pytest.raises(DatasetNameError):
        storage.asset_dir(name, "canonical_graph")
    with pytest.raises(DatasetNameError):
        storage.landing_dir(name)


@pytest.mark.parametrize("name", ["cora", "ogbn-arxiv", "web_Google.v2", "A1", "x" * 128])
def test_good_dataset_names_pass(name):
    assert validate_dataset_name(name) == name


def test_a_partition_key_that_escapes_fails_before_any_read_or_write(tmp_path):
    home, landing = tmp_path / "area" / "home", tmp_path / "area" / "landing"
    landing.mkdir(parents=True)
    write_edges(tmp_path / "area" / "x" / "edges.parquet", [1, 2], [2, 3])  # what ../x would reach
    before = _tree(tmp_path)
    storage = GnnflowStorage(home=str(home), landing=str(landing))
    result = dg.materialize(
        [canonical_graph],
        partition_key="../x",
        instance=_instance_with("../x"),
        resources={"storage": storage},
        raise_on_error=False,
    )
    assert not result.success
    assert "dataset name '../x' is not allowed" in result.failure_data_for_node("canonical_graph").error.message
    assert _tree(tmp_path) == before  # nothing written anywhere, home not even created


def test_sensor_and_sync_ignore_badly_named_landing_folders(tmp_path):
    from pipelines.sensors import make_landing_sensor

    write_edges(tmp_path / "landing" / "good" / "edges.parquet", [1], [2])
    write_edges(tmp_path / "landing" / "bad name" / "edges.parquet", [1], [2])
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    assert storage.landing_datasets() == ["good"]
    assert storage.landing_folders_with_bad_names() == ["bad name"]
    sensor = make_landing_sensor([canonical_graph])
    instance = dg.DagsterInstance.ephemeral()
    first = sensor(dg.build_sensor_context(instance=instance, resources={"storage": storage}))
    assert [list(r.partition_keys) for r in first.dynamic_partitions_requests] == [["good"]]
    # the run comes once the files stayed the same for a tick (tests/test_landing_sensor.py)
    result = sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor, resources={"storage": storage}))
    assert [r.partition_key for r in result.run_requests] == ["good"]


# ----------------------------------------------------------------------------- (3) the lock


def test_lock_excludes_other_processes_and_waits_for_them(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=hold_lock, args=(str(tmp_path), 1.5, ready))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(DatasetLockTimeout, match=f"pid {holder.pid}"):
            with dataset_lock(tmp_path, timeout_s=0.3):
                pass
        messages = []
        t = time.monotonic()
        with dataset_lock(tmp_path, log=messages.append):
            waited = time.monotonic() - t
            assert not holder.is_alive() or holder.exitcode is None  # got it once the holder let go
        assert waited > 0.3 and "waiting for it to finish" in messages[0]
    finally:
        holder.join(30)
    assert holder.exitcode == 0


def test_lock_is_released_when_its_holder_is_killed(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=hold_lock, args=(str(tmp_path), 600, ready))
    holder.start()
    assert ready.wait(60)
    holder.kill()
    holder.join(30)
    with dataset_lock(tmp_path, timeout_s=5):  # the kernel dropped the dead holder's lock
        pass


def test_a_child_of_the_holder_runs_under_its_lock_and_the_lock_is_reentrant(tmp_path):
    code = (
        "import sys; from graphs.infra.storage import dataset_lock\n"
        "with dataset_lock(sys.argv[1], timeout_s=2): print('child ran')\n"
    )
    with dataset_lock(tmp_path):
        with dataset_lock(tmp_path, timeout_s=0):  # re-entrant in the same thread
            pass
        child = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
    assert child.returncode == 0, child.stderr
    assert "child ran" in child.stdout


def test_taking_the_lock_cleans_stale_temporaries(tmp_path):
    stale = [tmp_path / ".canonical_graph.tmp-1234abcd", tmp_path / ".minibatch_shards.old-deadbeef"]
    for d in stale:
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f.npy").write_bytes(b"x")
    keep = [tmp_path / "canonical_graph", tmp_path / ".trained_model.work-0123456789abcdef"]
    for d in keep:
        d.mkdir()
    with dataset_lock(tmp_path):
        pass
    assert not any(d.exists() for d in stale)
    assert all(d.is_dir() for d in keep)
    assert clean_stale_temporaries(tmp_path / "missing") == []


def test_staged_output_publishes_whole_or_not_at_all(tmp_path):
    final = tmp_path / "asset"
    final.mkdir()
    (final / "v").write_text("1")
    with pytest.raises(RuntimeError):
        with staged_output(final) as tmp:
            tmp.mkdir()
            (tmp / "v").write_text("2")
            raise RuntimeError("a check failed")
    assert (final / "v").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["asset"]
    with staged_output(final) as tmp:
        tmp.mkdir()
        (tmp / "v").write_text("2")
    assert (final / "v").read_text() == "2" and sorted(p.name for p in tmp_path.iterdir()) == ["asset"]


def _materialize_canonical(home: str, landing: str, queue) -> None:
    storage = GnnflowStorage(home=home, landing=landing)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("dataset", ["race"])
    result = dg.materialize(
        [canonical_graph], partition_key="race", instance=instance, resources={"storage": storage}, raise_on_error=False
    )
    queue.put(result.success)


def test_two_runs_of_one_dataset_at_once_both_succeed_and_leave_no_temporaries(tmp_path):
    landing = tmp_path / "landing" / "race"
    rng = np.random.default_rng(0)
    write_edges(landing / "edges.parquet", rng.integers(0, 2000, 20000), rng.integers(0, 2000, 20000))
    ctx = multiprocessing.get_context("fork")  # Dagster is imported already: forked children start at once
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_materialize_canonical, args=(str(tmp_path / "home"), str(tmp_path / "landing"), queue))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(60)
    assert results == [True, True]
    dataset = tmp_path / "home" / "race"
    assert sorted(p.name for p in dataset.iterdir()) == [".lock", "canonical_graph"]
    assert pq.read_table(dataset / "canonical_graph" / "edges.parquet").num_rows > 0


def test_instance_config_limits_queued_runs_to_one_per_dataset(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((ROOT / "pipelines" / "dagster.yaml").read_text())
    with dg.DagsterInstance.from_config(str(home)) as instance:
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    assert limits == [{"key": "dagster/partition", "value": {"applyLimitPerUniqueValue": True}, "limit": 1}]
    make = subprocess.run(
        ["make", "-n", "-B", f"DAGSTER_HOME={home}", f"{home}/dagster.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"cp pipelines/dagster.yaml {home}/dagster.yaml" in make.stdout


def test_make_ui_binds_to_localhost_only():
    make = subprocess.run(["make", "-n", "ui"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    (line,) = [ln for ln in make.stdout.splitlines() if "dagster dev" in ln]
    assert " -h 127.0.0.1 " in f"{line} " and "0.0.0.0" not in line


# ----------------------------------------------------------------------------- (5) checks


def test_a_failed_check_on_the_new_files_refuses_to_publish(tmp_path, monkeypatch):
    import assets.normalized_adjacency as na

    write_edges(tmp_path / "landing" / "g" / "edges.parquet", [1, 2, 3, 4], [2, 3, 4, 1])
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    instance = _instance_with("g")
    assert dg.materialize(
        [canonical_graph, na.normalized_adjacency], partition_key="g", instance=instance, resources={"storage": storage}
    ).success
    out = tmp_path / "home" / "g" / "normalized_adjacency"
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    real = na.build_normalized_adjacency

    def corrupting_writer(canonical, out_dir, cfg):  # a writer bug: a NaN weight in the file
        s = real(canonical, out_dir, cfg)
        w = np.load(Path(out_dir) / "weights.npy")
        w[0] = np.nan
        np.save(Path(out_dir) / "weights.npy", w)
        return s

    monkeypatch.setattr(na, "build_normalized_adjacency", corrupting_writer)
    result = dg.materialize(
        [na.normalized_adjacency],
        partition_key="g",
        instance=instance,
        resources={"storage": storage},
        raise_on_error=False,
    )
    assert not result.success
    message = result.failure_data_for_node("normalized_adjacency").error.message
    assert "not published" in message and "finite_weights (nonfinite=1)" in message
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in out.parent.iterdir()) == [".lock", "canonical_graph", "normalized_adjacency"]


def test_correctness_checks_block_and_quality_checks_only_warn():
    from pipelines.definitions import ALL_ASSETS

    blocking = {}
    for a in ALL_ASSETS:
        for spec in a.check_specs:
            blocking[spec.name] = spec.blocking
    assert blocking == {
        "edges_valid": True,
        "no_held_out_edge_in_message_passing": True,
        "symmetric": True,
        "finite_weights": True,
        "weights_in_0_1": True,
        "largest_eigenvalue_at_most_1": True,
        "every_node_in_one_part": True,
        "metis_cut_below_random": False,
        "bloom_no_false_negatives": True,
        "dequantization_within_bound": True,
        "equal_minibatches_per_rank": True,
        "files_match_manifest": True,
        "test_accuracy_above_majority_class": False,
        "not_worse_than_promoted": False,
    }


# ----------------------------------------------------------------------------- (6) generate --out


def test_generate_refuses_a_non_empty_folder_it_did_not_write(tmp_path):
    from graphs.synthetic.generate import GenerateConfig, generate_dataset

    landing = tmp_path / "landing"
    write_edges(landing / "mine" / "edges.parquet", [1], [2])
    cfg = GenerateConfig(num_nodes=50, num_edges=200, feature_dim=4, num_classes=2, num_edge_files=1)
    with pytest.raises(FileExistsError, match="not written by the generator"):
        generate_dataset(cfg, landing, progress=False)
    assert (landing / "mine" / "edges.parquet").is_file()
    out = landing / "g"
    generate_dataset(cfg, out, progress=False)
    generate_dataset(cfg, out, progress=False)  # its own output may be replaced
    (out / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        generate_dataset(cfg, out, progress=False)
    assert (out / "notes.txt").read_text() == "mine"

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "generate", "--out", str(landing), "--num-nodes", "50", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 2 and "refusing to replace it" in cli.stderr
    assert (landing / "mine" / "edges.parquet").is_file()


# ----------------------------------------------------------------------------- (7) lineage


def test_trained_model_declares_every_stage_it_reads():
    from assets.trained_model import trained_model

    deps = {k.to_user_string() for k in trained_model.asset_deps[trained_model.key]}
    assert deps == {"canonical_graph", "normalized_adjacency", "compressed_graph", "minibatch_shards"}


# ----------------------------------------------------------------------------- determinism


def _digests(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "run_stats.json"
    }


def test_same_inputs_and_seed_give_byte_identical_files_and_timings_live_apart(tmp_path):
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
    from graphs.stages.compress import build_compressed_graph
    from graphs.stages.normalize import build_normalized_adjacency
    from graphs.stages.partition import PartitionConfig, build_partitions
    from graphs.synthetic.generate import GenerateConfig, generate_dataset

    landing = tmp_path / "landing"
    gen = GenerateConfig(num_nodes=300, num_edges=2000, feature_dim=6, num_classes=3, num_edge_files=2)
    generate_dataset(gen, landing, progress=False)
    # METIS (DGL 2.1) is the one stage that is not reproducible: both runs share its folder
    parts = tmp_path / "metis_partitions"
    homes = [tmp_path / "a", tmp_path / "b"]
    for i, h in enumerate(homes):
        build_canonical_graph(landing, h / "canonical_graph")
        build_normalized_adjacency(h / "canonical_graph", h / "normalized_adjacency")
        if i == 0:
            build_partitions(h / "canonical_graph", parts, PartitionConfig(num_parts=2, write_distdgl=False))
        build_compressed_graph(h / "canonical_graph", h / "normalized_adjacency", parts, h / "compressed_graph")
        inputs = load_shard_inputs(h / "canonical_graph", h / "normalized_adjacency", parts, h / "compressed_graph")
        write_minibatch_shards(
            inputs, h / "minibatch_shards", ShardConfig(fanouts="4,4", batch_size=32, epochs=2, world_size=2)
        )
    a, b = (_digests(h) for h in homes)
    assert len(a) > 20 and a.keys() == b.keys()
    assert [name for name in a if a[name] != b[name]] == []
    for stage in ("canonical_graph", "normalized_adjacency", "compressed_graph"):
        summary = (homes[0] / stage / "summary.json").read_text()
        assert '"seconds"' not in summary and "peak_rss_bytes" not in summary
        assert "seconds" in (homes[0] / stage / "run_stats.json").read_text()
    assert '"seconds"' not in (homes[0] / "minibatch_shards" / "manifest.json").read_text()


# ----------------------------------------------------------------------------- (4) stale inputs


def test_shards_refuse_an_upstream_re_materialized_since_they_were_cut(tmp_path):
    from graphs.formats.shard_format import ShardError, read_manifest
    from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
    from graphs.stages.compress import CompressConfig, build_compressed_graph
    from graphs.stages.normalize import build_normalized_adjacency
    from graphs.stages.partition import PartitionConfig, build_partitions
    from graphs.synthetic.generate import GenerateConfig, generate_dataset
    from training.checkpoint import data_version

    gen = GenerateConfig(num_nodes=200, num_edges=1200, feature_dim=4, num_classes=2, num_edge_files=1)
    generate_dataset(gen, tmp_path / "landing", progress=False)
    h = tmp_path / "home"
    can, adj, parts, comp = (h / s for s in ("canonical_graph", "normalized_adjacency", "metis", "compressed_graph"))
    build_canonical_graph(tmp_path / "landing", can)
    build_normalized_adjacency(can, adj)
    build_partitions(can, parts, PartitionConfig(num_parts=2, write_distdgl=False))
    build_compressed_graph(can, adj, parts, comp, CompressConfig())
    shards = h / "minibatch_shards"
    cfg = ShardConfig(fanouts="3,3", batch_size=32, epochs=1, world_size=1, feature_encoding="compressed")
    write_minibatch_shards(load_shard_inputs(can, adj, parts, comp), shards, cfg)
    manifest = read_manifest(shards, verify_upstream_files=True)
    stages = {e["stage"] for e in manifest["upstream"]}
    assert stages == {"canonical_graph", "normalized_adjacency", "compressed_graph"}
    version = data_version(shards, can, adj)

    # compressed_graph re-materialized with other settings, same shapes: refused, and the data version moves
    build_compressed_graph(can, adj, parts, comp, CompressConfig(seed=7, feature_transform="asinh"))
    with pytest.raises(ShardError, match="compressed_graph was re-materialized; re-materialize minibatch_shards"):
        read_manifest(shards, verify_upstream_files=True)
    assert data_version(shards, can, adj) != version
    read_manifest(shards)  # without verification the manifest itself still reads

    # canonical_graph re-ingested from new landing data of the same shape: refused, naming it
    write_minibatch_shards(load_shard_inputs(can, adj, parts, comp), shards, cfg)
    generate_dataset(dataclasses.replace(gen, seed=5), tmp_path / "landing", progress=False)
    build_canonical_graph(tmp_path / "landing", can)
    with pytest.raises(ShardError, match="canonical_graph was re-materialized"):
        read_manifest(shards, verify_upstream_files=True)
