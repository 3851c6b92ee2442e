"""canonical_graph's in-memory factorized relabelling (sparse and string ids whose edge rows fit
the sort budget) gives the same files as the streamed DISTINCT + lookup path, and the same
graph as the dense ids it was derived from."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from graphs.stages.canonical import CanonicalConfig, build_canonical_graph


def _landing(root, src, dst, node_ids, labels, feats):
    (root / "edges").mkdir(parents=True)
    half = len(src) // 2  # two files: the codes must follow file order across them
    pq.write_table(pa.table({"src": src[:half], "dst": dst[:half]}), root / "edges" / "a.parquet")
    pq.write_table(pa.table({"src": src[half:], "dst": dst[half:]}), root / "edges" / "b.parquet")
    pq.write_table(pa.table({"node_id": node_ids, "label": pa.array(labels, pa.int32())}), root / "nodes.parquet")
    flat = pa.array(feats.reshape(-1))
    pq.write_table(
        pa.table({"node_id": node_ids, "feat": pa.FixedSizeListArray.from_arrays(flat, feats.shape[1])}),
        root / "features.parquet",
    )


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """One random graph (with duplicates, self loops, nulls and a node only in nodes.parquet)
    written with dense ids, sparse int64 ids and string ids (the same permutation)."""
    root = tmp_path_factory.mktemp("factorize")
    rng = np.random.default_rng(7)
    n, m = 3000, 20000
    src, dst = rng.integers(0, n - 1, size=(2, m))  # node n-1 appears only in nodes.parquet
    dst[:50] = src[:50]  # self loops
    src_nulls = np.zeros(m, dtype=bool)
    src_nulls[100:110] = True
    sparse = rng.choice(10**12, size=n, replace=False).astype(np.int64)
    labels = rng.integers(-1, 4, size=n)
    feats = rng.standard_normal((n, 4)).astype(np.float32)
    order = rng.permutation(n)  # node rows in an order unrelated to any id order
    out = {}
    for kind in ("dense", "sparse", "string"):
        if kind == "dense":
            ids = pa.array(np.arange(n, dtype=np.int64))
        else:
            ids = pa.array(sparse)
            if kind == "string":
                ids = pc.binary_join_element_wise("v", pc.cast(ids, pa.string()), "")
        s_col = pc.if_else(pa.array(src_nulls), pa.nulls(m, ids.type), ids.take(pa.array(src)))
        _landing(root / kind, s_col, ids.take(pa.array(dst)), ids.take(pa.array(order)), labels[order], feats[order])
        out[kind] = (root / kind, ids)
    return out


def _original_edges(out):
    nodes = pq.read_table(out / "nodes.parquet")
    orig = nodes.column("original_id")
    e = pq.read_table(out / "edges.parquet")
    return orig, pc.take(orig, e.column("src")).to_pylist(), pc.take(orig, e.column("dst")).to_pylist()


@pytest.mark.parametrize("kind", ["sparse", "string"])
def test_factorized_equals_streamed_path(graphs, tmp_path, kind):
    landing, _ = graphs[kind]
    fast = build_canonical_graph(landing, tmp_path / "fast")
    # a 1 MB sort budget cannot hold 20k rows x 2 x 40 bytes: the streamed DISTINCT + lookup path
    slow = build_canonical_graph(landing, tmp_path / "slow", CanonicalConfig(sort_budget_mb=1))
    drop = ("seconds", "peak_rss_bytes")
    assert {k: v for k, v in fast.items() if k not in drop} == {k: v for k, v in slow.items() if k not in drop}
    for name in ("edges.parquet", "nodes.parquet"):
        assert pq.read_table(tmp_path / "fast" / name).equals(pq.read_table(tmp_path / "slow" / name))
    assert np.array_equal(np.load(tmp_path / "fast" / "features.npy"), np.load(tmp_path / "slow" / "features.npy"))


@pytest.mark.parametrize("kind", ["sparse", "string"])
def test_factorized_graph_is_the_dense_graph_renamed(graphs, tmp_path, kind):
    dense_landing, _ = graphs["dense"]
    landing, ids = graphs[kind]
    sd = build_canonical_graph(dense_landing, tmp_path / "dense")
    sk = build_canonical_graph(landing, tmp_path / kind)
    assert (sk["nodes"], sk["edges"], sk["dropped_null_id"], sk["dropped_self_loop"]) == (
        sd["nodes"],
        sd["edges"],
        sd["dropped_null_id"],
        sd["dropped_self_loop"],
    )
    assert sk["nodes"] == 3000  # the node met only in nodes.parquet is a node
    orig_k, src_k, dst_k = _original_edges(tmp_path / kind)
    assert orig_k.to_pylist() == sorted(orig_k.to_pylist())  # new ids follow the sorted original ids
    _, src_d, dst_d = _original_edges(tmp_path / "dense")
    rename = dict(zip(range(3000), ids.to_pylist()))
    assert sorted(zip(src_k, dst_k)) == sorted((rename[a], rename[b]) for a, b in zip(src_d, dst_d))
    # labels and feature rows travel with their node
    nd, nk = pq.read_table(tmp_path / "dense" / "nodes.parquet"), pq.read_table(tmp_path / kind / "nodes.parquet")
    label_of = dict(zip((rename[i] for i in nd.column("original_id").to_pylist()), nd.column("label").to_pylist()))
    assert nk.column("label").to_pylist() == [label_of[i] for i in orig_k.to_pylist()]
    fd, fk = np.load(tmp_path / "dense" / "features.npy"), np.load(tmp_path / kind / "features.npy")
    position = {v: i for i, v in enumerate(ids.to_pylist())}
    assert np.array_equal(fk, fd[[position[v] for v in orig_k.to_pylist()]])


def test_strings_encoded_by_hash_give_each_string_one_code():
    from graphs.kernels.id_codes import codes_by_hash

    values = [pa.array(["b", "a", None, "b"]), pa.array(["c", "a", "c"])]
    hashes = [pa.array([2, 1, None, 2], pa.uint64()), pa.array([3, 1, 3], pa.uint64())]
    index_chunks, strings = codes_by_hash(values, hashes)
    codes = [None if i < 0 else strings[int(i)].as_py() for c in index_chunks for i in c]  # -1 = null
    assert codes == ["b", "a", None, "b", "c", "a", "c"]
    assert sorted(strings.to_pylist()) == ["a", "b", "c"]
    # "a" and "c" share a hash: found by the comparison with each code's string, not trusted
    colliding = [pa.array([2, 1, None, 2], pa.uint64()), pa.array([1, 1, 1], pa.uint64())]
    assert codes_by_hash(values, colliding) is None


def test_string_hash_collisions_fall_back_to_the_same_files(graphs, tmp_path, monkeypatch):
    """With a hash of 7 values every code holds many strings: the stage must notice and encode
    the strings themselves, giving the files of the hash path and of the streamed path."""
    import graphs.stages.canonical_ids as canonical_ids

    landing, _ = graphs["string"]
    calls = []
    real = canonical_ids.codes_by_hash
    monkeypatch.setattr(canonical_ids, "codes_by_hash", lambda v, h: calls.append(real(v, h)) or calls[-1])
    by_hash = build_canonical_graph(landing, tmp_path / "hash")
    assert calls[0] is not None  # DuckDB's 64-bit hashes of 3000 strings do not collide
    monkeypatch.setattr(canonical_ids, "STRING_HASH_SQL", "CASE WHEN {c} IS NULL THEN NULL ELSE hash({c}) % 7 END")
    collided = build_canonical_graph(landing, tmp_path / "collided")
    assert len(calls) == 2 and calls[1] is None  # the collision was detected
    drop = ("seconds", "peak_rss_bytes")
    assert {k: v for k, v in by_hash.items() if k not in drop} == {k: v for k, v in collided.items() if k not in drop}
    for name in ("edges.parquet", "nodes.parquet"):
        assert pq.read_table(tmp_path / "hash" / name).equals(pq.read_table(tmp_path / "collided" / name))
    assert np.array_equal(np.load(tmp_path / "hash" / "features.npy"), np.load(tmp_path / "collided" / "features.npy"))


def test_int_ids_without_parquet_statistics_give_the_same_files(graphs, tmp_path):
    """Sparse int ids are sent to the factorized path by the files' min/max statistics; files
    written without them take the counting query first and must give the same graph."""
    import shutil

    landing, _ = graphs["sparse"]
    bare = tmp_path / "no_stats"
    shutil.copytree(landing, bare)
    for f in (bare / "edges").glob("*.parquet"):
        pq.write_table(pq.read_table(f), f, write_statistics=False)
    assert pq.read_metadata(next((bare / "edges").glob("*.parquet"))).row_group(0).column(0).statistics is None
    with_stats = build_canonical_graph(landing, tmp_path / "a")
    without = build_canonical_graph(bare, tmp_path / "b")
    drop = ("seconds", "peak_rss_bytes")
    assert {k: v for k, v in with_stats.items() if k not in drop} == {k: v for k, v in without.items() if k not in drop}
    assert with_stats["dropped_null_id"] == 10 and with_stats["dropped_self_loop"] >= 50
    for name in ("edges.parquet", "nodes.parquet"):
        assert pq.read_table(tmp_path / "a" / name).equals(pq.read_table(tmp_path / "b" / name))


@pytest.mark.parametrize("kind", ["sparse", "string"])
def test_node_and_feature_rows_in_many_row_groups_keep_their_ids(graphs, tmp_path, kind):
    """The node and feature files' ids are encoded with the edges (each row found again by its
    row number in the file): rewritten in small row groups and another row order, every
    node keeps its label and its feature row."""
    import shutil

    landing, _ = graphs[kind]
    moved = tmp_path / "moved"
    shutil.copytree(landing, moved)
    rng = np.random.default_rng(3)
    for name in ("nodes.parquet", "features.parquet"):
        t = pq.read_table(moved / name)
        pq.write_table(t.take(pa.array(rng.permutation(t.num_rows))), moved / name, row_group_size=97)
    a = build_canonical_graph(landing, tmp_path / "a")
    b = build_canonical_graph(moved, tmp_path / "b")
    assert a["labelled_nodes"] == b["labelled_nodes"] > 0
    assert pq.read_table(tmp_path / "a" / "nodes.parquet").equals(pq.read_table(tmp_path / "b" / "nodes.parquet"))
    assert np.array_equal(np.load(tmp_path / "a" / "features.npy"), np.load(tmp_path / "b" / "features.npy"))


@pytest.mark.parametrize("kind", ["dense", "sparse", "string"])
@pytest.mark.parametrize("budget_mb", [1024, 1])  # factorized in memory, and streamed
def test_a_feature_row_of_an_unknown_node_is_refused_by_name(graphs, tmp_path, kind, budget_mb):
    import shutil

    from graphs.stages.canonical import InputError

    landing, ids = graphs[kind]
    bad = tmp_path / "bad"
    shutil.copytree(landing, bad)
    t = pq.read_table(bad / "features.parquet")
    stranger = 10**13 + 5 if kind != "string" else "stranger"
    extra = pa.table({"node_id": pa.array([stranger], t.schema.field("node_id").type), "feat": t.column("feat")[:1]})
    pq.write_table(pa.concat_tables([t, extra]), bad / "features.parquet")
    with pytest.raises(InputError, match=rf"features.parquet: column 'node_id' has id {stranger!r} that no edge"):
        build_canonical_graph(bad, tmp_path / "out", CanonicalConfig(sort_budget_mb=budget_mb))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["sparse", "string"])
def test_a_feature_row_of_a_node_met_only_in_edges_is_kept(graphs, tmp_path, kind):
    import shutil

    landing, _ = graphs[kind]
    part = tmp_path / "part"
    shutil.copytree(landing, part)
    nodes = pq.read_table(part / "nodes.parquet")
    edge_ids = set(pq.read_table(part / "edges" / "a.parquet").column("dst").to_pylist())
    keep = [i not in edge_ids for i in nodes.column("node_id").to_pylist()]
    pq.write_table(nodes.filter(pa.array(keep)), part / "nodes.parquet")  # no node row for a.parquet's targets
    build_canonical_graph(landing, tmp_path / "full")
    s = build_canonical_graph(part, tmp_path / "out")
    assert s["nodes_without_node_row"] == keep.count(False) > 0 and s["nodes_without_features"] == 0
    assert np.array_equal(np.load(tmp_path / "full" / "features.npy"), np.load(tmp_path / "out" / "features.npy"))
