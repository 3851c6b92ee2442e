"""graphs.formats.shard_format: one definition of the shard keys, version and manifest for writer and reader."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from graphs.formats import shard_codec as codec
from graphs.formats import shard_format as sf
from graphs.formats.npzio import write_npz
from training.blocks import correction_is_per_dst

ROOT = Path(__file__).resolve().parents[1]


def _minibatch(loss_weight=None):
    """Two blocks: 5 sources -> 3 destinations -> 2 destinations (hand-made CSC)."""
    b0 = SimpleNamespace(
        indptr=np.array([0, 2, 3, 5], np.int64),
        indices=np.array([3, 4, 0, 1, 4], np.int32),
        num_src=5,
        num_dst=3,
        weight=np.array([0.5, -0.25, 1.0, 0.125, 2.0], np.float32),
        correction=np.array([1.0, 2.5, 1.0, 1.0, 3.0], np.float32),
    )
    b1 = SimpleNamespace(
        indptr=np.array([0, 1, 3], np.int64),
        indices=np.array([2, 0, 1], np.int32),
        num_src=3,
        num_dst=2,
        weight=np.array([0.3, 0.6, -0.9], np.float32),
        correction=np.array([1.0, 1.0, 4.0], np.float32),
    )
    return SimpleNamespace(
        input_nodes=np.array([7, 2, 9, 11, 4], np.int64),
        seeds=np.array([7, 2], np.int64),
        seed_pos=np.array([0, 1], np.int64),
        labels=np.array([1, 0], np.int64),
        loss_weight=loss_weight,
        blocks=[b0, b1],
    )


def test_keys_follow_the_documented_scheme():
    assert sf.minibatch_key(3, "seeds") == "mb3_seeds"
    assert sf.block_key(3, 1, "indptr") == "mb3_l1_indptr"
    assert sf.shard_relpath(2, 1, 7) == "epoch=2/rank=1/shard-00007.npz"
    arrays = codec.encode_shard([_minibatch(), _minibatch(np.array([0.5, 2.0], np.float32))], "fp32")
    assert int(arrays["format_version"]) == sf.FORMAT_VERSION and int(arrays["minibatches"]) == 2
    # every key is a header key or a documented minibatch / block entry
    names = set(sf.MINIBATCH_ENTRIES) | set(sf.BLOCK_ENTRIES)
    for key in arrays:
        if key in sf.HEADER_KEYS:
            continue
        rest = key.split("_", 1)[1]
        if rest.startswith("l") and rest[1].isdigit():
            rest = rest.split("_", 1)[1]
        assert rest in names, key
    assert "mb0_loss_weight" not in arrays and "mb1_loss_weight" in arrays
    assert arrays["mb0_input_nodes"].dtype == np.int32  # ids < 2^31 stored as int32


@pytest.mark.parametrize("encoding", sf.WEIGHT_ENCODINGS)
def test_encode_then_read_back_through_a_file(tmp_path, encoding):
    mb = _minibatch(np.array([0.5, 2.0], np.float32))
    size, digest = write_npz(tmp_path / "s.npz", codec.encode_shard([mb], encoding))
    record = {"path": "s.npz", "bytes": size, "sha256": digest, "minibatches": 1}
    got = codec.decode_minibatch(sf.read_shard(tmp_path, record), 0, 2, encoding)
    assert got.input_nodes.tolist() == [7, 2, 9, 11, 4]
    assert got.seeds.tolist() == [7, 2] and got.labels.tolist() == [1, 0]
    assert got.loss_weight.tolist() == [0.5, 2.0]
    for stored, orig in zip(got.blocks, mb.blocks):
        assert stored.indptr.tolist() == orig.indptr.tolist()
        assert stored.indices.tolist() == orig.indices.tolist()
        assert (stored.num_src, stored.num_dst) == (orig.num_src, orig.num_dst)
        assert np.array_equal(
            stored.correction_per_edge(), orig.correction
        )  # FP32, on its own, whatever the weights' encoding
        w = stored.decoded_weight()
        if encoding == "fp32":
            assert stored.weight_q is None and np.array_equal(w, orig.weight)
        elif encoding == "factors":  # no byte per edge: training recomputes them from Â's scales
            assert w is None and stored.weight is None and stored.weight_q is None
        else:
            assert stored.weight is None and stored.weight_q.dtype == np.int8
            # per-destination symmetric INT8: error at most half a step of that row's scale
            step = np.repeat(stored.weight_scale, np.diff(orig.indptr))
            assert np.all(np.abs(w - orig.weight) <= step / 2 + 1e-7)


def test_correction_is_stored_per_destination_only_where_that_is_exact():
    indptr = np.array([0, 3, 3, 4, 7], np.int64)  # destination 1 has no in-edge
    loops = np.array([1, 2, 2, 1, 1, 5, 5], np.float32)  # self loop first, one value for the others
    same = np.array([2, 2, 2, 1, 5, 5, 5], np.float32)  # one value per destination
    per_edge = np.array([1, 2, 3, 1, 1, 5, 5], np.float32)  # destination 0's others differ
    for c, per_dst in ((loops, False), (same, True), (per_edge, None)):
        compact = codec.compact_correction(indptr, c)
        assert (compact is None) == (per_dst is None)
        if compact is not None:
            assert np.array_equal(codec.expand_correction(indptr, *compact), c)
        b = SimpleNamespace(
            indptr=indptr, indices=np.zeros(7, np.int32), num_src=4, num_dst=4, weight=np.ones(7, np.float32)
        )
        mb = _minibatch()
        mb.blocks = [SimpleNamespace(**vars(b), correction=c)]
        arrays = codec.encode_shard([mb], "fp32")
        assert ("mb0_l0_correction" in arrays) == (per_dst is None)  # 8 bytes per destination instead of 4 per edge
        stored = codec.decode_minibatch(arrays, 0, 1).blocks[0]
        assert np.array_equal(stored.correction_per_edge(), c) and stored.correction_per_edge().dtype == np.float32
        assert stored.correction_per_dst == per_dst  # None: the reader checks the edges itself
        assert per_dst is None or per_dst == correction_is_per_dst(indptr, c)


def test_a_block_expands_its_compact_correction_as_the_format_does():
    import torch

    from training.blocks import Block

    indptr = np.array([0, 3, 3, 4, 7], np.int64)
    first, rest = np.array([1, 1, 3, 1], np.float32), np.array([2, 1, 3, 5], np.float32)
    block = Block(
        torch.from_numpy(indptr),
        torch.zeros(7, dtype=torch.int64),
        4,
        4,
        correction_compact=(torch.from_numpy(first), torch.from_numpy(rest)),
    )
    want = codec.expand_correction(indptr, first, rest)
    assert want.tolist() == [1, 2, 2, 3, 1, 5, 5]
    assert torch.equal(block.correction, torch.from_numpy(want))
    assert block.to("cpu") is block  # already there: the same block, the expanded correction kept


def test_read_shard_hashes_a_file_again_only_when_it_changed(tmp_path, monkeypatch):
    size, digest = write_npz(tmp_path / "s.npz", codec.encode_shard([_minibatch()], "fp32"))
    record = {"path": "s.npz", "bytes": size, "sha256": digest, "minibatches": 1}
    path = tmp_path / "s.npz"
    hashed = []
    real = sf.hashlib.sha256
    monkeypatch.setattr(sf.hashlib, "sha256", lambda data: hashed.append(1) or real(data))
    sf.read_shard(tmp_path, record)
    sf.read_shard(tmp_path, record)
    assert len(hashed) == 2  # written just now: hashed at every read
    later = time.time_ns() + 10 * sf._SETTLED_NS
    monkeypatch.setattr(sf.time, "time_ns", lambda: later)  # the file's times are now well in the past
    written = path.stat().st_mtime_ns
    sf.read_shard(tmp_path, record)
    sf.read_shard(tmp_path, record)
    sf.read_shard(tmp_path, record, verify=False)
    assert len(hashed) == 3  # settled: hashed once, then trusted while unchanged
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # corrupted in place: same inode and size, its modification time set back
    path.write_bytes(bytes(data))
    os.utime(path, ns=(written, written))  # only the change time tells
    with pytest.raises(sf.ShardError, match=r"s\.npz: SHA-256 .* does not match"):
        sf.read_shard(tmp_path, record)
    assert len(hashed) == 4


def test_read_shard_refuses_other_versions_and_counts(tmp_path):
    arrays = codec.encode_shard([_minibatch()], "fp32")
    arrays["format_version"] = np.int64(sf.FORMAT_VERSION + 1)
    size, digest = write_npz(tmp_path / "s.npz", arrays)
    record = {"path": "s.npz", "bytes": size, "sha256": digest, "minibatches": 1}
    with pytest.raises(sf.ShardError, match=rf"s\.npz: shard format version {sf.FORMAT_VERSION + 1}"):
        sf.read_shard(tmp_path, record)
    arrays["format_version"] = np.int64(sf.FORMAT_VERSION)
    size, digest = write_npz(tmp_path / "s.npz", arrays)
    with pytest.raises(sf.ShardError, match="holds 1 minibatches, manifest says 2"):
        sf.read_shard(tmp_path, {**record, "bytes": size, "sha256": digest, "minibatches": 2})


def _manifest() -> dict:
    m = {k: 0 for k, spec in sf.MANIFEST_KEYS.items() if spec.required}
    m["format_version"] = sf.FORMAT_VERSION
    m["streams"] = [{"epoch": 0, "rank": 1, "files": []}]
    m["world_size"], m["epochs"] = 2, 1
    return m


def test_manifest_round_trip_and_validation(tmp_path):
    sf.write_manifest(tmp_path, _manifest())
    m = sf.read_manifest(tmp_path)
    assert sf.stream_record(m, 0, 1) == {"epoch": 0, "rank": 1, "files": []}
    with pytest.raises(sf.ShardError, match="no stream for epoch 0, rank 0"):
        sf.stream_record(m, 0, 0)
    with pytest.raises(ValueError, match="world_size=2"):
        sf.stream_record(m, 0, 2)
    bad = _manifest()
    del bad["streams"]
    with pytest.raises(sf.ShardError, match=r"lacks \['streams'\]"):
        sf.write_manifest(tmp_path, bad)
    (tmp_path / sf.MANIFEST_NAME).write_text(json.dumps({**_manifest(), "format_version": 0}))
    with pytest.raises(sf.ShardError, match=r"manifest\.json: shard format version 0, this code reads version"):
        sf.read_manifest(tmp_path)
    with pytest.raises(sf.ShardError, match="no manifest; materialize minibatch_shards"):
        sf.read_manifest(tmp_path / "absent")


def test_writer_and_reader_share_the_module():
    """One owner: the sampler and the training reader use shard_format's names, not their own."""
    import graphs.sampling.writer as writer
    import training.data as data

    assert writer.FORMAT_VERSION is sf.FORMAT_VERSION
    assert data.read_manifest is sf.read_manifest and data.ShardError is sf.ShardError
    for path in (ROOT / "graphs" / "sampling", ROOT / "graphs" / "sampling.py", ROOT / "training" / "data.py"):
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.exists() else []
        for f in files:
            text = f.read_text()
            assert 'f"mb{' not in text and "FORMAT_VERSION = " not in text, f


def test_shard_format_imports_neither_dgl_nor_torch():
    code = "import sys, graphs.formats.shard_format; print(sorted(m for m in ('dgl', 'torch', 'dagster') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_new_optional_block_entry_travels_without_touching_the_reader(tmp_path, monkeypatch):
    """How a later format change (a per-edge array beyond the core ones) goes through this module."""
    monkeypatch.setitem(sf.BLOCK_ENTRIES, "edge_factor", sf.Entry("float32 [nnz] per-edge factor", required=False))
    mb = _minibatch()
    mb.blocks[0].edge_factor = np.array([1, 2, 3, 4, 5], np.float32)
    size, digest = write_npz(tmp_path / "s.npz", codec.encode_shard([mb], "fp32"))
    got = codec.decode_minibatch(
        sf.read_shard(tmp_path, {"path": "s.npz", "bytes": size, "sha256": digest, "minibatches": 1}), 0, 2
    )
    assert got.blocks[0].extra["edge_factor"].tolist() == [1, 2, 3, 4, 5]
    assert got.blocks[1].extra == {}  # absent on block 1: not written, not read
