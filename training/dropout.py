"""Dropout whose mask on the CPU costs one table lookup per 8 features instead of a random draw each.

``torch.nn.Dropout`` on the CPU draws one Bernoulli number per element (MKL's generator into an
int32 buffer, cast to float), divides the mask by the keep probability and multiplies: on a
sampled block's input features (hundreds of thousands of rows) that was about a quarter of an
epoch. `Dropout` draws the mask as random bits instead, 64 elements per 64-bit word of NumPy's
PCG64 (seeded from torch's default generator, so ``torch.manual_seed`` still fixes every mask),
and expands them with a table into the scaled float mask in one parallel pass; the product is
taken into that fresh mask where the input needs no gradient (a batch's input features).

Exact for any drop probability `p`: ``p = 0.5`` reads one bit per element; another `p` whose keep
probability is a multiple of 1/256 reads one byte per element, compared with the threshold; any
other `p`, and every tensor off the CPU, goes through ``torch.nn.functional.dropout``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Dropout", "dropout_mask"]

_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(np.float32)


def _random_bytes(count: int) -> np.ndarray:
    """`count` uniform random bytes drawn from a seed that torch's default generator gives."""
    seed = int(torch.randint(0, 2**62, (1,)).item())
    words = np.random.PCG64(seed).random_raw((count + 7) // 8)
    return words.view(np.uint8)[:count]


def _threshold(p: float) -> int | None:
    """The byte threshold t with keep probability t/256 == 1 - p exactly, or None."""
    t = (1.0 - p) * 256
    return int(t) if t == int(t) else None


def dropout_mask(shape: torch.Size, p: float) -> torch.Tensor | None:
    """float32 `shape` of 0 (dropped) and 1/(1-p) (kept), each kept with probability 1 - p; None
    where p has no exact bit or byte form (`_threshold`)."""
    n = int(np.prod(shape))
    if p == 0.5:  # one bit per element: 8 elements per byte, expanded through the table
        codes = torch.from_numpy(_random_bytes((n + 7) // 8).astype(np.int32))
        table = torch.from_numpy(_BITS * 2.0)
        return table.index_select(0, codes).view(-1)[:n].view(shape)
    t = _threshold(p)
    if t is None:
        return None
    keep = torch.from_numpy(_random_bytes(n) < t)
    return torch.mul(keep, 1.0 / (1.0 - p)).view(shape)


class _Masked(torch.autograd.Function):
    """x * mask, the mask saved for the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


class Dropout(nn.Dropout):
    """``nn.Dropout`` (the same module, state and semantics) with the CPU mask of `dropout_mask`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            not self.training
            or not 0 < self.p < 1
            or x.device.type != "cpu"
            or x.dtype != torch.float32
            or self.inplace
        ):
            return F.dropout(x, self.p, self.training, self.inplace)
        mask = dropout_mask(x.shape, self.p) if x.is_contiguous() else None
        if mask is None:
            return F.dropout(x, self.p, self.training)
        if x.requires_grad and torch.is_grad_enabled():
            return _Masked.apply(x, mask)
        return mask.mul_(x)  # the fresh mask becomes the output
