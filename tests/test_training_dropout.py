"""training.dropout.Dropout: nn.Dropout's semantics (kept elements scaled by 1/(1-p), dropped ones
0, each kept independently with probability 1 - p, gradients through the same mask) with its
mask drawn as bits; reproducible under torch.manual_seed."""

import pytest
import torch
from torch import nn

from training.dropout import Dropout, dropout_mask


def _draw(p: float, shape=(4001, 37), grad: bool = False):
    x = (torch.rand(shape) + 0.5).requires_grad_(grad)  # no zeros: a 0 in the output is a drop
    d = Dropout(p)
    d.train()
    return x, d(x)


@pytest.mark.parametrize("p", [0.5, 0.25, 0.75, 0.3])  # bits, bytes, bytes, torch's own
def test_kept_elements_are_scaled_and_kept_at_the_rate(p):
    torch.manual_seed(0)
    x, y = _draw(p)
    kept = y != 0
    assert torch.allclose(y[kept], x[kept] / (1 - p), rtol=1e-6)
    n = x.numel()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(kept.float().mean().item() - (1 - p)) < 5 * sigma


def test_bits_are_independent_across_positions_and_calls():
    torch.manual_seed(1)
    masks = torch.stack([dropout_mask(torch.Size([512, 64]), 0.5) != 0 for _ in range(20)]).float()
    # every column (each of a byte's 8 bit positions among them) kept half the time
    per_column = masks.mean(dim=(0, 1))
    sigma = (0.25 / (20 * 512)) ** 0.5
    assert (per_column - 0.5).abs().max().item() < 5 * sigma
    # two calls draw different masks; neighbouring elements are uncorrelated
    assert not torch.equal(masks[0], masks[1])
    both = (masks[:, :, :-1] * masks[:, :, 1:]).mean().item()
    assert abs(both - 0.25) < 0.01


def test_reproducible_under_manual_seed_and_the_size_is_any():
    torch.manual_seed(7)
    _, a = _draw(0.5, (13, 3))  # 39 elements: not a multiple of 8
    torch.manual_seed(7)
    _, b = _draw(0.5, (13, 3))
    assert torch.equal(a, b)
    assert a.shape == (13, 3)


@pytest.mark.parametrize("p", [0.5, 0.25])
def test_gradient_goes_through_the_same_mask(p):
    torch.manual_seed(2)
    x, y = _draw(p, (300, 16), grad=True)
    g = torch.rand_like(y)
    y.backward(g)
    assert torch.allclose(x.grad, (y != 0).float() * g / (1 - p), rtol=1e-6)


def test_a_drop_in_for_nn_dropout():
    d = Dropout(0.5)
    assert isinstance(d, nn.Dropout) and d.state_dict() == {} and repr(d) == repr(nn.Dropout(0.5))
    x = torch.rand(10, 4)
    d.eval()
    assert d(x) is x or torch.equal(d(x), x)  # evaluation: the identity
    d.train()
    assert torch.equal(Dropout(0.0)(x), x)
    assert torch.equal(Dropout(1.0)(x), torch.zeros_like(x))
    t = torch.rand(8, 6).t()  # not contiguous: torch's own dropout, the same semantics
    kept = Dropout(0.5)(t) != 0
    assert torch.allclose(Dropout(0.5).eval()(t), t) and kept.shape == t.shape
