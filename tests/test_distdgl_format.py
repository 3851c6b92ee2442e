"""DGL's partition format written part by part (graphs/formats/distdgl_format.py) against DGL's own
`partition_graph` for the same assignment."""

import json

import dgl
import numpy as np
import pytest
import torch
from dgl.data.utils import load_tensors

from graphs.formats.distdgl_format import (
    _mapped_file_region,
    edge_id_dtype,
    gather_rows,
    reshuffled_edge_ids,
    reshuffled_node_ids,
    write_distdgl_parts,
)
from graphs.stages.partition import dgl_graph
from tests.dgl_reference import write_distdgl


def _graph(n, m, symmetric, seed=0):
    rng = np.random.default_rng(seed)
    pairs = set()
    while len(pairs) < m:
        u, v = (int(x) for x in rng.integers(0, n, 2))
        if u != v:
            pairs.add((u, v))
            if symmetric:
                pairs.add((v, u))
    a = np.array(sorted(pairs), dtype=np.int64)  # sorted by (src, dst): the canonical order
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(a[:, 0], minlength=n), out=indptr[1:])
    return indptr, a[:, 1].copy()


def _node_data(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "feat": rng.normal(size=(n, 3)).astype(np.float32),
        "label": rng.integers(0, 4, n).astype(np.int64),
        "train_mask": rng.random(n) < 0.5,
    }


def _write_both(tmp_path, indptr, indices, part, k, data):
    g = dgl_graph(indptr, indices)
    for name, values in data.items():
        g.ndata[name] = torch.from_numpy(values)
    theirs = write_distdgl(g, part, k, tmp_path / "dgl", "g")
    ours = write_distdgl_parts(indptr, indices, part, k, tmp_path / "ours", "g", data)
    return theirs, ours


def _edges(graph, inner):
    """Set of (global src, global dst) of the part graph's edges with inner_edge == inner."""
    s, d = graph.edges()
    nid = graph.ndata["_ID"]
    mask = graph.edata["inner_edge"] == inner
    return set(zip(nid[s[mask]].tolist(), nid[d[mask]].tolist(), strict=True))


@pytest.mark.parametrize("symmetric", [True, False])
def test_per_part_writer_matches_dgl_partition_graph(tmp_path, symmetric):
    n, k = 60, 3
    indptr, indices = _graph(n, 150, symmetric)
    part = np.random.default_rng(1).integers(0, k, n).astype(np.int32)
    data = _node_data(n)
    theirs, ours = _write_both(tmp_path, indptr, indices, part, k, data)

    assert np.array_equal(theirs, ours)  # same node map: new id -> canonical id
    meta_dgl = json.loads((tmp_path / "dgl" / "g.json").read_text())
    meta_ours = json.loads((tmp_path / "ours" / "g.json").read_text())
    assert meta_ours == meta_dgl  # node_map, edge_map ranges, counts, types, file paths
    assert list(meta_ours) == list(meta_dgl)

    eid_dgl, eid_ours = {}, {}  # global edge id -> the (src, dst) pairs every part gives it
    for p in range(k):
        (gd,), _ = dgl.load_graphs(str(tmp_path / "dgl" / f"part{p}" / "graph.dgl"))
        (go,), _ = dgl.load_graphs(str(tmp_path / "ours" / f"part{p}" / "graph.dgl"))
        assert gd.num_nodes() == go.num_nodes() and gd.num_edges() == go.num_edges()
        assert set(go.ndata) == set(gd.ndata) and set(go.edata) == set(gd.edata)
        for name in go.ndata:
            assert go.ndata[name].dtype == gd.ndata[name].dtype, name
        inner_d, inner_o = gd.ndata["inner_node"].bool(), go.ndata["inner_node"].bool()
        # core nodes: the same global ids in the same (first) positions
        assert torch.equal(gd.ndata["_ID"][inner_d], go.ndata["_ID"][inner_o])
        assert torch.equal(inner_d, inner_o)
        # halo: the same node set with the same part ids (DGL's order is its C++ traversal's)
        halo_d = dict(zip(gd.ndata["_ID"][~inner_d].tolist(), gd.ndata["part_id"][~inner_d].tolist(), strict=True))
        halo_o = dict(zip(go.ndata["_ID"][~inner_o].tolist(), go.ndata["part_id"][~inner_o].tolist(), strict=True))
        assert halo_o == halo_d
        assert torch.equal(gd.ndata["part_id"][inner_d], go.ndata["part_id"][inner_o])
        # edges: the same (src, dst) sets, inner and outgoing; the same edge-id sets per kind
        assert _edges(go, 1) == _edges(gd, 1) and _edges(go, 0) == _edges(gd, 0)
        inner_ids_d = gd.edata["_ID"][gd.edata["inner_edge"] == 1]
        assert torch.equal(inner_ids_d, go.edata["_ID"][go.edata["inner_edge"] == 1])  # the part's range
        for inner in (0, 1):
            ids_o = go.edata["_ID"][go.edata["inner_edge"] == inner]
            assert ids_o.tolist() == sorted(ids_o.tolist())  # each kind in edge-id order, as DGL's
        for graph, eids in ((gd, eid_dgl), (go, eid_ours)):
            s, d = graph.edges()
            nid = graph.ndata["_ID"]
            for e, u, v in zip(graph.edata["_ID"].tolist(), nid[s].tolist(), nid[d].tolist(), strict=True):
                eids.setdefault(e, set()).add((u, v))
        feats_d = load_tensors(str(tmp_path / "dgl" / f"part{p}" / "node_feat.dgl"))
        feats_o = load_tensors(str(tmp_path / "ours" / f"part{p}" / "node_feat.dgl"))
        assert set(feats_o) == set(feats_d) == {"_N/feat", "_N/label", "_N/train_mask"}
        for name in feats_d:
            assert torch.equal(feats_o[name], feats_d[name]), name
        assert load_tensors(str(tmp_path / "ours" / f"part{p}" / "edge_feat.dgl")) == {}

    # every edge id names one edge in every part that holds it (inner in one, outgoing in another)
    for eids in (eid_dgl, eid_ours):
        assert sorted(eids) == list(range(len(indices))) and all(len(v) == 1 for v in eids.values())

    # DGL's own loader accepts ours (it verifies the id ranges) and builds the same partition book
    for p in range(k):
        g, nfeat, _, gpb, name, ntypes, etypes = dgl.distributed.load_partition(str(tmp_path / "ours" / "g.json"), p)
        assert name == "g" and gpb.num_partitions() == k
        assert torch.equal(gpb.nid2partid(torch.arange(n)), torch.from_numpy(part[theirs].astype(np.int64)))
        assert nfeat["_N/feat"].shape == (int(np.count_nonzero(part == p)), 3)


def test_single_part_matches_dgl(tmp_path):
    n = 30
    indptr, indices = _graph(n, 60, True, seed=3)
    data = _node_data(n, seed=3)
    theirs, ours = _write_both(tmp_path, indptr, indices, np.zeros(n, dtype=np.int32), 1, data)
    assert np.array_equal(theirs, ours) and ours.tolist() == list(range(n))
    assert json.loads((tmp_path / "ours" / "g.json").read_text()) == json.loads(
        (tmp_path / "dgl" / "g.json").read_text()
    )
    (gd,), _ = dgl.load_graphs(str(tmp_path / "dgl" / "part0" / "graph.dgl"))
    (go,), _ = dgl.load_graphs(str(tmp_path / "ours" / "part0" / "graph.dgl"))
    assert torch.equal(torch.stack(gd.edges()), torch.stack(go.edges()))
    assert torch.equal(gd.edata["_ID"], go.edata["_ID"]) and torch.equal(gd.ndata["_ID"], go.ndata["_ID"])


def test_edge_ids_group_edges_by_new_destination():
    indptr, indices = _graph(20, 50, False, seed=5)
    part = np.random.default_rng(5).integers(0, 3, 20)
    orig, new_of_old = reshuffled_node_ids(part)
    assert np.array_equal(np.sort(part[orig]), part[orig])  # grouped by part
    assert np.array_equal(new_of_old[orig], np.arange(20))
    eid = reshuffled_edge_ids(indptr, indices, new_of_old)
    assert eid.dtype == np.int32  # held compactly; the files still say int64 (compared with DGL's above)
    assert sorted(eid.tolist()) == list(range(len(indices)))
    by_eid = new_of_old[indices][np.argsort(eid)]
    assert np.all(np.diff(by_eid) >= 0)  # destinations ascending in edge-id order


def test_the_same_inputs_give_the_same_files(tmp_path):
    n = 40
    indptr, indices = _graph(n, 90, True, seed=7)
    part = np.random.default_rng(7).integers(0, 2, n)
    for name in ("a", "b"):
        write_distdgl_parts(indptr, indices, part, 2, tmp_path / name, "g", _node_data(n, seed=7))
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 7  # json + 3 files per part
    for f in files:
        if f.name != "graph.dgl":
            assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
            continue
        # DGL's save_graphs is not byte-stable; its content is
        (ga,), _ = dgl.load_graphs(str(tmp_path / "a" / f))
        (gb,), _ = dgl.load_graphs(str(tmp_path / "b" / f))
        assert torch.equal(torch.stack(ga.edges()), torch.stack(gb.edges()))
        for key in ga.ndata:
            assert torch.equal(ga.ndata[key], gb.ndata[key])
        for key in ga.edata:
            assert torch.equal(ga.edata[key], gb.edata[key])


def test_edge_id_dtype_widens_past_int32():
    assert edge_id_dtype(0) == np.int32 and edge_id_dtype(2**31) == np.int32  # ids up to 2^31 - 1
    assert edge_id_dtype(2**31 + 1) == np.int64


@pytest.mark.parametrize("block_bytes", [1, 50, 1 << 26])
def test_gather_rows_from_a_memory_map_equals_fancy_indexing(tmp_path, block_bytes):
    rng = np.random.default_rng(11)
    arrays = {
        "feat": rng.normal(size=(37, 5)).astype(np.float32),
        "label": rng.integers(-5, 5, 37).astype(np.int64),
        "mask": rng.random(37) < 0.5,
        "wide": rng.integers(0, 255, (37, 2, 3)).astype(np.uint8),
    }
    row_sets = [
        np.arange(37),  # k = 1: every row in order
        np.sort(rng.choice(37, 12, replace=False)),  # a part's core, ascending
        rng.permutation(37)[:15],  # unsorted (torch's sort leaves small parts unsorted)
        np.array([4, 4, 36, 0, 4, 17]),  # repeats
        np.array([-1, 3, -37]),  # negative, as numpy
        np.empty(0, dtype=np.int64),  # a part with no nodes
    ]
    for name, values in arrays.items():
        np.save(tmp_path / f"{name}.npy", values)
        mapped = np.load(tmp_path / f"{name}.npy", mmap_mode="r")
        path, position = _mapped_file_region(mapped)
        with open(path, "rb") as f:  # the region found is where row 0 lies in the file
            f.seek(position)
            assert f.read(values[0].nbytes) == values[0].tobytes()
        for view, expected in ((mapped, values), (mapped[9:], values[9:])):  # a row range of a map too
            for rows in row_sets:
                rows = rows[(rows < len(expected)) & (rows >= -len(expected))]
                got = gather_rows(view, rows, block_bytes=block_bytes)
                assert got.dtype == expected.dtype and got.shape == (len(rows), *expected.shape[1:])
                assert got.flags.c_contiguous and np.array_equal(got, expected[rows]), (name, rows)
        with pytest.raises(IndexError):
            gather_rows(mapped, np.array([0, 37]), block_bytes=block_bytes)
    # arrays that are not read-only maps of a file are fancy-indexed
    assert _mapped_file_region(arrays["feat"]) is None
    assert _mapped_file_region(np.load(tmp_path / "feat.npy", mmap_mode="c")) is None  # private changes
    assert _mapped_file_region(np.load(tmp_path / "feat.npy", mmap_mode="r")[:, 1:]) is None  # not contiguous
    assert np.array_equal(gather_rows(arrays["feat"], np.array([3, 1])), arrays["feat"][[3, 1]])


def test_memory_mapped_node_data_and_an_empty_part(tmp_path):
    n, k = 50, 3
    indptr, indices = _graph(n, 120, False, seed=13)
    part = np.random.default_rng(13).integers(0, k, n).astype(np.int32)
    part[part == 1] = 2  # part 1 holds no node (DGL's partition_graph fails on this; ours writes it)
    data = _node_data(n, seed=13)
    for name, values in data.items():
        np.save(tmp_path / f"{name}.npy", values)
    mapped = {name: np.load(tmp_path / f"{name}.npy", mmap_mode="r") for name in data}
    orig = write_distdgl_parts(indptr, indices, part, k, tmp_path / "mem", "g", data)
    assert np.array_equal(write_distdgl_parts(indptr, indices, part, k, tmp_path / "map", "g", mapped), orig)
    meta = json.loads((tmp_path / "map" / "g.json").read_text())
    assert meta == json.loads((tmp_path / "mem" / "g.json").read_text())
    n0 = int(np.count_nonzero(part == 0))
    assert meta["node_map"]["_N"] == [[0, n0], [n0, n0], [n0, n]]
    into0 = int(np.count_nonzero(part[indices] == 0))
    assert meta["edge_map"]["_N:_E:_N"] == [[0, into0], [into0, into0], [into0, len(indices)]]
    for p in range(k):
        for f in ("node_feat.dgl", "edge_feat.dgl"):
            assert (tmp_path / "map" / f"part{p}" / f).read_bytes() == (tmp_path / "mem" / f"part{p}" / f).read_bytes()
        feats = load_tensors(str(tmp_path / "map" / f"part{p}" / "node_feat.dgl"))
        core = orig[meta["node_map"]["_N"][p][0] : meta["node_map"]["_N"][p][1]]
        assert np.array_equal(feats["_N/feat"].numpy(), data["feat"][core])
        assert np.array_equal(feats["_N/label"].numpy(), data["label"][core])
    (empty,), _ = dgl.load_graphs(str(tmp_path / "map" / "part1" / "graph.dgl"))
    assert empty.num_nodes() == 0 and empty.num_edges() == 0
    assert load_tensors(str(tmp_path / "map" / "part1" / "node_feat.dgl"))["_N/feat"].shape == (0, 3)
    for p in (0, 2):  # DGL's loader accepts the non-empty parts
        g, nfeat, *_ = dgl.distributed.load_partition(str(tmp_path / "map" / "g.json"), p)
        assert nfeat["_N/feat"].shape == (int(np.count_nonzero(part == p)), 3)
        src, dst = g.edges()
        nid = g.ndata["_ID"]
        inner = g.edata["inner_edge"].bool()
        # every edge into the core (and only those) is inner; every edge touches the core
        assert torch.equal(g.ndata["inner_node"][dst].bool(), inner)
        assert bool((g.ndata["inner_node"][src].bool() | inner).all())
        assert int(inner.sum()) == int(np.count_nonzero(part[indices] == p)) and len(nid) >= nfeat["_N/feat"].shape[0]


def test_part_ids_are_checked(tmp_path):
    indptr, indices = _graph(10, 20, True, seed=2)
    with pytest.raises(ValueError, match="outside 0..1"):
        write_distdgl_parts(indptr, indices, np.full(10, 2), 2, tmp_path / "a", "g")
    with pytest.raises(ValueError, match="9 part ids for 10 nodes"):
        write_distdgl_parts(indptr, indices, np.zeros(9, dtype=np.int64), 2, tmp_path / "b", "g")
    with pytest.raises(TypeError, match="integers"):
        write_distdgl_parts(indptr, indices, np.zeros(10), 2, tmp_path / "c", "g")
    # any integer dtype: the same files as int64 ids
    part = np.random.default_rng(2).integers(0, 2, 10)
    ref = write_distdgl_parts(indptr, indices, part, 2, tmp_path / "i64", "g")
    for dtype in (np.uint8, np.int32, np.uint64):
        assert np.array_equal(write_distdgl_parts(indptr, indices, part.astype(dtype), 2, tmp_path / "x", "g"), ref)
