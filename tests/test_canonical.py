"""canonical_graph library: hand-checked tiny graphs, bad input, the spill path, real datasets."""

import json
from pathlib import Path

import networkx as nx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graphs.stages import canonical, canonical_edges
from graphs.stages.canonical import CanonicalConfig, InputError, build_canonical_graph
from tests.conftest import write_edges


def read_edges(out: Path) -> list[tuple[int, int]]:
    t = pq.read_table(out / "edges.parquet")
    assert t.schema.field("src").type == pa.int64() and t.schema.field("dst").type == pa.int64()
    return list(zip(t.column("src").to_pylist(), t.column("dst").to_pylist()))


def test_string_ids_duplicates_self_loops_nulls(tmp_path):
    write_edges(
        tmp_path / "in" / "edges.parquet",
        ["b", "a", "c", "b", "d", None, "e"],
        ["a", "c", "a", "a", "d", "a", None],
        pa.string(),
    )
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out")
    # a b c d e -> 0..4 (lexicographic); d's only edge is a self loop, e's only edge has a null
    nodes = pq.read_table(tmp_path / "out" / "nodes.parquet")
    assert nodes.column("original_id").to_pylist() == ["a", "b", "c", "d", "e"]
    assert nodes.column("node_id").to_pylist() == [0, 1, 2, 3, 4]
    assert nodes.column("label").to_pylist() == [-1] * 5
    assert read_edges(tmp_path / "out") == [(0, 1), (0, 2), (1, 0), (2, 0)]
    assert (s["nodes"], s["edges"]) == (5, 4)
    assert (s["dropped_null_id"], s["dropped_self_loop"], s["dropped_duplicate"]) == (2, 1, 1)
    assert s["isolated_nodes"] == 2
    assert s["degree_max"] == 2


def test_dense_integer_ids_with_nulls_and_self_loops(tmp_path):
    # dense ids take the bitmap path: ids seen only beside a null or in a self loop are nodes
    write_edges(tmp_path / "in" / "edges.parquet", [1, 2, None, 5, 3, 3], [2, None, 9, 5, 1, 1], pa.int64())
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out")
    nodes = pq.read_table(tmp_path / "out" / "nodes.parquet")
    assert nodes.column("original_id").to_pylist() == [1, 2, 3, 5, 9]
    assert read_edges(tmp_path / "out") == [(0, 1), (0, 2), (1, 0), (2, 0)]
    assert (s["dropped_null_id"], s["dropped_self_loop"], s["dropped_duplicate"], s["isolated_nodes"]) == (2, 1, 1, 2)


@pytest.mark.parametrize("symmetrize", [True, False])
def test_dense_ids_with_nulls_and_self_loops_spilled_and_in_memory(tmp_path, symmetrize):
    """Dense ids streamed with their null-partner and self-loop rows (the ids met only there
    are nodes), spilled by source range or kept in memory, against numpy's reference."""
    rng = np.random.default_rng(3)
    n, m = 4000, 50_000
    src, dst = rng.integers(0, n, m) + 100, rng.integers(0, n, m) + 100
    dst[:500] = src[:500]  # self loops
    src[-300:] = n + 100 + np.arange(300)  # ids met only beside a null (300) or in a self loop (200)
    dst[500:700] = src[500:700] = n + 400 + np.arange(200)
    null_src, null_dst = np.zeros(m, bool), np.zeros(m, bool)
    null_dst[-300:], null_src[1000:1100] = True, True
    write_edges(
        tmp_path / "in" / "edges" / "0.parquet",
        pa.array(src, mask=null_src),
        pa.array(dst, mask=null_dst),
    )
    outs = {}
    for name, budget in (("spill", 1), ("mem", 1024)):
        cfg = CanonicalConfig(symmetrize=symmetrize, sort_budget_mb=budget, batch_rows=7000)
        outs[name] = build_canonical_graph(tmp_path / "in", tmp_path / name, cfg)
        ids = np.unique(np.concatenate([src[~null_src], dst[~null_dst]]))
        nodes = pq.read_table(tmp_path / name / "nodes.parquet")
        np.testing.assert_array_equal(nodes.column("original_id").to_numpy(), ids)
        kept = ~null_src & ~null_dst & (src != dst)
        s, d = np.searchsorted(ids, src[kept]), np.searchsorted(ids, dst[kept])
        if symmetrize:
            s, d = np.concatenate([s, d]), np.concatenate([d, s])
        pairs = np.unique(np.stack([s, d], 1), axis=0)
        got = pq.read_table(tmp_path / name / "edges.parquet")
        np.testing.assert_array_equal(got.column("src").to_numpy(), pairs[:, 0])
        np.testing.assert_array_equal(got.column("dst").to_numpy(), pairs[:, 1])
        loops = int((~null_src & ~null_dst & (src == dst)).sum())  # the 700 made, and random ones
        assert (outs[name]["dropped_null_id"], outs[name]["dropped_self_loop"]) == (400, loops) and loops >= 700
    assert {k: v for k, v in outs["spill"].items() if k not in ("seconds", "peak_rss_bytes")} == {
        k: v for k, v in outs["mem"].items() if k not in ("seconds", "peak_rss_bytes")
    }


@pytest.mark.parametrize("budget_mb", [1, 1024])
def test_statistics_that_understate_the_ids_are_not_trusted(tmp_path, monkeypatch, budget_mb):
    """Dense ids streamed by the files' statistics: when a row holds an id outside them, the
    stage counts the ids itself and writes what trustworthy statistics give."""
    rng = np.random.default_rng(5)
    src, dst = rng.integers(0, 3000, 40_000), rng.integers(0, 3000, 40_000)
    dst[:50] = src[:50]
    write_edges(tmp_path / "in" / "edges" / "0.parquet", src, dst)
    cfg = CanonicalConfig(sort_budget_mb=budget_mb, batch_rows=7000)
    trusted = build_canonical_graph(tmp_path / "in", tmp_path / "trusted", cfg)
    monkeypatch.setattr(canonical, "parquet_id_bounds", lambda files: (100, 2000))  # narrower than the ids
    runs, ingest = [], canonical._ingest
    monkeypatch.setattr(canonical, "_ingest", lambda *a, **k: runs.append(k) or ingest(*a, **k))
    understated = build_canonical_graph(tmp_path / "in", tmp_path / "understated", cfg)
    assert runs == [{}, {"statistics": False}]  # the statistics' run stopped at the first id outside them
    for name in ("edges.parquet", "nodes.parquet"):
        assert pq.read_table(tmp_path / "understated" / name).equals(pq.read_table(tmp_path / "trusted" / name))
    drop = ("seconds", "peak_rss_bytes")
    assert {k: v for k, v in understated.items() if k not in drop} == {
        k: v for k, v in trusted.items() if k not in drop
    }
    assert trusted["dropped_self_loop"] == int((src == dst).sum()) >= 50
    assert not (tmp_path / "understated" / "_work").exists()


def test_all_null_ids_fail_clearly(tmp_path):
    write_edges(tmp_path / "in" / "edges.parquet", [None, None], [None, None], pa.int64())
    with pytest.raises(InputError, match="every edge row has a null id"):
        build_canonical_graph(tmp_path / "in", tmp_path / "out")


def test_int32_and_int64_files_mix(tmp_path):
    write_edges(tmp_path / "in" / "edges" / "a.parquet", [10, 20], [20, 30], pa.int32())
    write_edges(tmp_path / "in" / "edges" / "b.parquet", [2**40, 30], [10, 20], pa.int64())
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out")
    nodes = pq.read_table(tmp_path / "out" / "nodes.parquet")
    assert nodes.column("original_id").type == pa.int64()
    assert nodes.column("original_id").to_pylist() == [10, 20, 30, 2**40]
    assert read_edges(tmp_path / "out") == [(0, 1), (0, 3), (1, 0), (1, 2), (2, 1), (3, 0)]
    assert (s["nodes"], s["edges"], s["input_files"], s["dropped_duplicate"]) == (4, 6, 2, 0)


def test_negative_and_sparse_integer_ids_sort_numerically(tmp_path):
    # a span far wider than n forces the hash-index relabeller instead of the lookup table
    write_edges(tmp_path / "in" / "edges.parquet", [-5, 10**15, 7], [7, -5, 10**15], pa.int64())
    build_canonical_graph(tmp_path / "in", tmp_path / "out")
    nodes = pq.read_table(tmp_path / "out" / "nodes.parquet")
    assert nodes.column("original_id").to_pylist() == [-5, 7, 10**15]
    assert read_edges(tmp_path / "out") == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]


def test_directed_mode_keeps_direction(tmp_path):
    write_edges(tmp_path / "in" / "edges.parquet", [1, 2, 1, 3], [2, 1, 2, 1])
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out", CanonicalConfig(symmetrize=False))
    assert read_edges(tmp_path / "out") == [(0, 1), (1, 0), (2, 0)]
    assert (s["edges"], s["dropped_duplicate"], s["isolated_nodes"]) == (3, 1, 0)


def test_labels_without_split_get_seeded_split_and_isolated_node(tmp_path):
    n = 50
    src = np.arange(n - 1)
    write_edges(tmp_path / "in" / "edges.parquet", src, src + 1)
    # node 1000 appears only in nodes.parquet: an isolated node; label -1 on node 0
    ids = np.append(np.arange(n), 1000)
    labels = np.append(np.arange(n) % 3, 2)
    labels[0] = -1
    pq.write_table(pa.table({"node_id": ids, "label": pa.array(labels, pa.int32())}), tmp_path / "in" / "nodes.parquet")
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out", CanonicalConfig(split_seed=3))
    nodes = pq.read_table(tmp_path / "out" / "nodes.parquet").to_pandas()
    assert s["nodes"] == n + 1 and s["isolated_nodes"] == 1
    assert s["split_generated"] is True
    assert nodes.loc[n, "original_id"] == 1000 and nodes.loc[n, "label"] == 2
    assert nodes.loc[0, "split"] == "other"  # unlabelled
    counts = nodes["split"].value_counts().to_dict()
    assert counts == {"train": 30, "val": 10, "test": 10, "other": 1}
    again = build_canonical_graph(tmp_path / "in", tmp_path / "out2", CanonicalConfig(split_seed=3))
    assert again["train_nodes"] == 30
    assert pq.read_table(tmp_path / "out2" / "nodes.parquet").column("split").to_pylist() == nodes["split"].tolist()
    other = build_canonical_graph(tmp_path / "in", tmp_path / "out3", CanonicalConfig(split_seed=4))
    assert other["train_nodes"] == 30
    assert pq.read_table(tmp_path / "out3" / "nodes.parquet").column("split").to_pylist() != nodes["split"].tolist()


def test_features_follow_relabelling(tmp_path):
    write_edges(tmp_path / "in" / "edges.parquet", ["z", "y"], ["y", "x"], pa.string())
    feats = {"z": [1.0, 2.0], "x": [3.0, 4.0], "y": [5.0, 6.0]}
    table = pa.table(
        {
            "node_id": list(feats),
            "feat": pa.array(list(feats.values()), type=pa.list_(pa.float32(), 2)),
        }
    )
    pq.write_table(table, tmp_path / "in" / "features.parquet")
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out")
    x = np.load(tmp_path / "out" / "features.npy")
    assert x.dtype == np.float32 and x.shape == (3, 2)
    np.testing.assert_array_equal(x, [[3, 4], [5, 6], [1, 2]])  # x, y, z
    assert s["feature_dim"] == 2 and s["nodes_without_features"] == 0


def _assert_symmetrized_reference(edges_file, src, dst):
    """Assert `edges_file` holds numpy's reference: ids relabelled in sorted order, self loops
    dropped, both directions, unique, sorted. Returns (new src, new dst, kept rows, pairs)."""
    ids = np.unique(np.concatenate([src, dst]))
    s, d = np.searchsorted(ids, src), np.searchsorted(ids, dst)
    keep = s != d
    pairs = np.unique(np.stack([np.concatenate([s[keep], d[keep]]), np.concatenate([d[keep], s[keep]])], 1), axis=0)
    got = pq.read_table(edges_file)
    np.testing.assert_array_equal(got.column("src").to_numpy(), pairs[:, 0])
    np.testing.assert_array_equal(got.column("dst").to_numpy(), pairs[:, 1])
    return s, d, keep, pairs


@pytest.mark.parametrize("piece", [None, 1001])  # the default, and Parquet pieces that cut rows
def test_spilled_buckets_equal_in_memory_and_reference(tmp_path, monkeypatch, piece):
    if piece:
        monkeypatch.setattr(canonical_edges, "WRITE_PIECE", piece)
    rng = np.random.default_rng(0)
    n, m = 3000, 120_000
    src = rng.integers(0, n, m) * 7 + 3  # non-contiguous ids
    dst = rng.integers(0, n, m) * 7 + 3
    write_edges(tmp_path / "in" / "edges" / "0.parquet", src[: m // 2], dst[: m // 2])
    write_edges(tmp_path / "in" / "edges" / "1.parquet", src[m // 2 :], dst[m // 2 :])
    small = build_canonical_graph(
        tmp_path / "in", tmp_path / "spill", CanonicalConfig(sort_budget_mb=1, batch_rows=7000)
    )
    big = build_canonical_graph(tmp_path / "in", tmp_path / "mem")
    assert pq.read_table(tmp_path / "spill" / "edges.parquet").equals(pq.read_table(tmp_path / "mem" / "edges.parquet"))
    assert {k: v for k, v in small.items() if k not in ("seconds", "peak_rss_bytes")} == {
        k: v for k, v in big.items() if k not in ("seconds", "peak_rss_bytes")
    }
    s, d, keep, pairs = _assert_symmetrized_reference(tmp_path / "spill" / "edges.parquet", src, dst)
    directed = np.unique(np.stack([s[keep], d[keep]], 1), axis=0)
    assert small["dropped_duplicate"] == int(keep.sum()) - len(directed)
    assert small["dropped_self_loop"] == int((~keep).sum())
    assert small["degree_max"] == np.bincount(pairs[:, 0]).max()

    # directed mode, spilled and in memory, against the same reference
    for name, budget in (("dir-spill", 1), ("dir-mem", 1024)):
        cfg = CanonicalConfig(symmetrize=False, sort_budget_mb=budget, batch_rows=7000)
        res = build_canonical_graph(tmp_path / "in", tmp_path / name, cfg)
        got = pq.read_table(tmp_path / name / "edges.parquet")
        np.testing.assert_array_equal(got.column("src").to_numpy(), directed[:, 0])
        np.testing.assert_array_equal(got.column("dst").to_numpy(), directed[:, 1])
        assert res["dropped_duplicate"] == small["dropped_duplicate"]


@pytest.mark.parametrize("kind", ["sparse", "string"])
def test_spilled_sparse_and_string_ids_equal_in_memory_and_reference(tmp_path, kind):
    """Sparse, negative integer ids and string ids on the streamed path (located batch by batch
    in the sorted DISTINCT of every id) give the in-memory path's files."""
    rng = np.random.default_rng(1)
    n, m = 5000, 60_000
    src = rng.integers(0, n, m) * 1_000_003 - 500_000_000_000
    dst = rng.integers(0, n, m) * 1_000_003 - 500_000_000_000
    if kind == "string":
        src, dst = np.char.add("user-", src.astype(str)), np.char.add("user-", dst.astype(str))
    write_edges(tmp_path / "in" / "edges" / "0.parquet", src, dst)
    small = build_canonical_graph(
        tmp_path / "in", tmp_path / "spill", CanonicalConfig(sort_budget_mb=1, batch_rows=7000)
    )
    big = build_canonical_graph(tmp_path / "in", tmp_path / "mem")
    for name in ("edges.parquet", "nodes.parquet"):
        assert pq.read_table(tmp_path / "spill" / name).equals(pq.read_table(tmp_path / "mem" / name))
    assert small["nodes"] == big["nodes"] == len(np.unique(np.concatenate([src, dst])))
    _assert_symmetrized_reference(tmp_path / "spill" / "edges.parquet", src, dst)


# ----------------------------------------------------------------------------- bad input


@pytest.fixture
def good_run(tmp_path):
    """A landing folder with one good materialization already in `out`."""
    landing = tmp_path / "in"
    write_edges(landing / "edges" / "a.parquet", [1, 2], [2, 3])
    out = tmp_path / "out"
    build_canonical_graph(landing, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    return landing, out, before


def _assert_unchanged(out: Path, before: dict) -> None:
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".out.")], "temporary folder left behind"


def test_missing_dst_column(good_run):
    landing, out, before = good_run
    pq.write_table(pa.table({"src": [1], "target": [2]}), landing / "edges" / "b.parquet")
    with pytest.raises(InputError, match=r"b\.parquet.*missing column 'dst'"):
        build_canonical_graph(landing, out)
    _assert_unchanged(out, before)


def test_unreadable_file(good_run):
    landing, out, before = good_run
    (landing / "edges" / "c.parquet").write_bytes(b"this is not parquet at all" * 10)
    with pytest.raises(InputError, match=r"c\.parquet: cannot be read as Parquet"):
        build_canonical_graph(landing, out)
    _assert_unchanged(out, before)


def test_empty_file(good_run):
    landing, out, before = good_run
    (landing / "edges" / "d.parquet").write_bytes(b"")
    with pytest.raises(InputError, match=r"d\.parquet: file is empty"):
        build_canonical_graph(landing, out)
    _assert_unchanged(out, before)


def test_features_width_varies(good_run):
    landing, out, before = good_run
    table = pa.table({"node_id": [1, 2, 3], "feat": pa.array([[1.0, 2.0], [1.0], [0.0, 0.0]], pa.list_(pa.float32()))})
    pq.write_table(table, landing / "features.parquet")
    with pytest.raises(InputError, match=r"features\.parquet: column 'feat' varies in width: node_id 2 has 1"):
        build_canonical_graph(landing, out)
    _assert_unchanged(out, before)


def test_mixed_int_and_string_ids_name_both_files(good_run):
    landing, out, before = good_run
    write_edges(landing / "edges" / "s.parquet", ["x"], ["y"], pa.string())
    with pytest.raises(InputError, match=r"a\.parquet has int ids but .*s\.parquet column 'src' has string"):
        build_canonical_graph(landing, out)
    _assert_unchanged(out, before)


def test_float_ids_and_unknown_feature_ids_rejected(good_run):
    landing, out, before = good_run
    pq.write_table(pa.table({"node_id": [1, 99], "feat": [[1.0], [2.0]]}), landing / "features.parquet")
    with pytest.raises(InputError, match=r"features\.parquet: column 'node_id' has id 99"):
        build_canonical_graph(landing, out)
    (landing / "features.parquet").unlink()
    pq.write_table(pa.table({"src": [1.5], "dst": [2.0]}), landing / "edges" / "f.parquet")
    with pytest.raises(InputError, match=r"f\.parquet: column 'src' has type double"):
        build_canonical_graph(landing, out)
    _assert_unchanged(out, before)


# ----------------------------------------------------------------------------- real datasets


@pytest.mark.parametrize("name", ["cora", "citeseer", "email-eu-core", "ego-facebook"])
def test_real_datasets_match_networkx(tmp_path, shared_datasets, name):
    folder = shared_datasets / name
    raw = pq.read_table(folder / "edges.parquet").to_pandas()
    g = nx.Graph()
    g.add_nodes_from(raw["src"].tolist())
    g.add_nodes_from(raw["dst"].tolist())
    if (folder / "nodes.parquet").exists():
        g.add_nodes_from(pq.read_table(folder / "nodes.parquet").column("node_id").to_pylist())
    g.add_edges_from((u, v) for u, v in zip(raw["src"], raw["dst"]) if u != v)
    s = build_canonical_graph(folder, tmp_path / name)
    assert s["nodes"] == g.number_of_nodes()
    assert s["edges"] == 2 * g.number_of_edges()
    assert s["isolated_nodes"] == nx.number_of_isolates(g)
    assert s["degree_max"] == max(d for _, d in g.degree())
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    assert summary["edges"] == s["edges"]
    if name == "citeseer":
        assert s["isolated_nodes"] == 48
    if name == "cora":
        assert (s["train_nodes"], s["val_nodes"], s["test_nodes"]) == (140, 500, 1000)
        x = np.load(tmp_path / name / "features.npy", mmap_mode="r")
        assert x.shape == (2708, 1433)


# ----------------------------------------------------------------------------- weights


def write_weighted(path: Path, src, dst, weight, weight_type=pa.float64()) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"src": pa.array(src), "dst": pa.array(dst), "weight": pa.array(weight, weight_type)}), path
    )
    return path


def reference_weights(src, dst, weight, rule: str, symmetrize: bool):
    """(src, dst, weight) rows combined with pandas in input order: the spec of weight_combine."""
    import pandas as pd

    keep = src != dst
    src, dst, weight = src[keep], dst[keep], weight[keep]
    if symmetrize:
        a, b = np.minimum(src, dst), np.maximum(src, dst)
    else:
        a, b = src, dst
    df = pd.DataFrame({"a": a, "b": b, "w": weight})
    g = df.groupby(["a", "b"], sort=True)["w"].agg(rule).reset_index()
    if symmetrize:
        g = pd.concat([g, g.rename(columns={"a": "b", "b": "a"})]).sort_values(["a", "b"])
    return g["a"].to_numpy(), g["b"].to_numpy(), g["w"].to_numpy()


@pytest.mark.parametrize("rule,piece", [("sum", None), ("max", None), ("mean", None), ("first", None), ("sum", 777)])
def test_weights_combine_on_every_path(tmp_path, monkeypatch, rule, piece):
    if piece:  # Parquet pieces that cut rows: the weights are sliced with their edges
        monkeypatch.setattr(canonical_edges, "WRITE_PIECE", piece)
    # ids 0..n-1 as given (dense), so reference ids equal output ids
    rng = np.random.default_rng(1)
    n, m = 4000, 30_000
    # half the rows from 10 hubs (rows of thousands of keys, sorted by argsort), half spread
    # (a few keys per row, sorted in place by insertion); then repeats of spread rows' pairs,
    # in both directions, so short rows combine several weights in input order too
    src = np.where(rng.random(m) < 0.5, rng.integers(0, 10, m), rng.integers(0, n, m))
    dst = rng.integers(0, n, m)
    again = rng.integers(m // 2, m, 6000)
    flip = rng.random(len(again)) < 0.5
    rs, rd = np.where(flip, dst[again], src[again]), np.where(flip, src[again], dst[again])
    src = np.concatenate([np.arange(n), src, rs])  # every id occurs
    dst = np.concatenate([(np.arange(n) + 1) % n, dst, rd])
    m = len(src)
    weight = rng.integers(1, 1000, m) / 8.0  # exact binary fractions: sums are order-free
    write_weighted(tmp_path / "in" / "edges" / "0.parquet", src[: m // 2], dst[: m // 2], weight[: m // 2])
    write_weighted(tmp_path / "in" / "edges" / "1.parquet", src[m // 2 :], dst[m // 2 :], weight[m // 2 :])
    for symmetrize in (True, False):
        ref = reference_weights(src, dst, weight, rule, symmetrize)
        results = []
        for budget in (1, 1024):  # spilled (both directions as keys) / in memory (half keys)
            out = tmp_path / f"{symmetrize}-{budget}"
            cfg = CanonicalConfig(symmetrize=symmetrize, sort_budget_mb=budget, batch_rows=3000, weight_combine=rule)
            s = build_canonical_graph(tmp_path / "in", out, cfg)
            t = pq.read_table(out / "edges.parquet")
            assert t.schema.field("weight").type == pa.float64()
            np.testing.assert_array_equal(t.column("src").to_numpy(), ref[0])
            np.testing.assert_array_equal(t.column("dst").to_numpy(), ref[1])
            np.testing.assert_allclose(t.column("weight").to_numpy(), ref[2], rtol=1e-12)
            assert s["weighted"] and s["weight_combine"] == rule
            assert s["weight_max"] == pytest.approx(ref[2].max())
            results.append(t)
        assert results[0].equals(results[1])  # bit-identical whatever the path


def test_weight_combine_counts_reverse_pairs_and_first_is_input_order(tmp_path):
    # rows: 0->1 (w 2), 1->0 (w 5), 0->1 (w 3), 2->1 (w 4): edge {0,1} from 3 rows, 2 directions
    write_weighted(tmp_path / "in" / "edges.parquet", [0, 1, 0, 2], [1, 0, 1, 1], [2.0, 5.0, 3.0, 4.0])
    expect = {"sum": 10.0, "max": 5.0, "mean": 10.0 / 3, "first": 2.0}
    for rule, w01 in expect.items():
        s = build_canonical_graph(tmp_path / "in", tmp_path / rule, CanonicalConfig(weight_combine=rule))
        t = pq.read_table(tmp_path / rule / "edges.parquet")
        assert list(zip(t.column("src").to_pylist(), t.column("dst").to_pylist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]
        assert t.column("weight").to_pylist() == pytest.approx([w01, w01, 4.0, 4.0])
        assert s["dropped_duplicate"] == 1 and s["combined_reverse_pairs"] == 1


def test_files_without_weight_count_as_one(tmp_path):
    write_weighted(tmp_path / "in" / "edges" / "a.parquet", [0, 1], [1, 2], [4, 6], pa.int32())
    write_edges(tmp_path / "in" / "edges" / "b.parquet", [2, 3], [3, 0])
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out", CanonicalConfig(symmetrize=False))
    t = pq.read_table(tmp_path / "out" / "edges.parquet")
    assert t.column("weight").to_pylist() == [4.0, 6.0, 1.0, 1.0]
    assert s["weight_files"] == ["a.parquet"] and s["weight_default_1_files"] == ["b.parquet"]


def test_unweighted_input_has_no_weight_column(tmp_path):
    write_edges(tmp_path / "in" / "edges.parquet", [0, 1], [1, 2])
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out")
    assert pq.read_table(tmp_path / "out" / "edges.parquet").column_names == ["src", "dst"]
    assert s["weighted"] is False and "weight_combine" not in s


def test_invalid_weights_refused_per_file_or_dropped(tmp_path):
    write_weighted(tmp_path / "in" / "edges" / "a.parquet", [0, 1, 2, 3], [1, 2, 3, 3], [np.nan, 1.0, 0.0, -1.0])
    write_weighted(tmp_path / "in" / "edges" / "b.parquet", [4, 5, 6], [5, 6, 0], [np.inf, -2.0, 1.5])
    with pytest.raises(InputError) as err:
        build_canonical_graph(tmp_path / "in", tmp_path / "out")
    msg = str(err.value)
    # the self loop 3->3 (weight -1) is dropped as a self loop, not counted as a bad weight
    assert "a.parquet: column 'weight' has 2 invalid values (1 NaN, 1 zero)" in msg
    assert "b.parquet: column 'weight' has 2 invalid values (1 infinite, 1 negative)" in msg
    assert "invalid_weights='drop'" in msg
    assert not (tmp_path / "out").exists()
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out", CanonicalConfig(invalid_weights="drop"))
    t = pq.read_table(tmp_path / "out" / "edges.parquet")
    assert list(zip(t.column("src").to_pylist(), t.column("dst").to_pylist())) == [(0, 6), (1, 2), (2, 1), (6, 0)]
    assert s["dropped_invalid_weight"] == 4 and s["dropped_self_loop"] == 1
    assert s["nodes"] == 7  # ids of dropped rows stay nodes


def test_weight_settings_validated():
    with pytest.raises(ValueError, match="weight_combine='median'"):
        CanonicalConfig(weight_combine="median")
    with pytest.raises(ValueError, match="invalid_weights='ignore'"):
        CanonicalConfig(invalid_weights="ignore")


def test_string_ids_with_decimal_weights(tmp_path):
    from decimal import Decimal

    path = tmp_path / "in" / "edges.parquet"
    path.parent.mkdir(parents=True)
    weight = pa.array([Decimal("1.50"), Decimal("2.50"), Decimal("4.00")], pa.decimal128(5, 2))
    pq.write_table(pa.table({"src": ["b", "a", "b"], "dst": ["a", "b", "c"], "weight": weight}), path)
    build_canonical_graph(tmp_path / "in", tmp_path / "out", CanonicalConfig(weight_combine="mean"))
    t = pq.read_table(tmp_path / "out" / "edges.parquet")
    assert read_edges(tmp_path / "out") == [(0, 1), (1, 0), (1, 2), (2, 1)]
    assert t.column("weight").to_pylist() == [2.0, 2.0, 4.0, 4.0]


# the shuffled rows scattered in RAM, or into the file's mapping; read in batches that straddle
# row groups of 700 rows, or in batches of 1024 rows within one row group
@pytest.mark.parametrize("budget_mb,group_rows", [(64, 700), (1, 700), (64, 10**6)])
def test_feature_rows_in_any_order_land_on_their_nodes(tmp_path, monkeypatch, budget_mb, group_rows):
    import graphs.stages.canonical_features as canonical_features

    n, dim = 3000, 128  # 1.5 MB of features: above a 1 MB budget
    monkeypatch.setattr(canonical_features, "FEATURE_BATCH_BYTES", 4 * dim * 1024)
    rng = np.random.default_rng(5)
    src = rng.integers(0, n, 20000) * 3 + 1
    dst = rng.integers(0, n, 20000) * 3 + 1
    write_edges(tmp_path / "in" / "edges.parquet", src, dst)
    present = np.unique(np.concatenate([src, dst]))
    rows = rng.permutation(present)[: len(present) - 40]  # 40 nodes without a feature row
    feats = rng.standard_normal((len(rows), dim)).astype(np.float32)
    flat = pa.FixedSizeListArray.from_arrays(pa.array(feats.reshape(-1)), dim)
    path = tmp_path / "in" / "features.parquet"
    pq.write_table(pa.table({"node_id": rows, "feat": flat}), path, row_group_size=group_rows)
    assert pq.ParquetFile(path).metadata.num_row_groups == -(-len(rows) // group_rows)
    s = build_canonical_graph(tmp_path / "in", tmp_path / "out", CanonicalConfig(sort_budget_mb=budget_mb))
    x = np.load(tmp_path / "out" / "features.npy")
    new = np.searchsorted(present, rows)  # new ids follow the sorted original ids
    assert s["nodes_without_features"] == 40 and x.shape == (len(present), dim)
    np.testing.assert_array_equal(x[new], feats)
    missing = np.setdiff1d(np.arange(len(present)), new)
    assert len(missing) == 40 and not x[missing].any()
