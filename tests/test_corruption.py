"""Silent corruption between stages and a full disk: every stage checks the upstream files it
reads against their stage's hashes.json, the shards tell a damaged upstream file from a
re-materialized one, the shard / Bloom filter / compressed feature readers name a damaged file,
and memory-mapped outputs reserve their disk space, so a full disk is an error naming the file
instead of a SIGBUS."""

import contextlib
import dataclasses
import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from assets.compressed_graph import compressed_graph
from assets.metis_partitions import metis_partitions
from assets.normalized_adjacency import normalized_adjacency
from graphs.formats.npyrows import NpyRowWriter, create_npy_memmap
from graphs.formats.shard_format import DamagedFileError, ShardError, read_manifest, read_shard, stream_record
from graphs.infra import storage as storage_mod
from graphs.infra.storage import CorruptFileError, DiskFullError, cached_file_sha256, staged_output
from graphs.sampling import ShardConfig, load_shard_inputs, write_minibatch_shards
from graphs.stages.canonical import build_canonical_graph
from graphs.stages.compress import CompressConfig, build_compressed_graph, load_bloom_filters, load_features
from graphs.stages.normalize import build_normalized_adjacency
from graphs.stages.partition import PartitionConfig, build_partitions
from graphs.synthetic.generate import GenerateConfig, generate_dataset
from tests.conftest import folder_bytes

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("canonical_graph", "normalized_adjacency", "metis_partitions", "compressed_graph")


@contextlib.contextmanager
def flipped_bit(path: Path, offset: int | None = None, bit: int = 4):
    """One bit of `path` flipped (in the middle by default) for the duration of the block."""
    offset = os.path.getsize(path) // 2 if offset is None else offset
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))
    try:
        yield path
    finally:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(bytes([byte]))


# ----------------------------------------------------------------------------- stages, through the assets


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> dict:
    """canonical_graph .. compressed_graph of a small generated dataset, materialized once."""
    root = tmp_path_factory.mktemp("corruption")
    gen = GenerateConfig(num_nodes=400, num_edges=3000, feature_dim=8, num_classes=3, num_edge_files=1, seed=3)
    generate_dataset(gen, root / "landing" / "g", progress=False)
    storage = GnnflowStorage(home=str(root / "home"), landing=str(root / "landing"))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["g"])
    assets = [canonical_graph, normalized_adjacency, metis_partitions, compressed_graph]
    assert dg.materialize(
        assets, partition_key="g", instance=instance, resources={"storage": storage}, run_config=_run_config()
    ).success
    return {"storage": storage, "instance": instance, "dir": root / "home" / "g"}


def _run_config(write_distdgl: bool = False) -> dict:
    return {
        "ops": {
            "metis_partitions": {"config": {"num_parts": 2, "write_distdgl": write_distdgl}},
            "compressed_graph": {"config": {"fpr_queries": 1000}},
        }
    }


def _run(home: dict, asset, write_distdgl: bool = False) -> dg.ExecuteInProcessResult:
    ops = {k: v for k, v in _run_config(write_distdgl)["ops"].items() if k == asset.op.name}
    return dg.materialize(
        [asset],
        partition_key="g",
        instance=home["instance"],
        resources={"storage": home["storage"]},
        run_config={"ops": ops},
        raise_on_error=False,
    )


def _error(result: dg.ExecuteInProcessResult, step: str) -> str:
    assert not result.success
    return result.failure_data_for_node(step).error.message


@pytest.mark.parametrize(
    "name, stages",
    [
        ("edges.parquet", [(normalized_adjacency, False), (metis_partitions, False), (compressed_graph, False)]),
        # normalized_adjacency does not read the features; metis_partitions does for the DistDGL parts
        ("features.npy", [(metis_partitions, True), (compressed_graph, False)]),
    ],
)
def test_a_bit_flip_in_a_canonical_file_fails_every_stage_that_reads_it(home, name, stages):
    folder = home["dir"]
    before = {s: folder_bytes(folder / s) for s in STAGES}
    with flipped_bit(folder / "canonical_graph" / name):
        for asset, distdgl in stages:
            step = asset.op.name
            message = _error(_run(home, asset, distdgl), step)
            assert f"canonical_graph/{name}: its SHA-256 differs" in message, message
            assert "damaged or edited after publishing; re-materialize canonical_graph" in message
        if name == "features.npy":
            assert _run(home, normalized_adjacency).success  # reads only the edges and the summary
    after = {s: folder_bytes(folder / s) for s in STAGES}
    refused = [asset.op.name for asset, _ in stages]
    for s in refused:  # the previous output, byte for byte
        assert after[s] == before[s]
    assert [p.name for p in folder.iterdir() if ".tmp-" in p.name or ".old-" in p.name] == []
    assert _run(home, compressed_graph).success  # the bit restored, the stage runs again


def test_a_stage_folder_without_a_hash_record_is_refused_naming_the_stage(home):
    record = home["dir"] / "normalized_adjacency" / "hashes.json"
    kept = record.read_bytes()
    record.unlink()
    try:
        message = _error(_run(home, compressed_graph), "compressed_graph")
    finally:
        record.write_bytes(kept)
    assert "normalized_adjacency/hashes.json: missing" in message and "re-materialize normalized_adjacency" in message


# ----------------------------------------------------------------------------- the shards' upstream files


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> dict:
    """Every stage up to minibatch_shards (fp32 and compressed features), by the library writers."""
    root = tmp_path_factory.mktemp("shards")
    gen = GenerateConfig(num_nodes=300, num_edges=2000, feature_dim=6, num_classes=3, num_edge_files=1, seed=2)
    generate_dataset(gen, root / "landing", progress=False)
    h = root / "home"
    can, adj, parts, comp = (h / s for s in ("canonical_graph", "normalized_adjacency", "metis_partitions", STAGES[3]))
    build_canonical_graph(root / "landing", can)
    build_normalized_adjacency(can, adj)
    build_partitions(can, parts, PartitionConfig(num_parts=2, write_distdgl=False))
    build_compressed_graph(can, adj, parts, comp, CompressConfig(fpr_queries=1000))
    shards = {}
    for encoding in ("fp32", "compressed"):
        cfg = ShardConfig(fanouts="3,3", batch_size=32, epochs=1, world_size=1, feature_encoding=encoding)
        shards[encoding] = h / f"shards-{encoding}" / "minibatch_shards"
        write_minibatch_shards(load_shard_inputs(can, adj, parts, comp), shards[encoding], cfg)
    return {"root": root, "gen": gen, "can": can, "adj": adj, "parts": parts, "comp": comp, "shards": shards}


@pytest.mark.parametrize(
    "encoding, stage, name",
    [
        ("fp32", "canonical_graph", "features.npy"),
        ("fp32", "canonical_graph", "nodes.parquet"),
        ("fp32", "normalized_adjacency", "weights.npy"),
        ("compressed", "compressed_graph", "features_int8.npy"),
    ],
)
def test_an_upstream_file_damaged_after_publishing_is_not_taken_for_a_re_materialization(
    pipeline, encoding, stage, name
):
    shards = pipeline["shards"][encoding]
    read_manifest(shards, verify_upstream_files=True)
    with flipped_bit(shards.parents[1] / stage / name):
        with pytest.raises(DamagedFileError) as caught:
            read_manifest(shards, verify_upstream_files=True)
    message = str(caught.value)
    assert f"{stage}/{name} changed: it no longer matches what {stage} published" in message
    assert f"damaged after publishing; re-materialize {stage}" in message
    assert "re-materialize minibatch_shards" not in message
    assert isinstance(caught.value, CorruptFileError) and isinstance(caught.value, ShardError)
    read_manifest(shards, verify_upstream_files=True)  # restored: accepted again


def test_a_deleted_upstream_file_is_damage_and_a_re_ingested_one_a_re_materialization(pipeline, tmp_path):
    can, shards = pipeline["can"], pipeline["shards"]["fp32"]
    kept = tmp_path / "features.npy"
    shutil.copy2(can / "features.npy", kept)
    (can / "features.npy").unlink()
    try:
        with pytest.raises(
            DamagedFileError, match="features.npy is missing: it no longer matches what canonical_graph"
        ):
            read_manifest(shards, verify_upstream_files=True)
    finally:
        os.replace(kept, can / "features.npy")
    read_manifest(shards, verify_upstream_files=True)
    # canonical_graph published anew from other landing data: a genuine re-materialization
    other = pipeline["root"] / "other"
    generate_dataset(dataclasses.replace(pipeline["gen"], seed=9), other / "landing", progress=False)
    build_canonical_graph(other / "landing", other / "canonical_graph")
    saved = pipeline["root"] / "saved_canonical"
    os.rename(can, saved)
    shutil.copytree(other / "canonical_graph", can)
    try:
        with pytest.raises(ShardError) as caught:
            read_manifest(shards, verify_upstream_files=True)
        assert not isinstance(caught.value, DamagedFileError)
        assert "canonical_graph was re-materialized; re-materialize minibatch_shards" in str(caught.value)
        (can / "hashes.json").unlink()  # no record: it cannot be told, so the stage comes first
        with pytest.raises(ShardError, match="no hash record to tell.*re-materialize canonical_graph, then minibatch"):
            read_manifest(shards, verify_upstream_files=True)
    finally:
        shutil.rmtree(can)
        os.rename(saved, can)


@pytest.mark.parametrize(
    "stage, name",
    [
        ("canonical_graph", "features.npy"),
        ("canonical_graph", "nodes.parquet"),
        ("normalized_adjacency", "indices.npy"),
        ("normalized_adjacency", "row_scale.npy"),
        ("metis_partitions", "cluster_id.npy"),
        ("compressed_graph", "feature_scales.npy"),
    ],
)
def test_minibatch_shards_refuses_a_damaged_input_instead_of_recording_its_hash(pipeline, tmp_path, stage, name):
    p = pipeline
    out = tmp_path / "minibatch_shards"
    cfg = ShardConfig(fanouts="3,3", batch_size=32, epochs=1, world_size=1, feature_encoding="compressed")
    with flipped_bit(p["can"].parent / stage / name):  # every stage folder sits in one home
        with pytest.raises(CorruptFileError, match=f"{stage}/{name}: .*re-materialize {stage}"):
            write_minibatch_shards(load_shard_inputs(p["can"], p["adj"], p["parts"], p["comp"]), out, cfg)
    assert not out.exists()


# ----------------------------------------------------------------------------- readers of published files


def test_a_damaged_shard_file_names_itself_and_minibatch_shards(pipeline):
    shards = pipeline["shards"]["fp32"]
    manifest = read_manifest(shards)
    record = stream_record(manifest, 0, 0)
    path = shards / record["files"][0]["path"]
    with flipped_bit(path):
        with pytest.raises(
            DamagedFileError, match="damaged after minibatch_shards published it; re-materialize minibatch"
        ):
            read_shard(shards, record["files"][0])
    kept = path.read_bytes()
    path.write_bytes(kept[:-10])
    try:
        with pytest.raises(ShardError, match=r"damaged \(truncated or replaced\) after minibatch_shards published it"):
            read_shard(shards, record["files"][0])
    finally:
        path.write_bytes(kept)
    with flipped_bit(shards / "manifest.json", offset=3, bit=0):  # a space in the manifest becomes '!'
        with pytest.raises(
            DamagedFileError, match="manifest.json: its SHA-256 differs.*re-materialize minibatch_shards"
        ):
            read_manifest(shards, verify_upstream_files=True)


def test_bloom_filters_and_compressed_features_are_checked_when_opened(pipeline):
    comp = pipeline["comp"]
    with flipped_bit(comp / "bloom" / "part-1.bloom"):
        with pytest.raises(CorruptFileError, match="bloom/part-1.bloom: its SHA-256 differs.*compressed_graph"):
            load_bloom_filters(comp)
    assert len(load_bloom_filters(comp)) == 2
    with flipped_bit(comp / "features_int8.npy"):
        with pytest.raises(CorruptFileError, match="features_int8.npy: its SHA-256 differs.*compressed_graph"):
            load_features(comp)
        # training opens them unchecked: the shards' manifest records their hash (verify_upstream)
        assert load_features(comp, verify=False).num_rows == 300
    assert load_features(comp).num_rows == 300


def test_the_digest_cache_sees_a_rewrite_whose_times_were_set_back(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_mod, "_SETTLED_NS", 0)
    path = tmp_path / "f.bin"
    path.write_bytes(b"a" * 1000)
    first = cached_file_sha256(path)
    assert storage_mod._DIGESTS[(path.stat().st_dev, path.stat().st_ino)][1] == first
    st = path.stat()
    time.sleep(0.05)  # past the clock tick that stamped the first write
    with open(path, "r+b") as f:  # same size, in place, times restored: the change time still moves
        f.write(b"b")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cached_file_sha256(path) != first


# ----------------------------------------------------------------------------- disk full


def _no_space(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_memory_mapped_output_reserves_its_space_and_names_the_file_when_the_disk_is_full(tmp_path, monkeypatch):
    created = create_npy_memmap(tmp_path / "ok.npy", np.float32, (1000, 4))
    assert os.stat(tmp_path / "ok.npy").st_blocks * 512 >= created.nbytes  # allocated, not sparse
    monkeypatch.setattr(os, "posix_fallocate", _no_space)
    with pytest.raises(DiskFullError) as caught:
        create_npy_memmap(tmp_path / "big.npy", np.int8, (1000, 64))
    message = str(caught.value)
    assert message.startswith(f"disk full writing {tmp_path / 'big.npy'}: 64,000 bytes needed, ")
    assert " bytes free on " in message and caught.value.errno == errno.ENOSPC
    with pytest.raises(DiskFullError, match="rows.npy: 12,000 bytes needed"):
        NpyRowWriter(tmp_path / "rows.npy", np.float32, (1000, 3))


def test_compressed_graph_on_a_full_disk_fails_naming_the_file_and_keeps_its_previous_output(home, monkeypatch):
    folder = home["dir"] / "compressed_graph"
    before = folder_bytes(folder)
    monkeypatch.setattr(os, "posix_fallocate", _no_space)
    message = _error(_run(home, compressed_graph), "compressed_graph")
    assert "disk full writing " in message and ".tmp-" in message and "features_int8.npy: 3,200 bytes needed" in message
    assert folder_bytes(folder) == before
    assert [p.name for p in folder.parent.iterdir() if ".tmp-" in p.name] == []


def test_staged_output_reports_any_writer_s_full_disk(tmp_path):
    with pytest.raises(DiskFullError, match=r"disk full writing .*part\.npy: [0-9,]+ bytes free on "):
        with staged_output(tmp_path / "stage") as out:
            out.mkdir()
            raise OSError(errno.ENOSPC, "No space left on device", str(out / "part.npy"))
    assert list(tmp_path.iterdir()) == []


_FULL_DISK_RUN = """
import sys
from pathlib import Path
from graphs.stages.compress import build_compressed_graph
from graphs.infra.storage import staged_output
home, out = Path(sys.argv[1]), Path(sys.argv[2])
with staged_output(out / "compressed_graph") as tmp:  # as the asset publishes (storage.publishing)
    build_compressed_graph(home / "canonical_graph", home / "normalized_adjacency", home / "metis_partitions", tmp)
"""


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (needs root: skipped where mount is not allowed)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()[:120]}); the fallocate test covers the logic")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_compressed_graph_on_a_real_full_disk_raises_instead_of_dying_of_sigbus(tmp_path, small_tmpfs):
    gen = GenerateConfig(num_nodes=20_000, num_edges=40_000, feature_dim=96, num_classes=3, num_edge_files=1)
    generate_dataset(gen, tmp_path / "landing", progress=False)
    h = tmp_path / "home"
    build_canonical_graph(tmp_path / "landing", h / "canonical_graph")
    build_normalized_adjacency(h / "canonical_graph", h / "normalized_adjacency")
    build_partitions(h / "canonical_graph", h / "metis_partitions", PartitionConfig(num_parts=2, write_distdgl=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_RUN, str(h), str(small_tmpfs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, f"exit {run.returncode} (-7 is SIGBUS): {run.stderr[-2000:]}"
    last = run.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("graphs.infra.storage.DiskFullError: disk full writing ")
        and "features_int8.npy: 1,920,000 bytes needed" in last
    )
    assert f"bytes free on {small_tmpfs}" in last
    assert list(small_tmpfs.iterdir()) == []  # the staging folder removed
