"""compressed_graph library and asset: files and dtypes, dequantization bounds, Bloom filters
without false negatives and at their target rate, exact 0/1 features (Cora), chunked
processing, the checks catching corrupted files, and materialization through Dagster."""

import json
import shutil

import dagster as dg
import numpy as np
import pytest

from assets.canonical_graph import canonical_graph
from assets.common import GnnflowStorage, dataset_partitions
from assets.compressed_graph import check_compressed_graph, compressed_graph
from assets.metis_partitions import metis_partitions
from assets.normalized_adjacency import normalized_adjacency
from graphs.infra.storage import write_file_hashes
from graphs.kernels.bloom import BloomFilter, measured_fpr
from graphs.kernels.quantize_csr import dequantize_int8_rows_csr
from graphs.stages.canonical import CanonicalConfig, build_canonical_graph
from graphs.stages.compress import (
    CompressConfig,
    build_compressed_graph,
    load_bloom_filters,
    load_features,
    load_weights,
    verify_compressed_graph,
)
from graphs.stages.compress_bloom import csr_contains, might_be_edge
from graphs.stages.compress_features import encoding_nbytes
from graphs.stages.normalize import build_normalized_adjacency, load_csr
from graphs.stages.partition import PartitionConfig, build_partitions, read_edges
from graphs.synthetic.generate import GenerateConfig, generate_dataset

K = 4


def _prepare(landing, root, num_parts=K, symmetrize=True):
    """canonical, adjacency and partition folders under `root` for the dataset in `landing`."""
    build_canonical_graph(landing, root / "canonical", CanonicalConfig(symmetrize=symmetrize))
    build_normalized_adjacency(root / "canonical", root / "adj")
    build_partitions(root / "canonical", root / "parts", PartitionConfig(num_parts=num_parts, write_distdgl=False))
    return root / "canonical", root / "adj", root / "parts"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A generated 2000-node graph (continuous features), its inputs and its int8 compression."""
    root = tmp_path_factory.mktemp("small")
    generate_dataset(GenerateConfig(num_nodes=2000, num_edges=20000, seed=3), root / "landing", progress=False)
    inputs = _prepare(root / "landing", root)
    summary = build_compressed_graph(*inputs, root / "out", CompressConfig())
    return root, inputs, summary


def _inputs_dict(inputs):
    return dict(zip(("canonical_graph", "normalized_adjacency", "metis_partitions"), inputs))


def test_files_dtypes_and_manifest(small):
    root, (canonical, adj, _), s = small
    out = root / "out"
    x = np.load(canonical / "features.npy")
    n, d = x.shape
    nnz = len(np.load(adj / "weights.npy"))
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == sorted(
        [
            "features_int8.npy",
            "feature_scales.npy",
            "weights_int8.npy",
            "weight_scales.npy",
            "manifest.json",
            "summary.json",
            "run_stats.json",
            "hashes.json",
        ]
        + [f"bloom/part-{p}.bloom" for p in range(K)]
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == 1 and manifest["feature_encoding"] == "int8"
    files = manifest["files"]
    assert files["features_int8.npy"]["dtype"] == "int8" and files["features_int8.npy"]["shape"] == [n, d]
    assert files["feature_scales.npy"]["dtype"] == "float32" and files["feature_scales.npy"]["shape"] == [2, d]
    assert files["weights_int8.npy"]["dtype"] == "int8" and files["weights_int8.npy"]["shape"] == [nnz]
    assert files["weight_scales.npy"]["dtype"] == "float32" and files["weight_scales.npy"]["shape"] == [n]
    assert s["feature_encoding"] == "int8" and s["format_version"] == 1
    assert json.loads((out / "summary.json").read_text())["total"] == s["total"]


def test_dequantized_features_and_weights_within_bounds(small):
    root, (canonical, adj, _), s = small
    x = np.load(canonical / "features.npy")
    feats = load_features(root / "out")
    x_hat = feats.decode()
    scale = feats.arrays["scale"]
    err = np.abs(x.astype(np.float64) - x_hat).max(axis=0)
    assert (err <= scale * 0.5001 + 1e-6).all()
    assert err.max() > 0  # continuous features are not stored exactly
    assert s["features"]["max_abs_error"] == pytest.approx(err.max())
    rel = np.linalg.norm(x.astype(np.float64) - x_hat) / np.linalg.norm(x.astype(np.float64))
    assert s["features"]["rel_rms_error"] == pytest.approx(rel, rel=1e-6)
    # the torch decode of a batch equals the NumPy decode
    rows = np.array([5, 0, 1999, 17])
    np.testing.assert_array_equal(feats.decode_rows_torch(rows).numpy(), x_hat[rows])

    csr = load_csr(adj)
    q, wscale = load_weights(root / "out")
    w_hat = dequantize_int8_rows_csr(np.asarray(csr.indptr), np.asarray(q), np.asarray(wscale))
    row = np.repeat(np.arange(csr.n), np.diff(csr.indptr))
    w = np.asarray(csr.weights, dtype=np.float64)
    assert (np.abs(w - w_hat) <= wscale[row] * 0.5001 + 1e-9).all()
    # per-row scale: each row's largest weight is 127 * scale
    np.testing.assert_allclose(np.maximum.reduceat(w, csr.indptr[:-1]), 127 * wscale.astype(np.float64), rtol=1e-6)
    assert s["weights"]["bytes_after"] == nnz_bytes(csr)


def nnz_bytes(csr):
    return csr.nnz + 4 * csr.n


def test_every_true_edge_is_accepted_by_its_parts_filters(small):
    root, (canonical, _, parts), s = small
    n, src, dst = read_edges(canonical)
    part = np.load(parts / "part_id.npy")
    filters = load_bloom_filters(root / "out")
    assert len(filters) == K
    for p, bf in enumerate(filters):
        incident = (part[src] == p) | (part[dst] == p)
        assert incident.any()
        assert bf.might_contain(src[incident], dst[incident]).all()
        assert bf.might_contain(dst[incident], src[incident]).all()
        assert bf.count == s["bloom"]["keys_per_part"][p] == int(incident.sum())  # symmetrized: no extra reverse keys
    assert might_be_edge(filters, part, src, dst).all()
    assert might_be_edge(filters, part, dst, src).all()


def test_false_positive_rate_within_1_5x_target(small):
    root, (canonical, _, parts), s = small
    b = s["bloom"]
    assert b["fpr_queries"] == 1_000_000
    assert 0.005 < b["measured_fpr"] <= 1.5 * b["target_fpr"]
    assert max(b["measured_fpr_per_part"]) <= 1.5 * b["target_fpr"]
    # independently, with the Bloom module's own measurement against the sorted true edge keys
    n, src, dst = read_edges(canonical)
    part = np.load(parts / "part_id.npy")
    bf = BloomFilter.load(root / "out" / "bloom" / "part-0.bloom")
    incident = (part[src] == 0) | (part[dst] == 0)
    fpr = measured_fpr(bf, 1_000_000, n, exclude=(src[incident], dst[incident]), seed=7)
    assert fpr <= 1.5 * b["target_fpr"]
    assert b["bytes_after"] < b["bytes_before"] / 10  # far below 16 bytes per edge
    assert 9 < b["bits_per_key"] < 11.5


def test_compression_ratio_and_encoding_trade_off(small):
    _, (canonical, _, _), s = small
    n, d = np.load(canonical / "features.npy", mmap_mode="r").shape
    f, total = s["features"], s["total"]
    assert f["bytes_before"] == 4 * n * d and f["bytes_after"] == n * d + 8 * d
    assert set(f["encodings"]) == {"int8", "int4"}  # continuous features: no binary option
    assert f["encodings"]["int4"]["bytes"] == encoding_nbytes("int4", n, d) == n * d // 2 + 8 * d
    assert f["encodings"]["int4"]["rel_rms_error"] > 8 * f["encodings"]["int8"]["rel_rms_error"]
    assert f["encodings"]["int4"]["asset_ratio"] > f["encodings"]["int8"]["asset_ratio"] == total["ratio"]
    before = f["bytes_before"] + s["weights"]["bytes_before"] + s["bloom"]["bytes_before"]
    after = f["bytes_after"] + s["weights"]["bytes_after"] + s["bloom"]["bytes_after"]
    assert (total["bytes_before"], total["bytes_after"]) == (before, after)
    assert total["ratio"] == pytest.approx(before / after) and total["ratio"] > 4


def test_int4_encoding_and_chunked_processing(small, tmp_path):
    root, inputs, _ = small
    canonical = inputs[0]
    s = build_compressed_graph(
        *inputs, tmp_path / "int4", CompressConfig(feature_encoding="int4", chunk_rows=7, compare_encodings=False)
    )
    assert (tmp_path / "int4" / "features_int4.npy").is_file() and not (
        tmp_path / "int4" / "features_int8.npy"
    ).exists()
    feats = load_features(tmp_path / "int4")
    x = np.load(canonical / "features.npy")
    assert feats.arrays["packed"].shape == (x.shape[0], (x.shape[1] + 1) // 2)
    assert (np.abs(x - feats.decode()).max(axis=0) <= feats.arrays["scale"] * 0.5001 + 1e-6).all()
    assert set(s["features"]["encodings"]["int8"]) == {"bytes", "saving", "asset_ratio", "asset_saving"}
    # blocks of 7 rows give the same bytes as the default blocks
    small_blocks = build_compressed_graph(*inputs, tmp_path / "int8", CompressConfig(chunk_rows=7))
    for name in (
        "features_int8.npy",
        "feature_scales.npy",
        "weights_int8.npy",
        "weight_scales.npy",
        "bloom/part-1.bloom",
    ):
        assert (tmp_path / "int8" / name).read_bytes() == (root / "out" / name).read_bytes(), name
    assert small_blocks["features"]["encodings"]["int4"]["rel_rms_error"] == pytest.approx(
        s["features"]["rel_rms_error"]
    )
    assert verify_compressed_graph(tmp_path / "int4", *inputs)["feature_columns_over_bound"] == 0


def test_asinh_transform_on_heavy_tailed_features(small, tmp_path):
    _, (canonical, adj, parts), _ = small
    heavy = tmp_path / "canonical"
    heavy.mkdir()
    for name in ("edges.parquet", "nodes.parquet", "summary.json"):
        shutil.copyfile(canonical / name, heavy / name)
    x = np.exp(2.5 * np.load(canonical / "features.npy")).astype(np.float32)  # log-normal columns
    np.save(heavy / "features.npy", x)
    write_file_hashes(heavy)  # a canonical graph published with these features
    cfg = dict(feature_encoding="int4", fpr_queries=1000)
    plain = build_compressed_graph(heavy, adj, parts, tmp_path / "plain", CompressConfig(**cfg))
    s = build_compressed_graph(heavy, adj, parts, tmp_path / "asinh", CompressConfig(feature_transform="asinh", **cfg))
    assert s["features"]["transform"] == "asinh" and plain["features"]["transform"] == "none"
    feats = load_features(tmp_path / "asinh")
    # 16 equal steps over [min, max] of x leave the bulk of a log-normal column in the lowest
    # bucket; over asinh(x) the typical value keeps a few % relative error
    median_rel = {
        name: np.median(np.abs(load_features(tmp_path / name).decode() - x) / x) for name in ("plain", "asinh")
    }
    assert median_rel["asinh"] < median_rel["plain"] / 3
    assert (
        feats.transform == "asinh"
        and json.loads((tmp_path / "asinh" / "manifest.json").read_text())["feature_transform"] == "asinh"
    )
    x_hat = feats.decode()
    codes = np.asarray(feats.arrays["packed"])
    t_hat = (
        np.stack([codes & 15, codes >> 4], -1).reshape(len(x), -1)[:, : x.shape[1]] * feats.arrays["scale"]
        + feats.arrays["zero_point"]
    )
    np.testing.assert_array_equal(x_hat, np.sinh(t_hat.astype(np.float32)))
    # within half a step in asinh space, where the quantizer works
    assert (np.abs(np.arcsinh(x) - t_hat).max(axis=0) <= feats.arrays["scale"] * 0.5001 + 1e-6).all()
    np.testing.assert_allclose(feats.decode_rows_torch([0, 7]).numpy(), x_hat[[0, 7]], rtol=1e-6)
    assert s["features"]["rel_rms_error"] == pytest.approx(
        np.linalg.norm(x.astype(np.float64) - x_hat) / np.linalg.norm(x.astype(np.float64)), rel=1e-6
    )
    v = verify_compressed_graph(tmp_path / "asinh", heavy, adj, parts)
    assert v["feature_columns_over_bound"] == 0
    with pytest.raises(ValueError, match="feature_transform"):
        CompressConfig(feature_encoding="binary", feature_transform="asinh")
    with pytest.raises(ValueError, match="feature_transform"):
        CompressConfig(feature_transform="log")


def test_binary_encoding_rejects_continuous_features(small, tmp_path):
    _, inputs, _ = small
    with pytest.raises(ValueError, match="exactly 0 or 1"):
        build_compressed_graph(*inputs, tmp_path / "bin", CompressConfig(feature_encoding="binary"))
    assert not (tmp_path / "bin").exists()


def test_cora_auto_picks_binary_and_round_trips_exactly(tmp_path, shared_datasets):
    inputs = _prepare(shared_datasets / "cora", tmp_path, num_parts=2)
    x = np.load(inputs[0] / "features.npy")
    s = build_compressed_graph(*inputs, tmp_path / "auto", CompressConfig(fpr_queries=200_000))
    assert s["feature_encoding"] == "binary" and s["features"]["binary_valued"]
    feats = load_features(tmp_path / "auto")
    assert feats.arrays["packed"].shape == (2708, (1433 + 7) // 8)
    np.testing.assert_array_equal(feats.decode(), x)
    np.testing.assert_array_equal(feats.decode_rows_torch([3, 2700]).numpy(), x[[3, 2700]])
    enc = s["features"]["encodings"]
    assert set(enc) == {"int8", "int4", "binary"}
    for name in enc:  # 0/1 columns decode exactly under every encoding
        assert enc[name]["max_abs_error"] == 0.0 and enc[name]["rel_rms_error"] == 0.0
    assert enc["binary"]["saving"] > 0.96 and s["total"]["ratio"] > 10

    s8 = build_compressed_graph(
        *inputs, tmp_path / "int8", CompressConfig(feature_encoding="int8", fpr_queries=200_000)
    )
    assert s8["features"]["max_abs_error"] == 0.0
    np.testing.assert_array_equal(load_features(tmp_path / "int8").decode(), x)
    v = verify_compressed_graph(tmp_path / "auto", *inputs)
    assert v["bloom_false_negatives"] == 0 and v["bloom_edges_checked"] == 10556
    assert v["feature_columns_over_bound"] == 0 and v["weight_rows_over_bound"] == 0


def test_dataset_without_features_gets_weights_and_filters(tmp_path, shared_datasets):
    inputs = _prepare(
        shared_datasets / "email-eu-core", tmp_path, num_parts=3, symmetrize=False
    )  # directed, no features
    s = build_compressed_graph(*inputs, tmp_path / "out", CompressConfig(fpr_queries=100_000))
    assert s["features"] is None and s["feature_encoding"] is None and not s["symmetrized"]
    assert load_features(tmp_path / "out") is None
    assert not list((tmp_path / "out").glob("features_*.npy"))
    n, src, dst = read_edges(inputs[0])
    part = np.load(inputs[2] / "part_id.npy")
    filters = load_bloom_filters(tmp_path / "out")
    # a directed graph: both (u, v) and (v, u) are inserted, in the parts of both endpoints
    for p, bf in enumerate(filters):
        inc = (part[src] == p) | (part[dst] == p)
        assert bf.might_contain(src[inc], dst[inc]).all() and bf.might_contain(dst[inc], src[inc]).all()
    assert s["bloom"]["keys"] == 2 * (len(src) + int(np.count_nonzero(part[src] != part[dst])))
    assert s["total"]["bytes_before"] == s["weights"]["bytes_before"] + 16 * len(src)
    v = verify_compressed_graph(tmp_path / "out", *inputs)
    assert v["bloom_false_negatives"] == 0 and v["weight_rows_over_bound"] == 0


def test_checks_catch_corrupted_files(small, tmp_path):
    root, inputs, _ = small
    out = tmp_path / "out"
    shutil.copytree(root / "out", out)
    cfg = CompressConfig()
    assert all(c.passed for c in check_compressed_graph(out, _inputs_dict(inputs), cfg))
    q = np.load(out / "features_int8.npy", mmap_mode="r+")
    q[10, 3] = q[10, 3] + 1 if q[10, 3] < 127 else 0  # one step off: just over half a step of error
    q.flush()
    w = np.load(out / "weights_int8.npy", mmap_mode="r+")
    w[:5] = 0
    w.flush()
    del q, w
    data = bytearray((out / "bloom" / "part-2.bloom").read_bytes())
    data[64:] = bytes(len(data) - 64)  # an all-zero filter rejects every edge
    (out / "bloom" / "part-2.bloom").write_bytes(bytes(data))
    write_file_hashes(out)  # as a faulty writer would have published them
    v = verify_compressed_graph(out, *inputs)
    assert v["feature_columns_over_bound"] == 1 and v["weight_rows_over_bound"] >= 1
    assert v["bloom_false_negatives"] > 0
    assert not any(c.passed for c in check_compressed_graph(out, _inputs_dict(inputs), cfg))


def test_csr_contains_matches_brute_force():
    rng = np.random.default_rng(0)
    n = 50
    dense = rng.random((n, n)) < 0.1
    dense[3] = False  # an empty row
    dense[7] = True  # a full row
    indptr = np.concatenate([[0], np.cumsum(dense.sum(axis=1))])
    indices = np.nonzero(dense)[1].astype(np.int32)
    u, v = rng.integers(0, n, size=(2, 5000))
    np.testing.assert_array_equal(csr_contains(indptr, indices, u, v), dense[u, v])
    assert not csr_contains(np.zeros(4, np.int64), np.zeros(0, np.int32), [0, 2], [1, 0]).any()


def test_config_validation_and_sizes():
    with pytest.raises(ValueError, match="feature_encoding"):
        CompressConfig(feature_encoding="fp16")
    with pytest.raises(ValueError, match="bloom_fpr"):
        CompressConfig(bloom_fpr=0.0)
    with pytest.raises(ValueError, match="chunk_rows"):
        CompressConfig(chunk_rows=-1)
    assert encoding_nbytes("binary", 10, 9) == 20 and encoding_nbytes("int4", 10, 3) == 20 + 24
    assert encoding_nbytes("int8", 10, 3) == 30 + 24 and encoding_nbytes("fp32", 10, 3) == 120


def test_asset_materializes_with_passing_checks(tmp_path):
    generate_dataset(
        GenerateConfig(num_nodes=2000, num_edges=20000, seed=5), tmp_path / "landing" / "tiny", progress=False
    )
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(dataset_partitions.name, ["tiny"])
    storage = GnnflowStorage(home=str(tmp_path / "home"), landing=str(tmp_path / "landing"))
    result = dg.materialize(
        [canonical_graph, normalized_adjacency, metis_partitions, compressed_graph],
        partition_key="tiny",
        instance=instance,
        resources={"storage": storage},
        run_config={
            "ops": {
                "metis_partitions": {"config": {"write_distdgl": False}},
                "compressed_graph": {"config": {"fpr_queries": 200_000}},
            }
        },
    )
    assert result.success
    checks = {
        c.check_name: c.passed
        for c in result.get_asset_check_evaluations()
        if c.asset_key.to_user_string() == "compressed_graph"
    }
    assert checks == {"bloom_no_false_negatives": True, "dequantization_within_bound": True}
    md = result.asset_materializations_for_node("compressed_graph")[0].metadata
    assert md["feature_encoding"].value == "int8"
    assert md["compression_ratio"].value > 4 and md["ratio_if_int4"].value > md["ratio_if_int8"].value
    assert md["bloom_measured_fpr"].value <= 0.015
    assert "| int4 |" in md["feature_encodings"].value and "| edge sets |" in md["tensors"].value
    assert (tmp_path / "home" / "tiny" / "compressed_graph" / "bloom" / "part-0.bloom").is_file()
