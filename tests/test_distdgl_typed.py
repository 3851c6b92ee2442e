"""DGL's heterogeneous partition format written part by part (graphs/formats/distdgl_typed.py)
against DGL's own `partition_graph` of the same heterograph and assignment."""

import json

import dgl
import numpy as np
import pytest
import torch

from graphs.formats.distdgl_typed import etype_name, write_typed_distdgl_parts
from graphs.formats.graph_schema import GraphSchema, Relation, TypedSchema
from graphs.stages.canonical import CanonicalConfig, build_canonical_graph
from graphs.stages.partition import PartitionConfig, build_partitions
from graphs.stages.partition_nodes import node_data
from graphs.synthetic.typed import generate_typed
from tests.dgl_reference import write_distdgl

COUNTS = {"cat": 6, "item": 25, "user": 40}  # node types in name order, as DGL orders them
# our relation order differs from DGL's (sorted canonical tuples): the config maps names to indices
RELATIONS = (
    Relation("user", "buys", "item"),
    Relation("item", "in", "cat"),
    Relation("user", "follows", "user"),
    Relation("item", "rev-buys", "user"),
)


def _typed_graph(seed=0):
    """(TypedSchema, indptr, indices, etype, weight, DGL heterograph of the same edges and data)."""
    rng = np.random.default_rng(seed)
    types = tuple(COUNTS)
    typed = TypedSchema(GraphSchema(types, RELATIONS), tuple(COUNTS.values()), (3, 4, 5), None)
    offsets = typed.offsets
    per_rel = {}
    for r, rel in enumerate(RELATIONS[:3]):
        s_count, d_count = COUNTS[rel.src_type], COUNTS[rel.dst_type]
        pairs = np.unique(np.stack([rng.integers(0, s_count, 70), rng.integers(0, d_count, 70)], 1), axis=0)
        per_rel[r] = pairs
    per_rel[3] = per_rel[0][:, ::-1]  # rev-buys: the reverse of buys
    src, dst, etype = [], [], []
    for r, pairs in per_rel.items():
        rel = RELATIONS[r]
        src.append(pairs[:, 0] + offsets[types.index(rel.src_type)])
        dst.append(pairs[:, 1] + offsets[types.index(rel.dst_type)])
        etype.append(np.full(len(pairs), r))
    src, dst, etype = np.concatenate(src), np.concatenate(dst), np.concatenate(etype)
    order = np.lexsort((etype, dst, src))  # the CSR by source
    src, dst, etype = src[order], dst[order], etype[order]
    n = int(offsets[-1])
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    weight = rng.random(len(src)).astype(np.float32)

    data, weights = {}, {}
    for r, rel in enumerate(RELATIONS):
        mask = etype == r
        s0, d0 = offsets[types.index(rel.src_type)], offsets[types.index(rel.dst_type)]
        data[(rel.src_type, rel.name, rel.dst_type)] = (
            torch.from_numpy(src[mask] - s0),
            torch.from_numpy(dst[mask] - d0),
        )
        weights[(rel.src_type, rel.name, rel.dst_type)] = torch.from_numpy(weight[mask])
    g = dgl.heterograph(data, num_nodes_dict=COUNTS)
    for c_etype, w in weights.items():
        g.edges[c_etype].data["weight"] = w
    return typed, indptr, dst.copy(), etype, weight, g


def _node_data(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "user": {
            "feat": rng.normal(size=(COUNTS["user"], 4)).astype(np.float32),
            "label": rng.integers(0, 3, COUNTS["user"]).astype(np.int64),
            "train_mask": rng.random(COUNTS["user"]) < 0.5,
        },
        "item": {"feat": rng.normal(size=(COUNTS["item"], 3)).astype(np.float32)},
    }


def _write_both(tmp_path, k, part, seed=0):
    typed, indptr, indices, etype, weight, g = _typed_graph(seed)
    node_data = _node_data(seed)
    for t, arrays in node_data.items():
        for name, values in arrays.items():
            g.nodes[t].data[name] = torch.from_numpy(values)
    theirs = write_distdgl(g, part, k, tmp_path / "dgl", "g")
    ours = write_typed_distdgl_parts(
        indptr, indices, etype, typed, part, k, tmp_path / "ours", "g", node_data, {"weight": weight}
    )
    return typed, theirs, ours


def _typed_edges(graph, etypes: dict[int, str], inner: int) -> dict:
    """(global src, global dst, relation name) -> edge id of the part's edges with inner_edge == inner."""
    s, d = graph.edges()
    nid, mask = graph.ndata["_ID"], graph.edata["inner_edge"] == inner
    names = [etypes[int(e)] for e in graph.edata["_TYPE"][mask]]
    keys = zip(nid[s[mask]].tolist(), nid[d[mask]].tolist(), names, strict=True)
    return dict(zip(keys, graph.edata["_ID"][mask].tolist(), strict=True))


@pytest.mark.parametrize("k", [3, 1])
def test_typed_writer_matches_dgl_partition_graph(tmp_path, monkeypatch, k):
    monkeypatch.setenv("DGL_DIST_DEBUG", "1")  # load_partition verifies every id range against the book
    n = sum(COUNTS.values())
    part = np.random.default_rng(1).integers(0, k, n).astype(np.int32)
    typed, theirs, ours = _write_both(tmp_path, k, part)
    offsets, types = typed.offsets, typed.schema.node_types

    # the same node reshuffle: each type's own ids in new-id order
    type_of_new = typed.node_types_of(ours)
    for i, t in enumerate(types):
        assert np.array_equal(ours[type_of_new == i] - offsets[i], theirs[t]), t
    meta = {side: json.loads((tmp_path / side / "g.json").read_text()) for side in ("dgl", "ours")}
    for key in ("graph_name", "num_nodes", "num_edges", "num_parts", "halo_hops", "node_map", "ntypes"):
        assert meta["ours"][key] == meta["dgl"][key], key
    assert set(meta["ours"]["etypes"]) == set(meta["dgl"]["etypes"]) == {etype_name(r) for r in RELATIONS}
    for name, ranges in meta["dgl"]["edge_map"].items():  # the same sizes per (part, relation)
        assert [b - a for a, b in meta["ours"]["edge_map"][name]] == [b - a for a, b in ranges], name

    for p in range(k):
        loaded = {side: dgl.distributed.load_partition(str(tmp_path / side / "g.json"), p) for side in meta}
        (gd, nfd, efd, gpbd, *_), (go, nfo, efo, _, _, ntypes, etypes) = loaded["dgl"], loaded["ours"]
        assert ntypes == list(types) and sorted(etypes) == sorted(gpbd.canonical_etypes)
        assert set(go.ndata) == set(gd.ndata) and set(go.edata) == set(gd.edata)
        for frame_o, frame_d in ((go.ndata, gd.ndata), (go.edata, gd.edata)):
            for name in frame_o:
                assert frame_o[name].dtype == frame_d[name].dtype, name
        inner_d, inner_o = gd.ndata["inner_node"].bool(), go.ndata["inner_node"].bool()
        assert torch.equal(gd.ndata["_ID"][inner_d], go.ndata["_ID"][inner_o])
        assert torch.equal(gd.ndata["_TYPE"][inner_d], go.ndata["_TYPE"][inner_o])
        halo = {side: set(g.ndata["_ID"][~g.ndata["inner_node"].bool()].tolist()) for side, g in (("d", gd), ("o", go))}
        assert halo["o"] == halo["d"]
        names_d = {i: etype_name(Relation(*c)) for i, c in enumerate(gpbd.canonical_etypes)}
        names_o = {i: etype_name(r) for i, r in enumerate(RELATIONS)}
        for inner in (1, 0):
            edges_d, edges_o = _typed_edges(gd, names_d, inner), _typed_edges(go, names_o, inner)
            assert set(edges_o) == set(edges_d)
        # edge data follow their edges: each inner (src, dst, relation) has the same weight
        weights = []
        for side, feats in (("dgl", efd), ("ours", efo)):
            edges = _typed_edges(gd if side == "dgl" else go, names_d if side == "dgl" else names_o, 1)
            starts = {name: meta[side]["edge_map"][name][p][0] for name in meta[side]["edge_map"]}
            weights.append({key: float(feats[f"{key[2]}/weight"][e - starts[key[2]]]) for key, e in edges.items()})
        assert weights[0] == weights[1] and len(weights[0]) == int(go.edata["inner_edge"].sum())
        assert set(nfo) == set(nfd) == {"user/feat", "user/label", "user/train_mask", "item/feat"}
        for name in nfd:
            assert torch.equal(nfo[name], nfd[name]), name
        assert nfo["item/feat"].shape[1] == 3 and nfo["user/feat"].shape[1] == 4  # each type's own width


def test_a_type_absent_from_a_part_gets_an_empty_range(tmp_path, monkeypatch):
    """DGL's own partition_graph fails when a part holds no node of some type; ours writes an empty
    range that load_partition and its partition book accept."""
    monkeypatch.setenv("DGL_DIST_DEBUG", "1")
    typed, indptr, indices, etype, weight, _ = _typed_graph(seed=2)
    n, offsets = int(typed.offsets[-1]), typed.offsets
    part = np.random.default_rng(3).integers(0, 2, n)
    part[offsets[0] : offsets[1]] = 0  # every cat in part 0
    orig = write_typed_distdgl_parts(indptr, indices, etype, typed, part, 2, tmp_path, "g", _node_data(2))
    meta = json.loads((tmp_path / "g.json").read_text())
    start, end = meta["node_map"]["cat"][1]
    assert start == end
    for p in range(2):
        g, feats, _, book, *_ = dgl.distributed.load_partition(str(tmp_path / "g.json"), p)
        core = g.ndata["_ID"][g.ndata["inner_node"].bool()]
        assert torch.equal(book.nid2partid(core), torch.full((len(core),), p))
        assert np.array_equal(np.sort(orig[core.numpy()]), np.flatnonzero(part == p))
        assert feats["user/feat"].shape == (int(np.count_nonzero(part[offsets[2] :] == p)), 4)


def test_inputs_are_checked(tmp_path):
    typed, indptr, indices, etype, weight, _ = _typed_graph()
    n = int(typed.offsets[-1])
    part = np.zeros(n, dtype=np.int64)
    with pytest.raises(ValueError, match="relation ids outside 0..3"):
        write_typed_distdgl_parts(indptr, indices, etype + 1, typed, part, 2, tmp_path, "g")
    with pytest.raises(ValueError, match="node data user/feat has 3 rows for 40 nodes"):
        write_typed_distdgl_parts(
            indptr, indices, etype, typed, part, 2, tmp_path, "g", {"user": {"feat": np.zeros((3, 2))}}
        )
    with pytest.raises(ValueError, match="part ids outside 0..1"):
        write_typed_distdgl_parts(indptr, indices, etype, typed, part + 2, 2, tmp_path, "g")


def test_metis_partitions_writes_the_typed_format_dgl_loads(tmp_path, monkeypatch):
    """The stage on a generated typed graph: DGL's loader reads every part; each node type's rows
    carry its own feature width and the canonical rows; the target type carries labels and masks."""
    monkeypatch.setenv("DGL_DIST_DEBUG", "1")
    generate_typed(tmp_path / "shop", 400, seed=4)
    build_canonical_graph(tmp_path / "shop", tmp_path / "canonical", CanonicalConfig(add_reverse=True))
    summary = build_partitions(tmp_path / "canonical", tmp_path / "parts", PartitionConfig(num_parts=2))
    typed = TypedSchema.read(tmp_path / "canonical")
    config = tmp_path / "parts" / summary["distdgl_config"]
    meta = json.loads(config.read_text())
    assert meta["ntypes"] == {t: i for i, t in enumerate(typed.schema.node_types)}
    assert meta["etypes"] == {etype_name(r): i for i, r in enumerate(typed.schema.relations)}
    assert meta["num_edges"] == sum(typed.relation_edges)
    orig = np.load(tmp_path / "parts" / "distdgl" / "orig_nids.npy")
    canonical = node_data(tmp_path / "canonical", int(typed.offsets[-1]))
    part = np.load(tmp_path / "parts" / "part_id.npy")
    seen = 0
    for p in range(2):
        g, feats, *_ = dgl.distributed.load_partition(str(config), p)
        core = orig[g.ndata["_ID"][g.ndata["inner_node"].bool()].numpy()]
        assert (part[core] == p).all()
        seen += len(core)
        for i, t in enumerate(typed.schema.node_types):
            rows = core[typed.node_types_of(core) == i]
            width = typed.feat_widths[i]
            if width:
                assert torch.equal(feats[f"{t}/feat"], torch.from_numpy(canonical["feat"][rows, :width]))
            else:
                assert f"{t}/feat" not in feats
        target_rows = core[typed.node_types_of(core) == typed.schema.type_index(typed.target)]
        assert torch.equal(feats[f"{typed.target}/label"], torch.from_numpy(canonical["label"][target_rows]))
    assert seen == int(typed.offsets[-1])
