"""Historical compensation (training.compensation): the gradient moving average and VR-GCN."""

import copy

import pytest
import torch

from training.aggregate import aggregate
from training.blocks import Block
from training.compensation import VRGCN, CompensationConfig, GradientEMA, check_vrgcn_supports, full_rows_block
from training.config import RunConfig
from training.layers import GNN, ModelConfig, sampled_edge_weight

# ----------------------------------------------------------------------------- gradient EMA


def test_grad_ema_formula_on_a_toy_problem():
    """g~_t = eta g_t + (1 - eta) g~_{t-1}, g~_0 = g_0, applied to the gradient SGD steps with."""
    eta, lr = 0.8, 0.1
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = GradientEMA(torch.optim.SGD([w], lr=lr), eta)
    gen = torch.Generator().manual_seed(0)
    expected_w, avg = w.detach().clone(), None
    for _ in range(6):
        noise = torch.randn(2, generator=gen)
        loss = 0.5 * (w**2).sum() + (noise * w).sum()  # gradient w + noise
        g = (w.detach() + noise).clone()
        loss.backward()
        opt.step()
        opt.zero_grad()
        avg = g if avg is None else eta * g + (1 - eta) * avg
        expected_w -= lr * avg
        torch.testing.assert_close(w.detach(), expected_w)


def test_grad_ema_is_sgd_momentum_with_dampening():
    """GradientEMA(SGD, eta) makes the same steps as SGD(momentum=1-eta, dampening=1-eta)."""
    eta = 0.7
    torch.manual_seed(0)
    a = torch.nn.Linear(5, 3)
    b = torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    opt_a = GradientEMA(torch.optim.SGD(a.parameters(), lr=0.05), eta)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.05, momentum=1 - eta, dampening=1 - eta)
    for _ in range(8):
        x, y = torch.randn(16, 5), torch.randn(16, 3)
        for model, opt in ((a, opt_a), (b, opt_b)):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        for pa, pb in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(pa, pb, rtol=1e-6, atol=1e-7)


def test_grad_ema_reduces_gradient_noise():
    """On a noisy quadratic the averaged gradient's variance is eta/(2 - eta) of the raw one's."""
    eta = 0.5
    w = torch.nn.Parameter(torch.zeros(20_000))
    opt = GradientEMA(torch.optim.SGD([w], lr=0.0), eta)  # lr 0: w stays, only the noise varies
    gen = torch.Generator().manual_seed(1)
    for _ in range(60):  # past the start-up transient ((1 - eta)^60 ~ 1e-18)
        w.grad = torch.randn(20_000, generator=gen)
        opt.step()
    assert float(w.grad.var()) == pytest.approx(eta / (2 - eta), rel=0.05)


def test_grad_ema_state_dict_resumes_exactly():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = GradientEMA(torch.optim.AdamW(model.parameters(), lr=0.01), 0.8)
    data = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(6)]

    def step(m, o, x, y):
        torch.nn.functional.mse_loss(m(x), y).backward()
        o.step()
        o.zero_grad()

    for x, y in data[:3]:
        step(model, opt, x, y)
    saved_model = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())  # as a checkpoint file holds it
    for x, y in data[3:]:
        step(model, opt, x, y)
    resumed = torch.nn.Linear(4, 2)
    resumed.load_state_dict(saved_model)
    opt2 = GradientEMA(torch.optim.AdamW(resumed.parameters(), lr=0.01), 0.8)
    opt2.load_state_dict(saved_opt)
    for x, y in data[3:]:
        step(resumed, opt2, x, y)
    for p, q in zip(model.parameters(), resumed.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    with pytest.raises(ValueError, match="no gradient averages"):
        opt2.load_state_dict(torch.optim.AdamW(resumed.parameters()).state_dict())


def test_compensation_config_validation():
    with pytest.raises(ValueError, match="grad_ema"):
        CompensationConfig(grad_ema=1.5)
    cfg = RunConfig.from_dict(
        {"training": {"compensation": {"grad_ema": 0.8, "vrgcn": True}}, "paths": {"shards": "s", "out": "o"}}
    )
    assert cfg.training.compensation == CompensationConfig(grad_ema=0.8, vrgcn=True)
    with pytest.raises(ValueError, match="linear aggregation"):
        check_vrgcn_supports(ModelConfig(conv="gat"))
    with pytest.raises(ValueError, match="gcn_edge_weight"):
        check_vrgcn_supports(ModelConfig(conv="gcn", gcn_edge_weight=False))
    with pytest.raises(ValueError, match="activation_checkpointing"):
        check_vrgcn_supports(ModelConfig(activation_checkpointing=True))


# ----------------------------------------------------------------------------- VR-GCN

N = 12


def toy_adjacency():
    """A symmetric 12-node graph with self loops and D^-1/2 (A+I) D^-1/2 weights, as CSR tensors."""
    gen = torch.Generator().manual_seed(3)
    a = (torch.rand(N, N, generator=gen) < 0.4).float()
    a = ((a + a.T) > 0).float()
    a.fill_diagonal_(1.0)
    d = a.sum(1).rsqrt()
    w = d[:, None] * a * d[None, :]
    rows, cols = a.nonzero(as_tuple=True)
    indptr = torch.zeros(N + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(rows, minlength=N), 0)
    return indptr, cols.long(), w[rows, cols].float()


def sampled_block(indptr, indices, weights, dst: torch.Tensor, fanout: int, seed: int):
    """A neighbour-sampled block over ``dst`` (global ids): up to ``fanout`` in-neighbours per
    node without replacement (self loop always kept), correction deg/sampled as the sampler
    writes it; sources = dst first, then the new neighbours. Returns (block, source global ids)."""
    gen = torch.Generator().manual_seed(seed)
    src_ids = list(dst.tolist())
    local = {int(v): i for i, v in enumerate(src_ids)}
    ptr, idx, wt, corr = [0], [], [], []
    for v in dst.tolist():
        row = torch.arange(int(indptr[v]), int(indptr[v + 1]))
        nbrs = indices[row]
        others = row[nbrs != v]
        pick = others[torch.randperm(others.numel(), generator=gen)[:fanout]]
        for e in pick.tolist() + row[nbrs == v].tolist():
            u = int(indices[e])
            if u not in local:
                local[u] = len(src_ids)
                src_ids.append(u)
            idx.append(local[u])
            wt.append(float(weights[e]))
            corr.append(1.0 if u == v else others.numel() / max(pick.numel(), 1))
        ptr.append(len(idx))
    block = Block(
        torch.tensor(ptr),
        torch.tensor(idx, dtype=torch.int64),
        len(src_ids),
        dst.numel(),
        edge_weight=torch.tensor(wt),
        correction=torch.tensor(corr),
    )
    return block, torch.tensor(src_ids, dtype=torch.int64)


def test_full_rows_block_is_the_rows_of_the_csr():
    indptr, indices, weights = toy_adjacency()
    rows = torch.tensor([5, 0, 11])
    block = full_rows_block(indptr, indices, weights, rows)
    assert block.num_src == N and block.num_dst == 3
    for i, v in enumerate(rows.tolist()):
        s, e = int(indptr[v]), int(indptr[v + 1])
        got = slice(int(block.indptr[i]), int(block.indptr[i + 1]))
        assert block.indices[got].tolist() == indices[s:e].tolist()
        assert block.edge_weight[got].tolist() == weights[s:e].tolist()


@pytest.mark.parametrize("conv", ["sage", "gcn", "gin"])
def test_vrgcn_equals_full_aggregation_when_histories_are_exact(conv):
    """With h_bar = h at every node, the control-variate aggregation over a 2-neighbour sample
    is the full-neighbourhood aggregation, for each linear layer type."""
    indptr, indices, weights = toy_adjacency()
    x = torch.randn(N, 6, generator=torch.Generator().manual_seed(0))
    dst = torch.tensor([0, 3, 7, 9])
    block, src = sampled_block(indptr, indices, weights, dst, fanout=2, seed=1)
    reduce = {"sage": "mean", "gcn": "sum", "gin": "sum"}[conv]
    model = GNN(6, 8, 3, 1, conv)  # supplies conv type and edge-weight settings
    vr = VRGCN(indptr, indices, weights)
    vr.histories[0] = x.clone()  # exact histories
    full = full_rows_block(indptr, indices, weights, dst)
    expected = aggregate(full, x, reduce=reduce, edge_weight=sampled_edge_weight(conv, full))
    w_sampled = sampled_edge_weight(conv, block)
    plain = aggregate(block, x[src], reduce=reduce, edge_weight=w_sampled)
    assert not torch.allclose(plain, expected, atol=1e-3)  # sampling alone misses the full value
    with vr.attach(model, [block], src):
        got = model.convs[0].aggregate(block, x[src], reduce, w_sampled)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(vr.histories[0][src], x[src])  # histories updated to the current values
    assert model.convs[0].control_variate is None  # detached after the pass


@pytest.mark.parametrize("conv", ["sage", "gcn", "gin"])
def test_vrgcn_model_matches_full_graph_inference_once_histories_are_filled(conv):
    """A 2-layer model: a pass over the full neighbourhoods fills the histories; then a pass
    over a 2-neighbour sample of the same seeds gives the full-graph logits of those seeds."""
    indptr, indices, weights = toy_adjacency()
    x = torch.randn(N, 6, generator=torch.Generator().manual_seed(0))
    seeds = torch.tensor([2, 8])
    torch.manual_seed(0)
    model = GNN(6, 16, 3, 2, conv).eval()  # no dropout
    full_graph = Block(indptr, indices, N, N, edge_weight=weights)
    reference = model.inference(full_graph, x)[seeds]

    def blocks_for(fanout, seed):
        top, mid = sampled_block(indptr, indices, weights, seeds, fanout, seed)
        bottom, src = sampled_block(indptr, indices, weights, mid, fanout, seed + 1)
        return [bottom, top], src

    vr = VRGCN(indptr, indices, weights)
    blocks, src = blocks_for(fanout=N, seed=0)  # every neighbour: fills the histories exactly
    with vr.attach(model, blocks, src):
        torch.testing.assert_close(model(blocks, x[src]), reference, rtol=1e-4, atol=1e-5)
    blocks, src = blocks_for(fanout=2, seed=5)
    plain = model(blocks, x[src])
    with vr.attach(model, blocks, src):
        got = model(blocks, x[src])
    assert not torch.allclose(plain, reference, atol=1e-3)
    torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-5)


def test_vrgcn_is_unbiased_with_stale_histories():
    """Histories that are not the current values: the estimate's mean over many samples is
    still the full aggregation (GCN, sum over Â with the sampler's correction)."""
    indptr, indices, weights = toy_adjacency()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 4, generator=gen)
    stale = x + 0.3 * torch.randn(N, 4, generator=gen)
    dst = torch.tensor([1, 4, 6])
    full = full_rows_block(indptr, indices, weights, dst)
    expected = aggregate(full, x, reduce="sum", edge_weight=full.edge_weight)
    model = GNN(4, 8, 3, 1, "gcn")
    total, plain_err, cv_err, draws = torch.zeros_like(expected), 0.0, 0.0, 400
    for seed in range(draws):
        block, src = sampled_block(indptr, indices, weights, dst, fanout=2, seed=seed)
        vr = VRGCN(indptr, indices, weights)
        vr.histories[0] = stale.clone()
        w = sampled_edge_weight("gcn", block)
        with vr.attach(model, [block], src):
            est = model.convs[0].aggregate(block, x[src], "sum", w)
        total += est
        cv_err += float(((est - expected) ** 2).sum())
        plain_err += float(((aggregate(block, x[src], reduce="sum", edge_weight=w) - expected) ** 2).sum())
    torch.testing.assert_close(total / draws, expected, rtol=0, atol=0.05)
    assert cv_err < 0.5 * plain_err  # histories close to the values: much less variance


@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_vrgcn_histories_hold_the_input_without_dropout(conv):
    """In training mode (dropout 0.5) the histories keep the rows the layer would aggregate
    without dropout: T(h) for a layer that transforms first (in 6 > out 3), h otherwise."""
    indptr, indices, weights = toy_adjacency()
    x = torch.randn(N, 6, generator=torch.Generator().manual_seed(0))
    block, src = sampled_block(indptr, indices, weights, torch.tensor([0, 5]), fanout=2, seed=0)
    model = GNN(6, 8, 3, 1, conv, dropout=0.5).train()
    vr = VRGCN(indptr, indices, weights)
    with vr.attach(model, [block], src):
        model([block], x[src])
    conv_layer = model.convs[0]
    expected = conv_layer.fc_neigh(x[src]) if conv == "sage" else x[src] @ conv_layer.weight
    torch.testing.assert_close(vr.histories[0][src], expected.detach())
