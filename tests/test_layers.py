"""training.blocks / aggregate / layers against DGL's own kernels and modules, on CPU.

Every layer is compared with its DGL counterpart with copied weights (values and input
gradients to 1e-5) on two graphs: a small directed graph with zero-in-degree nodes and
duplicate edges, and a real sampled DGL block (``dgl.to_block``) with num_src > num_dst.
Layer tests run once per aggregation backend (torch sparse and DGL kernels).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

os.environ.setdefault("DGLBACKEND", "pytorch")
dgl = pytest.importorskip("dgl")

from training.aggregate import (  # noqa: E402
    Aggregating,
    _dgl_block,
    aggregate,
    edge_scores,
    edge_softmax,
    resolve_backend,
    use_aggregation,
    weighted_mean_weights,
    with_dst_rows,
)
from training.blocks import (  # noqa: E402
    Block,
    block_from_csr,
    csr_matrix,
    drop_edge_scale,
    drop_edges,
    mask_edges,
    remove_self_loops,
    slice_dst,
)
from training.convs.gat import GATConv  # noqa: E402
from training.convs.gcn import GraphConv  # noqa: E402
from training.convs.gin import GINConv  # noqa: E402
from training.convs.sage import SAGEConv  # noqa: E402
from training.layers import GNN, ModelConfig, build_model  # noqa: E402

CONVS = ("sage", "sage_pool", "gcn", "gat", "gin")  # the built-in layer types

REPO = Path(__file__).resolve().parents[1]
TOL = dict(atol=1e-5, rtol=1e-5)


def close(a, b):
    torch.testing.assert_close(a, b, **TOL)


def from_dgl(g) -> tuple[Block, torch.Tensor]:
    """Our Block for a DGL graph or block, and the DGL edge id of each of our edges."""
    indptr, indices, eids = g.adj_tensors("csc")
    return Block(indptr.long(), indices.long(), g.num_src_nodes(), g.num_dst_nodes()), eids.long()


def directed_graph():
    """40 nodes; nodes 34..39 have no in-edges; duplicates and self-loops allowed."""
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, 40, (160,), generator=gen)
    dst = torch.randint(0, 34, (160,), generator=gen)
    return dgl.graph((src, dst), num_nodes=40)


def sampled_block():
    """A DGL message-flow block (num_src > num_dst) with a zero-in-degree seed (195)."""
    dgl.seed(1)  # sample_neighbors draws from DGL's own generator
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(0, 200, (1500,), generator=gen)
    dst = torch.randint(0, 190, (1500,), generator=gen)  # 190..199: no in-edges
    g = dgl.graph((src, dst), num_nodes=200)
    seeds = torch.cat([torch.randperm(190, generator=gen)[:29], torch.tensor([195])])
    blk = dgl.to_block(dgl.sampling.sample_neighbors(g, seeds, 5), seeds)
    assert blk.num_src_nodes() > blk.num_dst_nodes()
    assert (blk.in_degrees() == 0).any()
    return blk


GRAPHS = {"directed": directed_graph, "sampled": sampled_block}


@pytest.fixture(params=sorted(GRAPHS))
def graph(request):
    g = GRAPHS[request.param]()
    block, eids = from_dgl(g)
    return g, block, eids


@pytest.fixture(params=["torch", "dgl"])
def backend(request, monkeypatch):
    """Every layer built in the test aggregates with this backend (the layers' class default)."""
    monkeypatch.setattr(Aggregating, "aggregation", request.param)
    return request.param


def run(module, graph, x, **kwargs):
    """Output and d(out . r)/dx for a fixed random r."""
    x = x.clone().requires_grad_(True)
    out = module(graph, x, **kwargs)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    out.backward(upstream)
    return out.detach(), x.grad


def features(n, f, seed=3):
    return torch.randn(n, f, generator=torch.Generator().manual_seed(seed))


def edge_weights(num_edges, seed=5):
    return torch.rand(num_edges, generator=torch.Generator().manual_seed(seed)) + 0.1


# ------------------------------------------------------------------------- aggregate


def test_dgl_block_is_create_blocks(graph):
    """The DGL block the kernels run on (built from its unit graph) is what dgl.create_block makes."""
    _, block, _ = graph
    eids = torch.arange(block.num_edges)
    ours = _dgl_block(dgl, block, eids)
    ref = dgl.create_block(("csc", (block.indptr, block.indices, eids)), block.num_src, block.num_dst)
    assert (ours.num_src_nodes(), ours.num_dst_nodes(), ours.canonical_etypes, ours.idtype) == (
        ref.num_src_nodes(),
        ref.num_dst_nodes(),
        ref.canonical_etypes,
        ref.idtype,
    )
    for fmt in ("csc", "csr", "coo"):
        for a, b in zip(ours.adj_tensors(fmt), ref.adj_tensors(fmt)):
            assert torch.equal(a, b)
    x = features(block.num_src, 4)
    for reduce in ("sum", "mean", "max"):
        close(dgl.ops.gspmm(ours, "copy_lhs", reduce, x, None), dgl.ops.gspmm(ref, "copy_lhs", reduce, x, None))


def test_dst_rows_gradient_is_autograds(graph, backend):
    """with_dst_rows: the same gradient as slicing x, for rows read by an aggregation and a linear
    map, and when the aggregation's output is unused (the destinations' gradient alone)."""
    _, block, _ = graph
    x0 = features(block.num_src, 6)
    lin = torch.nn.Linear(6, 3)
    r = features(block.num_dst, 6, seed=9)

    def grad(split: bool, use_all: bool = True):
        x = x0.clone().requires_grad_(True)
        x_all, x_dst = with_dst_rows(x, block.num_dst) if split else (x, x[: block.num_dst])
        loss = lin(x_dst).square().sum()
        if use_all:
            loss = loss + (aggregate(block, x_all, reduce="mean", backend=backend) * r).sum()
        loss.backward()
        return x.grad

    close(grad(True), grad(False))
    close(grad(True, use_all=False), grad(False, use_all=False))
    x = x0.clone()  # no gradient wanted: plain views
    a, b = with_dst_rows(x, block.num_dst)
    assert a is x and torch.equal(b, x[: block.num_dst])


def test_aggregate_hand_checked(backend):
    # dst 0 <- src 1, 2 ; dst 1 <- src 3 ; dst 2 has no in-edges
    block = Block(torch.tensor([0, 2, 3, 3]), torch.tensor([1, 2, 3]), num_src=4, num_dst=3)
    x = torch.tensor([[1.0], [2.0], [4.0], [8.0]])
    w = torch.tensor([0.5, 0.25, 2.0])
    assert aggregate(block, x, reduce="sum").flatten().tolist() == [6, 8, 0]
    assert aggregate(block, x, reduce="mean").flatten().tolist() == [3, 8, 0]
    assert aggregate(block, x, reduce="max").flatten().tolist() == [4, 8, 0]
    assert aggregate(block, x, reduce="sum", edge_weight=w).flatten().tolist() == [2, 16, 0]
    assert aggregate(block, x, reduce="mean", edge_weight=w).flatten().tolist() == [1, 16, 0]
    assert aggregate(block, -x, reduce="max").flatten().tolist() == [-2, -8, 0]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("weights", [None, "edge", "head"])
def test_aggregate_torch_and_dgl_agree(graph, reduce, weights):
    _, block, _ = graph
    shape = (block.num_src, 3, 4) if weights == "head" else (block.num_src, 6)
    results = {}
    for backend in ("torch", "dgl"):
        gen = torch.Generator().manual_seed(11)
        x = torch.randn(*shape, generator=gen, requires_grad=True)
        w = None
        if weights is not None:
            w_shape = (block.num_edges, 3) if weights == "head" else (block.num_edges,)
            w = (torch.rand(*w_shape, generator=gen) + 0.1).requires_grad_(True)
        out = aggregate(block, x, reduce=reduce, edge_weight=w, backend=backend)
        out.backward(torch.randn(out.shape, generator=gen))
        results[backend] = (out.detach(), x.grad, None if w is None else w.grad)
    assert results["torch"][0].shape == (block.num_dst, *shape[1:])
    # zero-in-degree destinations get 0 on both paths
    no_in = block.in_degrees() == 0
    assert no_in.any() and (results["torch"][0][no_in] == 0).all()
    for ours, theirs in zip(results["torch"], results["dgl"]):
        if ours is not None:
            close(ours, theirs)


def test_aggregate_matches_dgl_update_all(graph):
    g, block, eids = graph
    x = features(block.num_src, 5)
    w = edge_weights(g.num_edges())
    g.srcdata["h"], g.edata["w"] = x, w
    g.update_all(dgl.function.u_mul_e("h", "w", "m"), dgl.function.mean("m", "out"))
    ours = aggregate(block, x, reduce="mean", edge_weight=w[eids], backend="torch")
    close(ours, g.dstdata["out"])


@pytest.mark.parametrize("kernel", ["torch", "dgl"])
def test_edge_softmax_and_scores_match_dgl(graph, kernel):
    g, block, eids = graph
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(g.num_edges(), 3, generator=gen)
    theirs = dgl.nn.functional.edge_softmax(g, scores)
    close(edge_softmax(block, scores[eids], kernel), theirs[eids])
    src, dst = torch.randn(block.num_src, 3, generator=gen), torch.randn(block.num_dst, 3, generator=gen)
    theirs = dgl.ops.u_add_v(g, src, dst)
    close(edge_scores(block, src, dst, kernel), theirs[eids])


def test_aggregate_under_cpu_autocast():
    block, _ = from_dgl(sampled_block())
    x = features(block.num_src, 8)
    ref = aggregate(block, x, reduce="mean", backend="torch")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # torch 2.2.1 has no bf16 CSR kernel: this raised before aggregation ran in fp32
        out = aggregate(block, x, reduce="mean", backend="torch")
        out_bf16 = aggregate(block, x.bfloat16(), reduce="mean", backend="torch")
    assert out.dtype == torch.float32 and torch.equal(out, ref)
    assert out_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(out_bf16.float(), ref, atol=3e-2, rtol=3e-2)


def test_resolve_backend(monkeypatch):
    monkeypatch.setenv("GNNFLOW_AGGREGATE_BACKEND", "torch")  # the old variable is not read any more
    assert resolve_backend(None, torch.device("cpu")) == "dgl"  # dgl is installed here
    assert resolve_backend(None, torch.device("cuda")) == "torch"
    assert resolve_backend("torch", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="unknown aggregation backend 'cusparse'"):
        resolve_backend("cusparse", torch.device("cpu"))


def test_use_aggregation_sets_every_layer_and_restores(monkeypatch):
    from training import aggregate as agg

    model = build_model(ModelConfig(conv="gat", hidden=8, heads=2, num_layers=2), 4, 3)
    layers = [m for m in model.modules() if isinstance(m, Aggregating)]
    assert len(layers) == 2 and {m.aggregation for m in layers} == {"auto"}
    used = []
    real = agg.resolve_backend
    monkeypatch.setattr(agg, "resolve_backend", lambda b, d: used.append(b) or real(b, d))
    full = block_from_csr(torch.tensor([0, 2, 3, 5]), torch.tensor([0, 1, 1, 2, 0]))
    with use_aggregation(model, "torch"):
        assert {m.aggregation for m in layers} == {"torch"}
        model([full, full], torch.randn(3, 4))
    assert set(used) == {"torch"}
    assert {m.aggregation for m in layers} == {"auto"}


# ---------------------------------------------------------------------------- layers


@pytest.mark.parametrize("aggregator", ["mean", "pool"])
@pytest.mark.parametrize("in_feats,out_feats", [(6, 4), (4, 7)])
def test_sage_matches_dgl(graph, backend, aggregator, in_feats, out_feats):
    g, block, _ = graph
    theirs = dgl.nn.SAGEConv(in_feats, out_feats, aggregator)
    ours = SAGEConv(in_feats, out_feats, aggregator)
    ours.load_state_dict(theirs.state_dict())  # strict: same parameter layout
    x = features(block.num_src, in_feats)
    out, grad = run(ours, block, x)
    ref_out, ref_grad = run(theirs, g, x)
    close(out, ref_out)
    close(grad, ref_grad)


def test_sage_edge_weight_matches_dgl(graph, backend):
    g, block, eids = graph
    theirs = dgl.nn.SAGEConv(5, 3, "mean")
    ours = SAGEConv(5, 3, "mean")
    ours.load_state_dict(theirs.state_dict())
    x, w = features(block.num_src, 5), edge_weights(g.num_edges())
    out, grad = run(ours, block, x, edge_weight=w[eids])
    ref_out, ref_grad = run(theirs, g, x, edge_weight=w)
    close(out, ref_out)
    close(grad, ref_grad)


@pytest.mark.parametrize("norm", ["both", "right", "left", "none"])
@pytest.mark.parametrize("in_feats,out_feats", [(6, 4), (4, 7)])
@pytest.mark.parametrize("weighted", [False, True])
def test_graphconv_matches_dgl(graph, backend, norm, in_feats, out_feats, weighted):
    g, block, eids = graph
    theirs = dgl.nn.GraphConv(in_feats, out_feats, norm=norm, allow_zero_in_degree=True)
    torch.nn.init.uniform_(theirs.bias)  # non-zero bias, so a missing bias would show
    ours = GraphConv(in_feats, out_feats, norm=norm)
    ours.load_state_dict(theirs.state_dict())
    x, w = features(block.num_src, in_feats), edge_weights(g.num_edges())
    out, grad = run(ours, block, x, edge_weight=w[eids] if weighted else None)
    ref_out, ref_grad = run(theirs, g, x, edge_weight=w if weighted else None)
    close(out, ref_out)
    close(grad, ref_grad)


@pytest.mark.parametrize("in_feats,residual", [(6, False), (6, True), (12, True)])
@pytest.mark.parametrize("weighted", [False, True])
def test_gat_matches_dgl(graph, backend, in_feats, residual, weighted):
    g, block, eids = graph
    heads, out_feats = 3, 4  # in_feats 12 == heads * out_feats: identity residual
    theirs = dgl.nn.GATConv(in_feats, out_feats, heads, residual=residual, allow_zero_in_degree=True)
    for p in theirs.parameters():  # DGL zero-initialises the biases
        torch.nn.init.uniform_(p, -0.5, 0.5)
    ours = GATConv(in_feats, out_feats, heads, residual=residual)
    ours.load_state_dict(theirs.state_dict())
    x, w = features(block.num_src, in_feats), edge_weights(g.num_edges())
    out, grad = run(ours, block, x, edge_weight=w[eids] if weighted else None)
    ref_out, ref_grad = run(theirs, g, x, edge_weight=w if weighted else None)
    assert out.shape == (block.num_dst, heads, out_feats)
    close(out, ref_out)
    close(grad, ref_grad)


@pytest.mark.parametrize("aggregator", ["sum", "mean", "max"])
@pytest.mark.parametrize("learn_eps,init_eps", [(False, 0.0), (True, 0.3)])
def test_gin_matches_dgl(graph, backend, aggregator, learn_eps, init_eps):
    g, block, _ = graph
    ours = GINConv(5, 6, aggregator, learn_eps=learn_eps, init_eps=init_eps)
    theirs = dgl.nn.GINConv(copy.deepcopy(ours.apply_func), aggregator, init_eps=init_eps, learn_eps=learn_eps)
    assert set(ours.state_dict()) == set(theirs.state_dict())
    x = features(block.num_src, 5)
    out, grad = run(ours, block, x)
    ref_out, ref_grad = run(theirs, g, x)
    close(out, ref_out)
    close(grad, ref_grad)
    if learn_eps:
        assert ours.eps.grad is not None and ours.eps.grad.abs().item() > 0


# ----------------------------------------------------------------------------- model


def symmetric_graph(n=60, seed=4):
    """Undirected simple graph with self-loops plus its Â = D^-1/2 (A + I) D^-1/2 weights."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (150,), generator=gen)
    dst = torch.randint(0, n, (150,), generator=gen)
    g = dgl.graph((src, dst), num_nodes=n)
    g = dgl.add_self_loop(dgl.to_simple(dgl.to_bidirected(dgl.remove_self_loop(g))))
    dinv = g.in_degrees().float().rsqrt()
    return g, dinv


def weighted_block(g, dinv, src_ids, dst_ids) -> Block:
    """Our Block for DGL graph/block ``g`` carrying Â weights (a function of the endpoints)."""
    block, _ = from_dgl(g)
    dst_of_edge = torch.repeat_interleave(torch.arange(block.num_dst), block.in_degrees())
    block.edge_weight = dinv[src_ids[block.indices]] * dinv[dst_ids[dst_of_edge]]
    return block


MODEL_CASES = [
    dict(conv="sage"),
    dict(conv="sage_pool", residual=True, hidden_norm="batch"),
    dict(conv="gcn", residual=True, hidden_norm="layer"),
    dict(conv="gcn", gcn_edge_weight=True, hidden_norm="batch"),
    dict(conv="gat", heads=2, residual=True),
    dict(conv="gin", hidden_norm="batch", num_layers=3),
]


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_gnn_blocks_equal_full_graph_inference(case):
    case = dict(case)
    num_layers = case.pop("num_layers", 2)
    g, dinv = symmetric_graph()
    n = g.num_nodes()
    all_ids = torch.arange(n)
    full = weighted_block(g, dinv, all_ids, all_ids)
    feats = features(n, 10)
    seeds = torch.tensor([0, 5, 17, 33, 59])
    sampler = dgl.dataloading.MultiLayerFullNeighborSampler(num_layers)
    _, out_nodes, dgl_blocks = sampler.sample_blocks(g, seeds)
    blocks = [weighted_block(b, dinv, b.srcdata[dgl.NID], b.dstdata[dgl.NID]) for b in dgl_blocks]
    torch.manual_seed(0)
    model = GNN(10, 8, 3, num_layers, dropout=0.3, **case)
    with torch.no_grad():  # move BatchNorm's running statistics off their defaults
        model.train()(blocks, feats[dgl_blocks[0].srcdata[dgl.NID]])
    model.eval()
    out = model(blocks, feats[dgl_blocks[0].srcdata[dgl.NID]])
    everything = model.inference(full, feats)
    chunked = model.inference(full, feats, batch_size=7)
    assert out.shape == (len(seeds), 3)
    close(out, everything[out_nodes])
    close(chunked, everything)


@pytest.mark.parametrize("conv", ["sage", "gat"])
def test_gnn_layer_is_dropout_conv_residual_norm_relu(conv):
    g, dinv = symmetric_graph()
    ids = torch.arange(g.num_nodes())
    full = weighted_block(g, dinv, ids, ids)
    feats = features(g.num_nodes(), 10)
    torch.manual_seed(0)
    model = GNN(10, 8, 3, 2, conv, residual=True, hidden_norm="layer", heads=2, dropout=0.5).eval()
    torch.nn.init.uniform_(model.norms[0].bias)
    conv0 = model.convs[0](full, feats).reshape(g.num_nodes(), 8)
    hidden = torch.relu(model.norms[0](conv0 + model.residuals[0](feats)))
    close(model.layer(0, full, feats), hidden)
    out = model.convs[1](full, hidden)
    close(model.layer(1, full, hidden), out.mean(1) if conv == "gat" else out)
    close(model([full, full], feats), model.layer(1, full, hidden))


def test_gnn_gcn_uses_block_weights_only_when_asked():
    g, dinv = symmetric_graph()
    ids = torch.arange(g.num_nodes())
    full = weighted_block(g, dinv, ids, ids)
    feats = features(g.num_nodes(), 10)
    torch.manual_seed(0)
    weighted = GNN(10, 8, 3, 2, "gcn").eval()
    degree_normed = GNN(10, 8, 3, 2, "gcn", gcn_edge_weight=False).eval()
    degree_normed.load_state_dict(weighted.state_dict())
    # On a full graph with self-loops, Â weights equal norm='both' on the block's degrees.
    close(weighted.inference(full, feats), degree_normed.inference(full, feats))
    unweighted = Block(full.indptr, full.indices, full.num_src, full.num_dst)
    close(weighted.inference(unweighted, feats), weighted.inference(full, feats))
    full.edge_weight = full.edge_weight * 2  # a weight change must reach the output
    assert not torch.allclose(weighted.inference(full, feats), degree_normed.inference(full, feats))


def test_drop_edge_only_in_training():
    g, dinv = symmetric_graph()
    ids = torch.arange(g.num_nodes())
    full = weighted_block(g, dinv, ids, ids)
    feats = features(g.num_nodes(), 10)
    torch.manual_seed(0)
    model = GNN(10, 8, 3, 2, "sage", drop_edge=0.5)
    plain = GNN(10, 8, 3, 2, "sage")
    plain.load_state_dict(model.state_dict())
    close(model.eval()([full, full], feats), plain.eval()([full, full], feats))
    dropped, kept = model.train()([full, full], feats), plain.train()([full, full], feats)
    assert not torch.allclose(dropped, kept)


def test_mask_and_drop_edges():
    block = Block(
        torch.tensor([0, 2, 3, 3, 5]),
        torch.tensor([1, 2, 0, 3, 4]),
        5,
        4,
        edge_weight=torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]),
    )
    kept = mask_edges(block, torch.tensor([True, False, False, True, True]))
    assert kept.indptr.tolist() == [0, 1, 1, 1, 3]
    assert kept.indices.tolist() == [1, 3, 4]
    assert kept.edge_weight.tolist() == [1.0, 4.0, 5.0]
    big = block_from_csr(torch.arange(0, 20001, 2), torch.randint(0, 10000, (20000,)))
    dropped = drop_edges(big, 0.3, generator=torch.Generator().manual_seed(0))
    assert 0.68 < dropped.num_edges / big.num_edges < 0.72
    assert int(dropped.indptr[-1]) == dropped.num_edges and (dropped.in_degrees() <= 2).all()
    assert drop_edges(big, 0.0) is big


def _dropedge_draws(block, x, p, draws, seed=0):
    """``draws`` independent DropEdge draws at once: ``block`` (num_src == num_dst = N) copied
    ``draws`` times as one block-diagonal block, dropped once; returns it, its features
    (``x`` repeated) and a reshape of a result to ``[draws, N, ...]``."""
    n, e = block.num_dst, block.num_edges
    indptr = torch.cat(
        [torch.zeros(1, dtype=torch.int64), (block.indptr[1:] + e * torch.arange(draws).view(-1, 1)).flatten()]
    )
    indices = (block.indices + n * torch.arange(draws).view(-1, 1)).flatten()
    weight = None if block.edge_weight is None else block.edge_weight.repeat(draws)
    big = Block(indptr, indices, n * draws, n * draws, weight)
    dropped = drop_edges(big, p, generator=torch.Generator().manual_seed(seed))
    return dropped, x.repeat(draws, 1), lambda out: out.view(draws, n, *out.shape[1:])


def test_drop_edge_keeps_the_expected_sum_and_weighted_sum():
    # a 40-node graph with self loops and positive weights (Â-like); features in [0, 1]
    gen = torch.Generator().manual_seed(1)
    n, deg, p, draws = 40, 6, 0.4, 4000
    nbrs = (torch.arange(n).view(-1, 1) + torch.randint(1, n, (n, deg), generator=gen)) % n  # no self loops
    indices = torch.cat([torch.arange(n).view(-1, 1), nbrs], 1).flatten()  # self loop first
    weight = torch.rand(indices.numel(), generator=gen) + 0.5
    block = Block(torch.arange(0, n * (deg + 1) + 1, deg + 1), indices, n, n, weight)
    x = torch.rand(n, 3, generator=gen)
    full_sum = aggregate(block, x, reduce="sum", backend="torch")  # GIN's sum (no weights)
    full_weighted = aggregate(block, x, reduce="sum", edge_weight=weight, backend="torch")  # GCN over Â
    d, xs, per_draw = _dropedge_draws(block, x, p, draws)
    assert int((d.indices == d.dst_ids()).sum()) == n * draws  # every self loop survives
    assert abs(d.num_edges / (n * draws) - 1 - deg * (1 - p)) < 0.05  # and a (1-p) share of the others
    scale = drop_edge_scale(d, p)
    sums = per_draw(aggregate(d, xs, reduce="sum", edge_weight=scale, backend="torch"))
    weighted = per_draw(aggregate(d, xs, reduce="sum", edge_weight=d.edge_weight * scale, backend="torch"))
    unscaled = per_draw(aggregate(d, xs, reduce="sum", edge_weight=d.edge_weight, backend="torch"))
    # tolerance: 4 standard errors of the mean over the draws (at most ~0.05 per entry here)
    for got, want in ((sums, full_sum), (weighted, full_weighted)):
        stderr = got.std(0) / draws**0.5
        assert ((got.mean(0) - want).abs() <= 4 * stderr + 1e-6).all()
    # without 1/(1-p) the neighbours' share shrinks to (1-p): far outside that tolerance
    loops = aggregate(block, x, reduce="sum", edge_weight=weight * (block.indices == block.dst_ids()), backend="torch")
    torch.testing.assert_close(unscaled.mean(0), loops + (1 - p) * (full_weighted - loops), atol=0.1, rtol=0)
    assert (unscaled.mean(0) - full_weighted).abs().mean() > 1.0


def test_drop_edge_mean_is_over_the_kept_edges():
    # destinations 0..29 average neighbours among 30..89 (no self loops: exchangeable edges);
    # given that something was kept, the mean over the kept edges has the full mean as expectation
    gen = torch.Generator().manual_seed(2)
    n, deg, p, draws = 90, 5, 0.3, 4000
    indices = torch.randint(30, n, (30 * deg,), generator=gen)
    indptr = torch.cat([torch.arange(0, 30 * deg + 1, deg), torch.full((n - 30,), 30 * deg)])
    block = Block(indptr, indices, n, n)
    x = torch.rand(n, 2, generator=gen)
    full = aggregate(block, x, reduce="mean", backend="torch")[:30]
    d, xs, per_draw = _dropedge_draws(block, x, p, draws, seed=5)
    means = per_draw(aggregate(d, xs, reduce="mean", backend="torch"))[:, :30]
    some = per_draw(d.in_degrees() > 0)[:, :30, None].float()
    expected = (means * some).sum(0) / some.sum(0)
    # tolerance 0.02: about 4 standard errors (features in [0, 1], 5 neighbours, 4000 draws)
    torch.testing.assert_close(expected, full, atol=0.02, rtol=0)


def test_gnn_drop_edge_scales_gin_and_gcn_only():
    # with every non-loop edge dropped at p -> the sage mean sees only the self loop, gin's sum
    # sees the self loop scaled by 1 (not 1/(1-p)); checked through GNN.forward in training mode
    g, dinv = symmetric_graph()
    ids = torch.arange(g.num_nodes())
    full = weighted_block(g, dinv, ids, ids)
    loops = Block(full.indptr, full.indices, full.num_src, full.num_dst, full.edge_weight)
    feats = features(g.num_nodes(), 10)
    for conv in ("gin", "gcn"):
        torch.manual_seed(0)
        model = GNN(10, 8, 3, 1, conv, drop_edge=0.5).train()
        torch.manual_seed(7)
        out = model([loops], feats)
        torch.manual_seed(7)
        dropped = drop_edges(loops, 0.5)
        scale = drop_edge_scale(dropped, 0.5)
        want = model.eval().layer(0, dropped, feats, scale)
        close(out, want)
        assert not torch.allclose(out, model.layer(0, dropped, feats))  # the scale changed it


def test_remove_self_loops_and_slice_dst():
    # 0 <- 0, 1 ; 1 <- 1, 2 ; 2 <- 0
    block = block_from_csr(np.array([0, 2, 4, 5]), np.array([0, 1, 1, 2, 0]))
    no_loops = remove_self_loops(block)
    assert no_loops.indptr.tolist() == [0, 1, 2, 3] and no_loops.indices.tolist() == [1, 2, 0]
    sub, src_ids = slice_dst(block, 1, 3)
    assert src_ids.tolist() == [1, 2, 0]  # destinations first, then the other sources
    assert (sub.num_dst, sub.num_src) == (2, 3)
    assert src_ids[sub.indices].tolist() == [1, 2, 0]  # same edges, relabelled


def test_activation_checkpointing_same_output_and_grads():
    g, dinv = symmetric_graph()
    ids = torch.arange(g.num_nodes())
    full = weighted_block(g, dinv, ids, ids)
    feats = features(g.num_nodes(), 10)
    results = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = GNN(10, 8, 3, 2, "gat", heads=2, dropout=0.3, activation_checkpointing=ckpt)
        torch.manual_seed(1)  # same dropout masks
        out = model([full, full], feats)
        out.square().sum().backward()
        results.append((out.detach(), [p.grad for p in model.parameters()]))
    close(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        close(a, b)


@pytest.mark.parametrize("conv", CONVS)
def test_model_trains_under_bf16_autocast(conv):
    g, dinv = symmetric_graph()
    ids = torch.arange(g.num_nodes())
    full = weighted_block(g, dinv, ids, ids)
    feats = features(g.num_nodes(), 10)
    torch.manual_seed(0)
    model = build_model(ModelConfig(conv=conv, hidden=8, num_layers=2, hidden_norm="batch", heads=2), 10, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model([full, full], feats)
    loss = torch.nn.functional.cross_entropy(logits.float(), torch.arange(g.num_nodes()) % 3)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert model.norms[0].weight.dtype == torch.float32


def test_model_config_validation_and_build():
    cfg = ModelConfig(conv="gat", hidden=16, heads=4, hidden_norm="none", num_layers=3)
    assert cfg.hidden_norm is None
    model = build_model(cfg, in_feats=7, num_classes=5)
    assert [type(c) for c in model.convs] == [GATConv] * 3
    assert [c.num_heads for c in model.convs] == [4, 4, 1]
    assert set(ModelConfig.field_help()) == {
        "conv",
        "hidden",
        "num_layers",
        "dropout",
        "attn_dropout",
        "heads",
        "residual",
        "hidden_norm",
        "drop_edge",
        "edge_weights",
        "gcn_edge_weight",
        "activation_checkpointing",
        "relation_combine",
        "num_bases",
    }
    with pytest.raises(ValueError, match="model.conv"):
        ModelConfig(conv="graphsage")
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(conv="gat", hidden=10, heads=4)
    with pytest.raises(ValueError, match="model.dropout"):
        ModelConfig(dropout=1.0)
    with pytest.raises(TypeError):
        ModelConfig("sage")  # keyword-only


def test_block_validation():
    with pytest.raises(TypeError, match="int64"):
        Block(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0]), 1, 1)
    with pytest.raises(ValueError, match="num_dst"):
        Block(torch.tensor([0, 1]), torch.tensor([0]), 1, 2)
    with pytest.raises(ValueError, match="indptr"):
        Block(torch.tensor([0, 2]), torch.tensor([0]), 1, 1)
    block = block_from_csr(np.array([0, 1]), np.array([0]), np.array([0.5]))
    assert block.to("cpu") is block and block.edge_weight.dtype == torch.float32


def test_csr_matrix_is_cached_and_dense_matches():
    block = Block(torch.tensor([0, 2, 3, 3]), torch.tensor([1, 2, 0]), 3, 3, edge_weight=torch.tensor([0.5, 2.0, 3.0]))
    dense = csr_matrix(block).to_dense()
    assert dense.tolist() == [[0.0, 0.5, 2.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert csr_matrix(block) is csr_matrix(block)
    assert csr_matrix(block, torch.ones(3)).to_dense().sum().item() == 3.0


def test_layers_run_without_dgl():
    """training.layers imports and runs with dgl unimportable (auto -> torch kernels)."""
    script = textwrap.dedent(
        """
        import sys, importlib.abc
        class BlockDGL(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "dgl" or name.startswith("dgl."):
                    raise ImportError("dgl blocked for this test")
        sys.meta_path.insert(0, BlockDGL())
        import torch
        from training.aggregate import aggregate, resolve_backend
        from training.blocks import block_from_csr
        from training.layers import ModelConfig, build_model
        assert resolve_backend(None, torch.device("cpu")) == "torch"
        full = block_from_csr(torch.tensor([0, 2, 3, 5]), torch.tensor([0, 1, 1, 2, 0]))
        x = torch.randn(3, 4)
        for conv in ("sage", "sage_pool", "gcn", "gat", "gin"):
            model = build_model(ModelConfig(conv=conv, hidden=4, num_layers=2, heads=2), 4, 2).eval()
            out = model([full, full], x)
            assert torch.allclose(out, model.inference(full, x))
        assert aggregate(full, x, reduce="mean").shape == (3, 4)
        try:
            aggregate(full, x, backend="dgl")
        except ImportError as exc:
            assert "dgl" in str(exc)
        else:
            raise AssertionError("backend='dgl' without dgl must raise")
        assert "dgl" not in sys.modules
        print("ok")
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ------------------------------------------------------------------------- edge weights in sage / gin


def test_weighted_mean_weights_hand_checked():
    # dst 0 <- src 1 (w 1), src 2 (w 3); dst 1 <- src 3 (w 2); dst 2: no in-edges
    block = Block(torch.tensor([0, 2, 3, 3]), torch.tensor([1, 2, 3]), num_src=4, num_dst=3)
    w = weighted_mean_weights(block, torch.tensor([1.0, 3.0, 2.0]))
    close(w, torch.tensor([0.5, 1.5, 1.0]))  # w * deg / row sum
    x = torch.tensor([[0.0], [4.0], [8.0], [5.0]])
    close(aggregate(block, x, reduce="mean", edge_weight=w), torch.tensor([[(4 + 24) / 4], [5.0], [0.0]]))


@pytest.mark.parametrize("conv", ["sage", "sage_pool", "gin"])
def test_sage_and_gin_use_edge_weights_only_when_asked(conv, backend):
    blk = sampled_block()
    block, _ = from_dgl(blk)
    block.edge_weight = edge_weights(block.num_edges)
    x = features(block.num_src, 6)
    torch.manual_seed(0)
    plain = GNN(6, 8, 3, 1, conv).eval()
    weighted = GNN(6, 8, 3, 1, conv, edge_weights=True).eval()
    weighted.load_state_dict(plain.state_dict())
    layer = weighted.convs[0]
    if conv == "gin":  # weighted sum: GINConv with the block's weights as they are
        expect = layer(block, x, edge_weight=block.edge_weight)
    else:  # weighted mean: Σ w x / Σ w, checked without the helper
        dst = block.dst_ids()
        w = block.edge_weight
        row = torch.zeros(block.num_dst).index_add_(0, dst, w)
        if conv == "sage":
            msgs = layer.fc_neigh(x)[block.indices] * (w / row[dst])[:, None]
            neigh = torch.zeros(block.num_dst, 3).index_add_(0, dst, msgs)
            expect = layer.fc_self(x[: block.num_dst]) + neigh
        else:
            expect = layer(block, x, edge_weight=weighted_mean_weights(block, w))
    close(weighted([block], x), expect)
    assert not torch.allclose(weighted([block], x), plain([block], x))
    # weights constant per destination row: the weighted mean is the plain mean
    if conv != "gin":
        block.edge_weight = torch.repeat_interleave(torch.rand(block.num_dst) + 0.5, block.in_degrees())
        close(weighted([block], x), plain([block], x))


def test_correction_is_per_dst_on_hand_made_blocks():
    from training.blocks import correction_is_per_dst

    indptr = np.array([0, 2, 2, 5])  # dst 1 has no in-edges
    assert correction_is_per_dst(indptr, np.array([2.0, 2.0, 3.0, 3.0, 3.0], dtype=np.float32))
    assert not correction_is_per_dst(indptr, np.array([2.0, 1.0, 3.0, 3.0, 3.0], dtype=np.float32))
    assert not correction_is_per_dst(indptr, np.array([2.0, 2.0, 3.0, 3.0, 1.0], dtype=np.float32))  # a self loop's 1
    assert correction_is_per_dst(indptr, None) and correction_is_per_dst(np.array([0, 0]), np.empty(0))


def test_a_correction_per_destination_cancels_in_sage_only():
    from training.layers import sampled_edge_weight

    # dst 0 <- src 1, 2, 3 (corrections 4); dst 1 <- src 4 (correction 2): uniform sampling, no self loops
    indptr, indices = torch.tensor([0, 3, 4]), torch.tensor([1, 2, 3, 4])
    c = torch.tensor([4.0, 4.0, 4.0, 2.0])
    flagged = Block(indptr, indices, 5, 2, correction=c, correction_per_dst=True)
    plain = Block(indptr, indices, 5, 2, correction=c)
    assert sampled_edge_weight("sage", flagged) is None
    torch.testing.assert_close(sampled_edge_weight("sage", plain), torch.ones(4))  # the same mean, computed
    torch.testing.assert_close(sampled_edge_weight("gin", flagged), c)  # a sum keeps its correction
    torch.manual_seed(0)
    conv, x = SAGEConv(3, 2), torch.randn(5, 3)
    torch.testing.assert_close(
        conv(flagged, x, sampled_edge_weight("sage", flagged)), conv(plain, x, sampled_edge_weight("sage", plain))
    )
    assert (
        flagged.to("cpu").correction_per_dst
        and mask_edges(flagged, torch.tensor([1, 0, 1, 1]).bool()).correction_per_dst
    )


def test_the_transpose_is_built_only_for_a_gradient_of_the_sources():
    block = Block(torch.tensor([0, 2, 3, 3]), torch.tensor([1, 2, 3]), num_src=4, num_dst=3)
    x = torch.tensor([[1.0], [2.0], [4.0], [8.0]])
    out = aggregate(block, x, reduce="mean", backend="torch")  # input features: no gradient wanted
    assert not out.requires_grad and block.structure()._transpose is None
    xg = x.clone().requires_grad_(True)
    aggregate(block, xg, reduce="sum", backend="torch").pow(2).sum().backward()
    assert block.structure()._transpose is not None
    # d/dx of sum_v (sum_{u->v} x_u)^2 = 2 * (sum at the destination it feeds): src 1, 2 -> dst 0 (6), src 3 -> dst 1 (8)
    assert xg.grad.flatten().tolist() == [0.0, 12.0, 12.0, 16.0]
