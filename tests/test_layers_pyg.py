"""training.convs against PyTorch Geometric's layers, a second reference beside DGL's.

Each of gnnflow's SAGEConv (mean), GraphConv, GATConv and GINConv is compared with its PyG
counterpart, weights copied across, on the graphs tests/test_layers.py builds: outputs and
input gradients to 1e-5. Runs when the ``[peers]`` extra is installed (``make peers``) and
skips, saying so, without it; gnnflow itself never imports PyG.

PyG's arguments are those a PyG user sets to compute what gnnflow's layer computes:

- ``SAGEConv(aggr="mean")``: ``lin_l`` is our ``fc_neigh`` (plus ``fc_self``'s bias),
  ``lin_r`` our ``fc_self``; a block is the bipartite pair ``(x, x[:num_dst])``.
- ``GCNConv``: PyG's defaults (self loops added, symmetric normalization) give Â =
  D^-1/2 (A + I) D^-1/2, which is our ``GraphConv(norm="none")`` over Â's edge weights (how
  gnnflow's GCN model reads the normalized adjacency); ``add_self_loops=False`` is our
  ``norm="both"`` on a graph that carries its self loops. PyG normalizes both sides by the
  in-degree, so both checks use a symmetric graph, where in- and out-degrees agree.
- ``GATConv(add_self_loops=False)``: our blocks hold self loops only where the shards put them;
  PyG returns the heads concatenated, ours ``[num_dst, heads, out]``. PyG's residual is always a
  linear map with the layer's bias beside it: ours is the identity when the widths agree (PyG's
  weight set to the identity matrix) and a linear map carrying the bias otherwise. PyG's
  ``edge_attr`` is an edge feature, not a weight on the attention, so edge weights are not compared.
- ``GINConv``: a copy of our MLP (weights loaded again: PyG re-initialises the module it is
  given), ``train_eps`` for our ``learn_eps``, ``aggr="add"`` for our ``"sum"``.
"""

from __future__ import annotations

import copy

import pytest
import torch

pyg_nn = pytest.importorskip(
    "torch_geometric.nn",
    reason="PyTorch Geometric is not installed: `make peers` installs the [peers] extra",
)

from tests.test_layers import (  # noqa: E402
    close,
    directed_graph,
    features,
    from_dgl,
    run,
    sampled_block,
    symmetric_graph,
    weighted_block,
)
from training.blocks import Block  # noqa: E402
from training.convs.gat import GATConv  # noqa: E402
from training.convs.gcn import GraphConv  # noqa: E402
from training.convs.gin import GINConv  # noqa: E402
from training.convs.sage import SAGEConv  # noqa: E402

GRAPHS = {"directed": directed_graph, "sampled": sampled_block}


@pytest.fixture(params=sorted(GRAPHS))
def block(request) -> Block:
    return from_dgl(GRAPHS[request.param]())[0]


def edge_index(block: Block) -> torch.Tensor:
    """PyG's ``[2, E]`` (source, destination) for the block's edges, in the block's order."""
    return torch.stack([block.indices, block.dst_ids()])


class Bipartite(torch.nn.Module):
    """A PyG layer called the way PyG passes a sampled block: ``((x_src, x_dst), edge_index, size)``,
    the destinations being the first ``num_dst`` sources as in gnnflow's blocks."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, block: Block, x: torch.Tensor) -> torch.Tensor:
        size = (block.num_src, block.num_dst)
        return self.layer((x, x[: block.num_dst]), edge_index(block), size=size)


@pytest.mark.parametrize("in_feats,out_feats", [(6, 4), (4, 7)])
def test_sage_mean_matches_pyg(block, in_feats, out_feats):
    ours = SAGEConv(in_feats, out_feats, "mean")
    torch.nn.init.uniform_(ours.fc_self.bias)  # a bias on the wrong side would show
    theirs = pyg_nn.SAGEConv(in_feats, out_feats, aggr="mean")
    with torch.no_grad():
        theirs.lin_l.weight.copy_(ours.fc_neigh.weight)
        theirs.lin_l.bias.copy_(ours.fc_self.bias)
        theirs.lin_r.weight.copy_(ours.fc_self.weight)
    x = features(block.num_src, in_feats)
    out, grad = run(ours, block, x)
    ref_out, ref_grad = run(Bipartite(theirs), block, x)
    assert (block.in_degrees() == 0).any()  # a destination without neighbours: the root term alone
    close(out, ref_out)
    close(grad, ref_grad)


def full_graph_block(with_self_loops: bool) -> tuple[Block, torch.Tensor]:
    """A symmetric graph as our Block carrying Â's weights, and its PyG edge_index
    (with or without the self loops)."""
    g, dinv = symmetric_graph()
    ids = torch.arange(g.num_nodes())
    block = weighted_block(g, dinv, ids, ids)
    ei = edge_index(block)
    return block, ei if with_self_loops else ei[:, ei[0] != ei[1]]


def gcn_pair(in_feats: int, out_feats: int, **pyg_args) -> tuple[GraphConv, torch.nn.Module]:
    ours = GraphConv(in_feats, out_feats, norm="none")
    torch.nn.init.uniform_(ours.bias)
    theirs = pyg_nn.GCNConv(in_feats, out_feats, **pyg_args)
    with torch.no_grad():
        theirs.lin.weight.copy_(ours.weight.T)
        theirs.bias.copy_(ours.bias)
    return ours, theirs


@pytest.mark.parametrize("in_feats,out_feats", [(6, 4), (4, 7)])
def test_gcn_over_normalized_adjacency_matches_pyg_defaults(in_feats, out_feats):
    block, ei = full_graph_block(with_self_loops=False)
    ours, theirs = gcn_pair(in_feats, out_feats)  # PyG adds the self loops and normalizes
    x = features(block.num_src, in_feats)
    out, grad = run(ours, block, x, edge_weight=block.edge_weight)
    ref_out, ref_grad = run(lambda _, h: theirs(h, ei), block, x)
    close(out, ref_out)
    close(grad, ref_grad)


def test_gcn_norm_both_matches_pyg_without_added_self_loops():
    block, ei = full_graph_block(with_self_loops=True)
    ours, theirs = gcn_pair(6, 4, add_self_loops=False)
    x = features(block.num_src, 6)
    out, grad = run(ours, block, x, norm="both")
    ref_out, ref_grad = run(lambda _, h: theirs(h, ei), block, x)
    close(out, ref_out)
    close(grad, ref_grad)
    # the same layer without normalization is a different function: the check has teeth
    assert not torch.allclose(ours(block, x, norm="none"), ref_out, atol=1e-3)


@pytest.mark.parametrize("in_feats,residual", [(6, False), (6, True), (12, True)])
def test_gat_matches_pyg(block, in_feats, residual):
    heads, out_feats = 3, 4  # in_feats 12 == heads * out_feats: our residual is the identity
    ours = GATConv(in_feats, out_feats, heads, residual=residual)
    theirs = pyg_nn.GATConv(in_feats, out_feats, heads, add_self_loops=False, residual=residual)
    for p in ours.parameters():  # the biases start at zero otherwise
        torch.nn.init.uniform_(p, -0.5, 0.5)
    with torch.no_grad():
        theirs.lin.weight.copy_(ours.fc.weight)
        theirs.att_src.copy_(ours.attn_l)
        theirs.att_dst.copy_(ours.attn_r)
        if not residual:
            theirs.bias.copy_(ours.bias)
        elif ours.has_linear_res:  # ours: a linear residual carrying the bias; PyG's has a bias beside it
            theirs.res.weight.copy_(ours.res_fc.weight)
            theirs.bias.copy_(ours.res_fc.bias)
        else:  # ours: the identity; PyG's residual is always a linear map
            theirs.res.weight.copy_(torch.eye(in_feats))
            theirs.bias.copy_(ours.bias)
    x = features(block.num_src, in_feats)
    out, grad = run(ours, block, x)
    ref_out, ref_grad = run(Bipartite(theirs), block, x)
    assert out.shape == (block.num_dst, heads, out_feats)
    close(out.flatten(1), ref_out)
    close(grad, ref_grad)


@pytest.mark.parametrize("aggregator,pyg_aggr", [("sum", "add"), ("mean", "mean"), ("max", "max")])
@pytest.mark.parametrize("learn_eps,init_eps", [(False, 0.0), (True, 0.3)])
def test_gin_matches_pyg(block, aggregator, pyg_aggr, learn_eps, init_eps):
    ours = GINConv(5, 6, aggregator, learn_eps=learn_eps, init_eps=init_eps)
    theirs = pyg_nn.GINConv(copy.deepcopy(ours.apply_func), eps=init_eps, train_eps=learn_eps, aggr=pyg_aggr)
    theirs.nn.load_state_dict(ours.apply_func.state_dict())  # PyG re-initialises the MLP it is given
    x = features(block.num_src, 5)
    out, grad = run(ours, block, x)
    ref_out, ref_grad = run(Bipartite(theirs), block, x)
    close(out, ref_out)
    close(grad, ref_grad)
    if learn_eps:
        close(ours.eps.grad, theirs.eps.grad)
