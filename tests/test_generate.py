"""Tests for graphs/synthetic/generate.py: the DC-SBM synthetic dataset generator."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graphs.synthetic import generate as gen
from graphs.synthetic.generate import GenerateConfig, demo_config, generate_dataset, scale_config

SMALL = dict(num_nodes=2_000, num_edges=20_000, feature_dim=16, num_edge_files=3, chunk_edges=4_000)


def _small(**overrides) -> GenerateConfig:
    return GenerateConfig(**{**SMALL, **overrides})


def _read(path):
    """(edges, nodes, features) tables of a generated dataset, metadata dropped."""
    edges = pq.read_table(path / "edges")
    nodes = pq.read_table(path / "nodes.parquet")
    feats = pq.read_table(path / "features.parquet")
    return tuple(t.replace_schema_metadata(None) for t in (edges, nodes, feats))


def _degrees(edges: pa.Table, n: int, offset: int = 0) -> np.ndarray:
    ends = np.concatenate([edges["src"].to_numpy(), edges["dst"].to_numpy()]) - offset
    return np.bincount(ends, minlength=n)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One small default-ish dataset shared by the read-only checks."""
    out = tmp_path_factory.mktemp("gen") / "small"
    config = _small()
    summary = generate_dataset(config, out, progress=False)
    return config, out, summary, _read(out)


def test_layout_schemas_and_row_counts(small):
    config, out, summary, (edges, nodes, feats) = small
    assert sorted(p.name for p in out.iterdir()) == ["edges", "features.parquet", "nodes.parquet"]
    files = sorted(p.name for p in (out / "edges").iterdir())
    assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    m, f = config.num_edges, config.num_edge_files
    rows = [pq.ParquetFile(out / "edges" / name).metadata.num_rows for name in files]
    assert rows == [(i + 1) * m // f - i * m // f for i in range(f)] == [6666, 6667, 6667]

    assert edges.schema == pa.schema([("src", pa.int64()), ("dst", pa.int64())])
    assert nodes.schema == pa.schema([("node_id", pa.int64()), ("label", pa.int32()), ("split", pa.string())])
    feat_type = feats.schema.field("feat").type
    assert pa.types.is_fixed_size_list(feat_type)
    assert feat_type.list_size == config.feature_dim
    assert feat_type.value_type == pa.float32()
    assert feats.schema.field("node_id").type == pa.int64()

    assert nodes["node_id"].to_numpy().tolist() == list(range(config.num_nodes))
    assert feats["node_id"].to_numpy().tolist() == list(range(config.num_nodes))
    src, dst = edges["src"].to_numpy(), edges["dst"].to_numpy()
    assert src.min() >= 0 and max(src.max(), dst.max()) < config.num_nodes

    # Each file records the format version and the config that made it.
    meta = pq.read_schema(out / "nodes.parquet").metadata[b"gnnflow.generate"]
    payload = json.loads(meta)
    assert payload["format_version"] == gen.FORMAT_VERSION == 1
    assert GenerateConfig(**payload["config"]) == config

    assert summary["nodes"] == 2_000 and summary["edge_rows"] == 20_000
    assert summary["edge_files"] == 3
    assert summary["bytes"] == sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def test_same_seed_identical_other_seed_different(small, tmp_path):
    config, _, _, tables = small
    generate_dataset(config, tmp_path / "again", progress=False)
    again = _read(tmp_path / "again")
    assert all(a.equals(b) for a, b in zip(tables, again))

    generate_dataset(dataclasses.replace(config, seed=1), tmp_path / "other", progress=False)
    other = _read(tmp_path / "other")
    for a, b in zip(tables, other):
        assert not a.equals(b)
    # Different seed: same class sizes, but different nodes in them.
    assert not np.array_equal(tables[1]["label"].to_numpy(), other[1]["label"].to_numpy())


def test_edges_do_not_depend_on_file_count_or_chunk_size(small, tmp_path):
    config, _, _, (edges, nodes, feats) = small
    recut = dataclasses.replace(config, num_edge_files=7, chunk_edges=1_234)
    generate_dataset(recut, tmp_path / "recut", progress=False)
    e2, n2, f2 = _read(tmp_path / "recut")
    assert len(list((tmp_path / "recut" / "edges").iterdir())) == 7
    assert e2.equals(edges) and n2.equals(nodes) and f2.equals(feats)


@pytest.mark.parametrize("homophily", [0.85, 0.3])
def test_measured_homophily_matches_config(tmp_path, homophily):
    config = _small(homophily=homophily, seed=3)
    summary = generate_dataset(config, tmp_path, progress=False)
    edges, nodes, _ = _read(tmp_path)
    label = nodes["label"].to_numpy()
    same = label[edges["src"].to_numpy()] == label[edges["dst"].to_numpy()]
    assert abs(same.mean() - homophily) < 0.03
    assert summary["intra_class_fraction"] == pytest.approx(same.mean())


def test_classes_balanced_and_split_counts_exact(tmp_path):
    config = _small(num_nodes=2_003, num_classes=5, train_fraction=0.5, val_fraction=0.3)
    generate_dataset(config, tmp_path, progress=False)
    _, nodes, _ = _read(tmp_path)
    counts = np.bincount(nodes["label"].to_numpy(), minlength=5)
    assert counts.sum() == 2_003 and counts.max() - counts.min() <= 1
    split = nodes["split"].to_numpy(zero_copy_only=False)
    assert set(split) == {"train", "val", "test"}
    assert (split == "train").sum() == round(2_003 * 0.5) == 1_002
    assert (split == "val").sum() == round(2_003 * 0.3) == 601
    assert (split == "test").sum() == 400
    # Splits are random with respect to classes: each class is roughly half train.
    label = nodes["label"].to_numpy()
    for c in range(5):
        assert 0.4 < (split[label == c] == "train").mean() < 0.6


def test_features_are_class_centroids_plus_noise(small):
    config, _, _, (_, nodes, feats) = small
    d, k, sigma = config.feature_dim, config.num_classes, config.feature_noise
    x = feats["feat"].combine_chunks().flatten().to_numpy().reshape(-1, d)
    label = nodes["label"].to_numpy()
    means = np.stack([x[label == c].mean(0) for c in range(k)])
    resid = x - means[label]
    # Noise: per-coordinate std is feature_noise.
    assert resid.std() == pytest.approx(sigma, rel=0.03)
    # Centroids have unit norm; the class means estimate them to ~sigma*sqrt(d/250).
    assert np.allclose(np.linalg.norm(means, axis=1), 1.0, atol=0.15)
    # Class means are separated far beyond their standard error (sigma / sqrt(250) ~ 0.04).
    gaps = np.linalg.norm(means[:, None] - means[None], axis=2)[np.triu_indices(k, 1)]
    assert gaps.min() > 0.5
    # ... yet single nodes overlap: a node is often closer to another class's mean.
    nearest = np.argmin(((x[:, None, :] - means[None]) ** 2).sum(2), axis=1)
    assert 0.3 < (nearest == label).mean() < 0.8


def test_degrees_are_heavy_tailed_with_configured_exponent(tmp_path):
    def ccdf_slope(exponent: float) -> tuple[float, float]:
        config = GenerateConfig(num_nodes=20_000, num_edges=200_000, feature_dim=2, degree_exponent=exponent, seed=5)
        out = tmp_path / f"g{exponent}"
        generate_dataset(config, out, progress=False)
        deg = _degrees(_read(out)[0], config.num_nodes)
        d = np.sort(deg)[::-1]
        ccdf = np.arange(1, len(d) + 1) / len(d)
        # Tail between twice the median and half the structural cutoff sqrt(2m).
        sel = (d >= 2 * np.median(deg)) & (d <= 0.5 * math.sqrt(2 * config.num_edges))
        return np.polyfit(np.log(d[sel]), np.log(ccdf[sel]), 1)[0], deg.max() / deg.mean()

    slope, max_over_mean = ccdf_slope(2.5)
    # P(deg = d) ~ d^-2.5  =>  P(deg >= d) ~ d^-1.5 (measured about -1.55).
    assert -1.9 < slope < -1.3
    assert max_over_mean > 20
    steeper, _ = ccdf_slope(3.5)
    assert -3.0 < steeper < -2.2 and steeper < slope - 0.6


def test_self_loops_rare_and_hubs_capped(small):
    config, _, summary, (edges, _, _) = small
    src, dst = edges["src"].to_numpy(), edges["dst"].to_numpy()
    assert summary["self_loops"] == int((src == dst).sum())
    assert summary["self_loops"] < 0.02 * config.num_edges
    deg = _degrees(edges, config.num_nodes)
    # Structural cutoff: expected degree <= ~sqrt(2m) = 200 (allow Poisson spread).
    assert deg.max() < 1.5 * math.sqrt(2 * config.num_edges)


def test_id_offset_shifts_every_id(small, tmp_path):
    config, _, _, (edges, nodes, feats) = small
    offset = 10**12
    generate_dataset(dataclasses.replace(config, id_offset=offset), tmp_path, progress=False)
    e2, n2, f2 = _read(tmp_path)
    for col in ("src", "dst"):
        assert np.array_equal(e2[col].to_numpy(), edges[col].to_numpy() + offset)
    assert np.array_equal(n2["node_id"].to_numpy(), nodes["node_id"].to_numpy() + offset)
    assert n2["label"].equals(nodes["label"]) and f2["feat"].equals(feats["feat"])


def test_replaces_out_dir_atomically(small, tmp_path, monkeypatch):
    config = small[0]
    out = tmp_path / "ds"
    out.mkdir()  # an empty folder may be written into
    generate_dataset(dataclasses.replace(config, seed=3), out, progress=False)
    first = (out / "nodes.parquet").read_bytes()
    generate_dataset(config, out, progress=False)  # its own earlier output is replaced
    assert (out / "nodes.parquet").read_bytes() != first
    before = sorted(p.relative_to(out) for p in out.rglob("*"))

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(gen, "_write_edges", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        generate_dataset(dataclasses.replace(config, seed=9), out, progress=False)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no temporary left behind


@pytest.mark.parametrize(
    ("overrides", "field_name"),
    [
        ({"homophily": 1.5}, "homophily"),
        ({"num_classes": 0}, "num_classes"),
        ({"num_classes": 1, "homophily": 0.5}, "homophily"),
        ({"num_nodes": 4, "num_classes": 5}, "num_classes"),
        ({"degree_exponent": 1.0}, "degree_exponent"),
        ({"train_fraction": 0.9, "val_fraction": 0.2}, "val_fraction"),
        ({"feature_noise": -0.1}, "feature_noise"),
        ({"num_edge_files": 0}, "num_edge_files"),
        ({"num_nodes": 2.5}, "num_nodes"),
        ({"id_offset": 2**63 - 10}, "id_offset"),
    ],
)
def test_bad_config_names_the_field(overrides, field_name):
    with pytest.raises(ValueError, match=rf"GenerateConfig\.{field_name}="):
        _small(**overrides)


def test_every_field_is_cli_ready():
    # pipelines/cli.py builds an argparse flag per field: simple type plus help text.
    for f in dataclasses.fields(GenerateConfig):
        assert f.type in ("int", "float", "str", int, float, str), f.name
        assert f.metadata.get("help"), f.name


def test_named_recipes():
    demo = demo_config()
    assert (demo.num_nodes, demo.num_edges) == (100_000, 1_000_000)
    assert demo == GenerateConfig(num_nodes=100_000, num_edges=1_000_000)
    big = scale_config(10_000_000, 100_000_000, seed=2)
    assert (big.num_nodes, big.num_edges, big.seed, big.num_edge_files) == (10_000_000, 100_000_000, 2, 10)
    assert scale_config(1_000_000, 10_000_000).num_edge_files == 4


def test_guide_table_lookup_equals_binary_search():
    config = GenerateConfig(num_nodes=5_000, num_edges=50_000, num_classes=4, seed=11)
    model = gen._build_model(config)
    cum = model.cum[:-1]
    rng = np.random.default_rng(0)
    # Random points, every cumulative boundary exactly, and the neighbours of each.
    u = np.concatenate(
        [rng.random(100_000) * cum[-1], [0.0], cum[:-1], np.nextafter(cum[:-1], 0), np.nextafter(cum[:-1], np.inf)]
    )
    pos = gen._draw_positions(model, u, None)
    assert np.array_equal(pos, np.searchsorted(cum, u, side="right"))
    # Inside one class segment, a draw never leaves it.
    c = 2
    lo, hi = model.seg_lo[c], model.seg_hi[c]
    u = np.concatenate([lo + rng.random(10_000) * (hi - lo), [lo, np.nextafter(hi, 0)]])
    pos = gen._draw_positions(model, u, np.full(len(u), model.class_end[c] - 1))
    assert pos.min() >= model.class_end[c - 1] and pos.max() <= model.class_end[c] - 1
    assert set(model.labels[model.order[pos]]) == {c}
    # A guide entry that overshoots (as floating-point rounding at a bucket edge could
    # make it) is repaired by the backward scan.
    model.guide = np.minimum(model.guide + 2, len(model.guide) - 1).astype(model.guide.dtype)
    u = rng.random(10_000) * cum[-1]
    assert np.array_equal(gen._draw_positions(model, u, None), np.searchsorted(cum, u, side="right"))


def test_heavy_weight_marks_intra_class_rows_and_keeps_the_edges(small, tmp_path):
    config, _, _, (edges, nodes, _) = small
    generate_dataset(dataclasses.replace(config, heavy_weight=7.5), tmp_path / "w", progress=False)
    e2, n2, _ = _read(tmp_path / "w")
    assert e2.column_names == ["src", "dst", "weight"] and n2.equals(nodes)
    assert e2.select(["src", "dst"]).equals(edges)  # same rows, only the weight column added
    label = nodes["label"].to_numpy()
    same = label[edges["src"].to_numpy()] == label[edges["dst"].to_numpy()]
    np.testing.assert_array_equal(e2["weight"].to_numpy(), np.where(same, 7.5, 1.0))
    assert "weight" not in edges.column_names
    with pytest.raises(ValueError, match="heavy_weight"):
        _small(heavy_weight=-1.0)
