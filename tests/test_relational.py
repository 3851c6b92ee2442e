"""Relational layers (`training.convs.rgcn`, `training.relational`) against DGL's `RelGraphConv` and
`HeteroGraphConv`, on typed blocks sampled by DGL's neighbour sampler from a small typed graph
(users, items, categories; five relations, one of them user -> user), with copied weights:
values and input gradients to 1e-5, per aggregation backend."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
dgl = pytest.importorskip("dgl")
dglnn = pytest.importorskip("dgl.nn")

from training.blocks import Block, mask_edges  # noqa: E402
from training.convs.rgcn import RelGraphConv  # noqa: E402
from training.layer_registry import LayerOptions, layer_kind  # noqa: E402
from training.relational import RelationalConv  # noqa: E402
from training.typed_blocks import GraphSchema, Relation, TypedBlock  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
IN, OUT = 6, 4


def typed_graph(seed=0):
    """A DGL heterograph: 40 users, 30 items, 5 categories; power-law-ish purchases."""
    rng = np.random.default_rng(seed)
    users, items, cats = 40, 30, 5
    buyer = rng.integers(0, users, 160)
    bought = np.minimum(rng.zipf(1.6, 160) - 1, items - 1)
    in_cat = rng.integers(0, cats, items)
    follower, followed = rng.integers(0, users, 60), rng.integers(0, users, 60)
    data = {
        ("user", "buys", "item"): (buyer, bought),
        ("item", "bought-by", "user"): (bought, buyer),
        ("item", "in", "category"): (np.arange(items), in_cat),
        ("category", "has", "item"): (in_cat, np.arange(items)),
        ("user", "follows", "user"): (follower, followed),
    }
    g = dgl.heterograph({k: (torch.from_numpy(s), torch.from_numpy(d)) for k, (s, d) in data.items()})
    return g


def sampled_block(g, fanout=3, seed=1):
    """The input layer's DGL block of a 2-layer neighbour sample from users and items."""
    dgl.seed(seed)
    sampler = dgl.dataloading.NeighborSampler([fanout, fanout])
    seeds = {"user": torch.arange(0, 40, 5), "item": torch.arange(0, 30, 4)}
    _, _, blocks = sampler.sample(g, seeds)
    return blocks[0]


def to_typed(block, dst_pos=None) -> tuple[TypedBlock, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A DGL heterogeneous block in our homogeneous layout: the destinations first, at
    `dst_pos` (per type, each DGL destination's position; by default type by type), then the
    other sources, type by type. Returns the typed block and, per node type, the positions of
    its source and of its destination nodes."""
    ntypes = block.srctypes
    nsrc = {t: block.num_src_nodes(t) for t in ntypes}
    ndst = {t: block.num_dst_nodes(t) if t in block.dsttypes else 0 for t in ntypes}
    total_dst = sum(ndst.values())
    if dst_pos is None:
        starts = np.cumsum([0] + [ndst[t] for t in ntypes])
        dst_pos = {t: int(starts[i]) + torch.arange(ndst[t]) for i, t in enumerate(ntypes)}
    dst_pos = {t: dst_pos.get(t, torch.arange(0)) for t in ntypes}
    rest_off, at = {}, total_dst
    for t in ntypes:
        rest_off[t], at = at, at + nsrc[t] - ndst[t]
    src_pos = {t: torch.cat([dst_pos[t], rest_off[t] + torch.arange(nsrc[t] - ndst[t])]) for t in ntypes}
    relations = [Relation(*c) for c in block.canonical_etypes]
    schema = GraphSchema(tuple(ntypes), tuple(relations))
    src, dst, rel = [], [], []
    for r, c in enumerate(block.canonical_etypes):
        s, d = block.edges(etype=c)
        src.append(src_pos[c[0]][s])
        dst.append(dst_pos[c[2]][d])
        rel.append(torch.full((len(s),), r))
    src, dst, rel = torch.cat(src), torch.cat(dst), torch.cat(rel)
    order = torch.argsort(dst, stable=True)
    src, dst, rel = src[order], dst[order], rel[order]
    indptr = torch.zeros(total_dst + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=total_dst), 0)
    src_types = torch.empty(at, dtype=torch.int64)
    for i, t in enumerate(ntypes):
        src_types[src_pos[t]] = i
    typed = TypedBlock(Block(indptr, src, at, total_dst), rel, src_types, schema)
    return typed, src_pos, dst_pos


@pytest.fixture(scope="module")
def sample():
    g = typed_graph()
    block = sampled_block(g)
    typed, src_pos, dst_pos = to_typed(block)
    return block, typed, src_pos, dst_pos


@pytest.fixture(params=["torch", "dgl"])
def backend(request, monkeypatch):
    monkeypatch.setattr("training.aggregate.Aggregating.aggregation", request.param)
    return request.param


def features(block, typed, src_pos, seed=4):
    """Random source features, per type for DGL and in our layout (the same values)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(typed.num_src, IN, generator=gen, requires_grad=True)
    per_type = {t: x.detach()[src_pos[t]].clone().requires_grad_(True) for t in block.srctypes}
    return x, per_type


def test_the_sample_has_every_case():
    """The sampled block holds every relation, a destination without in-edges of one of its
    type's relations, and sources that are not destinations: what the comparisons below cover."""
    g = typed_graph()
    block = sampled_block(g)
    typed, _, _ = to_typed(block)
    counts = torch.bincount(typed.etypes, minlength=len(typed.schema.relations))
    assert bool((counts > 0).all()) and typed.num_src > typed.num_dst
    user = typed.schema.type_index("user")
    follows = [r.name for r in typed.schema.relations].index("follows")
    users = typed.dst_of_type(user).nonzero().view(-1)
    assert bool((typed.relation_block(follows).in_degrees()[users] == 0).any())


def test_typed_block_refuses_an_edge_between_the_wrong_types(sample):
    _, typed, _, _ = sample
    swapped = typed.etypes.clone()
    swapped[swapped == 0] = 1  # user -> item edges labelled item -> user
    with pytest.raises(ValueError, match="of another type than the relation's"):
        TypedBlock(typed.block, swapped, typed.src_types, typed.schema)
    with pytest.raises(ValueError, match="unknown node type|names node type"):
        GraphSchema(("user",), (Relation("user", "buys", "item"),))
    with pytest.raises(ValueError, match="must be 1-64 letters"):
        Relation("user", "a__b", "item")


@pytest.mark.parametrize("num_bases", [None, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_rgcn_matches_dgl_relgraphconv(sample, backend, num_bases, weighted):
    _, typed, _, _ = sample
    rels = len(typed.schema.relations)
    ref = dglnn.RelGraphConv(IN, OUT, rels, regularizer="basis" if num_bases else None, num_bases=num_bases)
    with torch.no_grad():  # a bias that is not zero, so that it is compared too
        ref.h_bias.uniform_(-1, 1)
    ours = RelGraphConv(IN, OUT, rels, num_bases)
    ours.load_state_dict(ref.state_dict())
    g = dgl.create_block(
        (typed.block.indices, typed.block.dst_ids()), num_src_nodes=typed.num_src, num_dst_nodes=typed.num_dst
    )
    w = torch.rand(typed.block.num_edges, generator=torch.Generator().manual_seed(7)) + 0.1 if weighted else None
    # R-GCN's 1/c_{v,r}: each edge's weight over the weights of its destination's edges of its relation
    key = typed.block.dst_ids() * rels + typed.etypes
    ones = torch.ones(typed.block.num_edges) if w is None else w
    total = torch.zeros(typed.num_dst * rels).index_add_(0, key, ones)
    norm = (ones / total[key]).view(-1, 1)
    x = torch.randn(typed.num_src, IN, generator=torch.Generator().manual_seed(3), requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    want = ref(g, x_ref, typed.etypes, norm)
    got = ours(typed, x, w)
    torch.testing.assert_close(got, want, **TOL)
    want.square().sum().backward()
    got.square().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **TOL)
    state = ours.state_dict()
    assert set(state) == set(ref.state_dict())


def test_rgcn_on_a_plain_block_is_one_relation(sample):
    """Over a block without types, rgcn is R-GCN with one relation: x_v W_0 + mean_u x_u W_1 + b."""
    _, typed, _, _ = sample
    block = typed.block
    ours = layer_kind("rgcn").build(IN, OUT, False, LayerOptions())
    x = torch.randn(block.num_src, IN)
    mean = torch.zeros(block.num_dst, IN).index_add_(0, block.dst_ids(), x[block.indices])
    mean = mean / block.in_degrees().clamp(min=1).view(-1, 1).float()
    want = mean @ ours.linear_r.W[0] + x[: block.num_dst] @ ours.loop_weight + ours.h_bias
    torch.testing.assert_close(ours(block, x), want, **TOL)
    with pytest.raises(ValueError, match="without relation types"):
        layer_kind("rgcn").build(IN, OUT, False, LayerOptions(relations=2))(block, x)


def dgl_module(conv: str):
    if conv == "sage":
        return dglnn.SAGEConv(IN, OUT, "mean")
    if conv == "gcn":
        return dglnn.GraphConv(IN, OUT, norm="both", allow_zero_in_degree=True)
    return dglnn.GATConv(IN, OUT // 2, 2, allow_zero_in_degree=True)


@pytest.mark.parametrize("conv", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("combine", ["sum", "mean", "max"])
def test_relational_conv_matches_dgl_heterographconv(sample, backend, conv, combine):
    block, typed, src_pos, dst_pos = sample
    kind = layer_kind(conv)
    opts = LayerOptions(heads=2)
    ours = RelationalConv(kind, typed.schema, IN, OUT, False, opts, combine)
    mods = {r.name: dgl_module(conv) for r in typed.schema.relations}
    for r in typed.schema.relations:
        for p in mods[r.name].parameters():  # random biases too
            torch.nn.init.uniform_(p, -0.5, 0.5)
        ours.convs[r.key].load_state_dict(mods[r.name].state_dict())
    ref = dglnn.HeteroGraphConv(mods, aggregate=combine)
    x, per_type = features(block, typed, src_pos)
    want = ref(block, per_type)
    got = ours(typed, x)
    loss_ref = loss = 0
    for t, out in want.items():
        out = out.flatten(1)  # GAT's heads side by side, as a hidden layer returns them
        torch.testing.assert_close(got[dst_pos[t]], out, **TOL)
        loss_ref = loss_ref + out.square().sum()
        loss = loss + got[dst_pos[t]].square().sum()
    loss_ref.backward()
    loss.backward()
    for t in block.srctypes:
        torch.testing.assert_close(x.grad[src_pos[t]], per_type[t].grad, **TOL)


# ------------------------------------------------------------------------------- the model


def to_typed_chain(blocks) -> list[tuple[TypedBlock, dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """DGL's blocks of one minibatch in our layout, each block's destinations in the order of the
    next block's sources (as a sampler of ours lays them out): per block, `to_typed`'s triple."""
    chain, dst_pos = [], None
    for block in reversed(blocks):
        chain.insert(0, to_typed(block, dst_pos))
        dst_pos = chain[0][1]
    return chain


@pytest.mark.parametrize("conv", ["sage", "rgcn"])
def test_relational_gnn_matches_dgl_modules_stacked(conv):
    """Two layers of HeteroGraphConv(SAGEConv) or of RelGraphConv (with bases), after a linear
    map for featured types of different widths and an embedding for a featureless type, equal
    DGL's modules given the same weights (eval mode: no dropout); gradients reach the
    embedding rows the minibatch touched, and only those."""
    from training.relational_model import RelationalGNN, TypeInput

    g = typed_graph()
    dgl.seed(1)
    _, _, blocks = dgl.dataloading.NeighborSampler([4, 4]).sample(g, {"user": torch.arange(0, 40, 3)})
    chain = to_typed_chain(blocks)
    typed, src_pos, out_pos = [c[0] for c in chain], chain[0][1], chain[-1][2]
    schema = typed[0].schema
    gen = torch.Generator().manual_seed(0)
    widths = {"item": 5, "category": 3}
    table = {t: torch.randn(g.num_nodes(t), w, generator=gen) for t, w in widths.items()}
    inputs = {"user": TypeInput(0, g.num_nodes("user")), **{t: TypeInput(w) for t, w in widths.items()}}
    nid = {t: blocks[0].srcnodes[t].data[dgl.NID] for t in blocks[0].srctypes}
    order = {t: torch.argsort(src_pos[t]) for t in nid}  # DGL's source index of each of our rows
    feats = {t: table[t][nid[t][order[t]]] for t in widths}
    ids = {"user": nid["user"][order["user"]]}
    ours = RelationalGNN(schema, inputs, 8, 3, conv=conv, num_bases=2 if conv == "rgcn" else 0).eval()
    got = ours(typed, feats, ids)

    h = {t: ours.input.proj[t](table[t][nid[t]]) for t in widths} | {"user": ours.input.embed["user"](nid["user"])}
    for layer, (block, tb) in enumerate(zip(blocks, typed)):
        d_out = 8 if layer == 0 else 3
        if conv == "sage":
            mods = {r.name: dglnn.SAGEConv(8, d_out, "mean") for r in schema.relations}
            for r in schema.relations:
                mods[r.name].load_state_dict(ours.convs[layer].convs[r.key].state_dict())
            h = dglnn.HeteroGraphConv(mods, aggregate="sum")(block, h)
        else:  # RelGraphConv over the homogeneous form, rows in our layout
            ref = dglnn.RelGraphConv(8, d_out, len(schema.relations), "basis", 2)
            ref.load_state_dict(ours.convs[layer].state_dict())
            _, pos, dpos = chain[layer]
            x = torch.zeros(tb.num_src, 8).index_copy(0, torch.cat([pos[t] for t in h]), torch.cat(list(h.values())))
            mono = dgl.create_block((tb.block.indices, tb.block.dst_ids()), tb.num_src, tb.num_dst)
            key = tb.block.dst_ids() * len(schema.relations) + tb.etypes
            count = torch.zeros(tb.num_dst * len(schema.relations)).index_add_(0, key, torch.ones(len(key)))
            y = ref(mono, x, tb.etypes, (1 / count[key]).view(-1, 1))
            h = {t: y[dpos[t]] for t in block.dsttypes}
        if layer == 0:
            h = {t: torch.relu(v) for t, v in h.items()}
    for t, want in h.items():
        torch.testing.assert_close(got[out_pos[t]], want, **TOL)

    got.square().sum().backward()
    grad = ours.input.embed["user"].weight.grad
    assert grad.is_sparse
    touched = set(grad.coalesce().indices().view(-1).tolist())
    assert touched and touched <= set(ids["user"].tolist())


@pytest.mark.parametrize("conv", ["rgcn", "sage"])
def test_relational_gnn_learns_a_label_only_the_relations_carry(conv):
    """Users without features, labelled by the community whose items they mostly buy; items carry
    a noisy one-hot of their community. Trained on half the users from sampled typed blocks (a
    dense optimizer for the layers, SparseAdam for the embeddings), the model labels the other
    half, whose embeddings it never trained, through their purchases: far above the 1/4 of chance."""
    from training.relational_model import RelationalGNN, TypeInput

    rng = np.random.default_rng(0)
    users, items, k = 400, 200, 4
    label = rng.integers(0, k, users)
    item_comm = np.arange(items) % k
    buys_u = np.repeat(np.arange(users), 6)
    own = rng.random(len(buys_u)) < 0.8
    comm = np.where(own, label[buys_u], rng.integers(0, k, len(buys_u)))
    buys_i = comm + k * rng.integers(0, items // k, len(buys_u))
    g = dgl.heterograph(
        {
            ("user", "buys", "item"): (torch.from_numpy(buys_u), torch.from_numpy(buys_i)),
            ("item", "bought-by", "user"): (torch.from_numpy(buys_i), torch.from_numpy(buys_u)),
        }
    )
    item_x = torch.from_numpy(np.eye(k)[item_comm] + rng.normal(0, 0.5, (items, k))).float()
    y = torch.from_numpy(label)
    train_users, test_users = torch.arange(0, users, 2), torch.arange(1, users, 2)
    inputs = {"user": TypeInput(0, users), "item": TypeInput(k)}
    sampler = dgl.dataloading.NeighborSampler([5, 5])

    def batch(seeds):
        _, _, blocks = sampler.sample(g, {"user": seeds})
        chain = to_typed_chain(blocks)
        pos = chain[0][1]
        nid = {t: blocks[0].srcnodes[t].data[dgl.NID][torch.argsort(pos[t])] for t in ("user", "item")}
        out = chain[-1][2]["user"]
        return [c[0] for c in chain], {"item": item_x[nid["item"]]}, {"user": nid["user"]}, out

    torch.manual_seed(0)
    dgl.seed(0)
    schema = batch(train_users[:4])[0][0].schema
    model = RelationalGNN(schema, inputs, 16, k, conv=conv, dropout=0.2)
    dense = torch.optim.Adam(model.dense_parameters(), lr=0.01)
    sparse = torch.optim.SparseAdam(model.sparse_parameters(), lr=0.01)
    for _ in range(60):
        seeds = train_users[torch.randperm(len(train_users))[:64]]
        blocks, feats, ids, out = batch(seeds)
        loss = torch.nn.functional.cross_entropy(model(blocks, feats, ids)[out], y[seeds])
        dense.zero_grad()
        sparse.zero_grad()
        loss.backward()
        dense.step()
        sparse.step()
    model.eval()
    with torch.no_grad():
        blocks, feats, ids, out = batch(test_users)
        acc = float((model(blocks, feats, ids)[out].argmax(1) == y[test_users]).float().mean())
    print(f"{conv}: accuracy on the held-out users {acc:.3f}")
    assert acc > 0.75, acc


def _reweighted(typed: TypedBlock, correction: str, shuffled: bool, seed=5) -> TypedBlock:
    """`typed` with Â-like edge weights and a sampler correction (none, one per edge, or one per
    (destination, relation) as per-relation draws give), its edges optionally out of relation
    order; relation 0 left without edges (its layer skipped, as HeteroGraphConv skips it)."""
    typed = TypedBlock(
        mask_edges(typed.block, typed.etypes != 0), typed.etypes[typed.etypes != 0], typed.src_types, typed.schema
    )
    b, gen = typed.block, torch.Generator().manual_seed(seed)
    order = torch.arange(b.num_edges)
    if shuffled:  # each destination's edges in a random order: relation_rows must sort them
        key = b.dst_ids().double() + torch.rand(b.num_edges, generator=gen, dtype=torch.float64) * 0.5
        order = torch.argsort(key)
    etypes, indices = typed.etypes[order], b.indices[order]
    weight = torch.rand(b.num_edges, generator=gen, dtype=torch.float64) + 0.1
    corr = None
    if correction == "per_edge":
        corr = torch.rand(b.num_edges, generator=gen, dtype=torch.float64) + 0.5
    elif correction == "per_relation":
        shape = (b.num_dst, len(typed.schema.relations))
        corr = (torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5)[b.dst_ids(), etypes]
    return TypedBlock(
        Block(b.indptr, indices, b.num_src, b.num_dst, weight, corr), etypes, typed.src_types, typed.schema
    )


@pytest.mark.parametrize("combine", ["sum", "mean"])
@pytest.mark.parametrize("correction", ["none", "per_edge", "per_relation"])
@pytest.mark.parametrize("shuffled", [False, True])
def test_sage_for_all_relations_at_once_equals_relation_by_relation(sample, backend, combine, correction, shuffled):
    """Sage's `per_relation` form against RelationalConv's relation-by-relation run of the same
    modules: values and gradients (input and every weight), with edge weights and corrections."""
    _, typed, _, _ = sample
    results = []
    for fused in (True, False):
        block = _reweighted(typed, correction, shuffled)
        torch.manual_seed(0)
        conv = RelationalConv(
            layer_kind("sage"), typed.schema, IN, OUT, False, LayerOptions(edge_weights=True), combine
        )
        conv.fused = fused
        conv.double()  # float64: the two sums differ only in their order, far below the tolerance
        x = torch.randn(
            typed.num_src, IN, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True
        )
        out = conv(block, x)
        out.square().sum().backward()
        results.append((out.detach(), x.grad, {n: p.grad for n, p in conv.named_parameters()}))
    (out_f, gx_f, gp_f), (out_g, gx_g, gp_g) = results
    torch.testing.assert_close(out_f, out_g, **TOL)
    torch.testing.assert_close(gx_f, gx_g, **TOL)
    assert gp_f.keys() == gp_g.keys()
    for name in gp_f:  # a relation without edges in the block has no gradient on either side
        if gp_g[name] is None:
            assert gp_f[name] is None or not gp_f[name].any(), name
        else:
            torch.testing.assert_close(gp_f[name], gp_g[name], **TOL)
